"""A loop together with every sub-loop it can run, loaded: what credentials, audit and
export look at when they ask what a whole run may do."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..language.diagnostics import LoopError
from ..language.model import Loop, LoopAction
from ..language.packaged_loops import PackageError, child_loop_path
from .pipeline import load_loop


def loop_tree(loop: Loop, load: Callable[[Path], Loop] = load_loop) -> list[Loop]:
    """The loop and every sub-loop it can run (children that fail to load are left out).
    `load` turns a child's file into its loop (audit passes one that reuses its lint session)."""
    out: list[Loop] = []
    seen: set[Path] = set()
    pending = [loop]
    while pending:
        current = pending.pop(0)
        key = current.source.resolve() if current.source else Path(f"<{id(current)}>")
        if key in seen:
            continue
        seen.add(key)
        out.append(current)
        for state in current.states.values():
            if not isinstance(state.action, LoopAction):
                continue
            try:
                path = child_loop_path(current.base_dir, state.action.path)
            except PackageError:  # an uninstalled package: lint reports it
                continue
            if path in seen:
                continue
            try:
                pending.append(load(path))
            except (LoopError, OSError):
                continue
    return out
