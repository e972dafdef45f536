"""A coding-agent CLI's tool uses as loopdsl tool notes: the fake `claude` and `codex`
(tests/data/fake_cli, scenario `tools`) run for real, and what reaches `on_event` is checked
for shape, redaction and size; hostile events are fed to the tracker directly."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from loopdsl.adapters.coding_cli_tools import OUTPUT_LIMIT, ToolTracker
from loopdsl.runtime.redaction import Redactor
from test_coding_cli import API_KEY, OTHER_SECRET, _run


def notes(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [note for event in events for note in event["tools"]]


def test_claude_tool_uses_become_started_and_finished_notes_redacted_and_capped(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "config.env").write_text(f"TOKEN={OTHER_SECRET}\n")
    result, _, events, _ = _run("claude-code", "tools", tmp_path)
    assert result.kind is None, result.error
    seen = notes(events)
    assert [(n["type"], n["id"]) for n in seen] == [
        ("tool_started", "tu_1"), ("tool_started", "tu_2"), ("tool_started", "tu_3"),
        ("tool_call", "tu_1"), ("tool_call", "tu_2"), ("tool_call", "tu_3")]  # tu_unknown: never started
    read, grep, missing = seen[3:]
    assert read["name"] == "Read" and read["summary"] == "config.env" and read["ok"] and read["error"] is None
    assert read["output"] == "API_KEY=***\nTOKEN=***\n"
    assert grep["truncated"] and len(grep["output"].encode()) < OUTPUT_LIMIT + 100
    assert grep["output"].startswith("HUGE-HEAD") and grep["output"].endswith("HUGE-TAIL")
    assert len(grep["summary"]) == 60 and grep["summary"].endswith("...")
    assert not missing["ok"] and missing["error"] == "File does not exist (key ***)"
    assert all(n["turn"] == 1 and n["duration_s"] >= 0 for n in seen[3:])
    shown = json.dumps(seen)
    assert API_KEY not in shown and OTHER_SECRET not in shown


def test_codex_items_become_tool_notes_and_a_failed_mcp_call_says_why(tmp_path: Path) -> None:
    result, _, events, _ = _run("codex", "tools", tmp_path, api_key_env="CODEX_API_KEY")
    assert result.kind is None, result.error
    done = [n for n in notes(events) if n["type"] == "tool_call"]
    assert [(n["name"], n["summary"], n["ok"]) for n in done] == [
        ("shell", "cat .env", True), ("edit", "a.py", True), ("docs.search", "x", False)]
    shell, edit, mcp = done
    assert shell["output"].startswith("KEY=***\n") and shell["truncated"]
    assert len(shell["output"].encode()) < OUTPUT_LIMIT + 100
    assert edit["output"] == "update a.py"
    assert mcp["error"] == "denied for ***"
    started = [n["id"] for n in notes(events) if n["type"] == "tool_started"]
    assert started == ["item_1", "item_2", "item_3"]  # a use reported only once completed starts too
    assert API_KEY not in json.dumps(events)


def test_a_tool_use_the_cli_never_finished_ends_failed_when_the_cli_is_stopped(tmp_path: Path) -> None:
    tracker = ToolTracker("claude-code", Redactor([]))
    tracker.feed({"type": "assistant", "message": {"content": [
        {"type": "tool_use", "id": "t1", "name": "Read", "input": {"file_path": "x"}}]}})
    [ended] = tracker.unfinished()
    assert ended["type"] == "tool_call" and not ended["ok"] and "ended before" in ended["error"]
    assert tracker.unfinished() == []


def test_hostile_events_give_no_notes_and_never_raise() -> None:
    hostile: list[Any] = [
        {"type": "assistant", "message": "not an object"},
        {"type": "assistant", "message": {"content": "text"}},
        {"type": "assistant", "message": {"content": [1, None, {"type": "tool_use", "id": 7, "name": "X"}]}},
        {"type": "user", "message": {"content": [{"type": "tool_result", "tool_use_id": ["x"]}]}},
        {"type": "item.completed", "item": []},
        {"type": "item.completed", "item": {"type": 5, "id": "i"}},
        {"type": "item.completed", "item": {"type": "agent_message", "id": "i", "text": "hi"}},
    ]
    for kind in ("claude-code", "codex"):
        tracker = ToolTracker(kind, Redactor([]))
        assert [tracker.feed(event) for event in hostile] == [[] for _ in hostile]
    # A name or output of the wrong type is dropped, never shown as a Python repr.
    tracker = ToolTracker("claude-code", Redactor([]))
    tracker.feed({"type": "assistant", "message": {"content": [{"type": "tool_use", "id": "a", "name": {"x": 1}}]}})
    [note] = tracker.feed({"type": "user", "message": {"content": [
        {"type": "tool_result", "tool_use_id": "a", "content": {"nested": True}}]}})
    assert note["name"] == "tool" and note["output"] == "" and note["summary"] == ""


def test_an_id_holding_a_secret_is_paired_yet_shown_redacted() -> None:
    tracker = ToolTracker("claude-code", Redactor(["s3cret-value"]))
    [started] = tracker.feed({"type": "assistant", "message": {"content": [
        {"type": "tool_use", "id": "id-s3cret-value", "name": "Read", "input": {"file_path": "s3cret-value.txt"}}]}})
    [ended] = tracker.feed({"type": "user", "message": {"content": [
        {"type": "tool_result", "tool_use_id": "id-s3cret-value", "content": "ok"}]}})
    assert started["id"] == ended["id"] == "id-***" and ended["summary"] == "***.txt"


def test_a_stream_opening_endless_tool_uses_is_bounded() -> None:
    tracker = ToolTracker("codex", Redactor([]))
    started = 0
    for n in range(5000):
        started += len(tracker.feed({"type": "item.started", "item": {"id": f"i{n}", "type": "command_execution",
                                                                      "command": "x"}}))
    assert started == 1000
