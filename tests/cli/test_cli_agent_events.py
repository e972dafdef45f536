"""A coding-agent CLI's progress reaches the run as events: `loopdsl run` (real subprocesses)
of loops whose `agent: {cli: ...}` state runs the fake `claude` / `codex`
(tests/data/fake_cli), checked in the progress lines, `show`, `show --json`, `show
--transcript`, the OTel spans and the store's bytes (no secret, no huge tool output)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from otlp_receiver import OtlpReceiver, otel_env, run_loopdsl

from loopdsl.adapters.store.run_store import RunStore
from loopdsl.ui import views

FAKES = Path(__file__).resolve().parents[1] / "data" / "fake_cli"
KEYS = {"claude-code": ("ANTHROPIC_API_KEY", "sk-ant-cli-events-SECRET-1234"),
        "codex": ("CODEX_API_KEY", "sk-codex-cli-events-SECRET-5678")}
DB_PASSWORD = "pw-in-the-workspace-hunter2"
MODELS = {"claude-code": ("anthropic/claude-sonnet-4-5", "claude"), "codex": ("openai/gpt-5", "codex")}


def write_loop(base: Path, cli: str, scenario: str, cap: float = 1.0) -> None:
    model, binary = MODELS[cli]
    base.mkdir(exist_ok=True)
    (base / "config.env").write_text(f"DB_PASSWORD={DB_PASSWORD}\n")
    (base / "loop.yaml").write_text(
        f"loopdsl: 1\nname: cli-events\nsecrets: [{KEYS[cli][0]}, DB_PASSWORD]\n"
        f"models:\n  m: {{model: {model}, max_tokens: 1000, cli_path: {FAKES / binary},\n"
        "       price: {input_per_mtok: 0.3, output_per_mtok: 1.5}}\n"
        "budget: {cost_usd: 5}\nstart: work\nstates:\n"
        f"  work:\n    agent: {{cli: {cli}, model: m, prompt: 'scenario {scenario}', max_cost_usd: {cap}}}\n"
        "    next: done\n  done: {end: completed}\n")


def run(base: Path, cli: str, endpoint: str | None = None) -> tuple[Any, str]:
    env = otel_env(endpoint, **{KEYS[cli][0]: KEYS[cli][1]}, DB_PASSWORD=DB_PASSWORD)
    env.pop("LOOPDSL_STORE", None)
    done = run_loopdsl(["run", "loop.yaml", "--store", "store"], base, env)
    [entry] = RunStore(base / "store").list_runs()
    return done, str(entry["run_id"])


def show(base: Path, run_id: str, *flags: str) -> str:
    done = run_loopdsl(["show", run_id, "--store", "store", *flags], base, otel_env(None))
    assert done.returncode == 0, done.stderr
    return done.stdout


def store_bytes(base: Path) -> bytes:
    return b"".join(p.read_bytes() for p in (base / "store").rglob("*") if p.is_file())


def test_claude_tool_uses_are_events_in_progress_show_transcript_and_spans(tmp_path: Path) -> None:
    write_loop(tmp_path, "claude-code", "tools")
    receiver = OtlpReceiver().start()
    try:
        done, run_id = run(tmp_path, "claude-code", receiver.endpoint)
    finally:
        receiver.stop()
    assert done.returncode == 0, done.stderr
    progress = done.stdout + done.stderr
    assert "tool Read config.env ok" in progress
    assert "tool Read missing.py failed (File does not exist (key ***))" in progress
    shown = json.loads(show(tmp_path, run_id, "--json"))
    events = shown["events"]
    recorded = shown["run"]["results"]["work"]["tool_calls"]
    assert [(c["id"], c["name"], c["ok"], c["args"]) for c in recorded] == [
        ("tu_1", "Read", True, None), ("tu_2", "Grep", True, None), ("tu_3", "Read", False, None)]
    calls = [e for e in events if e["type"] == "tool_call"]
    assert [(e["name"], e["ok"], e["cli"], e["state"]) for e in calls] == [
        ("Read", True, "claude-code", "work"), ("Grep", True, "claude-code", "work"),
        ("Read", False, "claude-code", "work")]
    assert calls[0]["output"] == "API_KEY=***\nDB_PASSWORD=***\n"
    assert calls[1]["truncated"] and len(calls[1]["output"]) < 2100
    assert [e["type"] for e in events].count("tool_started") == 3
    charges = [e for e in events if e["type"] == "cli_charge"]
    assert charges and charges[-1]["charged_usd"] == events[[e["type"] for e in events].index("llm")]["cost_usd"]
    llm = next(e for e in events if e["type"] == "llm")
    assert (llm["cli"], llm["stop"], llm["turns"], llm["exit_code"], llm["error_kind"]) == (True, "answer", 2, 0, None)
    assert [c["name"] for c in views.tool_calls(events)] == ["Read", "Grep", "Read"]  # the UI's run page
    assert "tool Grep " in show(tmp_path, run_id)
    transcript = show(tmp_path, run_id, "--transcript")
    assert "coding-agent CLI" in transcript and "--- tool result Read (tu_1, ok)\nAPI_KEY=***" in transcript
    assert "--- reply\nRead them." in transcript
    spans = receiver.snapshot()
    tools = sorted((s for s in spans if s.name.startswith("execute_tool ")), key=lambda s: s.start_ns)
    assert [(s.name, s.status) for s in tools] == [("execute_tool Read", "OK"), ("execute_tool Grep", "OK"),
                                                   ("execute_tool Read", "ERROR")]
    # Secrets never reach the disk or the collector; the 1 MB tool output is not kept.
    saved = store_bytes(tmp_path)
    for secret in (KEYS["claude-code"][1], DB_PASSWORD):
        assert secret.encode() not in saved and all(secret.encode() not in body for body in receiver.bodies)
    assert b"y" * 5000 not in saved and len(saved) < 400_000


def test_codex_items_are_tool_events_with_the_key_redacted(tmp_path: Path) -> None:
    write_loop(tmp_path, "codex", "tools")
    done, run_id = run(tmp_path, "codex")
    assert done.returncode == 0, done.stderr
    assert "tool shell cat .env ok" in done.stdout + done.stderr
    events = json.loads(show(tmp_path, run_id, "--json"))["events"]
    calls = [(e["name"], e["summary"], e["ok"]) for e in events if e["type"] == "tool_call"]
    assert calls == [("shell", "cat .env", True), ("edit", "a.py", True), ("docs.search", "x", False)]
    saved = store_bytes(tmp_path)
    assert KEYS["codex"][1].encode() not in saved and b"z" * 5000 not in saved


def test_the_kill_at_the_reservation_is_an_event_and_a_progress_line(tmp_path: Path) -> None:
    write_loop(tmp_path, "claude-code", "spend", cap=1.0)
    done, run_id = run(tmp_path, "claude-code")
    assert done.returncode != 0
    assert "claude-code reached its reservation" in done.stdout + done.stderr
    events = json.loads(show(tmp_path, run_id, "--json"))["events"]
    first = next(e for e in events if e["type"] == "cli_charge" and e.get("at_reservation"))
    assert first["charged_usd"] >= 1.0 and first["reserved_usd"] == 1.0
