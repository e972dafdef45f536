"""The durable run store: run records, event logs, run locks and stored LLM responses.

The JSON-only diskcache Disk and the directory checks are in `disk`, the run lock's
handle, heartbeat and fencing token in `lock`, path chunks, the per-run memory of a
commit and run-id prefixes in `run_rows`, run ids and keys in `runtime.run_keys`.

One directory per store (by default `.loopdsl/` at the repository root) holding a
diskcache `Cache` (SQLite in WAL mode) that never evicts and stores every value as JSON
text: diskcache pickles by default, and unpickling a planted row runs code
(CVE-2025-69872), so a row that is not our JSON is refused instead of decoded.

Key layout (all keys are strings):
  runs                       list of run ids in creation order (the index)
  run/<id>/record            the run record the engine gives, plus `updated_at`; a path of
                             64 states or more keeps only its tail here, with `path_chunks`
  run/<id>/path/<n:06d>      full chunks of 64 states of that path, each written once
  run/<id>/n                 number of events of the run
  run/<id>/event/<n:010d>    one event, append-only
  lock/<name>                the holder of a run lock (expires unless refreshed)
  owner/<name>               the token of the last process that took the lock (a fencing
                             token: every commit under a lock checks it in its transaction)
  response/<sha256>          paid LLM responses of runs (never evicted); an llm/evaluate one
                             also holds its request's redacted `messages` (older ones do not),
                             an `llm` event names its row in `key` (show --transcript)
  cache/<sha256>             optional cross-run response cache
"""
from __future__ import annotations

import os
import secrets
import socket
import sqlite3
import threading
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping

import diskcache

# The on-disk layer and the run lock live in their own modules; their public names are
# re-exported (see `__all__`) so `from loopdsl.adapters.store.run_store import ...` keeps working.
from .disk import (DB_NAME, FORMAT_VERSION, MARKER_NAME, JsonOnlyDisk, _guarded, _prepare_directory, database_error,
                   put_rows, read_range)
from ...runtime.errors import StoreError
from ...runtime.run_state import events_problem, record_problem
from ...runtime.run_keys import (
    _check_run_id,
    _count_key,
    _event_key,
    _path_key,
    _record_key,
    child_run_id,
    default_store_dir,
)
from .run_rows import RunRows, join_path, match_run_ref
from .lock import RunChanged, RunLock, RunLocked, _holder_is_dead, _lock_key, acquire, check_owner

ACTIVE_STATUSES = ("running", "waiting")
_RUN_ID_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"
_ABSENT = object()  # no record under the key (a stored JSON null is a damaged record)


# --------------------------------------------------------------------------- helpers


def _damaged_entry(run_id: str, problem: str) -> dict[str, Any]:
    return {"run_id": run_id, "status": "damaged", "loop": "?", "damaged": problem}


def _now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


# --------------------------------------------------------------------------- the store


class RunStore:
    """Durable runs: records, event logs, locks and stored LLM responses in one directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        try:
            _prepare_directory(self.directory)
        except OSError as exc:
            raise StoreError(
                f"cannot set up the run store {self.directory}: {exc.strerror or exc}",
                "check the permissions of that path, or give --store (or LOOPDSL_STORE) a writable "
                "directory",
            ) from None
        try:
            self._cache = diskcache.Cache(
                str(self.directory),
                timeout=30,
                disk=JsonOnlyDisk,
                eviction_policy="none",  # never evict a run or a paid response
                # No culling SELECT after every write (~7 us a commit): an expired lock row
                # reads as absent, is reused by the run's next `add` and deleted on release.
                cull_limit=0,
                statistics=False,
                tag_index=False,
                sqlite_journal_mode="wal",
                # NORMAL in WAL mode: a commit survives the death of the process (the
                # durability target); FULL would add an fsync per commit for power loss.
                sqlite_synchronous=1,
                # A commit rewrites the same few pages (the record, the count): a longer WAL
                # copies each into the database once per checkpoint instead of every 1,000
                # frames (~160 steps), and fsyncs less often. 4,000 pages = 16 MB at most.
                sqlite_wal_autocheckpoint=4000,
            )
        except sqlite3.DatabaseError as exc:
            raise database_error(self.directory, exc) from None
        self._locks: set[RunLock] = set()
        self._locks_guard = threading.Lock()
        self._rows = RunRows()  # what this process wrote of each run (see commit)

    # ---- lifecycle

    def close(self) -> None:
        with self._locks_guard:
            held = list(self._locks)
        for handle in held:
            handle.release()
        self._cache.close()

    def __enter__(self) -> RunStore:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    @property
    def worktrees_dir(self) -> Path:
        """Where per-run git worktrees live (ignored by git through the store's .gitignore)."""
        return self.directory / "worktrees"

    # ---- runs

    @_guarded
    def new_run_id(self) -> str:
        while True:
            run_id = "".join(secrets.choice(_RUN_ID_ALPHABET) for _ in range(8))
            if self._cache.get(_count_key(run_id)) is None:
                return run_id

    @_guarded
    def create_run(self, run_id: str, record: dict[str, Any], *, lock: RunLock | None = None) -> None:
        _check_run_id(run_id)
        cache = self._cache
        with cache.transact():
            if lock is not None:
                check_owner(cache, lock)
            if cache.get(_count_key(run_id)) is not None:
                raise StoreError(
                    f"a run with id {run_id!r} already exists in {self.directory}",
                    "use RunStore.new_run_id() for a fresh id",
                )
            ids = cache.get("runs") or []
            ids.append(run_id)
            cache.set("runs", ids)
            cache.set(_count_key(run_id), 0)
            cache.set(_record_key(run_id), {**record, "updated_at": _now_iso()})
        self._rows.forget(run_id)

    @_guarded
    def commit(
        self,
        run_id: str,
        record: dict[str, Any],
        events: Sequence[dict[str, Any]] = (),
        *,
        lock: RunLock | None = None,
        expect: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        """Replace the run record and append events in one atomic transaction.

        With `lock`, the commit happens only while that lock is still this process's (its
        token is the run's owner), checked inside the same transaction: a process that was
        suspended past the lock's ttl and taken over gets RunChanged instead of writing.
        `expect(current_record)` may raise to refuse the commit (a compare-and-set)."""
        cache, rows = self._cache, self._rows
        stamped = {**record, "updated_at": _now_iso()}
        path = stamped.get("path")
        chunks = rows.split_path(run_id, stamped)
        token = lock.token if lock is not None else None
        with cache.transact():
            if lock is not None:
                check_owner(cache, lock)
            count = rows.known_count(run_id, token)
            if count is None:
                count = cache.get(_count_key(run_id))
                if count is None:
                    raise self._unknown(run_id)
            if expect is not None:
                expect(self._join_path(run_id, cache.get(_record_key(run_id))))
            writes: list[tuple[str, Any]] = [(_path_key(run_id, index), chunk) for index, chunk in chunks]
            if events:
                # One row per commit, holding that commit's events: a step's three events
                # cost one write instead of three (the count key counts these batches).
                writes.append((_event_key(run_id, count), list(events)))
                count += 1
                writes.append((_count_key(run_id), count))
            writes.append((_record_key(run_id), stamped))
            put_rows(cache, writes)
        if stamped.get("status") not in ACTIVE_STATUSES:
            rows.forget(run_id)
            return
        rows.path_committed(run_id, path, chunks)
        rows.count_committed(run_id, token, count)

    def _join_path(self, run_id: str, record: Any) -> Any:
        return join_path(record, self._cache.get, run_id, lambda problem: self._damaged(run_id, problem))

    @_guarded
    def load(self, run_id: str) -> dict[str, Any]:
        """The stored record as JSON (any object); `load_run` also checks its shape."""
        try:
            stored = self._cache.get(_record_key(run_id), default=_ABSENT)
        except StoreError as exc:  # a value the store refused to read: say which run and store
            raise self._damaged(run_id, exc.message) from None
        if stored is _ABSENT:
            raise self._unknown(run_id)
        record = self._join_path(run_id, stored)
        if not isinstance(record, dict):  # a JSON null too: damaged, not a run that never was
            kind = "null" if record is None else type(record).__name__
            raise self._damaged(run_id, f"the record is a JSON {kind}, not an object")
        return record

    def load_run(self, run_id: str) -> dict[str, Any]:
        """A run record checked to have the shape `RunState.from_json` needs (else a
        StoreError naming the run and the store, never a crash further on)."""
        record = self.load(run_id)
        problem = record_problem(record)
        if problem is not None:
            raise self._damaged(run_id, problem)
        return record

    @_guarded
    def events(self, run_id: str) -> list[dict[str, Any]]:
        cache = self._cache
        count = cache.get(_count_key(run_id))
        if count is None:
            raise self._unknown(run_id)
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise self._damaged(run_id, "its event count is not a number")
        # Batches are append-only, so every index below the count read above exists.
        batches = read_range(cache, _event_key(run_id, 0), _event_key(run_id, count))
        if len(batches) != count:
            raise self._damaged(run_id, f"it counts {count} event batches but {len(batches)} are stored")
        events: list[dict[str, Any]] = []
        for batch in batches:
            events.extend(batch if isinstance(batch, list) else [batch])
        problem = events_problem(events)
        if problem is not None:
            raise self._damaged(run_id, problem)
        return events

    @_guarded
    def resolve(self, ref: str) -> str:
        return match_run_ref(self._run_ids(), ref, self.directory)

    def _run_ids(self) -> list[str]:
        ids = self._cache.get("runs") or []
        if not isinstance(ids, list):
            raise StoreError(
                f"the run index of the store {self.directory} is damaged (not a list of run ids)",
                "move the store directory aside (or pick another with --store or LOOPDSL_STORE) to start "
                "a fresh store",
            )
        return [run_id for run_id in ids if isinstance(run_id, str)]

    @_guarded
    def list_runs(self, *, check: bool = False) -> list[dict[str, Any]]:
        """Run records, newest first; each carries `run_id`. A record that cannot be read
        (or, with `check`, lacks the shape of a run record) is listed as {run_id, status:
        "damaged", damaged: why}, so one bad record does not hide the others."""
        out = []
        for run_id in reversed(self._run_ids()):
            try:
                stored = self._cache.get(_record_key(run_id), default=_ABSENT)
                if stored is _ABSENT:  # listed in the index, its record not written yet
                    continue
                record = self._join_path(run_id, stored)
            except StoreError as exc:  # not JSON at all, or a part of its path missing
                out.append(_damaged_entry(run_id, exc.message))
                continue
            problem = (record_problem(record) if check and isinstance(record, dict) else
                       None if isinstance(record, dict) else "the record is not a JSON object")
            if problem is not None:
                out.append(_damaged_entry(run_id, problem))
                continue
            record.setdefault("run_id", run_id)
            if self.interrupted(run_id, record):
                record["interrupted"] = True  # its process was killed: `resume` continues it
            out.append(record)
        return out

    def interrupted(self, run_id: str, record: Mapping[str, Any]) -> bool:
        """Whether a `running` record has no live process driving it (killed: `resume` continues it)."""
        return record.get("status") == "running" and not self._driven(run_id)

    def _driven(self, run_id: str) -> bool:
        """Whether a live process holds the run's lock (an expired row reads as absent)."""
        holder = self._holder(run_id)
        return holder is not None and not _holder_is_dead(holder)

    @_guarded
    def active_runs(self, group: str) -> list[str]:
        """Runs of `group` (record key `group`) that are waiting, or running with a live lock."""
        active = []
        for record in self.list_runs():
            if record.get("group") != group or record.get("status") not in ACTIVE_STATUSES:
                continue
            # A `running` record without a live lock is a crashed run, not an active one;
            # a `waiting` run sits at a checkpoint with no process, so holds no lock.
            if record["status"] == "waiting" or self._holder(record["run_id"]) is not None:
                active.append(record["run_id"])
        return active

    def _damaged(self, run_id: str, problem: str) -> StoreError:
        return StoreError(
            f"run {run_id} in the store {self.directory} is damaged: {problem}",
            "it was left untouched and the store's other runs still work (`loopdsl runs` lists them); "
            "to be rid of it, move the store aside (or pick another with --store or LOOPDSL_STORE)",
        )

    def _unknown(self, run_id: str) -> StoreError:
        return StoreError(
            f"no run {run_id!r} in {self.directory}",
            "`loopdsl runs` lists the runs of this store; --store (or LOOPDSL_STORE) selects another",
        )

    # ---- locks

    def _holder(self, name: str) -> dict[str, Any] | None:
        holder = self._cache.get(_lock_key(name))
        return holder if isinstance(holder, dict) else None

    @_guarded
    def lock(self, run_id: str, *, ttl: float = 15.0, wait: float = 0.0) -> RunLock:
        """Acquire the run's cross-process lock (or raise RunLocked saying who holds it).

        `wait` > 0 polls for up to that many seconds before giving up.
        """
        if ttl <= 0:
            raise ValueError("lock ttl must be positive")
        holder_info = {
            "token": secrets.token_hex(16),
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": _now_iso(),
            "ttl": ttl,
        }
        acquire(self._cache, run_id, holder_info, ttl, wait)
        return self._held(run_id, ttl, holder_info)

    def _held(self, run_id: str, ttl: float, holder_info: dict[str, Any]) -> RunLock:
        handle = RunLock(self, run_id, ttl, holder_info)
        with self._locks_guard:
            self._locks.add(handle)
        return handle

    @_guarded
    def _release(self, handle: RunLock) -> None:
        with self._locks_guard:
            self._locks.discard(handle)
        cache = self._cache
        with cache.transact():
            holder = self._holder(handle.name)
            if holder is not None and holder.get("token") == handle.token:
                cache.delete(_lock_key(handle.name))

    # ---- LLM responses

    @_guarded
    def get_response(self, key: str) -> dict[str, Any] | None:
        return self._cache.get(f"response/{key}")

    @_guarded
    def put_response(self, key: str, value: dict[str, Any], *, lock: RunLock | None = None) -> None:
        """Keep a paid response; with `lock`, only while that lock still owns its run."""
        with self._cache.transact():
            if lock is not None:
                check_owner(self._cache, lock)
            self._cache.set(f"response/{key}", value)

    @_guarded
    def get_cached(self, key: str) -> dict[str, Any] | None:
        return self._cache.get(f"cache/{key}")

    @_guarded
    def put_cached(self, key: str, value: dict[str, Any]) -> None:
        self._cache.set(f"cache/{key}", value)


__all__ = [
    "ACTIVE_STATUSES", "DB_NAME", "FORMAT_VERSION", "MARKER_NAME", "JsonOnlyDisk", "RunChanged",
    "RunLock", "RunLocked", "RunStore", "StoreError", "child_run_id", "default_store_dir"
]
