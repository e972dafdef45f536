"""Temporary folders a loopdsl process makes for its own work, and their removal when the
process is told to end.

Their owners remove them when the work ends, as `tempfile`'s own do. This module also keeps
the set still in use, because the CLI ends on SIGTERM with `os._exit` (cli/__init__.py), which
runs no `finally` and no `atexit`: its handler calls `remove_all()` first, so a stopped
`loopdsl test`, a stopped coding-agent CLI attempt (whose home holds the CLI's session log) or
a stopped read of a copied store leaves nothing in the temp dir. A `kill -9` still leaves them;
coding_cli_home sweeps the CLI homes such a kill left.
"""
from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_IN_USE: set[Path] = set()


def make_folder(prefix: str) -> Path:
    """A new private folder (mode 0700) in the temp dir; `remove_folder` it when done."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    _IN_USE.add(folder)
    return folder


def remove_folder(folder: Path) -> None:
    _IN_USE.discard(folder)
    shutil.rmtree(folder, ignore_errors=True)


def keep_folder(folder: Path) -> None:
    """The folder outlives the work (`loopdsl test --keep`): no longer removed at the end."""
    _IN_USE.discard(folder)


@contextmanager
def scratch_folder(prefix: str = "loopdsl-") -> Iterator[Path]:
    """A folder for the block's work, removed after it (and by `remove_all` before)."""
    folder = make_folder(prefix)
    try:
        yield folder
    finally:
        remove_folder(folder)


def remove_all() -> int:
    """Remove every folder still in use: for a process about to end without unwinding. How many."""
    folders = list(_IN_USE)  # a copy: another thread may add or remove one meanwhile
    for folder in folders:
        remove_folder(folder)
    return len(folders)
