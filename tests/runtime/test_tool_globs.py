"""Glob matching for `paths:`, `writable:` and the `glob` argument of the workspace tools."""
from __future__ import annotations

import time

import pytest

from loopdsl.runtime.tools.globs import glob_match

CASES = [
    ("src/**", "src", True), ("src/**", "src/a/b.py", True), ("src/**", "srcx/a", False),
    ("**/*.py", "a.py", True), ("**/*.py", "x/y/a.py", True), ("*.py", "x/a.py", False),
    (".github/**", ".GITHUB/workflows/ci.yml", True), (".github/workflows/**", ".github/CODEOWNERS", False),
    ("a/[bc].txt", "a/c.txt", True), ("a/[!bc].txt", "a/c.txt", False), ("a/[!bc].txt", "a/d.txt", True),
    ("[0-9]*.txt", "5x.txt", True), ("?.py", "ab.py", False), ("src/*", "src/a/b", False),
    ("**/.envrc", ".envrc", True), ("**/.envrc", "a/b/.envrc", True), (".envrc", "x/.envrc", False),
    ("a/**/b", "a/b", True), ("a/**/b", "a/x/y/b", True), ("a/**/b", "a/x/y/c", False),
    ("*a*b", "xxaxxb", True), ("*a*b", "xxaxxbc", False), ("**", "a/b", True),
]


@pytest.mark.parametrize(("pattern", "path", "expected"), CASES)
def test_glob_match(pattern: str, path: str, expected: bool) -> None:
    assert glob_match(pattern, path) is expected


def test_a_pattern_without_slash_matches_the_name_at_any_depth() -> None:
    assert glob_match("*.py", "x/y/a.py", basename_if_no_slash=True)
    assert not glob_match("x/*.py", "x/y/a.py", basename_if_no_slash=True)


def test_matching_time_stays_polynomial() -> None:
    started = time.monotonic()
    assert not glob_match("*a" * 60 + "*b", "a" * 255)
    assert not glob_match("/".join(["**"] * 100) + "/x", "/".join(["a"] * 500))
    assert time.monotonic() - started < 1
