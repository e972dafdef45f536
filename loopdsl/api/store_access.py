"""Opening the run store a command names, and the error for a user's mistake outside the
loop file. Apart from api.runs so that commands that only read the store (`show`, `runs`,
`clean`) start without importing the engine."""
from __future__ import annotations

from pathlib import Path

from ..adapters.store.run_store import RunStore, default_store_dir
from ..language.errors import LoopdslError
from ..runtime.errors import StoreError


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
