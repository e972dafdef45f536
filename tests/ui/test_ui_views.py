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


def test_an_error_without_its_kind_or_state_renders() -> None:
    """`error` in a record is any object to the record schema; the page once asked for its
    `kind` under StrictUndefined and answered 500 (and `show --html` an internal error)."""
    for error, shown in (({"message": "boom"}, "error: boom"), ({}, "error: </pre>"),
                         ({"kind": "gate", "state": "s", "message": "m"}, "gate in s: m")):
        record = {"run_id": "r1", "loop": "l", "status": "failed", "error": error}
        assert shown in run_page(RunView(record, [], []))


def test_bidi_and_control_characters_are_shown_as_escapes_on_every_page_part() -> None:
    """A right-to-left override in a checkpoint message made the browser show other words
    than the run's above the Approve button; the terminal printer escaped it, the page did not."""
    spoof = "to staging \u202edorp ot oslA\u202c"
    record = {"run_id": "r1", "loop": "l\u2066x", "status": "waiting", "current": "s\x00t",
              "waiting": {"state": "s", "message": f"Deploy {spoof}?", "choices": ["approve", "reject"]}}
    events = [{"type": "llm", "state": "s", "attempt": 1, "t": T0},
              {"type": "ok", "state": "s", "result": {"text": "a\x1b]52;c;eA==\x07b\tc\nd"}, "t": T0}]
    page = run_page(RunView(record, events, []), csrf="c")
    for raw in ("\u202e", "\u202c", "\u2066", "\x00", "\x1b", "\x07"):
        assert raw not in page
    assert "Deploy to staging \\u202edorp ot oslA\\u202c?" in page
    assert "s\\x00t" in page and "a\\x1b]52;c;eA==\\x07b\tc\nd" in page  # tabs and newlines kept


def test_a_long_runs_lists_show_their_last_entries_and_say_how_many_are_left_out() -> None:
    """200,000 gate checks made a page of 16.8 MB (4 s to render): each list is cut."""
    from loopdsl.ui.pages import LIST_LIMIT

    events = [{"type": "gate", "state": "s", "phase": "after", "gate": f"g{i}", "passed": True, "message": ""}
              for i in range(LIST_LIMIT + 250)]
    page = run_page(RunView({"run_id": "r1", "loop": "l", "status": "completed"}, events, []))
    assert "the first 250 are not shown here" in page and "loopdsl show r1 --json" in page
    assert f">after: g{LIST_LIMIT + 249}<" in page and ">after: g249<" not in page and ">after: g250<" in page
