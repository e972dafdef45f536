"""Diagnostics: what lint and the loader report, and how it is printed.

Every user-facing problem with a loop file becomes a `Diagnostic` that says
where (path:line:col), what (message), why it matters / how to fix it (hint),
and which rule found it. Lint collects them; nothing here raises.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Iterable, Sequence

from .terminal_safe import visible


class Severity(str, Enum):
    ERROR = "error"
    WARNING = "warning"


@dataclass(frozen=True, order=True)
class Diagnostic:
    """One finding. `line` and `col` are 1-based; 0 means "the whole file"."""

    path: str
    line: int
    col: int
    severity: Severity
    rule: str
    message: str
    hint: str = ""
    # Extra locations, e.g. the other side of a duplicate or an import cycle.
    related: tuple[tuple[str, int, int, str], ...] = field(default=())

    @property
    def is_error(self) -> bool:
        return self.severity is Severity.ERROR

    def location(self) -> str:
        # A finding about the whole file (line 0) shows no position rather than a false `:0:0`.
        return f"{self.path}:{self.line}:{self.col}" if self.line else self.path

    def to_json(self) -> dict[str, object]:
        data = asdict(self)
        data["severity"] = self.severity.value
        data["related"] = [
            {"path": p, "line": ln, "col": c, "message": m} for p, ln, c, m in self.related
        ]
        return data


class LoopError(Exception):
    """A user mistake that stops an operation; carries the diagnostics that explain it."""

    def __init__(self, diagnostics: Sequence[Diagnostic]):
        self.diagnostics = tuple(diagnostics)
        first = self.diagnostics[0] if self.diagnostics else None
        super().__init__(format_plain(first) if first else "invalid loop")


def format_plain(d: Diagnostic) -> str:
    return f"{d.location()}: {d.severity.value}: {d.message} [{d.rule}]"


def _snippet(source_lines: Sequence[str] | None, d: Diagnostic) -> list[str]:
    if not source_lines or d.line < 1 or d.line > len(source_lines):
        return []
    text = source_lines[d.line - 1].rstrip("\n").expandtabs(1)
    gutter = f"{d.line:>4} | "
    caret_col = max(d.col, 1)
    return [gutter + text, " " * (len(gutter) - 2) + "| " + " " * (caret_col - 1) + "^"]


def format_text(diags: Iterable[Diagnostic], sources: dict[str, list[str]] | None = None) -> str:
    """Human format: the location line, a source snippet with a caret, then the hint."""
    out: list[str] = []
    for d in diags:
        out.append(format_plain(d))
        out.extend(_snippet((sources or {}).get(d.path), d))
        for path, line, col, message in d.related:
            out.append(f"  {path}:{line}:{col}: note: {message}")
        if d.hint:
            out.append(f"  hint: {d.hint}")
    # A message quotes what the files hold (an import's path, a name, a snippet of the line),
    # and the files may be hostile: their control characters are shown, never sent.
    return visible("\n".join(out))


def format_json(diags: Iterable[Diagnostic]) -> str:
    return json.dumps([d.to_json() for d in diags], indent=2)


def _github_escape(text: str, *, prop: bool = False) -> str:
    # GitHub workflow commands need %, CR and LF escaped; property values also : and ,
    # (other control characters are shown as escapes: a job's log is a terminal too)
    text = visible(text).replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    if prop:
        text = text.replace(":", "%3A").replace(",", "%2C")
    return text


def format_github(diags: Iterable[Diagnostic]) -> str:
    """GitHub Actions workflow annotations (`::error file=...,line=...::message`)."""
    lines = []
    for d in diags:
        level = "error" if d.is_error else "warning"
        message = f"{d.message} [{d.rule}]" + (f" hint: {d.hint}" if d.hint else "")
        props = f"file={_github_escape(d.path, prop=True)},line={max(d.line, 1)},col={max(d.col, 1)},title={_github_escape(d.rule, prop=True)}"
        lines.append(f"::{level} {props}::{_github_escape(message)}")
    return "\n".join(lines)
