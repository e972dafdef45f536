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
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from ..language import bounded_json
from ..language.diagnostics import Diagnostic, Severity
from ..language.files import exists, file_sha256, is_file, read_capped
from ..language.model import Loop, LoopAction
from ..language.skills import skill_paths
from ..language.terminal_safe import visible

if TYPE_CHECKING:
    from .pipeline import LintSession

LOCK_NAME = "loopdsl.lock"
LOCK_VERSION = 1


def sha256_file(path: Path) -> str:
    try:
        return file_sha256(path)
    except OSError:
        return "missing"


def _imported_files(source: Path, session: LintSession) -> list[Path]:
    """The files a loop file imports, transitively, as lint resolves them."""
    analysis = session.children.get(source.resolve()) or session.lint_file(source)
    imported = analysis.imported
    return list(imported.files) if imported is not None else []


def dependencies(loop: Loop, _seen: set[Path] | None = None, session: LintSession | None = None) -> dict[str, str]:
    """Resolved path -> sha256 of every file `loop` depends on ("pkg:" entries: dist==version).
    Give a `session` to share the linting of files several loops use."""
    from .pipeline import LintSession
    from ..language.packaged_loops import child_loop_path, installed_loops

    session = session if session is not None else LintSession()
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
        for path in _imported_files(loop.source, session):
            files[str(path.resolve())] = sha256_file(path)
    for written in skill_paths(loop):
        skill = (base / written).resolve()
        files[str(skill)] = sha256_file(skill)
    # Sub-loops: of `loop:` states, and offered to agents as tools.
    children = [state.action.path for state in loop.states.values() if isinstance(state.action, LoopAction)]
    children += [tool.loop for tool in loop.tools.values() if tool.loop]
    for ref in children:
        if ref.startswith("pkg:"):
            match = [p for p in installed_loops() if p.name == ref[4:]]
            files[ref] = f"{match[0].distribution}=={match[0].version}" if match else "missing"
            continue
        child_path = child_loop_path(base, ref)
        try:
            child = session.loop_at(child_path)
        except Exception:  # a child that does not load is lint's to report; pin its bytes
            files[str(child_path)] = sha256_file(child_path)
            continue
        files.update(dependencies(child, seen, session))
    return files


def write_lock(loops: Iterable[Loop], where: Path, session: LintSession | None = None,
               paths: Sequence[str] = ()) -> Path:
    """Write `loopdsl.lock` in `where`, paths relative to it; returns its path. `paths`: what
    `loopdsl lock` was given, kept so that a stale lock can say the command that renews it."""
    entries: dict[str, str] = {}
    for loop in loops:
        for path, digest in dependencies(loop, session=session).items():
            entries[_relative(path, where)] = digest
    lock = where / LOCK_NAME
    written: dict[str, Any] = {"loopdsl_lock": LOCK_VERSION, "files": dict(sorted(entries.items()))}
    if paths:
        written["paths"] = [_relative(str(Path(given).resolve()), where) for given in paths]
    text = json.dumps(written, indent=2) + "\n"
    # Written beside, then renamed over: a `loopdsl.lock` that is a symbolic link (to a loop
    # file, to .git/config) is replaced, never written through, and a FIFO never blocks.
    partial = where / f".{LOCK_NAME}.{os.getpid()}.tmp"
    try:
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, lock)
    except OSError:
        partial.unlink(missing_ok=True)
        raise
    return lock


def _relative(path: str, where: Path) -> str:
    if path.startswith("pkg:"):
        return path
    return os.path.relpath(path, where).replace(os.sep, "/")


def find_lock(start: Path) -> Path | None:
    """The nearest `loopdsl.lock` at or above `start`, up to the repository's root (a folder
    with `.git`): one planted above it (in a shared /tmp) is not this project's."""
    for folder in (start.resolve(), *start.resolve().parents):
        candidate = folder / LOCK_NAME
        if is_file(candidate):
            return candidate
        if exists(folder / ".git"):
            return None
    return None


def _locked_files(lock_path: Path) -> tuple[dict[str, str], str]:
    """The lock file's `files`, checked (ValueError says what is wrong with it), and the
    command that renews it, run in its folder."""
    data: Any = bounded_json.loads(read_capped(lock_path).decode("utf-8"))
    if not isinstance(data, dict) or data.get("loopdsl_lock") != LOCK_VERSION:
        raise ValueError(f"it is not a version {LOCK_VERSION} lock file (`loopdsl_lock: {LOCK_VERSION}`)")
    files = data.get("files")
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        raise ValueError("its `files` is not a mapping of file to digest")
    paths = data.get("paths")  # written by this version; older locks and hostile values: the default
    if not isinstance(paths, list) or not paths or not all(isinstance(p, str) for p in paths[:50]):
        return files, "loopdsl lock"
    command = "loopdsl lock " + " ".join(shlex.quote(p) for p in paths[:50])
    return files, visible(command[:300])


def check_locked(loops: Iterable[tuple[str, Loop]], lock_path: Path,
                 session: LintSession | None = None) -> list[Diagnostic]:
    """Diagnostics for files that changed, or were never locked, since `loopdsl lock`."""
    try:
        locked, renew = _locked_files(lock_path)
    except OSError as exc:
        return [_unreadable(lock_path, exc.strerror or type(exc).__name__)]
    except ValueError as exc:  # not UTF-8, not JSON, too deep, or not the shape `loopdsl lock` writes
        return [_unreadable(lock_path, str(exc)[:200])]
    where = lock_path.parent
    problems: list[Diagnostic] = []
    for shown, loop in loops:
        for path, digest in dependencies(loop, session=session).items():
            key = _relative(path, where)
            if key not in locked:
                problems.append(Diagnostic(shown, 1, 1, Severity.ERROR, "lock-missing",
                                           f"'{key}' is used by this loop but not pinned in {lock_path.name}",
                                           f"run `{renew}` in {where} and review the change"))
            elif locked[key] != digest:
                problems.append(Diagnostic(shown, 1, 1, Severity.ERROR, "lock-changed",
                                           f"'{key}' changed since {lock_path.name} was written "
                                           f"(locked {locked[key][:12]}, now {digest[:12]})",
                                           f"review the change, then run `{renew}` in {where} to pin it"))
    return problems


def _unreadable(lock_path: Path, why: str) -> Diagnostic:
    return Diagnostic(str(lock_path), 0, 0, Severity.ERROR, "lock-unreadable", f"cannot read {LOCK_NAME}: {why}",
                      "run `loopdsl lock` to write it again")
