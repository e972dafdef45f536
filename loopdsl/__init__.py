"""loopdsl: agent loops as validated YAML state machines.

The Python API is imported lazily so that `import loopdsl` stays cheap:

    loopdsl.load(path) -> Loop            loopdsl.lint_paths(paths) -> LintReport
    loopdsl.compile_loop(loop)            loopdsl.run(path, inputs, script=...) -> RunResult
    loopdsl.resume(run_id, store=...)     loopdsl.decide(run_id, choice, comment, store=...)

(`loopdsl.lint.pipeline` is the lint module; its entry point is `lint_paths`.)
"""
from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"
__all__ = ["load", "lint_paths", "compile_loop", "run", "resume", "decide", "__version__"]

_API = {
    "load": ("lint.pipeline", "load_loop"),
    "lint_paths": ("lint.pipeline", "lint_paths"),
    "compile_loop": ("language.compile", "compile_loop"),
    "run": ("api.runs", "run"),
    "resume": ("api.runs", "resume"),
    "decide": ("api.durable", "decide"),
}


def __getattr__(name: str) -> Any:
    if name in _API:
        module, attribute = _API[name]
        return getattr(importlib.import_module(f".{module}", __name__), attribute)
    raise AttributeError(f"module 'loopdsl' has no attribute {name!r}")
