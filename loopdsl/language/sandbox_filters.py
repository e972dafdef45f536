"""Jinja's built-in filters, each wrapped to check its arguments against the render's limits
before it runs and to charge what it returns (sandbox_limits.py), plus loopdsl's own filters."""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from . import bounded_json
from .sandbox_limits import (
    MAX_BUILT,
    MAX_BUILT_DEPTH,
    _charge,
    _charge_size,
    _check_printf_format,
    _namespace_attrs,
    _shallow_text_size,
    _too_big,
    _width,
)
from .template_errors import RenderError

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
    _check_printf_format(str(value), [*args, *kwargs.values()])


def _check_replace(s: Any, old: Any = "", new: Any = "", count: Any = None) -> None:
    text = str(s)
    hits = text.count(str(old))
    if isinstance(count, int) and count >= 0:
        hits = min(hits, count)
    _too_big("replace", len(text) + hits * len(str(new)))


def _check_join(value: Any, d: Any = "", attribute: Any = None) -> None:
    if isinstance(value, (list, tuple, str)):  # a string is joined character by character
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


def _check_wordwrap(value: Any, width: Any = 79, *args: Any, **kwargs: Any) -> None:
    # Wrapping costs in lines made: a 1 MB value at width 1 took ~14 CPU-s that the render's
    # budget never counted. A line costs about as much as four loop iterations.
    lines = len(str(value)) // max(width if isinstance(width, int) and not isinstance(width, bool) else 79, 1)
    _charge(steps=4 * (lines + 1))


_FILTER_CHECKS: dict[str, Callable[..., None]] = {
    "center": _check_center, "indent": _check_indent, "batch": _check_batch,
    "slice": _check_slice, "format": _check_format, "replace": _check_replace,
    "join": _check_join, "tojson": _check_tojson, "sum": _check_sum, "pprint": _check_pprint,
    "wordwrap": _check_wordwrap,
}
