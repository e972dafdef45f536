"""The sandboxed Jinja environment that every template and expression runs in, and its limits.

Jinja's sandbox stops attribute escapes but not resource bombs (`'x' * 10**9`, huge format
widths, nested loops). `_LoopSandbox` bounds them: amplifying operations are checked before they
allocate, and each render or evaluation has a step and allocation budget.

The error classes live here, at the bottom layer, so that templates.py and shell_template.py
can both use them without importing each other; templates.py re-exports them.
"""
from __future__ import annotations

import functools
import json
import re
import string
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, cast

from jinja2 import StrictUndefined, Undefined, nodes
from jinja2.utils import Namespace
from jinja2.exceptions import SecurityError, UndefinedError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.visitor import NodeTransformer

from . import bounded_json
from .model import DEFAULT_OUTPUT_CAP

# Rule ids carried by TemplateError (lint reports them as `[rule-id]`); the shell ones are in
# shell_template.py.
RULE_SYNTAX = "template-syntax"

MAX_SEQUENCE = DEFAULT_OUTPUT_CAP          # chars of one string / items of one list built in a template
# ~1,000 decimal digits, as for a reply's JSON: Python refuses to print an int past 4,300
# digits, so a bigger one would break the store's JSON encoding.
MAX_INT_BITS = 3_300
MAX_STEPS = 1_000_000                      # loop iterations + calls per render
MAX_WORK = 128 * DEFAULT_OUTPUT_CAP        # chars/items produced, summed over one render
# A list, tuple or dict a template builds, measured as printed in full: a part repeated by
# reference (`[x] * 10`) prints once per reference, so `[[[x] * 10] * 10] * 10` is 1,000 x's.
MAX_BUILT = 16 * DEFAULT_OUTPUT_CAP
MAX_BUILT_DEPTH = 2 * bounded_json.MAX_DEPTH  # deep enough to wrap a reply's JSON, far from recursion limits


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


def _check_built(value: Any, what: str, times: int = 1) -> Any:
    """Refuse a container that would print past MAX_BUILT characters (`times` copies of it)
    or nest past MAX_BUILT_DEPTH; charge its printed size to the render's work."""
    if isinstance(value, (list, tuple, dict, Namespace)):
        size, depth, walked = bounded_json.measure(value, MAX_BUILT // max(times, 1), MAX_BUILT_DEPTH,
                                                   _namespace_attrs)
        _charge(steps=walked)
        if depth > MAX_BUILT_DEPTH:
            raise RenderError(f"{what} would nest more than {MAX_BUILT_DEPTH} levels deep; "
                              "build flatter values")
        _too_big(what, size * times, MAX_BUILT, "characters when printed")
        _charge(work=size * times)
    return value


def _namespace_attrs(value: Any) -> Any:
    """A namespace prints as the dict of its attributes: measure that."""
    if isinstance(value, Namespace):
        return object.__getattribute__(value, "_Namespace__attrs")
    return value


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
                    _check_built(seq, "repeating a list", max(times, 0))
        if isinstance(left, int) and isinstance(right, int):
            _too_big("an integer product", left.bit_length() + right.bit_length(),
                     MAX_INT_BITS, "bits")
    elif operator == "+" and isinstance(left, sized) and isinstance(right, sized):
        _too_big("a concatenation", len(left) + len(right))
        if isinstance(left, (list, tuple)) and isinstance(right, (list, tuple)):
            _check_built([left, right], "a concatenation")
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
    if isinstance(indent, int) and indent > 0:
        _check_indented(value, indent, "tojson with indent")


def _check_pprint(value: Any, *args: Any, **kwargs: Any) -> None:
    _check_indented(value, 1, "pprint")


def _check_indented(value: Any, indent: int, what: str) -> None:
    """Indented output repeats `indent` spaces per nesting level on every line: up to one
    line per item, and an item takes at least ~3 printed characters."""
    size, depth, walked = bounded_json.measure(value, MAX_BUILT, MAX_BUILT_DEPTH, _namespace_attrs)
    _charge(steps=walked)
    _too_big(what, size + (size // 3 + 1) * indent * depth, MAX_BUILT, "characters when printed")


def _check_sum(iterable: Any, attribute: Any = None, start: Any = 0) -> None:
    if isinstance(start, (str, list, tuple)) and isinstance(iterable, (list, tuple)):
        _too_big("sum of sequences", _shallow_text_size(iterable))


def _fromjson(value: Any) -> Any:
    try:
        return bounded_json.loads(value)
    except (TypeError, ValueError) as exc:
        raise RenderError(f"fromjson: not valid JSON ({exc}): {str(value)[:80]!r}") from None


def _unsafe_raw(value: Any) -> Any:
    """Identity. Lint rejects it in shell commands, where a value is never spliced as code."""
    return value


_FILTER_CHECKS: dict[str, Callable[..., None]] = {
    "center": _check_center, "indent": _check_indent, "batch": _check_batch,
    "slice": _check_slice, "format": _check_format, "replace": _check_replace,
    "join": _check_join, "tojson": _check_tojson, "sum": _check_sum, "pprint": _check_pprint,
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
        # dict(a=x, b=x) and namespace(a=x, b=x) share parts like [x] * 2 does.
        _check_built(result, "a call's result")
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

    def loopdsl_built(self, value: Any) -> Any:
        return _check_built(value, "a list or dict literal")

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
    """Route every for-loop iterable, every `~` and every list, tuple and dict literal through
    the budgeted helpers."""

    def visit_For(self, node: nodes.For) -> nodes.Node:
        self.generic_visit(node)
        node.iter = _env_call("loopdsl_iter", [cast(nodes.Expr, node.iter)], node.lineno)
        return node

    def visit_List(self, node: nodes.List) -> nodes.Node:
        self.generic_visit(node)
        return _env_call("loopdsl_built", [node], node.lineno)

    def visit_Dict(self, node: nodes.Dict) -> nodes.Node:
        self.generic_visit(node)
        return _env_call("loopdsl_built", [node], node.lineno)

    def visit_Tuple(self, node: nodes.Tuple) -> nodes.Node:
        self.generic_visit(node)
        if node.ctx != "load":  # an assignment target (`{% set a, b = ... %}`), not a value
            return node
        return _env_call("loopdsl_built", [node], node.lineno)

    def visit_Assign(self, node: nodes.Assign) -> nodes.Node:
        self.generic_visit(node)
        if isinstance(node.target, nodes.NSRef):  # `{% set ns.a = x %}` grows a namespace in place
            node.node = _env_call("loopdsl_built", [node.node], node.lineno)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        return _env_call("loopdsl_concat", list(node.nodes), node.lineno)


def _env_call(helper: str, args: list[nodes.Expr], lineno: int) -> nodes.Call:
    return nodes.Call(nodes.EnvironmentAttribute(helper, lineno=lineno), args, [], None, None,
                      lineno=lineno)



# ---------------------------------------------------------------- run-time failures

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
