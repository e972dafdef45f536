"""loopdsl: agent loops as validated YAML state machines.

The Python API (load, lint, compile_loop, run, resume) is imported lazily so that
`import loopdsl` stays cheap for lint-only users.
"""
from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["load", "lint", "compile_loop", "run", "resume", "__version__"]


def __getattr__(name: str) -> Any:
    if name in ("load", "lint"):
        from . import lint as _lint

        return {"load": _lint.load_loop, "lint": _lint.lint_paths}[name]
    if name == "compile_loop":
        from .compile import compile_loop

        return compile_loop
    if name in ("run", "resume"):
        from . import api

        return getattr(api, name)
    raise AttributeError(name)
