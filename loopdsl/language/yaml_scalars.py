"""What a YAML scalar means in a loop file: null, a boolean, an integer, a float, the `<<` merge
key or a string, by the YAML version the document declares. Numbers are read within limits
(Python refuses very long digit strings), and strings that escapes made unholdable (NUL, a
lone surrogate) are reported."""
from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

# (text of a plain scalar, the event's `implicit` pair) -> the tag YAML resolves it to,
# such as "tag:yaml.org,2002:int"; "tag:yaml.org,2002:str" when nothing else matches.
ResolvePlain = Callable[[str, Any], str]
# Records a problem (where, rule id, message) and lets the walk go on.
Collect = Callable[[tuple[int, int], str, str], None]

# Python refuses to turn longer digit strings into int (sys.int_max_str_digits).
MAX_INT_DIGITS = 4000

_TAG_INT = "tag:yaml.org,2002:int"
_TAG_FLOAT = "tag:yaml.org,2002:float"
_TAG_BOOL = "tag:yaml.org,2002:bool"
_TAG_NULL = "tag:yaml.org,2002:null"
_TAG_MERGE = "tag:yaml.org,2002:merge"
_TRUE_WORDS = frozenset({"true", "yes", "on"})
_BAD_ESCAPED = re.compile("[\x00\ud800-\udfff]")


def scalar_value(event: Any, where: tuple[int, int], resolve: ResolvePlain, version: tuple[int, ...],
                 collect: Collect) -> tuple[Any, str]:
    """A scalar event's value and kind: "str", "merge" (the `<<` key) or "other". Problems
    go to `collect`; `version` is the document's YAML version (1.1 reads more forms)."""
    text: str = event.value
    if event.style == ">":
        # ruamel's round-trip scanner marks each fold of a `>` scalar with a BEL for its
        # own constructor to remove; a real BEL cannot be there (block scalars have no
        # escapes and raw control characters are refused), so drop them all.
        text = text.replace("\a", "")
    elif event.style == '"' and _BAD_ESCAPED.search(text):
        # Only an escape (`\0`, `\uD800`) can get here: the raw text was checked.
        collect(where, "yaml-encoding", "an escape in this string makes a NUL or a "
                     "lone surrogate, which loop files cannot hold; write the character "
                     "itself, or use \\U0001F600-style escapes for emoji")
    if getattr(event, "ctag", None) is not None or event.style is not None:
        return text, "str"  # quoted, or tagged (already reported): the text as written
    resolved = resolve(text, event.implicit)
    if resolved == _TAG_NULL:
        return None, "other"
    if resolved == _TAG_BOOL:
        return text.lower() in _TRUE_WORDS, "other"
    if resolved == _TAG_INT:
        return _to_int(text, where, version, collect), "other"
    if resolved == _TAG_FLOAT:
        return _to_float(text, where, version, collect), "other"
    if resolved == _TAG_MERGE:
        return text, "merge"
    return text, "str"  # strings, and timestamps kept as the text written

def _to_int(text: str, where: tuple[int, int], version: tuple[int, ...], collect: Collect) -> int | str:
    digits = text.replace("_", "")
    sign = -1 if digits.startswith("-") else 1
    digits = digits.lstrip("+-")
    if len(digits) > MAX_INT_DIGITS:
        collect(where, "yaml-syntax", f"an integer with {len(digits)} digits is too "
                     "large; quote it if it is meant as text")
        return text
    try:
        if digits[:2] in ("0b", "0o", "0x"):
            return sign * int(digits[2:], {"b": 2, "o": 8, "x": 16}[digits[1]])
        if version == (1, 1) and ":" in digits:  # YAML 1.1 sexagesimal
            total = 0
            for part in digits.split(":"):
                total = total * 60 + int(part)
            return sign * total
        if version == (1, 1) and digits.startswith("0") and digits != "0":
            return sign * int(digits, 8)
        return sign * int(digits, 10)
    except ValueError:
        collect(where, "yaml-syntax", f"`{text}` looks like an integer but is not a "
                     "valid one; quote it if it is meant as text")
        return text

def _to_float(text: str, where: tuple[int, int], version: tuple[int, ...], collect: Collect) -> float | str:
    value = text.replace("_", "").lower()
    sign = -1.0 if value.startswith("-") else 1.0
    value = value.lstrip("+-")
    try:
        if value == ".inf":
            return sign * float("inf")
        if value == ".nan":
            return float("nan")
        if version != (1, 2) and ":" in value:  # YAML 1.1 sexagesimal
            total = 0.0
            for part in value.split(":"):
                total = total * 60 + float(part)
            return sign * total
        return sign * float(value)
    except ValueError:
        collect(where, "yaml-syntax", f"`{text}` looks like a number but is not a "
                     "valid one; quote it if it is meant as text")
        return text
