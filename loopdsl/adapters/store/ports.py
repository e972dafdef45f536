"""The run store behind the engine's two recording ports: the run log (state and events,
committed per run) and the response store (paid responses, shared by a run and its children)."""
from __future__ import annotations

from typing import Any, Callable, Mapping

from ...runtime.run_state import RunState
from ...runtime.sealed_inputs import seal_inputs
from .run_store import RunLock, RunStore


class StoreRunLog:
    """Commits a run's state and events to the durable run store."""

    durable = True

    def __init__(self, store: RunStore, run_id: str, lock: RunLock | None = None,
                 secrets: Mapping[str, str] | None = None):
        self.store = store
        self.run_id = run_id
        # The run's lock: every commit checks, in its transaction, that it is still ours.
        self.lock = lock
        self.secrets = secrets or {}  # declared secrets' values: kept out of the recorded inputs

    def commit(self, run: RunState, events: list[dict[str, Any]], *,
               expect: Callable[[dict[str, Any]], None] | None = None) -> None:
        record = stored_record(run, self.secrets)
        self.store.commit(self.run_id, record, events, lock=self.lock, expect=expect)


class StoreResponses:
    """Paid responses in the run store; a write checks the run's lock like a commit does."""

    def __init__(self, store: RunStore, lock: RunLock | None = None):
        self.store = store
        self.lock = lock

    def get_response(self, key: str) -> dict[str, Any] | None:
        return self.store.get_response(key)

    def put_response(self, key: str, value: dict[str, Any]) -> None:
        self.store.put_response(key, value, lock=self.lock)

    def get_cached(self, key: str) -> dict[str, Any] | None:
        return self.store.get_cached(key)

    def put_cached(self, key: str, value: dict[str, Any]) -> None:
        self.store.put_cached(key, value)


def stored_record(run: RunState, secrets: Mapping[str, str]) -> dict[str, Any]:
    """The record a commit writes: the run as JSON, its inputs sealed (runtime/sealed_inputs.py)."""
    record = run.to_json()
    record["inputs"] = seal_inputs(record["inputs"], secrets, str(run.meta.get("seal") or ""))
    record["group"] = run.meta.get("group")
    return record
