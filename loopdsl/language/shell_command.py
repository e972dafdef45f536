"""Injection-proof shell commands: placeholders become quoted environment variables.

Every `{{ }}` in a shell command becomes an environment variable (`"$LOOPDSL_1"` outside quotes,
`${LOOPDSL_1}` inside double quotes), so a value is never parsed as shell code. Where bash
would still evaluate the value (arithmetic, variable names, `eval`, `bash -c`), quoting is not
enough: shell_places.py reads the command with a real bash parser and only the places on its
allow-list are accepted. Lint and the engine both compile commands here, so they agree.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from jinja2 import nodes
from jinja2.exceptions import TemplateSyntaxError

from .sandbox import RULE_SYNTAX, RenderError, TemplateError, _environment, _render_error
from .shell_places import (
    NO_FACTS,
    RULE_ARITHMETIC,
    RULE_BACKTICK,
    RULE_CODE,
    RULE_COMMAND,
    RULE_ESCAPED,
    RULE_HEREDOC,
    RULE_NAME,
    RULE_OPTION,
    RULE_PLACE,
    RULE_SHELL_SYNTAX,
    RULE_SINGLE_QUOTE,
    RULE_STATEMENT,
    RULE_UNSAFE_RAW,
    InputFacts,
    Placeholder,
    argv_problems,
    check_argv,
    check_env,
    env_problems,
    placement_problems,
    with_hint,
)

if TYPE_CHECKING:
    from .templates import Expression


# Linux refuses (E2BIG) one environment string longer than 32 pages, "NAME=value\0" included.
MAX_ENV_STRING = 131_072
ENV_CHUNK_BYTES = 120_000


# ---------------------------------------------------------------- shell commands

_RAW_BEGIN = re.compile(r"\{%[-+]?\s*raw\s*[-+]?%\}")
_RAW_END = re.compile(r"\{%[-+]?\s*endraw\s*[-+]?%\}")
_INTEGER_TEXT = re.compile(r"[+-]?[0-9]{1,30}")


def _source_pos(source: str, start: int, normalized_length: int) -> int:
    """Jinja's lexer turns \\r\\n into \\n: map a length of its output back into `source`."""
    if "\r" not in source:
        return start + normalized_length
    pos = start
    for _ in range(normalized_length):
        pos += 2 if source.startswith("\r\n", pos) else 1
    return pos


def _placeholder_at(source: str, start: int) -> tuple[Placeholder, int]:
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
                return Placeholder(start, source[begin:inner_end], begin), end
            consumed += len(value)
    except TemplateSyntaxError as exc:
        raise TemplateError(f"template syntax error: {exc.message}", RULE_SYNTAX, start) from None
    raise TemplateError("'{{' is never closed by '}}'", RULE_SYNTAX, start)


def _split_jinja(source: str, errors: list[TemplateError]) -> list[tuple[int, Any]]:
    """The command as (offset, char | Placeholder) items: comments dropped, raw blocks kept as text."""
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
            errors.append(with_hint(
                f"{source[nxt:pos][:60]} is not allowed in a shell command: a command is one "
                "fixed script whose values arrive as quoted variables",
                RULE_STATEMENT, nxt,
                "compute the value in a `set` state or inside {{ }} (e.g. {{ a if ok else b }}), "
                "or use `argv:`; for a literal {% write {{ '{%' }}"))
    return items


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


def _script(items: list[tuple[int, Any]], places: list[Any]) -> str:
    out: list[str] = []
    number = 0
    for _offset, item in items:
        if not isinstance(item, Placeholder):
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
    return _analyze(source, facts, build=True)


def shell_problems(source: str, facts: InputFacts = NO_FACTS) -> tuple[list[TemplateError], list[TemplateError]]:
    """analyze_shell's errors and warnings, without building the command (for lint)."""
    _command, errors, warnings = _analyze(source, facts, build=False)
    return errors, warnings


def _analyze(source: str, facts: InputFacts, build: bool
             ) -> tuple[ShellCommand | None, list[TemplateError], list[TemplateError]]:
    errors: list[TemplateError] = []
    try:
        items = _split_jinja(source, errors)
    except TemplateError as exc:
        return None, [*errors, exc], []
    placeholders = [item for _, item in items if isinstance(item, Placeholder)]
    places, placement_errors, warnings = placement_problems(items, placeholders, facts)
    errors.extend(placement_errors)
    expressions = []
    for placeholder in placeholders:
        compiled = _compile_placeholder(placeholder, errors, build)
        if compiled is not None:
            expressions.append(compiled)
    errors.sort(key=lambda e: (e.offset is None, e.offset or 0))
    if errors or not build:
        return None, errors, warnings
    command = ShellCommand(source, _script(items, places), tuple(expressions),
                           tuple(check for _place, check in places))
    return command, [], warnings


def _compile_placeholder(placeholder: Placeholder, errors: list[TemplateError], build: bool) -> Expression | None:
    """The placeholder's compiled expression (None when it has errors, or when not `build`:
    then it is only checked)."""
    # Imported here: templates.py imports this module, so a module-level import would cycle.
    from .templates import Expression, _parse_expression, check_expression

    try:
        tree = _parse_expression(placeholder.expression)
        # Looked for before compiling: compiling rewrites parts of the tree.
        unsafe = any(f.name == "unsafe_raw" for f in [tree, *tree.find_all(nodes.Filter)]
                     if isinstance(f, nodes.Filter))
        expression = Expression(placeholder.expression) if build else None
        if not build:
            check_expression(placeholder.expression, tree)
    except TemplateError as exc:
        errors.append(TemplateError(exc.message, exc.rule, placeholder.offset))
        return None
    if unsafe:
        at = placeholder.expression.find("unsafe_raw")
        errors.append(with_hint(
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
