"""Injection-proof shell commands: the shell lexer and placeholder analysis behind ShellCommand.

Every `{{ }}` in a shell command becomes an environment variable (`"$LOOPDSL_1"` outside quotes,
`${LOOPDSL_1}` inside double quotes), so a value is never parsed as shell code. A small shell
lexer finds where each placeholder stands and refuses the places where that cannot work
(single quotes, here-documents, backticks, arithmetic).
"""
from __future__ import annotations

import re
from collections.abc import Mapping
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

# Linux refuses (E2BIG) one environment string longer than 32 pages, "NAME=value\0" included.
MAX_ENV_STRING = 131_072
ENV_CHUNK_BYTES = 120_000


# ---------------------------------------------------------------- shell commands

_RAW_BEGIN = re.compile(r"\{%[-+]?\s*raw\s*[-+]?%\}")
_RAW_END = re.compile(r"\{%[-+]?\s*endraw\s*[-+]?%\}")
_META = set(" \t\n;&|()<>")


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


@dataclass
class _Frame:
    kind: str            # top cmd dq sq ansi bq param arith
    depth: int = 0
    in_dq: bool = False


class _ShellScanner:
    """Walks the command like bash's lexer does, far enough to know each placeholder's quoting."""

    def __init__(self, items: list[tuple[int, Any]], source: str) -> None:
        self.items, self.source = items, source
        self.out: list[str] = []
        self.errors: list[TemplateError] = []
        self.expressions: list[str] = []
        self.stack = [_Frame("top")]
        self.heredocs: list[tuple[str, bool, int]] = []   # delimiter, strip tabs, offset
        self.k = 0
        self.escaped = False

    def char(self, j: int) -> str | None:
        if j < len(self.items) and isinstance(self.items[j][1], str):
            return self.items[j][1]
        return None

    def emit(self, count: int) -> None:
        for _ in range(count):
            item = self.items[self.k][1]
            self.out.append(item if isinstance(item, str) else "")
            self.k += 1

    def run(self) -> None:
        while self.k < len(self.items):
            item = self.items[self.k][1]
            if isinstance(item, _Placeholder):
                self.placeholder(item)
                self.k += 1
            else:
                self.step(item)
            self.escaped = False if not isinstance(item, str) or item != "\\" else self.escaped

    def error(self, rule: str, placeholder: _Placeholder, what: str, hint: str) -> None:
        shown = f"{{{{ {placeholder.expression.strip()} }}}}"
        self.errors.append(TemplateError(f"{shown} {what}; {hint.format(p=shown)}", rule,
                                         placeholder.offset, hint.format(p=shown)))

    def placeholder(self, p: _Placeholder, in_heredoc: bool = False) -> None:
        kinds = [frame.kind for frame in self.stack]
        before = self.char(self.k - 1)
        if in_heredoc:
            self.error(RULE_HEREDOC, p, "is inside a here-document, where a value is spliced into "
                       "the text", "pipe it in instead: printf '%s\\n' \"{p}\" | cmd, or use a "
                       "here-string: cmd <<< \"{p}\"")
        elif self.escaped:
            self.error(RULE_ESCAPED, p, "follows a backslash, which would escape the quoting "
                       "loopdsl puts around the value", "remove the backslash")
        elif before == "$" and self.char(self.k - 2) != "\\":
            self.error(RULE_ESCAPED, p, "follows a '$'", "remove the '$': the placeholder "
                       "already stands for the value")
        elif kinds[-1] in ("sq", "ansi"):
            self.error(RULE_SINGLE_QUOTE, p, "is inside single quotes, where the shell never "
                       "expands anything", "move it outside the single quotes: printf %s \"{p}\"")
        elif "bq" in kinds:
            self.error(RULE_BACKTICK, p, "is inside backticks", "use $( ) instead of "
                       "backticks: $(cmd \"{p}\")")
        elif "arith" in kinds:
            self.error(RULE_ARITHMETIC, p, "is inside an arithmetic expression, where bash "
                       "evaluates the value as code (a[$(cmd)] runs cmd)", "do the arithmetic "
                       "in the template: {{{{ (n | int) + 1 }}}}")
        self.expressions.append(p.expression)
        number = len(self.expressions)
        top = self.stack[-1]
        if top.kind == "dq" or (top.kind == "param" and top.in_dq):
            self.out.append(f"${{LOOPDSL_{number}}}")
        else:
            self.out.append(f'"$LOOPDSL_{number}"')

    def push(self, frame: _Frame, width: int) -> None:
        self.stack.append(frame)
        self.emit(width)

    def pop(self, width: int = 1) -> None:
        if len(self.stack) > 1:
            self.stack.pop()
        self.emit(width)

    def expansion(self, in_dq: bool) -> bool:
        """At a '$': enter $( ), $(( )), ${ }, $' ' or $" " if one starts here."""
        after, third = self.char(self.k + 1), self.char(self.k + 2)
        if after == "(" and third == "(":
            self.push(_Frame("arith"), 3)
        elif after == "(":
            self.push(_Frame("cmd"), 2)
        elif after == "{":
            self.push(_Frame("param", in_dq=in_dq), 2)
        elif after == "'" and not in_dq:
            self.push(_Frame("ansi"), 2)
        elif after == '"' and not in_dq:
            self.push(_Frame("dq"), 2)
        else:
            return False
        return True

    def backslash(self, escapable: str | None) -> None:
        nxt = self.char(self.k + 1)
        if nxt is None and self.k + 1 < len(self.items):
            self.emit(1)
            self.escaped = True      # the placeholder handler reads this on the next item
            return
        self.emit(2 if nxt is not None and (escapable is None or nxt in escapable) else 1)

    def step(self, c: str) -> None:
        frame = self.stack[-1]
        kind = frame.kind
        if kind in ("sq", "ansi"):
            if c == "\\" and kind == "ansi":
                self.backslash(None)
            else:
                self.pop() if c == "'" else self.emit(1)
        elif kind == "bq":
            if c == "\\":
                self.backslash(None)
            else:
                self.pop() if c == "`" else self.emit(1)
        elif kind == "dq":
            if c == "\\":
                self.backslash('$`"\\\n')
            elif c == '"':
                self.pop()
            elif c == "`":
                self.push(_Frame("bq"), 1)
            elif not (c == "$" and self.expansion(in_dq=True)):
                self.emit(1)
        else:
            self.unquoted(c, frame)

    def unquoted(self, c: str, frame: _Frame) -> None:
        """top level, $( ), ${ } and $(( )): quotes open here, words and comments start here."""
        before = self.char(self.k - 1)
        word_start = self.k == 0 or (before is not None and before in _META)
        if c == "\\":
            self.backslash(None)
        elif c == "'" and not (frame.kind == "param" and frame.in_dq):
            self.push(_Frame("sq"), 1)
        elif c == '"':
            self.push(_Frame("dq"), 1)
        elif c == "`":
            self.push(_Frame("bq"), 1)
        elif c == "$" and self.expansion(in_dq=frame.kind == "param" and frame.in_dq):
            pass
        elif frame.kind == "param" and c in "{}":
            if c == "}" and frame.depth == 0:
                self.pop()
            else:
                frame.depth += 1 if c == "{" else -1
                self.emit(1)
        elif frame.kind in ("cmd", "arith") and c == ")":
            if frame.depth > 0:
                frame.depth -= 1
                self.emit(1)
            elif frame.kind == "arith" and self.char(self.k + 1) == ")":
                self.pop(2)
            else:
                self.pop()
        elif c == "(":
            if frame.kind == "top" and word_start and self.char(self.k + 1) == "(":
                self.push(_Frame("arith"), 2)
            else:
                frame.depth += frame.kind in ("cmd", "arith")
                self.emit(1)
        elif frame.kind == "arith" or frame.kind == "param":
            self.emit(1)
        elif c == "#" and word_start:
            while self.k < len(self.items) and self.items[self.k][1] != "\n":
                item = self.items[self.k][1]
                if isinstance(item, _Placeholder):
                    self.placeholder(item)
                    self.k += 1
                else:
                    self.emit(1)
        elif c == "<" and self.char(self.k + 1) == "<":
            if self.char(self.k + 2) == "<":
                self.emit(3)
            else:
                self.heredoc_operator()
        elif c == "\n" and self.heredocs:
            self.emit(1)
            self.heredoc_bodies()
        else:
            self.emit(1)

    def heredoc_operator(self) -> None:
        start = self.items[self.k][0]
        self.emit(2)
        strip_tabs = self.char(self.k) == "-"
        if strip_tabs:
            self.emit(1)
        while self.char(self.k) in (" ", "\t"):
            self.emit(1)
        word: list[str] = []
        quote: str | None = None
        while self.k < len(self.items):
            item = self.items[self.k][1]
            if isinstance(item, _Placeholder):
                self.placeholder(item, in_heredoc=True)
                self.k += 1
                continue
            if quote is None and (item in _META):
                break
            if quote is None and item in ("'", '"'):
                quote = item
            elif item == quote:
                quote = None
            elif item == "\\" and quote != "'" and self.char(self.k + 1) is not None:
                self.emit(1)
                word.append(self.items[self.k][1])
            else:
                word.append(item)
            self.emit(1)
        self.heredocs.append(("".join(word), strip_tabs, start))

    def heredoc_bodies(self) -> None:
        for delimiter, strip_tabs, _start in self.heredocs:
            while self.k < len(self.items):
                line: list[str] = []
                while self.k < len(self.items) and self.items[self.k][1] != "\n":
                    item = self.items[self.k][1]
                    if isinstance(item, _Placeholder):
                        self.placeholder(item, in_heredoc=True)
                        line.append("\0")      # a line holding a placeholder never ends the body
                        self.k += 1
                    else:
                        line.append(item)
                        self.emit(1)
                if self.k < len(self.items):
                    self.emit(1)                # the newline
                text = "".join(line)
                if (text.lstrip("\t") if strip_tabs else text) == delimiter:
                    break
        self.heredocs = []


class ShellCommand:
    """A shell command whose placeholders reach bash only as environment variables."""

    def __init__(self, source: str, script: str, placeholders: tuple[Expression, ...]) -> None:
        self.source = source
        self.script = script
        self.placeholders = placeholders

    def _values(self, context: Mapping[str, Any]) -> list[str]:
        # Imported here: templates.py imports this module, so a module-level import would cycle.
        from .templates import to_text, truncate_text

        values = []
        for expression in self.placeholders:
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


def check_shell(source: str) -> tuple[ShellCommand | None, list[TemplateError]]:
    """Compile a shell command, collecting every problem (for lint) instead of the first."""
    # Imported here: templates.py imports this module, so a module-level import would cycle.
    from .templates import _parse_expression, compile_expression

    errors: list[TemplateError] = []
    try:
        items = _split_jinja(source, errors)
    except TemplateError as exc:
        return None, [*errors, exc]
    scanner = _ShellScanner(items, source)
    scanner.run()
    errors.extend(scanner.errors)
    placeholders = [item for _, item in items if isinstance(item, _Placeholder)]
    expressions = []
    for placeholder in placeholders:
        try:
            expression = compile_expression(placeholder.expression)
        except TemplateError as exc:
            errors.append(TemplateError(exc.message, exc.rule, placeholder.offset))
            continue
        tree = _parse_expression(placeholder.expression)
        filters = [tree, *tree.find_all(nodes.Filter)]   # find_all skips the root itself
        if any(isinstance(f, nodes.Filter) and f.name == "unsafe_raw" for f in filters):
            at = placeholder.expression.find("unsafe_raw")
            errors.append(_with_hint(
                "unsafe_raw is not allowed in a shell command: every placeholder reaches the "
                "command as one quoted value, never as shell code", RULE_UNSAFE_RAW,
                placeholder.expression_offset + max(at, 0),
                "to run generated code, write it to a file in an earlier step and run the file"))
        expressions.append(expression)
    errors.sort(key=lambda e: (e.offset is None, e.offset or 0))
    if errors:
        return None, errors
    return ShellCommand(source, "".join(scanner.out), tuple(expressions)), []


def compile_shell(source: str) -> ShellCommand:
    command, errors = check_shell(source)
    if errors:
        raise errors[0]
    assert command is not None
    return command
