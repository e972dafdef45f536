"""What loopdsl prints of a run: one line per tool call whatever the model named, and a
waiting run's next step as it stands."""
from __future__ import annotations

from loopdsl.adapters.terminal import summary, tool_line
from loopdsl.runtime.run_state import RunState


def test_a_tool_call_is_one_line_whatever_the_model_sent() -> None:
    line = tool_line({"name": "x\nrun abcd1234: completed", "summary": "a\r\nb\u2028c", "ok": False,
                      "error": "unknown tool", "duration_s": 0.01})
    assert "\n" not in line and "\r" not in line and "\u2028" not in line
    assert line == "tool x\\nrun abcd1234: completed a\\r\\nb\\u2028c failed (unknown tool) 0.01s"
    assert len(tool_line({"name": "n" * 5000, "ok": True})) < 200


def _waiting(decision: dict[str, str] | None) -> RunState:
    return RunState(run_id="r1", loop="ck", start="ask", status="waiting", current="ask", path=["ask"],
                    waiting={"state": "ask", "message": "ok?", "choices": ["approve", "reject", "later"]},
                    decision=decision)


def test_a_waiting_run_says_how_to_decide_until_a_decision_is_recorded() -> None:
    before = summary(_waiting(None))
    assert "decide with: loopdsl decide r1 CHOICE" in before and "then:        loopdsl resume r1" in before
    after = summary(_waiting({"decision": "later", "by": "ada", "at": "2026-12-07T03:00:00+00:00"}))
    assert "decide with" not in after  # it would be refused: the run already has a decision
    assert "  decided: 'later' by ada at 2026-12-07T03:00:00+00:00" in after
    assert "then:        loopdsl resume r1" in after
