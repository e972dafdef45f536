"""Pinning: every file a loop depends on, with its sha256; `loopdsl.lock`.

A loop depends on its own file, its imports (transitively), the skills its `llm`
states name and the sub-loops its `loop:` states run (with everything they depend
on). `loopdsl lock` writes those digests next to the loops; `lint --locked` fails
when one changed, the way a lock file pins a shared CI workflow. Packaged loops
(`pkg:NAME`) are pinned by pip; the lock records their distribution and version.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable

from ..language.diagnostics import Diagnostic, Severity
from ..language.files import file_sha256
from ..language.model import LlmAction, Loop, LoopAction

LOCK_NAME = "loopdsl.lock"
LOCK_VERSION = 1


def sha256_file(path: Path) -> str:
    try:
        return file_sha256(path)
    except OSError:
        return "missing"


def _imported_files(source: Path) -> list[Path]:
    """The files a loop file imports, transitively, as lint resolves them."""
    from .pipeline import LintSession

    imported = LintSession().lint_file(source).imported
    return list(imported.files) if imported is not None else []


def dependencies(loop: Loop, _seen: set[Path] | None = None) -> dict[str, str]:
    """Resolved path -> sha256 of every file `loop` depends on ("pkg:" entries: dist==version)."""
    from .pipeline import load_loop
    from ..language.packaged_loops import child_loop_path, installed_loops

    seen = _seen if _seen is not None else set()
    files: dict[str, str] = {}
    if loop.source is not None:
        src = loop.source.resolve()
        if src in seen:
            return files
        seen.add(src)
        files[str(src)] = sha256_file(src)
    base = loop.base_dir
    if loop.source is not None and loop.imports:
        for path in _imported_files(loop.source):
            files[str(path.resolve())] = sha256_file(path)
    for state in loop.states.values():
        action = state.action
        if isinstance(action, LlmAction) and action.skill:
            skill = (base / action.skill).resolve()
            files[str(skill)] = sha256_file(skill)
        if isinstance(action, LoopAction):
            if action.path.startswith("pkg:"):
                name = action.path[4:]
                match = [p for p in installed_loops() if p.name == name]
                files[action.path] = f"{match[0].distribution}=={match[0].version}" if match else "missing"
                continue
            child_path = child_loop_path(base, action.path)
            try:
                child = load_loop(child_path)
            except Exception:  # a child that does not load is lint's to report; pin its bytes
                files[str(child_path)] = sha256_file(child_path)
                continue
            files.update(dependencies(child, seen))
    return files


def write_lock(loops: Iterable[Loop], where: Path) -> Path:
    """Write `loopdsl.lock` in `where`, paths relative to it; returns its path."""
    entries: dict[str, str] = {}
    for loop in loops:
        for path, digest in dependencies(loop).items():
            entries[_relative(path, where)] = digest
    lock = where / LOCK_NAME
    lock.write_text(json.dumps({"loopdsl_lock": LOCK_VERSION, "files": dict(sorted(entries.items()))}, indent=2) + "\n")
    return lock


def _relative(path: str, where: Path) -> str:
    if path.startswith("pkg:"):
        return path
    return os.path.relpath(path, where).replace(os.sep, "/")


def find_lock(start: Path) -> Path | None:
    for folder in (start.resolve(), *start.resolve().parents):
        candidate = folder / LOCK_NAME
        if candidate.is_file():
            return candidate
    return None


def check_locked(loops: Iterable[tuple[str, Loop]], lock_path: Path) -> list[Diagnostic]:
    """Diagnostics for files that changed, or were never locked, since `loopdsl lock`."""
    try:
        data: Any = json.loads(lock_path.read_text(encoding="utf-8"))
        locked: dict[str, str] = dict(data["files"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return [Diagnostic(str(lock_path), 0, 0, Severity.ERROR, "lock-unreadable",
                           f"cannot read {LOCK_NAME}: {exc}", "run `loopdsl lock` to write it again")]
    where = lock_path.parent
    problems: list[Diagnostic] = []
    for shown, loop in loops:
        for path, digest in dependencies(loop).items():
            key = _relative(path, where)
            if key not in locked:
                problems.append(Diagnostic(shown, 1, 1, Severity.ERROR, "lock-missing",
                                           f"'{key}' is used by this loop but not pinned in {lock_path.name}",
                                           "run `loopdsl lock` and review the change"))
            elif locked[key] != digest:
                problems.append(Diagnostic(shown, 1, 1, Severity.ERROR, "lock-changed",
                                           f"'{key}' changed since {lock_path.name} was written "
                                           f"(locked {locked[key][:12]}, now {digest[:12]})",
                                           "review the change, then run `loopdsl lock` to pin it"))
    return problems
