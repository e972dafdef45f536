"""The run store's on-disk layer: a JSON-only diskcache Disk and the store directory.

diskcache pickles by default, and unpickling a planted row runs code (CVE-2025-69872),
so every value is stored as JSON text and a row that is not our JSON is refused instead
of decoded. The directory carries a marker naming its format, so loopdsl never writes
into a directory that is not its own store. `StoreError` lives here, the lowest layer
that raises it; `store` re-exports it.
"""
from __future__ import annotations

import functools
import json
import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import diskcache
from diskcache.core import MODE_RAW, UNKNOWN

from ...language import bounded_json
from ...runtime.errors import StoreError

# 2: a long path is kept in chunk rows (store_keys.PATH_CHUNK); format 1 stores are upgraded.
FORMAT_VERSION = 2
MARKER_NAME = "loopdsl-store.json"
DB_NAME = diskcache.core.DBNAME  # "cache.db"


_F = TypeVar("_F", bound=Callable[..., Any])


def _guarded(method: _F) -> _F:
    """Turn SQLite and diskcache failures of a store method (its object has `directory`)
    into StoreError: a message, never a traceback."""

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except diskcache.Timeout:
            raise StoreError(
                f"the run store {self.directory} stayed busy (another process is writing)",
                "retry; if it persists, look for a stuck loopdsl process",
            ) from None
        except sqlite3.DatabaseError as exc:
            raise database_error(self.directory, exc) from None

    return wrapper  # type: ignore[return-value]


def database_error(directory: Path, exc: sqlite3.DatabaseError) -> StoreError:
    """The error for an SQLite failure on the store's database. "locked" or "busy" means
    another process held the write lock past the wait (one stopped mid-write, say): the
    database is fine, and moving it aside, the advice for a damaged one, would hide its runs."""
    if isinstance(exc, sqlite3.OperationalError) and ("locked" in str(exc) or "busy" in str(exc)):
        return StoreError(
            f"the run store database {directory / DB_NAME} stayed locked by another process ({exc})",
            "retry once that process is done; if it persists, look for a stopped or stuck loopdsl "
            "process (a suspended job, a paused container) and continue or end it",
        )
    return StoreError(
        f"the run store database {directory / DB_NAME} is unreadable ({exc})",
        "it is left untouched; move the store directory aside (or pick another with --store or "
        "LOOPDSL_STORE) to start a fresh store",
    )


# --------------------------------------------------------------------------- JSON disk


# Built once: `json.dumps` with options builds an encoder per call, and a commit writes three values.
_ENCODE = json.JSONEncoder(separators=(",", ":")).encode


# What `Cache.set` writes for one of our values (inline JSON text, no expiry, no tag, no
# file), as one statement: diskcache's own `set` first SELECTs the row (to delete an old
# side file, which our rows never have) and then INSERTs or UPDATEs it. Its table keeps a
# unique index on (key, raw), and its count and size triggers fire for these statements too.
_UPSERT = (
    "INSERT INTO Cache(key, raw, store_time, expire_time, access_time, access_count, tag, size, mode,"
    " filename, value) VALUES (?, 1, ?, NULL, ?, 0, NULL, 0, ?, NULL, ?)"
    " ON CONFLICT(key, raw) DO UPDATE SET store_time = excluded.store_time, expire_time = NULL,"
    " access_time = excluded.access_time, access_count = 0, tag = NULL, size = 0, mode = excluded.mode,"
    " filename = NULL, value = excluded.value"
)


def put_rows(cache: diskcache.Cache, rows: list[tuple[str, Any]]) -> None:
    """Inside `cache.transact()`: write (key, JSON value) rows as `cache.set` would, read back
    by `cache.get` alike. A commit writes three rows a step; this is its hot path."""
    now = time.time()
    params = []
    for key, value in rows:
        if type(key) is not str:
            raise TypeError(f"run store keys are strings, got {type(key).__name__}")
        params.append((key, now, now, MODE_RAW, _ENCODE(value)))
    cache._con.executemany(_UPSERT, params)  # the transaction's own connection (this thread's)


# Live rows with keys in [low, high), in key order: what `cache.get` would return for each.
_RANGE = (
    "SELECT key, raw, mode, filename, value FROM Cache WHERE key >= ? AND key < ?"
    " AND (expire_time IS NULL OR expire_time > ?) ORDER BY key"
)


def read_range(cache: diskcache.Cache, low: str, high: str) -> list[Any]:
    """The values of the rows whose keys lie in [low, high), in key order, in one query.

    Reading a 1,000-step run's event batches one `cache.get` at a time costs a statement
    and a Python round trip each; one range scan reads them all. Every value goes through
    the same JSON-only, bounded `JsonOnlyDisk.fetch` (and key check) as `cache.get`."""
    disk = cache._disk
    rows = cache._sql(_RANGE, (low, high, time.time())).fetchall()
    values = []
    for key, raw, mode, filename, value in rows:
        disk.get(key, bool(raw))  # refuses a key that is not plain text
        values.append(disk.fetch(mode, filename, value, False))
    return values


class JsonOnlyDisk(diskcache.Disk):
    """Stores string keys and JSON values inline in SQLite; refuses anything else on read.

    Values live inline (never in side files) so a commit is one SQLite transaction and
    nothing outside the database can be half-written by a crash.
    """

    def __init__(self, directory: str, **_settings: Any) -> None:
        # diskcache passes its `disk_*` settings (pickle protocol, min file size): unused.
        super().__init__(directory)

    def put(self, key: Any) -> tuple[Any, bool]:
        if type(key) is not str:
            raise TypeError(f"run store keys are strings, got {type(key).__name__}")
        return key, True

    def get(self, key: Any, raw: bool) -> str:
        if not raw or type(key) is not str:
            raise StoreError(
                "the run store holds a key that loopdsl did not write (not plain text)",
                "the store may have been tampered with; move the store directory aside",
            )
        return key

    def store(self, value: Any, read: bool, key: Any = UNKNOWN) -> tuple[int, int, None, str]:
        if read:
            raise TypeError("the run store does not store file objects")
        text = _ENCODE(value)
        return 0, MODE_RAW, None, text

    def fetch(self, mode: int, filename: Any, value: Any, read: bool) -> Any:
        if mode != MODE_RAW or type(value) is not str or filename is not None:
            raise StoreError(
                "the run store holds a value that is not JSON (possibly a pickle); "
                "it was refused, not loaded",
                "someone else wrote into the store; move the store directory aside and "
                "inspect it",
            )
        try:
            # A record holds a result that holds a reply's JSON: room for both, still bounded;
            # any integer the store could write (Python prints at most 4,300 digits) reads back.
            return bounded_json.loads(value, max_depth=4 * bounded_json.MAX_DEPTH, max_int_digits=4300)
        except ValueError:
            raise StoreError(
                "the run store holds a value that is not valid JSON",
                "the store may be damaged; move the store directory aside",
            ) from None


# --------------------------------------------------------------------------- directory


def _write_marker(directory: Path) -> None:
    marker = directory / MARKER_NAME
    tmp = directory / f".{MARKER_NAME}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps({"format": FORMAT_VERSION, "tool": "loopdsl"}) + "\n")
    os.replace(tmp, marker)  # atomic: a crash never leaves half a marker


def _prepare_directory(directory: Path) -> None:
    """Create or check the store directory. Never deletes or rewrites anything not ours."""
    if directory.exists() and not directory.is_dir():
        raise StoreError(
            f"the run store path {directory} is a file, not a directory",
            "give --store (or LOOPDSL_STORE) a directory, or move that file",
        )
    if not directory.exists():
        directory.mkdir(parents=True, exist_ok=True)
    marker = directory / MARKER_NAME
    if marker.exists():
        try:
            info = json.loads(marker.read_text())
            fmt = info["format"]
            tool = info["tool"]
        except (OSError, ValueError, KeyError, TypeError):
            raise StoreError(
                f"the run store marker {marker} is damaged",
                "it was left untouched; move the store directory aside to start a fresh store",
            ) from None
        if tool != "loopdsl" or not isinstance(fmt, int):
            raise StoreError(
                f"{directory} is not a loopdsl run store (its marker names {tool!r})",
                "give --store (or LOOPDSL_STORE) another directory",
            )
        if fmt > FORMAT_VERSION:
            raise StoreError(
                f"the run store {directory} was written by a newer loopdsl "
                f"(store format {fmt}; this version reads format {FORMAT_VERSION})",
                "upgrade loopdsl (pip install -U loopdsl), or use another store (--store or LOOPDSL_STORE)",
            )
        if fmt < FORMAT_VERSION:
            _write_marker(directory)  # its rows still read; an older loopdsl now refuses it
    else:
        if any(directory.iterdir()):
            raise StoreError(
                f"{directory} exists, is not empty and is not a loopdsl run store "
                f"(no {MARKER_NAME})",
                "nothing was changed; give --store (or LOOPDSL_STORE) an empty or new directory, "
                "or move that directory",
            )
        _write_marker(directory)
    if not (directory / DB_NAME).exists():
        # Pre-create the database owner-only: SQLite gives its -wal/-shm files the same mode.
        fd = os.open(directory / DB_NAME, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        os.close(fd)
    # Run records and responses may hold prompts and outputs: owner-only.
    os.chmod(directory, 0o700)
    gitignore = directory / ".gitignore"
    if not gitignore.exists():
        # `*` ignores everything here, itself included, so `git status` stays clean.
        gitignore.write_text("*\n")
