"""The sandboxed Jinja environment that every template and expression runs in, and its limits.

Jinja's sandbox stops attribute escapes but not resource bombs (`'x' * 10**9`, huge format
widths, nested loops). `_LoopSandbox` bounds them: amplifying operations are checked before they
allocate, and each render or evaluation has a step and allocation budget.

The budget and size checks are in sandbox_limits.py, the guarded filters in
sandbox_filters.py, the error classes in template_errors.py; the names other modules import
from here (the errors, the limits) are re-exported below.
"""
from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from typing import Any, cast

from jinja2 import StrictUndefined, Undefined, nodes
from jinja2.exceptions import SecurityError, UndefinedError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.visitor import NodeTransformer

from .sandbox_filters import _FILTER_CHECKS, _fromjson, _guard_filter, _unsafe_raw
from .sandbox_limits import (
    _BUDGET,
    MAX_BUILT,
    MAX_BUILT_DEPTH,
    MAX_INT_BITS,
    MAX_SEQUENCE,
    MAX_STEPS,
    MAX_WORK,
    _Budget,
    _charge,
    _charge_size,
    _check_binop,
    _check_built,
    _check_method_call,
    _check_str_format,
    _too_big,
)
from .template_errors import RULE_SYNTAX, RenderError, TemplateError

__all__ = [
    "MAX_BUILT", "MAX_BUILT_DEPTH", "MAX_INT_BITS", "MAX_SEQUENCE", "MAX_STEPS", "MAX_WORK", "RULE_SYNTAX",
    "RenderError", "TemplateError",
]


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
            _check_str_format(fmt, [*args, *kwargs.values()])
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


# What every value a `{{ }}` prints becomes, while set (`values_as_data`); None: itself.
_VALUE_TEXT: ContextVar[Callable[[str], str] | None] = ContextVar("loopdsl_value_text", default=None)


@contextlib.contextmanager
def values_as_data(transform: Callable[[str], str]) -> Iterator[None]:
    """Render with every printed value (never the template's own text) passed through
    `transform`: `publish:` uses it to keep a model's words from mentioning or closing."""
    token = _VALUE_TEXT.set(transform)
    try:
        yield
    finally:
        _VALUE_TEXT.reset(token)


def _finalize(value: Any) -> Any:
    # Every {{ }} output passes here, also inside macros and {% set %} blocks, which buffer
    # their output instead of streaming it. A constant (`{{ "x" }}`) is folded when the
    # template compiles, outside any `values_as_data`: it is the template's own text.
    if isinstance(value, str):
        _charge(work=len(value))
    elif isinstance(value, (list, tuple, dict)):
        # A misspelt name inside a printed list or mapping (`[ask.json.nope]`, a map over a
        # missing attribute) printed the word "Undefined": an error, as it is printed alone.
        _reject_undefined(value)
    transform = _VALUE_TEXT.get()
    if transform is not None and value is not None:
        return transform(value if isinstance(value, str) else str(value))
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
