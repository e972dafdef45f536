"""The state of one run: everything needed to resume it, as JSON.

The engine mutates a RunState as it goes and hands it to its run log at each
commit point; `to_json` / `from_json` are the only (de)serialisation.
"""
from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime
from importlib import resources
from typing import Any

from .errors import StoreError

RUNNING, WAITING, COMPLETED, FAILED, ESCALATED, BUDGET_EXHAUSTED, ABORTED = (
    "running", "waiting", "completed", "failed", "escalated", "budget_exhausted", "aborted",
)
STATUSES = (RUNNING, WAITING, COMPLETED, FAILED, ESCALATED, BUDGET_EXHAUSTED, ABORTED)
FINAL_STATUSES = frozenset({COMPLETED, FAILED, ESCALATED, BUDGET_EXHAUSTED, ABORTED})
# The longest `loopdsl abort --reason` a record keeps (characters).
ABORT_REASON_LIMIT = 2_000


def aborted_error(state: str, reason: str) -> dict[str, Any]:
    """The error of a run a person ended with `loopdsl abort` (either backend), with their reason."""
    reason = reason[:ABORT_REASON_LIMIT]
    return {"state": state, "kind": "aborted",
            "message": "aborted with `loopdsl abort`" + (f": {reason}" if reason.strip() else "")}


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
# The run id of a run kept in memory only (`--no-store`): nothing can decide or resume it later.
IN_MEMORY_PREFIX = "mem-"
# What a stored record may look like: loopdsl/data/run-record.schema.json (published with the
# loop schemas), checked with fastjsonschema: it compiles the schema to Python once (~10 ms),
# then checks a record in ~10 us where jsonschema takes ~400 us, and `loopdsl runs` checks
# every record of the store. The JSON type names, as said in a message:
_JSON_TYPES = {dict: "object", list: "array", str: "string", bool: "boolean", int: "integer", float: "number",
               type(None): "null"}


def stamp_time(stamp: str) -> datetime:
    """A stored time stamp (`utc_now`'s ISO 8601, or RFC 3339's `Z`) as an aware datetime;
    ValueError for anything else. The record schema's `date-time` format is this very check,
    so the stamps a loaded record's code compares (a checkpoint's `since`, a decision's `at`)
    always parse."""
    text = stamp[:-1] + "+00:00" if stamp.endswith(("Z", "z")) else stamp
    parsed = datetime.fromisoformat(text)
    if parsed.tzinfo is None:
        raise ValueError(f"a time stamp without a time zone: {stamp[:40]!r}")
    return parsed


def _is_stamp(value: str) -> bool:
    try:
        stamp_time(value)
        return True
    except ValueError:
        return False


@functools.cache
def _published_schema() -> dict[str, Any]:
    text = resources.files("loopdsl").joinpath("data", "run-record.schema.json").read_text(encoding="utf-8")
    return dict(json.loads(text))


@functools.cache
def _validator(definition: str | None) -> Callable[[Any], Any]:
    """Of a record (None), or of one of the schema's `definitions` (a stored response's kind)."""
    import fastjsonschema  # deferred: only reading a stored run needs it

    schema = _published_schema()
    part = schema if definition is None else {"$schema": schema["$schema"], **schema["definitions"][definition]}
    return fastjsonschema.compile(part, formats={"date-time": _is_stamp})


@functools.cache
def _validators() -> tuple[Callable[[Any], Any], Callable[[Any], Any]]:
    """Of a record, and of a run's list of events."""
    import fastjsonschema

    schema = _published_schema()
    events = {"$schema": schema["$schema"], "type": "array", "items": schema["definitions"]["event"]}
    return _validator(None), fastjsonschema.compile(events, formats={"date-time": _is_stamp})


# The kinds of stored response, as the schema's `definitions` name them, and as a message says them.
RESPONSE_KINDS = {"model_reply": "model reply", "agent_start": "agent request", "agent_tool": "tool call",
                  "workspace_mark": "workspace commit"}


def checked_response(value: Any, kind: str, run_id: str) -> dict[str, Any] | None:
    """A response read back from the store (a paid reply, an agent's tool call) as its kind's
    schema says it looks, or None when none was stored. The store is hostile like the record:
    one of the wrong shape is a StoreError naming the run and the place, and the run is left
    as it is (nothing is paid again on top of a response that cannot be read)."""
    if value is None:
        return None
    problem = _problem(_validator(kind), value, lambda path: f"'{'.'.join(path)}'" if path else "it")
    if problem is not None:
        raise StoreError(f"run {run_id} is damaged: a stored {RESPONSE_KINDS[kind]}: {problem}",
                         f"abort the run (`loopdsl abort {run_id}`) and start it again")
    return dict(value)


def record_problem(data: Any) -> str | None:
    """What is wrong with the shape of a stored run record, or None when it can be loaded.

    The store holds JSON, but a record of the right JSON and the wrong shape (edited,
    written by another tool) must give a message, never a crash deep in `show` or `resume`.
    The message names the place and the JSON types, never the stored value itself."""
    return _problem(_validators()[0], data, lambda path: f"'{'.'.join(path)}'" if path else "the record")


def events_problem(events: Any) -> str | None:
    """What is wrong with a run's stored event log, or None (events are counted from 1)."""
    def place(path: list[str]) -> str:
        if not path:
            return "the event log"
        event = f"event {int(path[0]) + 1}"
        return f"{event}: '{'.'.join(path[1:])}'" if path[1:] else event

    return _problem(_validators()[1], events, place)


def _problem(validate: Callable[[Any], Any], data: Any, place_of: Callable[[list[str]], str]) -> str | None:
    from fastjsonschema import JsonSchemaValueException

    try:
        validate(data)
        return None
    except JsonSchemaValueException as error:
        # path[0] is fastjsonschema's name for the whole; a stored key may be long: cut
        path = [str(part)[:60] for part in error.path[1:]]
        value, rule, definition = error.value, error.rule, error.definition or {}
    found, place = _JSON_TYPES.get(type(value), type(value).__name__), place_of(path)
    if rule == "required":
        missing = next((name for name in definition["required"] if name not in value), "?")
        return f"{place} has no '{missing}'"
    if rule == "type":
        wanted = definition["type"] if isinstance(definition["type"], str) else " or ".join(definition["type"])
        return f"{place} is a JSON {found}, not {'an' if wanted[0] in 'aeiou' else 'a'} {wanted}"
    if rule == "enum":
        return f"{place} {str(value)[:40]!r} is not one of {', '.join(map(str, definition['enum']))}"
    if rule == "minimum":
        return f"{place} is below {definition['minimum']}"
    if rule == "format":
        return f"{place} is not an ISO 8601 time with a time zone"
    return f"{place} does not have the shape loopdsl writes"


_RESULT_EVENTS = frozenset({"ok", "retry", "failed"})


def history_from_events(events: list[dict[str, Any]]) -> dict[str, list[Any]]:
    history: dict[str, list[Any]] = {}
    for event in events:
        if event.get("type") in _RESULT_EVENTS and "result" in event and "state" in event:
            history.setdefault(event["state"], []).append(event["result"])
    return history
