"""Templates and expressions (sandboxed Jinja2, strict undefined) and injection-proof shell commands.

Every `{{ }}` in a shell command becomes an environment variable (`"$LOOPDSL_1"` outside quotes,
`${LOOPDSL_1}` inside double quotes), so a value is never parsed as shell code. A small shell
lexer finds where each placeholder stands and refuses the places where that cannot work
(single quotes, here-documents, backticks, arithmetic).

Jinja's sandbox stops attribute escapes but not resource bombs (`'x' * 10**9`, huge format
widths, nested loops). `_LoopSandbox` bounds them: amplifying operations are checked before they
allocate, and each render or evaluation has a step and allocation budget.
"""
from __future__ import annotations

import functools
from collections import ChainMap
import json
import re
import string
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, cast

from jinja2 import StrictUndefined, Undefined, nodes
from jinja2 import meta as jinja_meta
from jinja2.environment import Template as JinjaTemplate
from jinja2.exceptions import SecurityError, TemplateSyntaxError, UndefinedError
from jinja2.parser import Parser
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.visitor import NodeTransformer

from .model import DEFAULT_OUTPUT_CAP

# Rule ids carried by TemplateError (lint reports them as `[rule-id]`).
RULE_SYNTAX = "template-syntax"
RULE_SINGLE_QUOTE = "shell-quote-single"
RULE_HEREDOC = "shell-quote-heredoc"
RULE_BACKTICK = "shell-quote-backtick"
RULE_STATEMENT = "shell-statement"
RULE_UNSAFE_RAW = "shell-unsafe-raw"
RULE_ARITHMETIC = "shell-arithmetic"
RULE_ESCAPED = "shell-escaped-placeholder"

MAX_SEQUENCE = DEFAULT_OUTPUT_CAP          # chars of one string / items of one list built in a template
MAX_INT_BITS = 65_536                      # Python refuses to print ints past ~14k bits anyway
MAX_STEPS = 1_000_000                      # loop iterations + calls per render
MAX_WORK = 128 * DEFAULT_OUTPUT_CAP        # chars/items produced, summed over one render
# Linux refuses (E2BIG) one environment string longer than 32 pages, "NAME=value\0" included.
MAX_ENV_STRING = 131_072
ENV_CHUNK_BYTES = 120_000


class TemplateError(Exception):
    """A template, expression or shell command that cannot be compiled."""

    def __init__(self, message: str, rule: str = RULE_SYNTAX, offset: int | None = None,
                 hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.rule = rule
        self.offset = offset
        self.hint = hint


class RenderError(Exception):
    """Rendering or evaluating failed at run time (undefined name, sandbox, type, size)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


# ---------------------------------------------------------------- budgets and size guards

@dataclass
class _Budget:
    steps: int = 0
    work: int = 0


_BUDGET: ContextVar[_Budget | None] = ContextVar("loopdsl_template_budget", default=None)


def _charge(steps: int = 0, work: int = 0) -> None:
    budget = _BUDGET.get()
    if budget is None:          # compile-time constant folding: sizes there come from the source
        return
    budget.steps += steps
    budget.work += work
    if budget.steps > MAX_STEPS:
        raise RenderError(f"template gave up after {MAX_STEPS} loop iterations and calls; "
                          "it is probably looping over far more than intended")
    if budget.work > MAX_WORK:
        raise RenderError(f"template built more than {MAX_WORK} characters of intermediate "
                          "values; shrink the data it works on")


def _charge_size(value: Any) -> None:
    if isinstance(value, (str, bytes, list, tuple, dict)):
        _charge(work=len(value))


def _too_big(what: str, size: int, limit: int = MAX_SEQUENCE, unit: str = "characters or items") -> None:
    if size > limit:
        raise RenderError(f"{what} would make {size:,} {unit}, over the template limit of "
                          f"{limit:,}; work on smaller data")


def _width(value: Any, what: str) -> None:
    if isinstance(value, int) and not isinstance(value, bool):
        _too_big(what, value)


def _check_binop(operator: str, left: Any, right: Any) -> None:
    sized = (str, bytes, list, tuple)
    if operator == "*":
        for seq, times in ((left, right), (right, left)):
            if isinstance(seq, sized) and isinstance(times, int):
                _too_big("repeating a sequence", len(seq) * max(times, 0))
                if isinstance(seq, (list, tuple)):  # repeated references still render in full
                    _too_big("repeating a list", _shallow_text_size(seq) * max(times, 0))
        if isinstance(left, int) and isinstance(right, int):
            _too_big("an integer product", left.bit_length() + right.bit_length(),
                     MAX_INT_BITS, "bits")
    elif operator == "+" and isinstance(left, sized) and isinstance(right, sized):
        _too_big("a concatenation", len(left) + len(right))
    elif operator == "**" and isinstance(left, int) and isinstance(right, int) and right > 0:
        _too_big("a power", max(abs(left).bit_length() - 1, 0) * right, MAX_INT_BITS, "bits")
    elif operator == "%" and isinstance(left, str):
        _check_printf_format(left)


def _shallow_text_size(seq: Iterable[Any]) -> int:
    return sum(len(item) if isinstance(item, (str, bytes, list, tuple, dict)) else 1 for item in seq)


_PRINTF_SPEC = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d+))?")


def _check_printf_format(fmt: str) -> None:
    for match in _PRINTF_SPEC.finditer(fmt):
        for number in match.groups():
            if number == "*":
                raise RenderError("'*' widths are not allowed in % formats in templates; "
                                  "write the width as a number")
            if number:
                _too_big("a % format width", int(number))


def _check_str_format(fmt: str) -> None:
    try:
        fields = list(string.Formatter().parse(fmt))
    except ValueError as exc:
        raise RenderError(f"bad format string {fmt[:60]!r}: {exc}") from None
    for _literal, _name, spec, _conversion in fields:
        if spec and "{" in spec:
            raise RenderError("nested {} inside a format spec is not allowed in templates; "
                              "write the width as a number")
        for number in re.findall(r"\d+", spec or ""):
            _too_big("a format width", int(number))


def _check_method_call(func: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[Any, ...]:
    """Guard the str/bytes/int methods whose result can be far larger than their inputs.
    Returns the arguments to call with."""
    owner = getattr(func, "__self__", None)
    name = getattr(func, "__name__", "")
    if isinstance(owner, (str, bytes)):
        if name in ("center", "ljust", "rjust", "zfill") and args:
            _width(args[0], f"str.{name}() width")
        elif name == "expandtabs":
            size = args[0] if args else kwargs.get("tabsize", 8)
            if isinstance(size, int):
                tabs = owner.count("\t") if isinstance(owner, str) else owner.count(b"\t")
                _too_big("str.expandtabs()", len(owner) + tabs * size)
        elif name == "replace" and len(args) >= 2:
            old, new = args[0], args[1]
            hits = cast(Any, owner).count(old) if type(old) is type(owner) else 0
            if len(args) > 2 and isinstance(args[2], int) and args[2] >= 0:
                hits = min(hits, args[2])
            if type(new) is type(owner):
                _too_big("str.replace()", len(owner) + hits * len(new))
        elif name == "join" and len(args) == 1:
            items = list(args[0])            # a generator would be used up by the estimate
            _too_big("str.join()", _shallow_text_size(items) + len(owner) * len(items))
            return (items,)
        elif name == "translate" and args and isinstance(args[0], Mapping):
            longest = max((len(v) for v in args[0].values() if isinstance(v, str)), default=1)
            _too_big("str.translate()", len(owner) * longest)
    elif isinstance(owner, int) and name == "to_bytes" and args:
        _width(args[0], "int.to_bytes() length")
    return args


# ---------------------------------------------------------------- filters

def _guard_filter(name: str, func: Callable[..., Any], check: Callable[..., None] | None) -> Callable[..., Any]:
    # pass_context/pass_eval_context markers live in the function's __dict__: wraps keeps them.
    passes_arg = getattr(func, "jinja_pass_arg", None) is not None

    @functools.wraps(func)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        if check is not None:
            check(*(args[1:] if passes_arg else args), **kwargs)
        result = func(*args, **kwargs)
        _charge_size(result)
        return result
    return guarded


def _check_center(value: Any, width: Any = 80) -> None:
    _width(width, "center width")


def _check_indent(s: Any, width: Any = 4, *args: Any, **kwargs: Any) -> None:
    lines = str(s).count("\n") + 1
    pad = len(width) if isinstance(width, str) else width
    if isinstance(pad, int):
        _too_big("indent", len(str(s)) + lines * pad)


def _check_batch(value: Any, linecount: Any = 0, *args: Any, **kwargs: Any) -> None:
    _width(linecount, "batch size")


def _check_slice(value: Any, slices: Any = 0, *args: Any, **kwargs: Any) -> None:
    _width(slices, "slice count")


def _check_format(value: Any, *args: Any, **kwargs: Any) -> None:
    _check_printf_format(str(value))


def _check_replace(s: Any, old: Any = "", new: Any = "", count: Any = None) -> None:
    text = str(s)
    hits = text.count(str(old))
    if isinstance(count, int) and count >= 0:
        hits = min(hits, count)
    _too_big("replace", len(text) + hits * len(str(new)))


def _check_join(value: Any, d: Any = "", attribute: Any = None) -> None:
    if isinstance(value, (list, tuple)):
        _too_big("join", _shallow_text_size(value) + len(value) * len(str(d)))


def _check_tojson(value: Any, indent: Any = None) -> None:
    _width(indent, "tojson indent")
    if isinstance(indent, int) and indent > 64:
        raise RenderError("tojson indent above 64 is not allowed")


def _check_sum(iterable: Any, attribute: Any = None, start: Any = 0) -> None:
    if isinstance(start, (str, list, tuple)) and isinstance(iterable, (list, tuple)):
        _too_big("sum of sequences", _shallow_text_size(iterable))


def _fromjson(value: Any) -> Any:
    try:
        return json.loads(value)
    except (TypeError, ValueError) as exc:
        raise RenderError(f"fromjson: not valid JSON ({exc}): {str(value)[:80]!r}") from None


def _unsafe_raw(value: Any) -> Any:
    """Identity. Lint rejects it in shell commands, where a value is never spliced as code."""
    return value


_FILTER_CHECKS: dict[str, Callable[..., None]] = {
    "center": _check_center, "indent": _check_indent, "batch": _check_batch,
    "slice": _check_slice, "format": _check_format, "replace": _check_replace,
    "join": _check_join, "tojson": _check_tojson, "sum": _check_sum,
}


# ---------------------------------------------------------------- the environment

class _LoopSandbox(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def getattr(self, obj: Any, attribute: str) -> Any:
        # Results are mappings: `plan.items` or `x.keys` must mean the key a loop wrote,
        # not the dict method Jinja would find first.
        if isinstance(obj, Mapping) and isinstance(attribute, str):
            try:
                return obj[attribute]
            except (KeyError, TypeError):
                pass
        return super().getattr(obj, attribute)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        _check_binop(operator, left, right)
        result = super().call_binop(context, operator, left, right)
        _charge_size(result)
        return result

    def call(self, context: Any, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        _charge(steps=1)
        args = _check_method_call(obj, args, kwargs)
        result = super().call(context, obj, *args, **kwargs)
        _charge_size(result)
        return result

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return None
        fmt = value.__self__

        def checked(*args: Any, **kwargs: Any) -> str:
            _check_str_format(fmt)
            return wrapped(*args, **kwargs)
        return checked

    # Reached from generated code through nodes.EnvironmentAttribute (see _BoundLoops).
    def loopdsl_iter(self, iterable: Any) -> Iterator[Any]:
        for item in iterable:
            _charge(steps=1)
            yield item

    def loopdsl_concat(self, *parts: Any) -> str:
        texts = [str(part) for part in parts]
        size = sum(map(len, texts))
        _too_big("a ~ concatenation", size)
        _charge(work=size)
        return "".join(texts)


def _finalize(value: Any) -> Any:
    # Every {{ }} output passes here, also inside macros and {% set %} blocks, which buffer
    # their output instead of streaming it.
    if isinstance(value, str):
        _charge(work=len(value))
    return value


@functools.lru_cache(maxsize=1)
def _environment() -> _LoopSandbox:
    env = _LoopSandbox(undefined=StrictUndefined, autoescape=False, keep_trailing_newline=True,
                       finalize=_finalize)
    # lipsum(n) builds n paragraphs and exposes nothing a loop needs.
    env.globals.pop("lipsum", None)
    env.filters["fromjson"] = _fromjson
    env.filters["unsafe_raw"] = _unsafe_raw
    for name, func in list(env.filters.items()):
        env.filters[name] = _guard_filter(name, func, _FILTER_CHECKS.get(name))
    return env


class _BoundLoops(NodeTransformer):
    """Route every for-loop iterable and every `~` through the budgeted helpers."""

    def visit_For(self, node: nodes.For) -> nodes.Node:
        self.generic_visit(node)
        node.iter = _env_call("loopdsl_iter", [cast(nodes.Expr, node.iter)], node.lineno)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        return _env_call("loopdsl_concat", list(node.nodes), node.lineno)


def _env_call(helper: str, args: list[nodes.Expr], lineno: int) -> nodes.Call:
    return nodes.Call(nodes.EnvironmentAttribute(helper, lineno=lineno), args, [], None, None,
                      lineno=lineno)


# ---------------------------------------------------------------- errors

def _line_offset(source: str, lineno: int | None) -> int | None:
    if not lineno:
        return None
    offset = 0
    for _ in range(lineno - 1):
        nl = source.find("\n", offset)
        if nl < 0:
            return offset
        offset = nl + 1
    return offset


def _syntax_error(exc: TemplateSyntaxError, source: str, base: int = 0) -> TemplateError:
    offset = _line_offset(source, exc.lineno)
    return TemplateError(f"template syntax error: {exc.message}", RULE_SYNTAX,
                         None if offset is None else base + offset)


def _render_error(exc: BaseException) -> RenderError:
    if isinstance(exc, RenderError):
        return exc
    if isinstance(exc, SecurityError):
        return RenderError(f"blocked by the template sandbox: {exc}")
    if isinstance(exc, UndefinedError):
        return RenderError(f"undefined: {exc.message}")
    if isinstance(exc, RecursionError):
        return RenderError("template recursed too deeply (a macro calling itself?)")
    if isinstance(exc, MemoryError):
        return RenderError("template ran out of memory")
    return RenderError(f"{type(exc).__name__}: {exc}")


def _guarded(run: Callable[[], Any]) -> Any:
    token = _BUDGET.set(_Budget())
    try:
        return run()
    except Exception as exc:  # noqa: BLE001 - any failure inside a template is the template's
        raise _render_error(exc) from None
    finally:
        _BUDGET.reset(token)


def _reject_undefined(value: Any, depth: int = 0) -> Any:
    if isinstance(value, Undefined):
        value._fail_with_undefined_error()
    if depth < 8:
        if isinstance(value, (list, tuple)):
            for item in value:
                _reject_undefined(item, depth + 1)
        elif isinstance(value, dict):
            for item in value.values():
                _reject_undefined(item, depth + 1)
    return value


# ---------------------------------------------------------------- text

TRUNCATION_MARKER = "\n[... truncated by loopdsl at {cap} bytes]"


def truncate_text(text: str, cap: int = DEFAULT_OUTPUT_CAP) -> str:
    """Cut `text` to at most `cap` UTF-8 bytes (never inside a character) and mark the cut."""
    if len(text) * 4 <= cap:
        return text
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= cap:
        return text
    kept = data[:cap].decode("utf-8", "ignore")
    return kept + TRUNCATION_MARKER.format(cap=cap)


def to_text(value: Any) -> str:
    """How a value becomes text in a command or environment variable."""
    if isinstance(value, str):
        return str(value)
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=_json_default)
    return str(value)


def _json_default(value: Any) -> Any:
    if isinstance(value, (set, frozenset)):
        return list(value)
    return str(value)


# ---------------------------------------------------------------- expressions and templates

def _parse_expression(source: str) -> nodes.Expr:
    env = _environment()
    try:
        parser = Parser(env, source, state="variable")
        expr = parser.parse_expression()
        if not parser.stream.eos:
            raise TemplateSyntaxError(f"unexpected {parser.stream.current.value!r} after the "
                                      "expression", parser.stream.current.lineno)
    except TemplateSyntaxError as exc:
        raise _syntax_error(exc, source) from None
    return expr


def _compile_tree(tree: nodes.Template, source: str) -> JinjaTemplate:
    env = _environment()
    tree = _BoundLoops().visit(tree)
    tree.set_environment(env)
    try:
        return env.from_string(tree)
    except TemplateSyntaxError as exc:   # e.g. an unknown filter name
        raise _syntax_error(exc, source) from None


# A key no template can name (Jinja names cannot hold NUL): marks a context dict that
# already carries the environment's globals, so expressions need not layer them on.
GLOBALS_INSTALLED = "\x00globals"


def install_globals(context: dict[str, Any]) -> None:
    """Put the sandbox's globals (range, dict, namespace ...) into a long-lived context
    dict once, so each expression evaluated on it skips a per-call layering."""
    for name, value in _environment().globals.items():
        context.setdefault(name, value)
    context[GLOBALS_INSTALLED] = True


class Expression:
    """A compiled Jinja expression (`when`, `expr`, `set` values, `for_each`)."""

    def __init__(self, source: str) -> None:
        self.source = source
        expr = _parse_expression(source)
        body = [nodes.Assign(nodes.Name("result", "store", lineno=1), expr, lineno=1)]
        self._template = _compile_tree(nodes.Template(body, lineno=1), source)
        self._cached: Any = None

    def __call__(self, context: Mapping[str, Any]) -> Any:
        def run() -> Any:
            ctx = self._context_for(context)
            for _ in self._template.root_render_func(ctx):
                pass
            result = ctx.vars.pop("result")
            if isinstance(result, Iterator):   # a lazy map/select: evaluate it inside the guard
                result = list(result)
            return _reject_undefined(result)
        return _guarded(run)

    def _context_for(self, context: Mapping[str, Any]) -> Any:
        """A Jinja context over `context` without copying it (shared=True).

        An engine evaluates its expressions over one long-lived dict that already holds
        the globals (install_globals): the Jinja context built over that dict is kept and
        reused while the dict is the same object, since an expression only ever writes its
        own `result`, which is taken out after each call. Other mappings get a fresh
        context with the globals layered beneath."""
        if context.get(GLOBALS_INSTALLED) is not True:
            scope = ChainMap(context, self._template.globals)  # type: ignore[arg-type]
            return self._template.new_context(scope, shared=True)  # type: ignore[arg-type]
        cached = self._cached
        if cached is not None and cached.parent is context:
            return cached
        self._cached = self._template.new_context(context, shared=True)  # type: ignore[arg-type]
        return self._cached

    def __repr__(self) -> str:
        return f"Expression({self.source!r})"


class Template:
    """A compiled Jinja template (prompts, outputs, messages, cwd, argv elements)."""

    def __init__(self, source: str) -> None:
        self.source = source
        env = _environment()
        try:
            tree = env.parse(source)
        except TemplateSyntaxError as exc:
            raise _syntax_error(exc, source) from None
        self._template = _compile_tree(tree, source)

    def render(self, context: Mapping[str, Any], cap: int = DEFAULT_OUTPUT_CAP) -> str:
        def run() -> str:
            pieces: list[str] = []
            size = 0
            # Streamed so that a template producing gigabytes stops at the cap.
            for piece in self._template.generate(dict(context)):
                pieces.append(piece)
                size += len(piece.encode("utf-8", "surrogatepass"))
                if size > cap:
                    break
            return truncate_text("".join(pieces), cap)
        return _guarded(run)

    def __repr__(self) -> str:
        return f"Template({self.source!r})"


def compile_expression(source: str) -> Expression:
    return Expression(source)


def compile_template(source: str) -> Template:
    return Template(source)


def variables(source: str, *, expression: bool = False) -> set[str]:
    """Root names that a template (or an expression) reads from its context."""
    if expression:
        tree = nodes.Template([nodes.Output([_parse_expression(source)], lineno=1)], lineno=1)
    else:
        try:
            tree = _environment().parse(source)
        except TemplateSyntaxError as exc:
            raise _syntax_error(exc, source) from None
    tree.set_environment(_environment())
    return set(jinja_meta.find_undeclared_variables(tree))



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
