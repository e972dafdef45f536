"""The run page's parts from event logs of any shape: a record or an event written by hand (or
by a newer loopdsl) renders, never crashes, and everything in it is escaped."""
from __future__ import annotations

from loopdsl.api.records import RunView
from loopdsl.ui import views
from loopdsl.ui.pages import run_page

T0 = "2026-12-03T10:00:00+00:00"


def test_hostile_shapes_render_escaped_and_never_crash() -> None:
    events = [
        {"type": "attempt", "state": "s", "attempt": 1, "t": T0},
        {"type": "attempt", "state": ["not", "a", "name"], "t": "yesterday"},
        {"type": "llm", "state": "s", "usage": "lots", "cost_usd": "free", "model": {"x": 1}, "t": 5},
        {"type": "ok", "state": "s", "result": {"text": None, "error": {"message": "<b>boom</b>"}},
         "t": "2026-12-03T10:00:02+00:00"},
        {"type": "tool_call", "state": "s", "attempt": 1, "turn": 2, "name": "<svg onload=x>", "summary": 42,
         "ok": False, "error": "<i>denied</i>", "t": "2026-12-03T10:00:03+00:00"},
        {"type": "gate", "state": "s", "phase": "after", "gate": "g", "passed": "yes", "message": None},
        {"type": "decision", "state": "s", "decision": "approve", "by": None, "comment": "<u>x</u>"},
        {"type": "decided", "state": "s", "decision": "approve", "by": None, "comment": "<u>x</u>"},
    ]
    record = {"run_id": "r1", "loop": "<script>l</script>", "status": "waiting", "ledger": "spent",
              "usage": {"s": "much", "<t>": {"cost_usd": "NaN?", "attempts": 1}},
              "waiting": {"state": "s", "message": "<img src=x onerror=y>", "choices": "approve"}, "path": "s"}
    timeline = views.timeline(events)
    assert timeline.lanes == ["s"] and len(timeline.bars) == 1 and timeline.bars[0].outcome == "ok"
    assert views.llm_calls(events)[0]["reply"] == "<b>boom</b>" and views.llm_calls(events)[0]["cost"] == "?"
    assert len(views.decisions(events)) == 1
    page = run_page(RunView(record, events, []), csrf="c")
    for text in ("<script>l</script>", "<img src=x onerror=y>", "<svg onload=x>", "<b>boom</b>", "<i>denied</i>",
                 "<u>x</u>", "<t>"):
        assert text not in page
    assert "&lt;img src=x onerror=y&gt;" in page and "&lt;svg onload=x&gt;" in page
    assert 'value="approve"' in page and 'value="reject"' in page  # choices not a list: the default two


def test_a_long_text_is_cut_and_counted() -> None:
    assert views.shown("x" * (views.TEXT_LIMIT + 5)).endswith("... (5 more characters)")
