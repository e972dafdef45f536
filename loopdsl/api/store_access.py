"""Opening the run store a command names, and the error for a user's mistake outside the
loop file. Apart from api.runs so that commands that only read the store (`show`, `runs`,
`clean`) start without importing the engine."""
from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..adapters.store.run_store import RunStore, default_store_dir
from ..language.errors import LoopdslError
from ..runtime.errors import StoreError
from ..runtime.scratch import scratch_folder


class UsageError(LoopdslError):
    """A user mistake outside the loop file (bad input, unknown run, changed file); exit 2."""


def open_store(store: str | Path | RunStore | None, near: Path, *, create: bool = True) -> RunStore:
    """The run store to use; commands that only read or change existing runs pass
    create=False so that a mistyped --store is an error, not a new empty store."""
    if isinstance(store, RunStore):
        return store
    directory = Path(store) if store is not None else default_store_dir(near)
    if not create and not directory.exists():
        raise StoreError(f"no run store at {directory}",
                         "pass --store DIR (or set LOOPDSL_STORE) where `loopdsl run` kept its runs")
    return RunStore(directory)


@contextmanager
def reading_store(store: str | Path | RunStore | None, near: Path) -> Iterator[RunStore]:
    """The run store for a command that only reads it (`runs`, `show`), closed after. Opening
    a store writes to it (SQLite's WAL, diskcache's settings), so one this process may not
    write (a read-only mount, a CI artifact, a colleague's folder) is read from a temporary
    copy of its files, worktrees left out, removed after."""
    if isinstance(store, RunStore):  # the caller's own, open and closed by it
        yield store
        return
    directory = Path(store) if store is not None else default_store_dir(near)
    if not directory.is_dir() or os.access(directory, os.W_OK):
        with open_store(directory, near, create=False) as opened:
            yield opened
        return
    with store_copy(directory) as opened:
        yield opened


@contextmanager
def store_copy(directory: Path) -> Iterator[RunStore]:
    """The store at `directory` opened from a temporary copy of its regular files (its
    worktrees and any symbolic link left out: a hostile store's link must not lead the copy's
    database elsewhere), closed and removed after. For reading a store without writing one
    byte of it: one this process may not write, or an artifact that must stay as it came."""
    with scratch_folder("loopdsl-store-") as scratch:
        copy = scratch / "store"
        try:
            _copy_regular_files(directory, copy)
        except OSError as exc:
            raise StoreError(f"cannot read the run store {directory}: {exc.strerror or exc}",
                             "check that you may read every file in it") from None
        with RunStore(copy) as opened:
            # After the open, `directory` only names the store in messages and finds its
            # worktrees: both are the user's store, not the copy.
            opened.directory = directory
            yield opened


def _copy_regular_files(source: Path, target: Path) -> None:
    target.mkdir()
    for entry in os.scandir(source):
        if entry.name == "worktrees" or entry.is_symlink():
            continue
        if entry.is_dir(follow_symlinks=False):
            _copy_regular_files(Path(entry.path), target / entry.name)
        elif entry.is_file(follow_symlinks=False):
            shutil.copyfile(entry.path, target / entry.name)
