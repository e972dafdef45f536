"""The two pages, rendered to HTML strings: the run list and one run.

The server and `loopdsl show RUN --html FILE` both call `run_page`; the static file has no
decision forms (nothing to post to) and carries the same Content-Security-Policy as a
meta tag, so even a page opened from disk runs no script.
"""
from __future__ import annotations

from typing import Any, Mapping
from urllib.parse import urlencode

from ..api.records import RunPage, RunView, loop_spend, run_diff
from . import views

# No script at all: a reply that escaped escaping still could not run.
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; form-action 'self'; base-uri 'none'"
STATUSES = ("running", "waiting", "completed", "failed", "escalated", "aborted", "budget_exhausted")


def _record_fields(record: Mapping[str, Any]) -> dict[str, Any]:
    ledger = record.get("ledger") if isinstance(record.get("ledger"), dict) else {}
    path = record.get("path") if isinstance(record.get("path"), list) else []
    error = record.get("error") if isinstance(record.get("error"), dict) else None
    return {
        "run_id": views.shown(record.get("run_id"), 64), "loop": views.shown(record.get("loop"), 200),
        "status": views.shown(record.get("status"), 64), "current": views.shown(record.get("current"), 200),
        "started": views.shown(record.get("started_at"), 64), "ended": views.shown(record.get("ended_at"), 64),
        "tokens": ledger.get("tokens", 0), "cost": views.money(ledger.get("cost_usd")), "steps": ledger.get("steps", 0),
        "path_len": len(path), "path_tail": [views.shown(p, 200) for p in path[-30:]],
        # Each part may be missing from a record written elsewhere (`error` is any object).
        "error": {"kind": views.shown(error.get("kind"), 200) or "error", "state": views.shown(error.get("state"), 200),
                  "message": views.shown(error.get("message"), 2000)} if error is not None else None,
        "outputs": views.shown(record.get("outputs") or "", 5000),
    }


LIST_LIMIT = 1000  # entries of one list on a run's page


def run_page(view: RunView, *, store: Any = None, csrf: str | None = None, notice: str = "",
             error: str = "", chart: bool = True) -> str:
    """One run as a page. With `csrf` (the server) a waiting run gets decision forms."""
    record = view.record
    loop = record.get("loop")
    history = loop_spend(str(loop), store) if chart and isinstance(loop, str) and store is not None else []
    children = [_record_fields(child) for child in view.children]
    diff = run_diff(record)
    lists = {"llm_calls": views.llm_calls(view.events), "tool_calls": views.tool_calls(view.events),
             "transcript": view.transcript, "gates": views.gates(view.events), "decisions": views.decisions(view.events)}
    # A long run (200,000 gate checks) made a page of tens of megabytes: each list shows its
    # last LIST_LIMIT entries, and says how many earlier ones `show --json` has.
    omitted = {name: max(0, len(items) - LIST_LIMIT) for name, items in lists.items()}
    return views.environment().get_template("run.html").render(
        csp=CSP, run=_record_fields(record), timeline=views.timeline(view.events), per_state=views.per_state(record),
        omitted=omitted, **{name: items[-LIST_LIMIT:] for name, items in lists.items()},
        waiting=views.waiting(record), csrf=csrf, notice=views.shown(notice, 2000), error=views.shown(error, 4000),
        diff=views.shown(diff, 200_000) if diff is not None else None,
        chart=views.spend_chart(history, str(record.get("run_id"))), children=children,
    )


def runs_page(page: RunPage, *, status: str = "", loop: str = "") -> str:
    def link(offset: int) -> str:
        query = {k: v for k, v in (("status", status), ("loop", loop)) if v}
        return "/?" + urlencode({**query, "offset": max(0, offset)})

    rows = [{"run_id": views.shown(r.run_id, 64), "status": "interrupted" if r.interrupted else views.shown(r.status, 64),
             "loop": views.shown(r.loop, 200), "started": views.shown(r.started_at, 64)[:19].replace("T", " "),
             "cost": views.money(r.cost_usd), "tokens": r.tokens, "steps": r.steps} for r in page.rows]
    return views.environment().get_template("runs.html").render(
        csp=CSP, rows=rows, where=str(page.where), total=page.total, statuses=STATUSES, status=status, loop=loop,
        first=page.offset + 1, last=page.offset + len(rows),
        prev_link=link(page.offset - page.limit) if page.offset > 0 else "",
        next_link=link(page.offset + page.limit) if page.more else "",
    )


__all__ = ["run_page", "runs_page", "CSP"]
