"""Where a shell command's placeholders may stand, as errors and warnings with their fixes.

shell_template.py splits a command into text and placeholders; this module turns each
placeholder into a sentinel word, has shell_flow.py read the script with a bash parser, and
reports every place the shell rule refuses (see docs/dsl.md, "Shell commands and quoting"),
both for lint and for the engine, which compile commands the same way. It also checks
`argv:` lists, whose program may itself be a shell (`[sh, -c, "... {{ v }}"]`).
"""
from __future__ import annotations

from collections.abc import Sequence
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from jinja2 import nodes

from .sandbox import TemplateError

# Rule ids carried by TemplateError for shell commands (lint reports them as `[rule-id]`).
RULE_SINGLE_QUOTE = "shell-quote-single"
RULE_HEREDOC = "shell-quote-heredoc"
RULE_BACKTICK = "shell-quote-backtick"
RULE_STATEMENT = "shell-statement"
RULE_UNSAFE_RAW = "shell-unsafe-raw"
RULE_ARITHMETIC = "shell-arithmetic"
RULE_ESCAPED = "shell-escaped-placeholder"
RULE_NAME = "shell-name"
RULE_CODE = "shell-code"
RULE_COMMAND = "shell-command-name"
RULE_PLACE = "shell-place"
RULE_OPTION = "shell-option"
RULE_SHELL_SYNTAX = "shell-syntax"


@dataclass(frozen=True)
class Placeholder:
    offset: int          # of the opening "{{"
    expression: str      # the text between the delimiters
    expression_offset: int


def with_hint(message: str, rule: str, offset: int, hint: str) -> TemplateError:
    return TemplateError(f"{message}; {hint}", rule, offset, hint)


# The word each placeholder becomes while the command is parsed: a name no script uses, which
# bash reads as one word anywhere (and as a variable name where it wants a name).
_SENTINEL = "_LoopdslValue{}_"


def _sentinel_script(items: list[tuple[int, Any]]) -> tuple[bytes, list[tuple[int, int]], list[int]]:
    """The command with a sentinel for each placeholder: (UTF-8 bytes, the byte span of each
    sentinel, the source offset of each byte)."""
    chunks: list[bytes] = []
    spans: list[tuple[int, int]] = []
    origin: list[int] = []
    size = 0
    for offset, item in items:
        if isinstance(item, Placeholder):
            data = _SENTINEL.format(len(spans) + 1).encode()
            spans.append((size, size + len(data)))
        else:
            data = item.encode("utf-8", "surrogateescape")
        chunks.append(data)
        origin.extend([offset] * len(data))
        size += len(data)
    origin.append(items[-1][0] + 1 if items else 0)
    return b"".join(chunks), spans, origin


def _escape_errors(items: list[tuple[int, Any]]) -> list[tuple[int, str, str, str]]:
    """A placeholder right after an unescaped backslash or `$` would change its own quoting."""
    found = []
    for k, (_offset, item) in enumerate(items):
        if not isinstance(item, Placeholder):
            continue
        backslashes = 0
        while k - backslashes - 1 >= 0 and items[k - backslashes - 1][1] == "\\":
            backslashes += 1
        before = items[k - 1][1] if k else None
        if backslashes % 2:
            found.append((k, RULE_ESCAPED, "follows a backslash, which would escape the quoting "
                          "loopdsl puts around the value", "remove the backslash"))
        elif before == "$" and not (k >= 2 and items[k - 2][1] == "\\"):
            found.append((k, RULE_ESCAPED, "follows a '$'",
                          "remove the '$': the placeholder already stands for the value"))
    return found


@dataclass(frozen=True)
class InputFacts:
    """What the loop's `inputs` prove about a value: integer inputs, and inputs whose `enum`
    lists every value they may take (text the loop's author wrote, so it may even be code)."""

    integers: frozenset[str] = frozenset()
    choices: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # Variables of the command's `env:` whose value is a template: they carry values too.
    env: frozenset[str] = frozenset()
    # A shell tool's `integer` params: `args.X` is validated against its params before it runs.
    arg_integers: frozenset[str] = frozenset()

    def with_env(self, env: Mapping[str, str]) -> InputFacts:
        carrying = frozenset(k for k, v in env.items() if "{{" in str(v) or "{%" in str(v))
        return replace(self, env=carrying) if carrying != self.env else self

    def choice(self, name: str) -> tuple[str, ...] | None:
        return next((values for input_name, values in self.choices if input_name == name), None)


NO_FACTS = InputFacts()


# How each place a value must not stand is reported: (rule, what happens there, how to fix).
_PLACE_RULES: dict[str, tuple[str, str, str]] = {
    "single": (RULE_SINGLE_QUOTE, "is inside single quotes, where the shell never expands anything",
               "move it outside the single quotes: printf %s \"{p}\""),
    "heredoc": (RULE_HEREDOC, "is inside a here-document, where a value is spliced into the text",
                "pipe it in instead: printf '%s\\n' \"{p}\" | cmd, or use a here-string: "
                "cmd <<< \"{p}\""),
    "backtick": (RULE_BACKTICK, "is inside backticks", "use $( ) instead of backticks: $(cmd \"{p}\")"),
    "integer": (RULE_ARITHMETIC, "stands in {context}: a value like a[$(cmd)] runs cmd",
                "declare the input `type: integer` in `inputs`, or convert it: {{{{ ({e}) | int }}}}; "
                "to compare text use [[ {p} == 1 ]]"),
    "name": (RULE_NAME, "stands in {context}: bash evaluates a name like a[$(cmd)] and runs cmd",
             "keep variable names literal and pass the value as data, e.g. name={p}"),
    "code": (RULE_CODE, "stands in {context}: the value would run as shell code",
             "keep the code literal and pass the value as data after it: "
             "bash -c 'cmd \"$1\"' _ {p}, or use `argv:`"),
    "command": (RULE_COMMAND, "is {context}: the value would choose the program",
                "name the program literally; choose between fixed programs with `case`"),
    "place": (RULE_PLACE, "stands in {context}, which is not a place for a value",
              "pass it as a plain argument or assign it first: x={p}; then use \"$x\""),
    "option": (RULE_OPTION, "is {context}: a value starting with '-' would be read as an option",
               "put `--` before it (`git log --end-of-options {p}` for a git revision), or "
               "prefix a path with ./"),
}


def proven_value(expression: str, facts: InputFacts) -> tuple[str, tuple[str, ...]] | None:
    """What lint can prove an expression renders: ("int", ()) for an integer input,
    run.attempt, a literal integer or anything ending in `| int`; ("choice", values) for an
    input with an `enum`; None when it could be anything."""
    from .templates import _parse_expression

    try:
        tree = _parse_expression(expression)
    except TemplateError:
        return None
    integer = ("int", ())
    if isinstance(tree, nodes.Filter):
        return integer if tree.name == "int" else None
    if isinstance(tree, nodes.Const):
        return integer if isinstance(tree.value, int) and not isinstance(tree.value, bool) else None
    if isinstance(tree, nodes.Getattr) and isinstance(tree.node, nodes.Name):
        if (tree.node.name, tree.attr) == ("run", "attempt"):
            return integer
        if tree.node.name == "inputs" and tree.attr in facts.integers:
            return integer
        if tree.node.name == "args" and tree.attr in facts.arg_integers:
            return integer
        values = facts.choice(tree.attr) if tree.node.name == "inputs" else None
        if values is not None:
            return ("choice", values)
    return None


def placement_problems(items: list[tuple[int, Any]], placeholders: list[Placeholder],
                        facts: InputFacts) -> tuple[list[Any], list[TemplateError],
                                                    list[TemplateError]]:
    """Each placeholder's runtime check (None, or what its value must be), the errors and the
    warnings."""
    from .shell_flow import analyze

    data, spans, origin = _sentinel_script(items)
    proven = [proven_value(p.expression, facts) for p in placeholders]
    analysis = analyze(data, spans, [p is not None for p in proven], inherited=facts.env)
    errors: list[TemplateError] = []
    warnings: list[TemplateError] = []
    escaped = {k for k, *_ in _escape_errors(items)}
    for k, rule, what, hint in _escape_errors(items):
        errors.append(_problem(items[k][1], rule, what, hint))
    checks: list[tuple[str, tuple[str, ...]] | None] = []
    positions = [k for k, (_o, item) in enumerate(items) if isinstance(item, Placeholder)]
    for k, placeholder, place, known in zip(positions, placeholders, analysis.places, proven):
        kind = place.kind
        evaluated = kind in ("integer", "name", "code", "command")
        # Every proven value is checked again at run time: it also keeps variables it is
        # assigned to free of taint (shell_flow.py), which holds only while it is true.
        checks.append(known)
        if known is not None and (kind == "option" or (kind == "integer" and known[0] == "int")
                                  or (evaluated and known[0] == "choice")):
            kind = "ok"
        if kind == "ok" or k in escaped:
            continue
        rule, what, hint = _PLACE_RULES.get(kind, _PLACE_RULES["place"])
        problem = _problem(placeholder, rule, what.format(context=place.context), hint)
        (warnings if kind == "option" else errors).append(problem)
    for byte, kind, context, variable in analysis.carried:
        rule, _what, _hint = _PLACE_RULES.get(kind, _PLACE_RULES["place"])
        errors.append(with_hint(
            f"variable ${variable} carries a placeholder's value into {context}, where bash "
            "evaluates it (a value like a[$(cmd)] runs cmd)", rule, origin[byte],
            "keep the value out of arithmetic, names and code: validate it as `type: integer` in "
            "`inputs` and use the placeholder there directly, or pass it with `argv:`"))
    for byte, context, variable in analysis.carried_options:
        rule, what, hint = _PLACE_RULES["option"]
        warnings.append(with_hint(f"variable ${variable} carries a placeholder's value into "
                                   f"{context}: a value starting with '-' would be read as an "
                                   "option", rule, origin[byte], hint.format(p=f'"${variable}"')))
    for byte, context in analysis.hazards:
        errors.append(with_hint(f"{context}, in a command that holds a value", RULE_CODE,
                                 origin[byte], "pass the value as an argument after a literal "
                                 "script: bash -c 'cmd \"$1\"' _ \"$value\""))
    if analysis.syntax_error is not None:
        errors.append(with_hint("the bash parser cannot read this command here", RULE_SHELL_SYNTAX,
                                 origin[min(analysis.syntax_error, len(origin) - 1)],
                                 "fix the shell syntax (check quotes, brackets and `done`/`fi`); "
                                 "a here-string `<<<` goes before other redirections"))
    return list(zip(analysis.places, checks)), errors, warnings


def _problem(placeholder: Placeholder, rule: str, what: str, hint: str) -> TemplateError:
    shown = f"{{{{ {placeholder.expression.strip()} }}}}"
    fix = hint.format(p=shown, e=placeholder.expression.strip())
    return TemplateError(f"{shown} {what}; {fix}", rule, placeholder.offset, fix)


def argv_problems(argv: Sequence[str]) -> tuple[list[tuple[int, TemplateError]], list[tuple[int, TemplateError]]]:
    """`argv:` runs without a shell, but its program may be one: `[sh, -c, "... {{ v }}"]`
    runs the value as code. (errors, warnings) as (element index, problem)."""
    from .shell_commands import Word, judge_argument

    def holds_template(text: str) -> bool:
        return "{{" in text or "{%" in text

    words = [Word(None if holds_template(a) else a, holds_template(a)) for a in argv]
    errors: list[tuple[int, TemplateError]] = []
    warnings: list[tuple[int, TemplateError]] = []
    for index, element in enumerate(argv):
        if not holds_template(element):
            continue
        judged = judge_argument(words, index)
        kind = judged.verdict
        leading = element.lstrip().startswith("{")     # the value starts the argument
        if kind == "leading-code":
            kind = "code" if leading else "ok"
        if kind == "option" and not leading:
            continue
        if kind not in ("code", "command", "option"):
            continue
        rule, what, hint = _PLACE_RULES[kind]
        if kind == "code":
            hint = "keep the script literal and pass the value after it: [sh, -c, 'cmd \"$1\"', _, \"{p}\"]"
        shown = element.strip()[:60]
        fix = hint.format(p=shown, e=shown)
        problem = TemplateError(f"argv element {index} ({shown}) {what.format(context=judged.context)}; "
                                f"{fix}", rule, max(element.find("{"), 0), fix)
        (warnings if kind == "option" else errors).append((index, problem))
    return errors, warnings


def env_problems(env: Mapping[str, str]) -> list[tuple[str, TemplateError]]:
    """`env: {PS4: "{{ v }}"}`, `{BASH_ENV: ...}`, `{NODE_OPTIONS: ...}`: a value there decides
    what bash or a program runs. (key, problem) for each."""
    from .shell_parse import dangerous_variable

    problems = []
    for key, value in env.items():
        if dangerous_variable(key) and ("{{" in str(value) or "{%" in str(value)):
            hint = (f"set {key} to a literal in the loop file; pass the value under another "
                    "name and validate it in the command")
            problems.append((key, TemplateError(
                f"env {key} gets a template value, and {key} decides what bash or a program "
                f"runs; {hint}", RULE_CODE, max(str(value).find("{"), 0), hint)))
    return problems


def check_env(env: Mapping[str, str]) -> None:
    """Raise the first problem env_problems finds (the engine's check before running it)."""
    problems = env_problems(env)
    if problems:
        raise problems[0][1]


def check_argv(argv: Sequence[str]) -> None:
    """Raise the first problem argv_problems finds (the engine's check before running it)."""
    errors, _warnings = argv_problems(argv)
    if errors:
        raise errors[0][1]
