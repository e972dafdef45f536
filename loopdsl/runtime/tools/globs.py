"""Glob patterns over workspace-relative paths (`src/**`, `*.py`, `.github/**`).

A model sends `glob` arguments, so matching must not backtrack: a regular expression made
from `*a*a*a*a*b` takes time growing as a high power of the name's length. Here one
component is matched by the classic two-pointer wildcard algorithm (time at most
pattern x name), and `**` across components by a table over (pattern part, path part).

`**` as a whole component matches zero or more components, so `src/**` names `src` and
everything below it; `*`, `?` and `[...]` (`[!...]` negated) stay inside one component.
Matching ignores case, since a case-insensitive checkout names `.GITHUB` and `.github` alike.
"""
from __future__ import annotations

from functools import lru_cache

_STAR = ("*",)
_ANY = ("?",)
Token = tuple


@lru_cache(maxsize=1024)
def _tokens(part: str) -> tuple[Token, ...]:
    out: list[Token] = []
    i = 0
    while i < len(part):
        char, close = part[i], part.find("]", i + 2)
        if char == "*":
            if not out or out[-1] != _STAR:  # `**` inside a name is one star
                out.append(_STAR)
        elif char == "?":
            out.append(_ANY)
        elif char == "[" and close > 0:
            out.append(_char_class(part[i + 1:close]))
            i = close
        else:
            out.append(("=", char))
        i += 1
    return tuple(out)


def _char_class(body: str) -> Token:
    negate = body[:1] in ("!", "^")
    body = body[1:] if negate else body
    ranges: list[tuple[str, str]] = []
    i = 0
    while i < len(body):
        if i + 2 < len(body) and body[i + 1] == "-":
            ranges.append((body[i], body[i + 2]))
            i += 3
        else:
            ranges.append((body[i], body[i]))
            i += 1
    return ("[", negate, tuple(ranges))


def _token_matches(token: Token, char: str) -> bool:
    kind = token[0]
    if kind == "?":
        return char != "/"
    if kind == "=":
        return token[1] == char
    inside = any(low <= char <= high for low, high in token[2])
    return inside != token[1] and char != "/"


def _component_match(tokens: tuple[Token, ...], name: str) -> bool:
    """Wildcard match with backtracking only to the last star: O(len(tokens) x len(name))."""
    t = n = 0
    star, mark = -1, 0
    while n < len(name):
        if t < len(tokens) and tokens[t] == _STAR:
            star, mark = t, n
            t += 1
        elif t < len(tokens) and _token_matches(tokens[t], name[n]):
            t += 1
            n += 1
        elif star >= 0:
            t, mark = star + 1, mark + 1
            n = mark
        else:
            return False
    while t < len(tokens) and tokens[t] == _STAR:
        t += 1
    return t == len(tokens)


@lru_cache(maxsize=512)
def _pattern_parts(pattern: str) -> tuple[tuple[Token, ...] | None, ...]:
    """One entry per component; None stands for `**`."""
    return tuple(None if part == "**" else _tokens(part)
                 for part in pattern.casefold().split("/") if part not in ("", "."))


def glob_match(pattern: str, rel: str, *, basename_if_no_slash: bool = False) -> bool:
    """`rel` (a '/'-separated relative path) matches `pattern`. With `basename_if_no_slash`,
    a pattern without '/' is tried on the last component only (`*.py` at any depth)."""
    if basename_if_no_slash and "/" not in pattern:
        rel = rel.rsplit("/", 1)[-1]
    parts = _pattern_parts(pattern)
    names = [name for name in rel.casefold().split("/") if name]
    # reach[j]: the pattern parts seen so far can consume exactly the first j names.
    reach = [True] + [False] * len(names)
    for part in parts:
        if part is None:
            for j in range(1, len(names) + 1):
                reach[j] = reach[j] or reach[j - 1]
        else:
            reach = [False] + [reach[j - 1] and _component_match(part, names[j - 1])
                               for j in range(1, len(names) + 1)]
    return reach[len(names)]


def any_glob(patterns: tuple[str, ...] | list[str], rel: str) -> bool:
    return any(glob_match(p, rel) for p in patterns)
