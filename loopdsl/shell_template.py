"""Injection-proof shell commands: placeholders become quoted environment variables.

Every `{{ }}` in a shell command becomes an environment variable (`"$LOOPDSL_1"` outside quotes,
`${LOOPDSL_1}` inside double quotes), so a value is never parsed as shell code. Where bash
would still evaluate the value (arithmetic, variable names, `eval`, `bash -c`), quoting is not
enough: shell_parse.py reads the command with a real bash parser and only the places on its
allow-list are accepted. Lint and the engine both compile commands here, so they agree.
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from jinja2 import nodes
from jinja2.exceptions import TemplateSyntaxError

from .sandbox import RULE_SYNTAX, RenderError, TemplateError, _environment, _render_error

if TYPE_CHECKING:
    from .templates import Expression

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

# Linux refuses (E2BIG) one environment string longer than 32 pages, "NAME=value\0" included.
MAX_ENV_STRING = 131_072
ENV_CHUNK_BYTES = 120_000


# ---------------------------------------------------------------- shell commands

_RAW_BEGIN = re.compile(r"\{%[-+]?\s*raw\s*[-+]?%\}")
_RAW_END = re.compile(r"\{%[-+]?\s*endraw\s*[-+]?%\}")
_INTEGER_TEXT = re.compile(r"[+-]?[0-9]{1,30}")


@dataclass(frozen=True)
class _Placeholder:
    offset: int          # of the opening "{{"
    expression: str      # the text between the delimiters
    expression_offset: int


def _source_pos(source: str, start: int, normalized_length: int) -> int:
    """Jinja's lexer turns \\r\\n into \\n: map a length of its output back into `source`."""
    if "\r" not in source:
        return start + normalized_length
    pos = start
    for _ in range(normalized_length):
        pos += 2 if source.startswith("\r\n", pos) else 1
    return pos


def _placeholder_at(source: str, start: int) -> tuple[_Placeholder, int]:
    """Use Jinja's own lexer to find where `{{` at `start` ends (so `{{ "}}" }}` works)."""
    consumed, inner_start = 0, 0
    try:
        for _lineno, kind, value in _environment().lexer.tokeniter(source[start:], None):
            if kind == "variable_begin":
                inner_start = consumed + len(value)
            elif kind == "variable_end":
                begin = _source_pos(source, start, inner_start)
                inner_end = _source_pos(source, start, consumed)
                end = _source_pos(source, start, consumed + value.index("}}") + 2)
                return _Placeholder(start, source[begin:inner_end], begin), end
            consumed += len(value)
    except TemplateSyntaxError as exc:
        raise TemplateError(f"template syntax error: {exc.message}", RULE_SYNTAX, start) from None
    raise TemplateError("'{{' is never closed by '}}'", RULE_SYNTAX, start)


def _split_jinja(source: str, errors: list[TemplateError]) -> list[tuple[int, Any]]:
    """The command as (offset, char | _Placeholder) items: comments dropped, raw blocks kept as text."""
    items: list[tuple[int, Any]] = []
    pos = 0
    while pos < len(source):
        nxt = source.find("{", pos)
        while nxt >= 0 and source[nxt + 1: nxt + 2] not in ("{", "%", "#"):
            nxt = source.find("{", nxt + 1)
        stop = len(source) if nxt < 0 else nxt
        items.extend((i, source[i]) for i in range(pos, stop))
        if nxt < 0:
            break
        marker = source[nxt + 1]
        if marker == "{":
            placeholder, pos = _placeholder_at(source, nxt)
            items.append((nxt, placeholder))
        elif marker == "#":
            close = source.find("#}", nxt + 2)
            if close < 0:
                raise TemplateError("'{#' comment is never closed by '#}'", RULE_SYNTAX, nxt)
            pos = close + 2
        elif (raw := _RAW_BEGIN.match(source, nxt)) is not None:
            end = _RAW_END.search(source, raw.end())
            if end is None:
                raise TemplateError("{% raw %} is never closed by {% endraw %}", RULE_SYNTAX, nxt)
            items.extend((i, source[i]) for i in range(raw.end(), end.start()))
            pos = end.end()
        else:
            close = source.find("%}", nxt + 2)
            pos = len(source) if close < 0 else close + 2
            errors.append(_with_hint(
                f"{source[nxt:pos][:60]} is not allowed in a shell command: a command is one "
                "fixed script whose values arrive as quoted variables",
                RULE_STATEMENT, nxt,
                "compute the value in a `set` state or inside {{ }} (e.g. {{ a if ok else b }}), "
                "or use `argv:`; for a literal {% write {{ '{%' }}"))
    return items


def _with_hint(message: str, rule: str, offset: int, hint: str) -> TemplateError:
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
        if isinstance(item, _Placeholder):
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
        if not isinstance(item, _Placeholder):
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


def _passes(check: tuple[str, tuple[str, ...]], text: str) -> bool:
    kind, values = check
    if kind == "int":
        return _INTEGER_TEXT.fullmatch(text) is not None
    return text in values


class ShellCommand:
    """A shell command whose placeholders reach bash only as environment variables."""

    def __init__(self, source: str, script: str, placeholders: tuple[Expression, ...],
                 checks: tuple[tuple[str, tuple[str, ...]] | None, ...] = ()) -> None:
        self.source = source
        self.script = script
        self.placeholders = placeholders
        # For a placeholder where bash evaluates the value, what lint proved it to be
        # (("int", ()) or ("choice", values)); checked again before the value reaches bash.
        self.checks = checks

    def _values(self, context: Mapping[str, Any]) -> list[str]:
        # Imported here: templates.py imports this module, so a module-level import would cycle.
        from .templates import to_text, truncate_text

        values = []
        for number, expression in enumerate(self.placeholders):
            shown = f"{{{{ {expression.source.strip()} }}}}"
            try:
                text = truncate_text(to_text(expression(context)))
            except RenderError as exc:
                raise RenderError(f"in {shown}: {exc.message}") from None
            except Exception as exc:  # noqa: BLE001 - e.g. str() of an odd value
                raise RenderError(f"in {shown}: {_render_error(exc).message}") from None
            if "\0" in text:
                raise RenderError(f"the value of {shown} contains a NUL character, which no "
                                  "command can receive; remove it in the template: "
                                  f"{{{{ ({expression.source.strip()}) | replace('\\x00', '') }}}}")
            try:
                text.encode("utf-8", "surrogateescape")
            except UnicodeEncodeError:
                raise RenderError(f"the value of {shown} contains a lone UTF-16 surrogate, "
                                  "which cannot be passed to a command") from None
            check = self.checks[number] if number < len(self.checks) else None
            if check is not None and not _passes(check, text):
                raise RenderError(f"the value of {shown} stands where bash evaluates it, but it "
                                  f"is not {'an integer' if check[0] == 'int' else 'one of its enum values'}: "
                                  f"{text[:40]!r}")
            values.append(text)
        return values

    def environment(self, context: Mapping[str, Any]) -> dict[str, str]:
        """{"LOOPDSL_1": text, ...}; raises RenderError (also for a value too big for one variable)."""
        env = {}
        for number, text in enumerate(self._values(context), start=1):
            name = f"LOOPDSL_{number}"
            size = len(text.encode("utf-8", "surrogateescape")) + len(name) + 2
            if size > MAX_ENV_STRING:
                raise RenderError(
                    f"the value of {{{{ {self.placeholders[number - 1].source.strip()} }}}} is "
                    f"{size} bytes, more than one environment variable can carry "
                    f"({MAX_ENV_STRING}); write it to a file in an earlier step and pass the path")
            env[name] = text
        return env

    def prepare(self, context: Mapping[str, Any]) -> tuple[str, dict[str, str]]:
        """(script, environment) like `script`/`environment()`, but values too big for one
        environment variable travel in chunks that a one-line prologue joins again."""
        env: dict[str, str] = {}
        joins: list[str] = []
        chunk_chars = ENV_CHUNK_BYTES // 4        # UTF-8 needs at most 4 bytes per character
        for number, text in enumerate(self._values(context), start=1):
            name = f"LOOPDSL_{number}"
            if len(text) <= chunk_chars:
                env[name] = text
                continue
            parts = [f"{name}_{i}" for i in range(1, -(-len(text) // chunk_chars) + 1)]
            for i, part in enumerate(parts):
                env[part] = text[i * chunk_chars:(i + 1) * chunk_chars]
            joins.append(f'{name}="{"".join("${" + p + "}" for p in parts)}"; unset {" ".join(parts)}')
        if not joins:
            return self.script, env
        return "; ".join(joins) + "\n" + self.script, env

    def __repr__(self) -> str:
        return f"ShellCommand({self.source!r})"


@dataclass(frozen=True)
class InputFacts:
    """What the loop's `inputs` prove about a value: integer inputs, and inputs whose `enum`
    lists every value they may take (text the loop's author wrote, so it may even be code)."""

    integers: frozenset[str] = frozenset()
    choices: tuple[tuple[str, tuple[str, ...]], ...] = ()

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


def _proven(expression: str, facts: InputFacts) -> tuple[str, tuple[str, ...]] | None:
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
        values = facts.choice(tree.attr) if tree.node.name == "inputs" else None
        if values is not None:
            return ("choice", values)
    return None


def _placement_problems(items: list[tuple[int, Any]], placeholders: list[_Placeholder],
                        facts: InputFacts) -> tuple[list[Any], list[TemplateError],
                                                    list[TemplateError]]:
    """Each placeholder's runtime check (None, or what its value must be), the errors and the
    warnings."""
    from .shell_parse import analyze

    data, spans, origin = _sentinel_script(items)
    proven = [_proven(p.expression, facts) for p in placeholders]
    analysis = analyze(data, spans, [p is not None for p in proven])
    errors: list[TemplateError] = []
    warnings: list[TemplateError] = []
    escaped = {k for k, *_ in _escape_errors(items)}
    for k, rule, what, hint in _escape_errors(items):
        errors.append(_problem(items[k][1], rule, what, hint))
    checks: list[tuple[str, tuple[str, ...]] | None] = []
    positions = [k for k, (_o, item) in enumerate(items) if isinstance(item, _Placeholder)]
    for k, placeholder, place, known in zip(positions, placeholders, analysis.places, proven):
        kind = place.kind
        evaluated = kind in ("integer", "name", "code", "command")
        # Every proven value is checked again at run time: it also keeps variables it is
        # assigned to free of taint (shell_parse.py), which holds only while it is true.
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
        errors.append(_with_hint(
            f"variable ${variable} carries a placeholder's value into {context}, where bash "
            "evaluates it (a value like a[$(cmd)] runs cmd)", rule, origin[byte],
            "keep the value out of arithmetic, names and code: validate it as `type: integer` in "
            "`inputs` and use the placeholder there directly, or pass it with `argv:`"))
    for byte, context, variable in analysis.carried_options:
        rule, what, hint = _PLACE_RULES["option"]
        warnings.append(_with_hint(f"variable ${variable} carries a placeholder's value into "
                                   f"{context}: a value starting with '-' would be read as an "
                                   "option", rule, origin[byte], hint.format(p=f'"${variable}"')))
    for byte, context in analysis.hazards:
        errors.append(_with_hint(f"{context}, in a command that holds a value", RULE_CODE,
                                 origin[byte], "pass the value as an argument after a literal "
                                 "script: bash -c 'cmd \"$1\"' _ \"$value\""))
    if analysis.syntax_error is not None:
        errors.append(_with_hint("the bash parser cannot read this command here", RULE_SHELL_SYNTAX,
                                 origin[min(analysis.syntax_error, len(origin) - 1)],
                                 "fix the shell syntax (check quotes, brackets and `done`/`fi`); "
                                 "a here-string `<<<` goes before other redirections"))
    return list(zip(analysis.places, checks)), errors, warnings


def _problem(placeholder: _Placeholder, rule: str, what: str, hint: str) -> TemplateError:
    shown = f"{{{{ {placeholder.expression.strip()} }}}}"
    fix = hint.format(p=shown, e=placeholder.expression.strip())
    return TemplateError(f"{shown} {what}; {fix}", rule, placeholder.offset, fix)


def _script(items: list[tuple[int, Any]], places: list[Any]) -> str:
    out: list[str] = []
    number = 0
    for _offset, item in items:
        if not isinstance(item, _Placeholder):
            out.append(item)
            continue
        number += 1
        quoted = number <= len(places) and places[number - 1][0].in_double_quotes
        out.append(f"${{LOOPDSL_{number}}}" if quoted else f'"$LOOPDSL_{number}"')
    return "".join(out)


def analyze_shell(source: str, facts: InputFacts = NO_FACTS
                  ) -> tuple[ShellCommand | None, list[TemplateError], list[TemplateError]]:
    """Compile a shell command: (command or None, every error, every warning). `facts` says
    which inputs are integers or fixed choices, the only values bash may evaluate."""
    errors: list[TemplateError] = []
    try:
        items = _split_jinja(source, errors)
    except TemplateError as exc:
        return None, [*errors, exc], []
    placeholders = [item for _, item in items if isinstance(item, _Placeholder)]
    places, placement_errors, warnings = _placement_problems(items, placeholders, facts)
    errors.extend(placement_errors)
    expressions = []
    for placeholder in placeholders:
        compiled = _compile_placeholder(placeholder, errors)
        if compiled is not None:
            expressions.append(compiled)
    errors.sort(key=lambda e: (e.offset is None, e.offset or 0))
    if errors:
        return None, errors, warnings
    command = ShellCommand(source, _script(items, places), tuple(expressions),
                           tuple(check for _place, check in places))
    return command, [], warnings


def _compile_placeholder(placeholder: _Placeholder, errors: list[TemplateError]) -> Expression | None:
    # Imported here: templates.py imports this module, so a module-level import would cycle.
    from .templates import _parse_expression, compile_expression

    try:
        expression = compile_expression(placeholder.expression)
    except TemplateError as exc:
        errors.append(TemplateError(exc.message, exc.rule, placeholder.offset))
        return None
    tree = _parse_expression(placeholder.expression)
    filters = [tree, *tree.find_all(nodes.Filter)]   # find_all skips the root itself
    if any(isinstance(f, nodes.Filter) and f.name == "unsafe_raw" for f in filters):
        at = placeholder.expression.find("unsafe_raw")
        errors.append(_with_hint(
            "unsafe_raw is not allowed in a shell command: every placeholder reaches the "
            "command as one quoted value, never as shell code", RULE_UNSAFE_RAW,
            placeholder.expression_offset + max(at, 0),
            "to run generated code, write it to a file in an earlier step and run the file"))
    return expression


def check_shell(source: str, facts: InputFacts = NO_FACTS
                ) -> tuple[ShellCommand | None, list[TemplateError]]:
    """Compile a shell command, collecting every problem (for lint) instead of the first."""
    command, errors, _warnings = analyze_shell(source, facts)
    return command, errors


def compile_shell(source: str, facts: InputFacts = NO_FACTS) -> ShellCommand:
    command, errors = check_shell(source, facts)
    if errors:
        raise errors[0]
    assert command is not None
    return command


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
        if judged.verdict not in ("code", "command", "option"):
            continue
        kind = judged.verdict
        rule, what, hint = _PLACE_RULES[kind]
        if kind == "code":
            hint = "keep the script literal and pass the value after it: [sh, -c, 'cmd \"$1\"', _, \"{p}\"]"
        shown = element.strip()[:60]
        fix = hint.format(p=shown, e=shown)
        problem = TemplateError(f"argv element {index} ({shown}) {what.format(context=judged.context)}; "
                                f"{fix}", rule, max(element.find("{"), 0), fix)
        (warnings if kind == "option" else errors).append((index, problem))
    return errors, warnings


def check_argv(argv: Sequence[str]) -> None:
    """Raise the first problem argv_problems finds (the engine's check before running it)."""
    errors, _warnings = argv_problems(argv)
    if errors:
        raise errors[0][1]
