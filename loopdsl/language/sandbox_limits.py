"""The limits of one render: a step and allocation budget, and size checks that run before an
amplifying operation (`'x' * 10**9`, a huge format width, a format string's padding) allocates.

Jinja's sandbox stops attribute escapes but not resource bombs; sandbox.py calls these checks
from its operators, calls and literals, sandbox_filters.py from the filters.
"""
from __future__ import annotations

import re
import string
from collections.abc import Iterable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, cast

from jinja2.utils import Namespace

from . import bounded_json
from .model import DEFAULT_OUTPUT_CAP
from .template_errors import RenderError

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
        values = right.values() if isinstance(right, Mapping) else right if isinstance(right, tuple) else (right,)
        _check_printf_format(left, list(values))


def _shallow_text_size(seq: Iterable[Any]) -> int:
    return sum(len(item) if isinstance(item, (str, bytes, list, tuple, dict)) else 1 for item in seq)


_PRINTF_SPEC = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d+))?")


def _check_printf_format(fmt: str, values: Sequence[Any] = ()) -> None:
    widest = 0
    specs = 0
    for match in _PRINTF_SPEC.finditer(fmt):
        specs += 1
        for number in match.groups():
            if number == "*":
                raise RenderError("'*' widths are not allowed in % formats in templates; "
                                  "write the width as a number")
            if number:
                _too_big("a % format width", int(number))
                widest = max(widest, int(number))
    _check_output(fmt, specs, widest, values, "a % format")


def _check_str_format(fmt: str, values: Sequence[Any] = ()) -> None:
    try:
        fields = list(string.Formatter().parse(fmt))
    except ValueError as exc:
        raise RenderError(f"bad format string {fmt[:60]!r}: {exc}") from None
    widest = 0
    for _literal, _name, spec, _conversion in fields:
        if spec and "{" in spec:
            raise RenderError("nested {} inside a format spec is not allowed in templates; "
                              "write the width as a number")
        for number in re.findall(r"\d+", spec or ""):
            _too_big("a format width", int(number))
            widest = max(widest, int(number))
    _check_output(fmt, sum(1 for field in fields if field[1] is not None), widest, values, "str.format()")


def _check_output(fmt: str, fields: int, widest: int, values: Sequence[Any], what: str) -> None:
    """Refuse a format whose output may pass the limit before it is made: each field may print
    the largest value given (`'{0}' * 4000` of a 1 MB value allocated gigabytes before the size
    check after it)."""
    largest = max((_printed_size(value) for value in values), default=0)
    _too_big(what, len(fmt) + fields * max(largest, widest), MAX_BUILT)


def _printed_size(value: Any) -> int:
    if isinstance(value, (str, bytes)):
        return len(value)
    if isinstance(value, (list, tuple, dict, Namespace)):
        return bounded_json.measure(value, MAX_SEQUENCE, MAX_BUILT_DEPTH, _namespace_attrs)[0]
    return len(repr(value)) if isinstance(value, (int, float, bool)) or value is None else 64


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
