"""The state of one run: everything needed to resume it, as JSON.

The engine mutates a RunState as it goes and hands it to its recorder at each
commit point; `to_json` / `from_json` are the only (de)serialisation.
"""
from __future__ import annotations

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
_RESULT_EVENTS = frozenset({"ok", "retry", "failed"})


def history_from_events(events: list[dict[str, Any]]) -> dict[str, list[Any]]:
    history: dict[str, list[Any]] = {}
    for event in events:
        if event.get("type") in _RESULT_EVENTS and "result" in event and "state" in event:
            history.setdefault(event["state"], []).append(event["result"])
    return history
