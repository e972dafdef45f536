"""The pure parts of the coding-CLI adapter: line splitting, event readers, the meter and
prices, fed hostile input (hypothesis) as well as the documented shapes."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loopdsl.adapters.coding_cli import prices_for, worst_call_usd
from loopdsl.adapters.coding_cli_events import (
    ClaudeReader,
    CodexReader,
    Meter,
    TokenPrices,
    looks_like_auth,
    parse_line,
)
from loopdsl.adapters.coding_cli_rollout import RolloutTail
from loopdsl.adapters.coding_cli_stream import LineSplitter
from loopdsl.language.model import Price

PRICES = TokenPrices(3.0, 15.0, 0.3, 3.75)

_scalars = st.none() | st.booleans() | st.integers(-10**12, 10**12) | st.floats(allow_nan=True) | st.text(max_size=8)
_json = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4)
                     | st.dictionaries(st.sampled_from(
                         ["type", "message", "usage", "id", "content", "text", "result", "total_cost_usd",
                          "num_turns", "subtype", "is_error", "input_tokens", "output_tokens", "item",
                          "cached_input_tokens", "cache_read_input_tokens", "error", "x", "modelUsage",
                          "errors", "inputTokens", "outputTokens", "cache_write_input_tokens"]), inner, max_size=6),
                     max_leaves=20)
_event_types = st.sampled_from(["assistant", "result", "user", "system", "turn.completed", "turn.failed",
                                "item.completed", "error", "other"])


@given(st.lists(st.binary(max_size=40), max_size=12), st.integers(4, 64))
def test_splitter_yields_the_lines_and_cuts_long_ones(chunks: list[bytes], max_line: int) -> None:
    chunks = [c for c in chunks if c]  # a pipe reads b"" only at EOF, which is the last feed
    splitter = LineSplitter(max_line)
    got = [item for chunk in [*chunks, b""] for item in splitter.feed(chunk)]
    expected = []
    whole = b"".join(chunks)
    parts = whole.split(b"\n")
    for index, part in enumerate(parts):
        last = index == len(parts) - 1
        if last and not part:
            continue
        expected.append((part[:max_line], True) if len(part) > max_line else (part, False))
    assert got == expected


@given(st.lists(st.tuples(_event_types, _json), max_size=15))
def test_readers_never_raise_and_the_charged_amount_never_falls(events: list[tuple[str, Any]]) -> None:
    for reader in (ClaudeReader(), CodexReader()):
        meter = Meter(PRICES)
        charged = 0.0
        for kind, body in events:
            event = dict(body) if isinstance(body, dict) else {"payload": body}
            event["type"] = kind
            reader.feed(event)
            delta = meter.take_delta(reader.state)
            assert delta >= 0
            charged += delta
            assert meter.charged_usd == pytest.approx(charged)
            assert all(isinstance(v, int) and v >= 0 for v in reader.state.usage.values())


def test_parse_line_skips_what_is_not_an_object() -> None:
    assert parse_line(b'{"type": "x"}') == {"type": "x"}
    for raw in (b"", b"  ", b"[1]", b"nope", b'{"a": ', b"\xff\xfe", b'{"a":' * 100_000 + b"1" + b"}" * 100_000):
        assert parse_line(raw) is None


def test_claude_counts_a_repeated_message_once_and_trusts_the_higher_total() -> None:
    reader, meter = ClaudeReader(), Meter(PRICES)
    usage = {"input_tokens": 1000, "output_tokens": 100}
    for _ in range(3):
        reader.feed({"type": "assistant", "message": {"id": "m1", "usage": usage, "content": []}})
    assert meter.take_delta(reader.state) == pytest.approx(0.0045)
    reader.feed({"type": "result", "total_cost_usd": 0.001, "num_turns": 1, "result": "ok"})
    assert meter.take_delta(reader.state) == 0.0  # a lower reported total never refunds
    reader.feed({"type": "result", "total_cost_usd": 0.01, "num_turns": 1, "result": "ok"})
    assert meter.take_delta(reader.state) == pytest.approx(0.0055)


def test_claude_budget_stop_zeroes_usage_but_model_usage_and_errors_tell() -> None:
    # The shape Claude Code 2.1.332 prints when its --max-budget-usd stops it.
    reader = ClaudeReader()
    reader.feed({"type": "result", "subtype": "error_max_budget_usd", "is_error": True, "num_turns": 1,
                 "total_cost_usd": 0.6015, "errors": ["Reached maximum budget ($0.5)", 7],
                 "usage": {"input_tokens": 0, "output_tokens": 0},
                 "modelUsage": {"claude-sonnet-4-5": {"inputTokens": 200000, "outputTokens": 100,
                                                      "cacheReadInputTokens": 0, "costUSD": 0.6015},
                                "garbage": "x"}})
    assert reader.state.usage["input_tokens"] == 200000 and reader.state.usage["output_tokens"] == 100
    assert reader.state.errors == ["Reached maximum budget ($0.5)"]
    assert Meter(PRICES).take_delta(reader.state) == pytest.approx(0.6015)


def test_codex_cache_writes_are_part_of_the_input_and_the_live_log_counts_first() -> None:
    reader, meter = CodexReader(), Meter(TokenPrices(1.0, 10.0, 0.1, 2.0))
    reader.live_total({"input_tokens": 1000, "cached_input_tokens": 300, "cache_write_input_tokens": 200,
                       "output_tokens": 50, "reasoning_output_tokens": 30})
    assert reader.state.usage == {"input_tokens": 500, "cache_read_tokens": 300, "cache_write_tokens": 200,
                                  "output_tokens": 50}  # reasoning is inside output_tokens
    assert meter.take_delta(reader.state) == pytest.approx((500 + 30 + 400 + 500) / 1e6)
    reader.live_total({"input_tokens": 10})  # an older or garbled total never lowers the spend
    # The turn's own total counts the same calls: charged once, not twice.
    reader.feed({"type": "turn.completed", "usage": {"input_tokens": 1000, "cached_input_tokens": 300,
                                                     "cache_write_input_tokens": 200, "output_tokens": 50}})
    assert meter.take_delta(reader.state) == 0.0


def test_rollout_tail_reads_token_counts_as_they_are_appended(tmp_path: Path) -> None:
    day = tmp_path / "sessions" / "2026" / "12" / "03"
    day.mkdir(parents=True)
    log = day / "rollout-2026-12-03T15-00-00-x.jsonl"
    count = lambda n: json.dumps({"type": "event_msg", "payload": {"type": "token_count", "info": {  # noqa: E731
        "total_token_usage": {"input_tokens": n}}}})
    tail = RolloutTail(tmp_path)
    assert list(tail.totals()) == []  # no log yet
    line = count(100)
    log.write_text(json.dumps({"type": "session_meta"}) + "\nnot json\n" + line[:20])
    assert list(tail.totals()) == []  # a half-written line waits for its end
    with log.open("a") as handle:
        handle.write(line[20:] + "\n" + count(250) + "\n")
    assert list(tail.totals()) == [{"input_tokens": 100}, {"input_tokens": 250}]
    assert list(tail.totals()) == []  # read once
    (day / "rollout-link.jsonl").symlink_to(log)  # a link is not a log of this attempt
    assert list(tail.totals()) == []


def test_rollout_tail_walks_only_real_folders_and_never_blocks(tmp_path: Path) -> None:
    """A CLI that linked `sessions` to /proc made the poll walk it every 0.2 s until an entry
    vanished mid-walk (an internal error that failed the run, charged its whole reservation);
    a log swapped for a FIFO would block the event loop on open."""
    import os

    home = tmp_path / "home"
    home.mkdir()
    (home / "sessions").symlink_to("/proc")
    assert list(RolloutTail(home).totals()) == []
    (home / "sessions").unlink()
    day = home / "sessions" / "2026" / "12" / "03"
    day.mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere" / "12" / "03"
    elsewhere.mkdir(parents=True)
    (elsewhere / "rollout-x.jsonl").write_text(json.dumps({"type": "event_msg", "payload": {
        "type": "token_count", "info": {"total_token_usage": {"input_tokens": 99}}}}) + "\n")
    (home / "sessions" / "2027").symlink_to(tmp_path / "elsewhere")  # a linked year is not walked either
    os.mkfifo(day / "rollout-fifo.jsonl")
    (day / "rollout-real.jsonl").write_text(json.dumps({"type": "event_msg", "payload": {
        "type": "token_count", "info": {"total_token_usage": {"input_tokens": 7}}}}) + "\n")
    tail = RolloutTail(home)
    assert list(tail.totals()) == [{"input_tokens": 7}]
    os.unlink(day / "rollout-real.jsonl")
    os.mkfifo(day / "rollout-real.jsonl")  # swapped after it was read once
    assert list(tail.totals()) == []


def test_codex_cached_tokens_are_part_of_the_input() -> None:
    reader = CodexReader()
    reader.feed({"type": "turn.completed", "usage": {"input_tokens": 100, "cached_input_tokens": 60,
                                                     "output_tokens": 7}})
    reader.feed({"type": "turn.completed", "usage": {"input_tokens": 5, "cached_input_tokens": 50}})
    assert reader.state.usage == {"input_tokens": 45, "cache_read_tokens": 60, "output_tokens": 7,
                                  "cache_write_tokens": 0}


def test_prices_from_the_table_and_from_an_alias() -> None:
    table = prices_for("claude-sonnet-4-5")
    assert table == TokenPrices(3.0, 15.0, 0.3, 3.75)
    assert prices_for("no-such-model-anywhere") is None and prices_for(None) is None
    own = prices_for("no-such-model-anywhere", Price(2.0, 8.0, tiers=((200_000, 4.0, 16.0),)))
    assert own == TokenPrices(4.0, 16.0, 4.0, 4.0)  # the dearest tier: a CLI hides prompt sizes
    # 200k tokens written to the cache at $3.75/M + 64k out at $15/M.
    assert worst_call_usd(table, "claude-sonnet-4-5") == pytest.approx(0.75 + 0.96)
    assert worst_call_usd(own, "no-such-model-anywhere") is None
    assert worst_call_usd(own, None, max_input_tokens=1000, max_output_tokens=1000) == pytest.approx(0.02)


def test_auth_words() -> None:
    assert looks_like_auth(["Error: Invalid API key · Please run /login"])
    assert looks_like_auth(["unexpected status 401 Unauthorized"])
    assert not looks_like_auth(["tests failed: 3 errors", json.dumps({"exit": 1})])


def test_a_lone_surrogate_in_a_cli_event_becomes_a_replacement_character() -> None:
    """`"\\ud800"` in a CLI's JSON line made every later view of the run (and `run --json`)
    an internal error; in a tool's name it failed the run while the CLI still ran."""
    line = b'{"type":"result","result":"x \\ud800","tool":{"name":"Re\\udfffad"},"pair":"\\ud83d\\ude00"}'
    assert parse_line(line) == {"type": "result", "result": "x \ufffd", "tool": {"name": "Re\ufffdad"},
                                "pair": "\U0001F600"}


def test_a_long_tool_use_id_is_redacted_before_it_is_cut() -> None:
    """The id was cut to 200 characters and then redacted: a key at the cut kept 20 of its 21
    characters in the stored events."""
    from loopdsl.adapters.coding_cli_tools import ToolTracker
    from loopdsl.runtime.redaction import Redactor

    key = "sk-ant-PROBEKEY123456"
    tool_id = "x" * (201 - len(key)) + key
    tracker = ToolTracker("claude-code", Redactor([key]), clock=lambda: 0.0)
    notes = tracker.feed({"type": "assistant", "message": {"content": [
        {"type": "tool_use", "id": tool_id, "name": "Read", "input": {"file_path": "a"}}]}})
    notes += tracker.feed({"type": "user", "message": {"content": [
        {"type": "tool_result", "tool_use_id": tool_id, "content": "ok"}]}})
    assert [n["type"] for n in notes] == ["tool_started", "tool_call"]
    assert all("sk-ant" not in json.dumps(n) and n["id"].endswith("***") for n in notes)


def test_a_stream_of_many_message_ids_is_summed_as_it_comes_with_bounded_memory() -> None:
    """Every event re-summed every message seen (12,000 ids took 32 s and a state's timeout
    was overrun by as much as it lasted); the ids kept for recognising repeats are bounded,
    and past them a message counts whole each time (more spend, never less)."""
    from loopdsl.adapters.coding_cli_events import MAX_MESSAGE_IDS

    reader = ClaudeReader()
    reader.feed({"type": "assistant", "message": {"id": "m0", "usage": {"output_tokens": 5}}})
    reader.feed({"type": "assistant", "message": {"id": "m0", "usage": {"output_tokens": 7}}})  # the same, once per block
    assert reader.state.usage["output_tokens"] == 7 and reader.state.turns == 1
    count = MAX_MESSAGE_IDS + 5_000
    for i in range(1, count):
        reader.feed({"type": "assistant", "message": {"id": f"m{i}", "usage": {"output_tokens": 1}}})
    reader.feed({"type": "assistant", "message": {"id": f"m{count - 1}", "usage": {"output_tokens": 1}}})  # a repeat past the kept ids
    assert len(reader._by_message) == MAX_MESSAGE_IDS
    assert reader.state.usage["output_tokens"] == 7 + (count - 1) + 1 and reader.state.turns == count + 1
