"""One page of a store's runs without loading every record: for the web UI's run list.

`RunStore.list_runs` decodes every record (fine for `loopdsl runs`, too slow for a store of
10,000 runs on each page view). Here SQLite itself reads the few fields a list shows out of
the JSON text of the record rows (`json_extract`), newest first by row id (a record's row is
inserted once, when the run is created, and updated in place after: `disk.put_rows` upserts), so a page costs one
query that stops as soon as the page is full. Values are JSON text inline in the `Cache`
table (see `disk.JsonOnlyDisk`), which is what makes this possible.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ...runtime.run_keys import _check_run_id
from .disk import _guarded
from .run_store import RunStore

# A record row: 'run/<id>/record'. Rows that are not a JSON object are left out of pages
# (`loopdsl runs` reports them as damaged). NOT INDEXED: walking the table backwards by row
# id stops after a page of rows; the key index would find every record and then sort them.
_RECORDS = "FROM Cache NOT INDEXED WHERE key GLOB 'run/*/record' AND raw = 1"
_VALID = "json_valid(value) AND json_type(value) = 'object'"
_FIELDS = (
    "substr(key, 5, length(key) - 11), json_extract(value, '$.status'), json_extract(value, '$.loop'),"
    " json_extract(value, '$.started_at'), json_extract(value, '$.ended_at'),"
    " json_extract(value, '$.ledger.cost_usd'), json_extract(value, '$.ledger.tokens'),"
    " json_extract(value, '$.ledger.steps')"
)
_NAMES = ("run_id", "status", "loop", "started_at", "ended_at", "cost_usd", "tokens", "steps")
_TOP_LEVEL = "coalesce(json_extract(value, '$.parent'), '') = ''"


@dataclass
class RunSummary:
    """What a list row shows of a run (any field may be of a hostile type: shown, never trusted)."""

    run_id: str
    status: Any
    loop: Any
    started_at: Any
    ended_at: Any
    cost_usd: Any
    tokens: Any
    steps: Any
    interrupted: bool = False


def _where(status: str | None, loop: str | None) -> tuple[str, list[Any]]:
    """The filter; each field test is preceded by a plain substring test of the stored JSON
    text (written compact, ASCII-only by `JsonOnlyDisk`), which skips most rows of a
    filtered scan without parsing them; the JSON test then decides."""
    clauses: list[str] = []
    params: list[Any] = []
    for name, wanted in (("status", status), ("loop", loop)):
        if wanted:
            clauses.append("instr(value, ?) > 0")
            params.append(f'"{name}":{json.dumps(wanted)}')
    clauses += [_VALID, _TOP_LEVEL]
    for name, wanted in (("status", status), ("loop", loop)):
        if wanted:
            clauses.append(f"json_extract(value, '$.{name}') = ?")
            params.append(wanted)
    return " AND ".join(clauses), params


@_guarded
def summaries(store: RunStore, *, status: str | None = None, loop: str | None = None,
              offset: int = 0, limit: int = 50) -> list[RunSummary]:
    """Up to `limit` top-level runs, newest first, after skipping `offset`."""
    where, params = _where(status, loop)
    sql = f"SELECT {_FIELDS} {_RECORDS} AND {where} ORDER BY rowid DESC LIMIT ? OFFSET ?"
    rows = store._cache._sql(sql, (*params, max(0, limit), max(0, offset))).fetchall()
    out = [RunSummary(**dict(zip(_NAMES, row))) for row in rows]
    for summary in out:
        if summary.status == "running" and not store._driven(summary.run_id):
            summary.interrupted = True  # its process was killed: `resume` continues it
    return out


@_guarded
def spend_history(store: RunStore, loop: str, limit: int = 200) -> list[RunSummary]:
    """The latest `limit` top-level runs of `loop`, oldest first (a spend-over-time chart)."""
    return list(reversed(summaries(store, loop=loop, limit=limit)))


@_guarded
def run_count(store: RunStore) -> int:
    """How many runs (sub-loop runs included) the store's index holds, counted by SQLite
    (decoding the index of 10,000 ids in Python would cost more than the page itself)."""
    row = store._cache._sql("SELECT json_array_length(value) FROM Cache WHERE key = 'runs' AND raw = 1"
                            " AND json_valid(value) AND json_type(value) = 'array'").fetchone()
    return int(row[0]) if row else 0


@_guarded
def child_ids(store: RunStore, run_id: str) -> list[str]:
    """The ids of the sub-loop runs of `run_id` (their ids extend the parent's with '.'),
    found through the key index instead of decoding the whole run index."""
    _check_run_id(run_id)  # letters, digits, '.', '_', '-': nothing GLOB would read as a pattern
    rows = store._cache._sql("SELECT key FROM Cache WHERE key GLOB ? AND raw = 1 ORDER BY rowid",
                             (f"run/{run_id}.*/record",)).fetchall()
    return [key[4:-len("/record")] for (key,) in rows]


__all__ = ["RunSummary", "summaries", "spend_history", "run_count", "child_ids"]
