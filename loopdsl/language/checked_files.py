"""Test files and reply scripts, read and checked against their published schemas.

`*.test.yaml` and `*.replies.yaml` files are validated by schemas/test.schema.json and
schemas/replies.schema.json, the same files editors use, and reported like loop files:
`path:line:col`, a message and a hint per offending node (see schema.py).
"""
from __future__ import annotations

import os
from dataclasses import replace

from .diagnostics import Diagnostic
from .loader import Document, load_document

# The loader speaks of loop files; say what this file is instead.
_WHAT = {"test": "test file", "replies": "reply script"}
_SHAPE = {
    "test": "a mapping: one test (with `loop:`) or `tests: [...]`",
    "replies": "a mapping of state names to replies, e.g. `draft: [\"first reply\"]`",
}


def load_checked(path: str | os.PathLike[str], kind: str,
                 text: str | bytes | None = None) -> tuple[Document | None, list[Diagnostic]]:
    """Read one file of `kind` ("test" or "replies"); (None, errors) when it cannot be read,
    (Document, errors) when it can but breaks its schema, (Document, []) when it is fine."""
    doc, problems = load_document(path, text)
    if doc is None:
        return None, [_reworded(d, kind) for d in problems]
    from .schema import check  # deferred: jsonschema is only needed once a file parsed

    return doc, check(doc, kind)


def _reworded(diagnostic: Diagnostic, kind: str) -> Diagnostic:
    shape = f"a {_WHAT[kind]} is {_SHAPE[kind]}"
    if diagnostic.rule == "yaml-not-mapping":
        found = diagnostic.message.rsplit(", found ", 1)[-1] if ", found " in diagnostic.message else "something else"
        return replace(diagnostic, message=f"{shape}, not {found}", hint="")
    if diagnostic.rule == "yaml-empty":
        return replace(diagnostic, hint=shape)
    return diagnostic


def describe(diagnostics: list[Diagnostic]) -> str:
    """One line per finding, `path:line:col: message (hint: ...)`, for errors raised as text."""
    lines = []
    for d in diagnostics:
        where = f"{d.path}:{d.line}:{d.col}" if d.line else d.path
        lines.append(f"{where}: {d.message}" + (f" (hint: {d.hint})" if d.hint else ""))
    return "\n".join(lines)
