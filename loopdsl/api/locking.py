"""`loopdsl lock` and `lint --locked`: find the loop files under paths, pin or check what they use."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from ..language.diagnostics import Diagnostic, LoopError
from ..language.model import Loop
from ..lint.lockfile import LOCK_NAME, check_locked, find_lock, write_lock
from ..lint.pipeline import LintSession
from ..lint.report import is_loop_text
from ..language.errors import LoopdslError
from ..language.files import YAML_SUFFIXES, exists, is_dir, leads_outside, read_head, walk

EXIT_FINDINGS = 1


def loop_files(paths: Sequence[str | Path]) -> list[Path]:
    """The loop files named or found under `paths` (the one file walker skips the run store,
    version-control folders, virtual environments and caches)."""
    found: list[Path] = []
    for given in paths:
        path = Path(given)
        candidates = sorted(walk(path, YAML_SUFFIXES)) if is_dir(path) else [path]
        for file in candidates:
            try:
                if is_loop_text(read_head(file)):
                    found.append(file)
            except OSError:
                continue
    return found


def loadable_loops(files: Sequence[Path], session: LintSession | None = None) -> list[tuple[str, Loop]]:
    """(path, loop) for each file that loads; the others are lint's to report."""
    session = session if session is not None else LintSession()
    loops = []
    for file in files:
        try:
            loops.append((str(file), session.loop_at(file)))
        except LoopError:
            continue
    return loops


def check_lock(paths: Sequence[str]) -> list[Diagnostic]:
    """What changed since `loopdsl lock` in the files the loops under `paths` depend on."""
    first = Path(paths[0])
    lock_path = find_lock(first if first.is_dir() else first.parent)
    if lock_path is None:
        raise LoopdslError(f"--locked: no {LOCK_NAME} here or in a parent folder", "run `loopdsl lock` first",
                         exit_code=EXIT_FINDINGS)
    session = LintSession()  # every file linted once, however many of the loops use it
    return check_locked(loadable_loops(loop_files(paths), session), lock_path, session)


def lock(paths: Sequence[str], where: Path) -> tuple[Path, int]:
    """Write the lock file in `where` for the loops under `paths`; its path and how many loops."""
    missing = [given for given in paths if not exists(Path(given))]
    if missing:
        raise LoopdslError(f"no such file or folder: {missing[0]}", "name loop files or folders that hold them "
                           "(with no path, `loopdsl lock` pins the loops under loops/)")
    session = LintSession()
    files = loop_files(paths)
    if not files:
        raise LoopdslError(f"no loop files under {', '.join(paths)}",
                           "a loop file is a .yaml or .yml file with `loopdsl: 1` at its top")
    loops = loadable_loops(files, session)
    if not loops:
        raise LoopdslError(f"no loadable loop files under {', '.join(paths)}",
                         "lint them: `loopdsl lint " + " ".join(paths) + "`")
    elsewhere = leads_outside(where, where / LOCK_NAME)
    if elsewhere is not None:
        raise LoopdslError(f"{where / LOCK_NAME} is a symbolic link to {elsewhere}, outside {where}; nothing was written",
                           "remove the link, then run `loopdsl lock` again")
    try:
        return write_lock([loop for _, loop in loops], where, session, paths), len(loops)
    except OSError as exc:  # a folder of that name, a read-only checkout
        raise LoopdslError(f"cannot write {where / LOCK_NAME}: {exc.strerror or exc}",
                           "remove what is in the way, or run `loopdsl lock` where you may write") from None
