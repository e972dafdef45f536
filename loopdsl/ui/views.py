"""What the web pages show, built from what the API returns, and the pages rendered.

Pure functions of a run's record and events (no web framework here): `loopdsl show RUN
--html FILE` renders the same run page as the server does. Every value from a run is
hostile (a model reply may hold `<script>`): the Jinja environment autoescapes every
substitution and shows control and bidi characters as escapes, the templates never mark run
data `safe`, and texts are redacted of the secrets the process knows before they are shown.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Iterable, Mapping

import jinja2
import markupsafe

from ..adapters.terminal import _money
from ..language.terminal_safe import visible
from ..runtime.redaction import redact_printed

TEXT_LIMIT = 20_000  # characters of one reply or output shown; the rest is counted
BAR_MIN_PCT = 0.15  # a bar of an instant step stays visible


def money(value: Any) -> str:
    """Dollars as `loopdsl show` writes them; a value that is not a number shows as '?'."""
    try:
        return _money(float(value or 0))
    except (TypeError, ValueError, OverflowError):
        return "?"


def shown(value: Any, limit: int = TEXT_LIMIT) -> str:
    """Any value from a run as redacted text of bounded length (escaped later, by Jinja)."""
    text = value if isinstance(value, str) else "" if value is None else str(value)
    if len(text) > limit:
        text = text[:limit] + f"\n... ({len(text) - limit} more characters)"
    return redact_printed(text)


def _time(value: Any) -> float | None:
    try:
        return datetime.fromisoformat(str(value)).timestamp()
    except (TypeError, ValueError, OverflowError):
        return None


@dataclass
class Bar:
    state: str
    lane: int
    attempt: Any
    start: float
    end: float
    outcome: str = "running"
    style: str = ""  # its place on the time axis, as CSS (computed once the span is known)


@dataclass
class Timeline:
    lanes: list[str] = field(default_factory=list)
    bars: list[Bar] = field(default_factory=list)
    seconds: float = 0.0


def timeline(events: Iterable[Mapping[str, Any]]) -> Timeline:
    """One bar per state attempt, from its `attempt` event to the next step (or the wait,
    or the end), in one lane per state: a Gantt chart of the run."""
    out, lanes, last_t, first_t = Timeline(), {}, None, None
    names: dict[Any, str] = {}  # a state's shown name, redacted once (a long run repeats a few names)
    open_bar: Bar | None = None
    for event in events:
        t = _time(event.get("t"))
        if t is None:
            continue
        first_t = t if first_t is None else first_t
        last_t = t
        kind = event.get("type")
        if kind in ("attempt", "end", "waiting", "resume") and open_bar is not None:
            open_bar.end, open_bar = t, None
        raw = event.get("state")
        name = names.get(raw) if isinstance(raw, str) else None
        if name is None:
            name = shown(raw, 200)
            if isinstance(raw, str):
                names[raw] = name
        if kind == "attempt":
            lane = lanes.setdefault(name, len(lanes))
            open_bar = Bar(name, lane, event.get("attempt"), t, t)
            out.bars.append(open_bar)
        elif kind in ("ok", "failed") and out.bars and out.bars[-1].state == name:
            out.bars[-1].outcome = "ok" if kind == "ok" else "failed"
            out.bars[-1].end = t
        elif kind == "waiting" and out.bars:
            out.bars[-1].outcome = "waiting"
    if open_bar is not None and last_t is not None:
        open_bar.end = last_t
    out.lanes = list(lanes)
    span = (last_t - first_t) if first_t is not None and last_t is not None else 0.0
    out.seconds = span
    for bar in out.bars:
        left = 100.0 * (bar.start - first_t) / span if span > 0 and first_t is not None else 0.0
        width = max(BAR_MIN_PCT, 100.0 * (bar.end - bar.start) / span if span > 0 else 100.0)
        bar.style = f"left:{min(left, 100.0 - BAR_MIN_PCT):.3f}%;width:{width:.3f}%"
    return out


def llm_calls(events: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each model call with the reply its attempt ended with (from the attempt's result)."""
    calls: list[dict[str, Any]] = []
    pending: dict[Any, list[dict[str, Any]]] = {}
    for event in events:
        kind = event.get("type")
        if kind == "llm":
            usage = event.get("usage") if isinstance(event.get("usage"), dict) else {}
            call = {"state": shown(event.get("state"), 200), "attempt": event.get("attempt"),
                    "model": shown(event.get("model"), 200), "tokens_in": usage.get("prompt_tokens", 0),
                    "tokens_out": usage.get("completion_tokens", 0), "failed": bool(event.get("failed")),
                    "cost": money(0 if event.get("cached") else event.get("cost_usd")),
                    "tag": "cached" if event.get("cached") else "replayed" if event.get("replayed") else "",
                    "reply": ""}
            calls.append(call)
            pending.setdefault(event.get("state"), []).append(call)
        elif kind in ("ok", "failed"):
            result = event.get("result") if isinstance(event.get("result"), dict) else {}
            text = result.get("text")
            if not text and isinstance(result.get("error"), dict):
                text = result["error"].get("message")
            for call in pending.pop(event.get("state"), []):
                call["reply"] = shown(text)
    return calls


def tool_calls(events: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [{"state": shown(e.get("state"), 200), "attempt": e.get("attempt"), "turn": e.get("turn"),
             "name": shown(e.get("name"), 200), "summary": shown(e.get("summary"), 2000), "ok": bool(e.get("ok")),
             "error": shown(e.get("error"), 2000), "duration": e.get("duration_s")}
            for e in events if e.get("type") == "tool_call"]


def gates(events: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [{"state": shown(e.get("state"), 200), "phase": shown(e.get("phase"), 20), "gate": shown(e.get("gate"), 200),
             "passed": bool(e.get("passed")), "message": shown(e.get("message"), 2000), "duration": e.get("duration_s")}
            for e in events if e.get("type") == "gate"]


def decisions(events: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Decisions once each: a recorded one (`decision`) and the run taking it (`decided`) agree."""
    seen = {(str(e.get("state")), str(e.get("decision")), str(e.get("by")), str(e.get("at"))): e
            for e in events if e.get("type") in ("decision", "decided")}
    return [{"state": shown(e.get("state"), 200), "decision": shown(e.get("decision"), 200), "by": shown(e.get("by"), 200),
             "at": shown(e.get("at"), 64), "comment": shown(e.get("comment"), 2000)} for e in seen.values()]


def per_state(record: Mapping[str, Any]) -> list[dict[str, Any]]:
    usage = record.get("usage") if isinstance(record.get("usage"), dict) else {}
    rows = []
    for name, figures in usage.items():
        figures = figures if isinstance(figures, dict) else {}
        rows.append({"state": shown(name, 200), "attempts": figures.get("attempts", 0), "tokens": figures.get("tokens", 0),
                     "cost": money(figures.get("cost_usd")), "seconds": figures.get("seconds", 0)})
    return rows


def spend_chart(runs: Iterable[Any], current: str = "") -> list[dict[str, Any]]:
    """Bars for a spend-per-run chart: x by start time, height by cost (percent of the axes)."""
    points = [(t, r) for r in runs if (t := _time(r.started_at)) is not None]
    if not points:
        return []
    costs = []
    for _, r in points:
        try:
            costs.append(max(0.0, float(r.cost_usd or 0)))
        except (TypeError, ValueError, OverflowError):
            costs.append(0.0)
    low, high, top = points[0][0], points[-1][0], max(costs) or 1.0
    span = (high - low) or 1.0
    width = max(0.4, min(4.0, 90.0 / len(points)))
    return [{"x": min(100.0 - width, 100.0 * (t - low) / span), "w": width, "h": max(0.5, 100.0 * cost / top),
             "run_id": shown(r.run_id, 64), "cost": money(cost), "started": shown(r.started_at, 64),
             "current": r.run_id == current} for (t, r), cost in zip(points, costs)]


def waiting(record: Mapping[str, Any]) -> dict[str, Any] | None:
    """The checkpoint a waiting run asks about (None when nothing is to decide)."""
    info = record.get("waiting")
    if record.get("status") != "waiting" or not isinstance(info, dict) or record.get("decision"):
        return None
    choices = info.get("choices") if isinstance(info.get("choices"), list) else ["approve", "reject"]
    return {"state": shown(info.get("state"), 200), "message": shown(info.get("message")),
            "since": shown(info.get("since"), 64), "choices": [shown(c, 200) for c in choices]}


@functools.lru_cache(maxsize=1)
def _inert(value: Any) -> Any:
    """Every text a template prints, its control and bidi characters shown as escapes, as on a
    terminal: a right-to-left override in a checkpoint message would otherwise make the
    browser show other words than the run's above the Approve button (Trojan Source)."""
    return visible(value) if isinstance(value, str) and not isinstance(value, markupsafe.Markup) else value


def environment() -> jinja2.Environment:
    """Templates shipped in the package, every substitution HTML-escaped and made inert."""
    return jinja2.Environment(loader=jinja2.PackageLoader("loopdsl.ui", "templates"), finalize=_inert,
                              autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)


__all__ = ["timeline", "llm_calls", "tool_calls", "gates", "decisions", "per_state", "spend_chart", "waiting",
           "environment", "money", "shown"]
