"""What an activity may hand back to the workflow: Temporal warns at 256 KiB a payload and
refuses 2 MB (an activity whose result is refused never completes, and a history over
50 MB ends the run), so every result is checked here before it leaves the worker.

Text a command or a tool printed is cut to FIELD_LIMIT per field (head and tail kept, the
cut marked, as the local backend marks its own 1 MiB cap) and flagged `truncated`; a
result still over RESULT_LIMIT (a paid model reply cannot be cut without changing it)
becomes an error the engine reports with both sizes, never a stuck workflow.
"""
from __future__ import annotations

import json
from typing import Any

from ...runtime.tools.base import safe_output

FIELD_LIMIT = 256 * 1024  # bytes of one text field (Temporal's payload warning size)
RESULT_LIMIT = 1536 * 1024  # bytes of one result, under the 2 MB payload limit with room for the envelope


class PayloadTooLarge(Exception):
    """A result that cannot be cut to fit (its message says what and how big)."""


def size_of(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False, default=str).encode("utf-8"))


def cut_text(value: Any, limit: int = FIELD_LIMIT) -> tuple[Any, bool]:
    """`value` with every string over `limit` bytes cut (recursively); and whether any was."""
    if isinstance(value, str):
        if len(value) * 4 <= limit or len(value.encode("utf-8")) <= limit:
            return value, False
        return safe_output(value, limit=limit, redact=str)
    if isinstance(value, dict):
        cut_any = False
        out = {}
        for key, item in value.items():
            out[key], cut = cut_text(item, limit)
            cut_any = cut_any or cut
        return out, cut_any
    if isinstance(value, list):
        pairs = [cut_text(item, limit) for item in value]
        return [p[0] for p in pairs], any(p[1] for p in pairs)
    return value, False


def fitted(result: dict[str, Any], what: str, *, cut: bool) -> dict[str, Any]:
    """`result` as it may go into the history (text cut when `cut`), or PayloadTooLarge."""
    if cut:
        result, was_cut = cut_text(result)
        if was_cut and "truncated" in result:
            result["truncated"] = True
    size = size_of(result)
    if size > RESULT_LIMIT:
        raise PayloadTooLarge(f"the {what} returned {size:,} bytes, more than the {RESULT_LIMIT:,} a result may "
                              "carry into a Temporal workflow's history")
    return result


def summary_within_limit(record: dict[str, Any]) -> dict[str, Any]:
    """A run's record as the workflow returns it or a query shows it: whole when it fits;
    else without its per-state history (the events keep it) and with its text cut ever
    shorter until it does, marked `trimmed` (outputs and results then say where they were cut)."""
    if size_of(record) <= RESULT_LIMIT:
        return record
    trimmed = dict(record, history={name: [] for name in record.get("history") or {}})
    limit = FIELD_LIMIT
    while limit >= 1024:
        trimmed, _ = cut_text(trimmed, limit)
        if size_of(trimmed) <= RESULT_LIMIT:
            break
        limit //= 4
    trimmed["trimmed"] = True
    return trimmed


def recent_events(events: list[dict[str, Any]], budget: int, most: int = 500) -> list[dict[str, Any]]:
    """The last events (at most `most`, text cut) that fit in `budget` bytes, oldest first."""
    kept: list[dict[str, Any]] = []
    for event in reversed(events[-most:]):
        event, _ = cut_text(event, FIELD_LIMIT // 4)
        budget -= size_of(event)
        if budget < 0:
            break
        kept.append(event)
    return kept[::-1]
