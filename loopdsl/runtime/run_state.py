"""The state of one run: everything needed to resume it, as JSON.

The engine mutates a RunState as it goes and hands it to its run log at each
commit point; `to_json` / `from_json` are the only (de)serialisation.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

RUNNING, WAITING, COMPLETED, FAILED, ESCALATED, BUDGET_EXHAUSTED, ABORTED = (
    "running", "waiting", "completed", "failed", "escalated", "budget_exhausted", "aborted",
)
STATUSES = (RUNNING, WAITING, COMPLETED, FAILED, ESCALATED, BUDGET_EXHAUSTED, ABORTED)
FINAL_STATUSES = frozenset({COMPLETED, FAILED, ESCALATED, BUDGET_EXHAUSTED, ABORTED})


@dataclass
class RunState:
    run_id: str
    loop: str  # loop name
    start: str
    status: str = RUNNING
    current: str = ""  # the state about to run (its visit already counted)
    path: list[str] = field(default_factory=list)
    visits: dict[str, int] = field(default_factory=dict)
    results: dict[str, Any] = field(default_factory=dict)
    history: dict[str, list[Any]] = field(default_factory=dict)
    feedback: str = ""
    error: dict[str, Any] | None = None  # the latest state failure: {state, kind, message}
    ledger: dict[str, Any] = field(default_factory=dict)
    inputs: dict[str, Any] = field(default_factory=dict)
    outputs: dict[str, Any] = field(default_factory=dict)
    started_at: str = ""
    ended_at: str | None = None
    date: str = ""  # run.date: the start date in the schedule's timezone, fixed on resume
    active_s: float = 0.0  # wall time spent running (waiting for a person excluded)
    # An attempt whose side effects may have started: {state, visit, attempt, kind, ...}.
    pending: dict[str, Any] | None = None
    # Set while status == waiting: {state, since, message, choices, timeout_s, reason}.
    waiting: dict[str, Any] | None = None
    # A person's decision recorded by approve/reject/decide for the waiting state.
    decision: dict[str, Any] | None = None
    # Per-state totals for the summary: {state: {tokens, cost_usd, seconds, attempts}}.
    usage: dict[str, dict[str, float]] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)  # loop path, file hashes, workspace ...
    seq: int = 0  # events emitted so far

    def to_json(self) -> dict[str, Any]:
        """The record committed at each step. `history` is left out: it grows with every
        attempt, so it lives in the append-only event log (`result` of each `ok`, `retry`
        and `failed` event) and `history_from_events` rebuilds it on resume."""
        # No deep copy: the store serialises the record at once.
        return {name: getattr(self, name) for name in _RECORD_FIELDS}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "RunState":
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})

    @property
    def is_final(self) -> bool:
        return self.status in FINAL_STATUSES


_RECORD_FIELDS = tuple(f.name for f in fields(RunState) if f.name != "history")
_JSON_SCALARS = (str, int, float, bool, type(None))
_MAX_VALUE_DEPTH = 100


class NotJsonValue(TypeError):
    """A value computed by the loop (a `set` value, an output) that the run record cannot hold."""


def json_value(value: Any, depth: int = 0) -> Any:
    """`value` as plain JSON data (mappings become dicts, tuples lists), or NotJsonValue.

    Everything a run keeps is committed as JSON: a value that is not (e.g. a method such
    as `feedback.upper`) must fail its state, not the commit after it. A mapping view such
    as `budget` is kept as the plain dict it reads as."""
    if isinstance(value, _JSON_SCALARS):
        return value
    if depth >= _MAX_VALUE_DEPTH:
        raise NotJsonValue(f"the value is nested more than {_MAX_VALUE_DEPTH} levels deep")
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise NotJsonValue(f"a mapping key {str(key)[:40]!r} is a {type(key).__name__}, not a string")
            out[key] = json_value(item, depth + 1)
        return out
    if isinstance(value, (list, tuple)):
        return [json_value(item, depth + 1) for item in value]
    raise NotJsonValue(f"a {type(value).__name__} is not a JSON value (strings, numbers, booleans, null, "
                       "lists and mappings are)")
_STR, _NUM, _DICT, _LIST = (str,), (int, float), (dict,), (list,)
# The JSON type of each stored field (None allowed where the field is optional).
_FIELD_TYPES: dict[str, tuple[tuple[type, ...], bool]] = {
    "run_id": (_STR, False), "loop": (_STR, False), "start": (_STR, False), "status": (_STR, False),
    "current": (_STR, False), "path": (_LIST, False), "visits": (_DICT, False), "results": (_DICT, False),
    "feedback": (_STR, False), "error": (_DICT, True), "ledger": (_DICT, False), "inputs": (_DICT, False),
    "outputs": (_DICT, False), "started_at": (_STR, False), "ended_at": (_STR, True), "date": (_STR, False),
    "active_s": (_NUM, False), "pending": (_DICT, True), "waiting": (_DICT, True), "decision": (_DICT, True),
    "usage": (_DICT, False), "meta": (_DICT, False), "seq": ((int,), False),
}


def record_problem(data: Any) -> str | None:
    """What is wrong with the shape of a stored run record, or None when it can be loaded.

    The store holds JSON, but a record of the right JSON and the wrong shape (edited,
    written by another tool) must give a message, never a crash deep in `show` or `resume`."""
    if not isinstance(data, dict):
        return f"the record is a JSON {type(data).__name__}, not an object"
    for name in ("loop", "status"):
        if name not in data:
            return f"the record has no '{name}'"
    for name, (types, optional) in _FIELD_TYPES.items():
        value = data.get(name)
        if name not in data or (value is None and optional):
            continue
        if not isinstance(value, types) or isinstance(value, bool) and bool not in types:
            return f"'{name}' is a JSON {type(value).__name__}, not the {types[0].__name__} loopdsl writes"
    if data["status"] not in STATUSES:
        return f"'status' {str(data['status'])[:40]!r} is not one of {', '.join(STATUSES)}"
    return _nested_problem(data)


def _nested_problem(data: dict[str, Any]) -> str | None:
    if not all(isinstance(step, str) for step in data.get("path", ())):
        return "'path' holds a value that is not a state name"
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in data.get("visits", {}).values()):
        return "'visits' holds a count that is not an integer"
    for name in ("results", "usage"):
        if not all(isinstance(v, dict) for v in data.get(name, {}).values()):
            return f"'{name}' holds an entry that is not an object"
    ledger = data.get("ledger", {})
    for key in ("tokens", "cost_usd", "cost_picousd", "steps"):
        if key in ledger and (not isinstance(ledger[key], (int, float)) or isinstance(ledger[key], bool)):
            return f"'ledger.{key}' is not a number"
    outstanding = ledger.get("outstanding", [])
    if not isinstance(outstanding, list) or not all(isinstance(item, dict) for item in outstanding):
        return "'ledger.outstanding' is not a list of reservations"
    for name in ("pending", "waiting"):
        part = data.get(name) or {}
        if "state" in part and not isinstance(part["state"], str):
            return f"'{name}.state' is not a state name"
    return None


def events_problem(events: Any) -> str | None:
    """What is wrong with a run's stored event log, or None."""
    if not isinstance(events, list):
        return "the event log is not a list"
    if not all(isinstance(event, dict) for event in events):
        return "an event is not a JSON object"
    return None
_RESULT_EVENTS = frozenset({"ok", "retry", "failed"})


def history_from_events(events: list[dict[str, Any]]) -> dict[str, list[Any]]:
    history: dict[str, list[Any]] = {}
    for event in events:
        if event.get("type") in _RESULT_EVENTS and "result" in event and "state" in event:
            history.setdefault(event["state"], []).append(event["result"])
    return history
