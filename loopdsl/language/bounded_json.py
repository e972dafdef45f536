"""Parsing JSON that comes from outside (model replies, command output, inputs, the store)
within fixed bounds, so that a hostile document is a clean error and never a crash.

Python's own parser fails on such documents with exceptions nobody expects from `json.loads`:
a 100,000-deep array raises RecursionError, and a 5,000-digit integer raises ValueError from
the interpreter's int-string limit. Worse, a document that parses (600 deep) can still crash
whatever walks it recursively later (the redactor, the store's encoder). Here the nesting is
measured before parsing, without recursion, and integers, NaN and infinities are checked as
they are read, so everything downstream may rely on `MAX_DEPTH`.
"""
from __future__ import annotations

import functools
import json
import math
import re
from typing import Any, Callable, NamedTuple

# Deeper than any document a loop needs, shallow enough for every recursive walker
# (json.dumps, repr, the templates' tojson) to stay far from Python's recursion limit.
MAX_DEPTH = 100
# Digits of one integer: more than any id or count; Python itself refuses past 4,300.
MAX_INT_DIGITS = 1000

# A JSON string (so brackets inside strings are not counted) or a bracket.
_STRING_OR_BRACKET = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', re.DOTALL)


class JsonLimitError(ValueError):
    """The text is JSON-like but breaks a bound (nesting, integer size, NaN/Infinity)."""


def nesting_depth(text: str, stop_above: int) -> int:
    """How deeply brackets nest in `text`, counting no further than `stop_above` + 1."""
    depth = deepest = 0
    for match in _STRING_OR_BRACKET.finditer(text):
        token = match.group()
        if token in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > stop_above:
                    return deepest
        elif token in "]}":
            depth -= 1
    return deepest


def _int_parser(max_digits: int) -> Callable[[str], int]:
    def parse(digits: str) -> int:
        count = len(digits.lstrip("-"))
        if count > max_digits:
            raise JsonLimitError(f"a number has {count:,} digits, more than the {max_digits:,} allowed")
        return int(digits)
    return parse


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise JsonLimitError(f"the number {text[:40]} is too large for a float")
    return value


def _no_constant(name: str) -> Any:
    raise JsonLimitError(f"{name} is not JSON")


@functools.lru_cache(maxsize=8)
def _decoder(max_int_digits: int) -> json.JSONDecoder:
    # One decoder per bound, made once: `json.loads` with hooks builds a new one per call,
    # which was a third of the cost of reading a long run's events from the store.
    return json.JSONDecoder(parse_int=_int_parser(max_int_digits), parse_float=_finite_float,
                            parse_constant=_no_constant)


def loads(text: str | bytes, max_depth: int = MAX_DEPTH, max_int_digits: int = MAX_INT_DIGITS) -> Any:
    """`json.loads` with bounds. Raises json.JSONDecodeError for text that is not JSON and
    JsonLimitError (both ValueErrors) for JSON nested deeper than `max_depth`, with an integer
    longer than `max_int_digits` digits, or with NaN/Infinity."""
    if isinstance(text, (bytes, bytearray)):
        text = text.decode("utf-8")
    if not isinstance(text, str):
        raise TypeError(f"JSON must be text, not {type(text).__name__}")
    # Nesting never exceeds the count of opening brackets (those inside strings included): a
    # document with few of them (a store row, most replies) skips the token scan, which cost
    # most of the time of reading a long run's events.
    if text.count("[") + text.count("{") > max_depth and nesting_depth(text, max_depth) > max_depth:
        raise JsonLimitError(f"the JSON nests deeper than {max_depth} levels")
    if text.startswith("\ufeff"):  # as json.loads says it
        raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
    try:
        return _decoder(max_int_digits).decode(text)
    except RecursionError:  # not reachable after the depth check; kept as a last guard
        raise JsonLimitError(f"the JSON nests deeper than {max_depth} levels") from None


@functools.lru_cache(maxsize=8)
def _decoder(max_int_digits: int) -> json.JSONDecoder:
    """One decoder per bound: the store reads several values a step, and `json.loads` with
    hooks would build a decoder for each."""
    return json.JSONDecoder(parse_int=_int_parser(max_int_digits), parse_float=_finite_float,
                            parse_constant=_no_constant)


_CONTAINERS = (dict, list, tuple)


def _children(item: Any) -> list[Any]:
    if isinstance(item, dict):
        return [*item.keys(), *item.values()]
    return list(item)


def _scalar_size(value: Any) -> int:
    if isinstance(value, (str, bytes)):
        return len(value)
    if isinstance(value, bool) or value is None:
        return 5
    if isinstance(value, int):
        return value.bit_length() // 3 + 2  # decimal digits, over-estimated, without printing
    return 24


class Measure(NamedTuple):
    size: int  # characters when printed
    depth: int  # nesting levels
    walked: int  # items looked at to find out (the cost of measuring)


def measure(value: Any, max_size: int, max_depth: int = MAX_DEPTH,
            unwrap: Callable[[Any], Any] | None = None) -> Measure:
    """(text size, nesting depth) of a value of dicts, lists and tuples as if printed in full:
    a part shared by reference (`[x] * 10`) counts each time it appears, as it would print.
    Walks each distinct container once, without recursion, and stops as soon as a bound is
    passed (then the figures returned are only known to exceed it). `unwrap` maps another
    kind of container (a template namespace) to the dict it holds."""
    if unwrap is not None:
        value = unwrap(value)
    if not isinstance(value, _CONTAINERS):
        return Measure(_scalar_size(value), 0, 0)
    done: dict[int, tuple[int, int]] = {}
    entered: set[int] = set()
    walked = 0
    stack: list[tuple[Any, bool]] = [(value, False)]
    while stack:
        item, children_done = stack.pop()
        if id(item) in done or (not children_done and id(item) in entered):
            continue  # measured already, or a container inside itself
        children = _children(item)
        walked += len(children)
        if unwrap is not None:
            children = [unwrap(child) for child in children]
        if not children_done:
            entered.add(id(item))
            stack.append((item, True))
            stack.extend((c, False) for c in children if isinstance(c, _CONTAINERS) and id(c) not in done)
            continue
        size, depth = 2, 0
        for child in children:
            if isinstance(child, _CONTAINERS):
                # A container that contains itself never finishes: count it as too deep.
                child_size, child_depth = done.get(id(child), (max_size + 1, max_depth + 1))
            else:
                child_size, child_depth = _scalar_size(child), 0
            size += child_size + 2  # a separator and quotes, roughly
            depth = max(depth, child_depth)
        depth += 1
        done[id(item)] = (size, depth)
        if size > max_size or depth > max_depth:
            return Measure(size, depth, walked)
    return Measure(*done[id(value)], walked)


# A UTF-16 surrogate in a Python string: JSON text may escape one (`"\ud800"`), and decoding
# joins a valid pair into one character, so any left after decoding stands alone. Such a
# string cannot be encoded as UTF-8: printing it, writing it to a file or a pipe, or sending
# it to a server raises.
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def has_lone_surrogate(value: Any) -> bool:
    """Whether a string anywhere in a decoded JSON value (a key included) holds one."""
    if isinstance(value, str):
        return _LONE_SURROGATE.search(value) is not None
    if isinstance(value, dict):
        return any(has_lone_surrogate(k) or has_lone_surrogate(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return any(has_lone_surrogate(item) for item in value)
    return False


def without_lone_surrogates(value: Any) -> Any:
    """The value with each lone surrogate in its strings (keys too) replaced by U+FFFD, as a
    UTF-8 decoder replaces a byte it cannot read."""
    if isinstance(value, str):
        return _LONE_SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {without_lone_surrogates(k): without_lone_surrogates(v) for k, v in value.items()}
    if isinstance(value, list):
        return [without_lone_surrogates(item) for item in value]
    return value
