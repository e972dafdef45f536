"""Loop files as one worker sees them: loaded, compiled and cached by content hash.

Workflow code may not read files, but it must compile the loop it runs. A worker loads
each loop once (in the `prepare` activity, or on a replay on another worker) and keeps it
keyed by the hashes the run recorded at its start, so a loop file edited while a run is
going never changes what that run executes: a worker whose files differ refuses the run.
This module is passed through Temporal's sandbox, so its cache is the worker process's.
"""
from __future__ import annotations

import hashlib
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ...language.compile import CompiledLoop, compile_loop
from ...language.files import file_sha256
from ...language.model import Loop


class FilesChanged(Exception):
    """This worker's copy of a run's files differs from the one the run started with."""


class OutsideRoot(ValueError):
    """A request named a file outside the repository the worker serves."""


@dataclass(frozen=True)
class LoadedLoop:
    compiled: CompiledLoop
    skills: Mapping[str, str]  # skill path -> text
    files: Mapping[str, str]  # path relative to the worker's root -> sha256
    script: Any  # the reply script's data, or None for real models


_ROOT: list[Path] = []
_CACHE: dict[tuple[str, str | None, str], LoadedLoop] = {}
_LOCK = threading.Lock()


def set_root(root: Path) -> None:
    """The repository a worker serves: loop paths, commands and worktrees are relative to it."""
    _ROOT[:] = [root.resolve()]


def root() -> Path:
    if not _ROOT:
        raise RuntimeError("no worker root set: start the worker with `loopdsl worker --temporal ...`")
    return _ROOT[0]


def relative(path: str | Path, base: Path) -> str:
    """`path` relative to `base` when inside it (so that workers in different folders agree)."""
    try:
        return str(Path(path).resolve().relative_to(base))
    except ValueError:
        return str(path)


def inside_root(path: str, what: str) -> Path:
    """`path` (relative to the root) as a file of the repository the worker serves. Whoever may
    start workflows on the namespace writes the request, so it names only the repository's own
    loops and reply scripts, never another file on the worker's disk (`../`, an absolute path
    or a symlink out all land outside)."""
    base = root()
    full = (base / path).resolve()
    if base not in full.parents:
        raise OutsideRoot(f"{what} {path} is outside the repository the worker serves ({base}); a worker runs only "
                          "the loops of the repository it was started in")
    return full


def _fingerprint(files: Mapping[str, str]) -> str:
    return hashlib.sha256(repr(sorted(files.items())).encode()).hexdigest()


def _read(loop_path: str, script: str | None) -> LoadedLoop:
    from ...language.checked_files import load_checked
    from ...language.skills import read_skills
    from ...lint.lockfile import dependencies
    from ...lint.pipeline import load_loop

    base = root()
    loop: Loop = load_loop(inside_root(loop_path, "loop file"))
    files = {relative(path, base): digest for path, digest in dependencies(loop).items()}
    skills = read_skills(loop)
    data = None
    if script is not None:
        script_file = inside_root(script, "reply script")
        doc, problems = load_checked(script_file, "replies")
        if problems or doc is None:
            raise ValueError(f"reply script {script}: " + "; ".join(p.message for p in problems))
        data = doc.data
        files[script] = file_sha256(script_file)
    return LoadedLoop(compile_loop(loop), skills, files, data)


def load(loop_path: str, script: str | None, expect: Mapping[str, str] | None = None, *,
         fresh: bool = False) -> LoadedLoop:
    """The loop at `loop_path` (relative to the root), from the cache when its files are
    unchanged; FilesChanged when `expect` (the run's recorded hashes) is not what is here.
    `fresh`: read the files even on a cache hit (a decision checks what is on disk now)."""
    with _LOCK:
        if expect is not None and not fresh:
            hit = _CACHE.get((loop_path, script, _fingerprint(expect)))
            if hit is not None:
                return hit
        loaded = _read(loop_path, script)
        if expect is not None and dict(loaded.files) != dict(expect):
            changed = sorted(p for p in set(expect) | set(loaded.files) if expect.get(p) != loaded.files.get(p))
            raise FilesChanged(f"files changed since the run started: {', '.join(changed)}")
        _CACHE[(loop_path, script, _fingerprint(loaded.files))] = loaded
        return loaded


_CHILDREN: dict[str, tuple[CompiledLoop, dict[str, str]]] = {}


def child(parent: Loop, ref: str) -> tuple[CompiledLoop, dict[str, str]]:
    """A `loop:` state's loop, compiled, with its skills. Its file is among the hashes the
    run recorded at its start (the lock file's dependencies include sub-loops)."""
    from ...language.packaged_loops import child_loop_path
    from ...language.skills import read_skills
    from ...lint.pipeline import load_loop

    path = str(child_loop_path(parent.base_dir, ref))
    with _LOCK:
        hit = _CHILDREN.get(path)
        if hit is None:
            loop = load_loop(path)
            skills = read_skills(loop)
            hit = _CHILDREN[path] = (compile_loop(loop), skills)
        return hit


def loop_at(loop_path: str, script: str | None, files: Mapping[str, str] | None, loop_file: str) -> Loop:
    """The run's loop, or (`loop_file` another file under the root) one of its sub-loops."""
    if loop_file == loop_path:
        return load(loop_path, script, files).compiled.loop
    from ...lint.pipeline import load_loop

    path = str(root() / loop_file)
    with _LOCK:
        hit = _CHILDREN.get(path)
    return hit[0].loop if hit is not None else load_loop(path)


def worker_host() -> str:
    return os.uname().nodename
