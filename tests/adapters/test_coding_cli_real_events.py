"""The REAL Claude Code's tool uses as run events, through `loopdsl run` and `loopdsl show`
as a user runs them (real subprocesses, the loopback stub as the provider; fixtures and the
installation from test_coding_cli_real.py): the progress lines and `show --json` show each
tool use, and a declared secret the CLI read from a workspace file never reaches the store."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from stub_server import StubReply, StubServer, tool_call
from test_coding_cli_real import CLAUDE_KEY, clis, loop_file, stubs, world  # noqa: F401  (fixtures)
from cli_forked import loopdsl_command

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def loopdsl(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))  # `world` set the key and a hostile outer env
    return subprocess.run([*loopdsl_command(), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=180)


def test_real_claude_tool_uses_show_in_progress_and_show_json_with_secrets_kept_out_of_the_store(
        clis: dict[str, Path], world: dict[str, Path], stubs: tuple[StubServer, StubServer]) -> None:  # noqa: F811
    stub, _ = stubs
    repo = world["repo"]
    (repo / "secret.txt").write_text(f"deploy key: {CLAUDE_KEY}\n")
    (repo / "big.txt").write_text(("B" * 150 + "\n") * 1500)  # ~225 KB read back by the CLI
    stub.enqueue(
        StubReply(text=None, tool_calls=[tool_call("Read", {"file_path": "secret.txt"}, "c1")],
                  prompt_tokens=1000, completion_tokens=20),
        StubReply(text=None, tool_calls=[tool_call("Read", {"file_path": "big.txt"}, "c2")],
                  prompt_tokens=1100, completion_tokens=20),
        StubReply(text="read both", prompt_tokens=1200, completion_tokens=10))
    loop = loop_file(world, "claude-code", clis["claude"], stub.anthropic_api_base, max_cost=2.5)
    store = repo.parent / "store"
    done = loopdsl("run", str(loop), "--store", str(store), cwd=repo)
    assert done.returncode == 0, done.stderr
    assert "tool Read secret.txt ok" in done.stderr and "tool Read big.txt ok" in done.stderr
    assert CLAUDE_KEY in json.dumps([r.body for r in stub.requests])  # the secret was there to leak
    [run_id] = [line.split()[1].rstrip(":") for line in done.stdout.splitlines() if line.startswith("run ")]
    shown = loopdsl("show", run_id, "--store", str(store), "--json", cwd=repo)
    events = json.loads(shown.stdout)["events"]
    calls = [e for e in events if e["type"] == "tool_call"]
    assert [(e["name"], e["summary"], e["ok"], e["cli"]) for e in calls] == [
        ("Read", "secret.txt", True, "claude-code"), ("Read", "big.txt", True, "claude-code")]
    assert "deploy key: ***" in calls[0]["output"]
    assert calls[1]["truncated"] and len(calls[1]["output"]) < 2100
    assert any(e["type"] == "cli_charge" for e in events)
    saved = b"".join(p.read_bytes() for p in store.rglob("*") if p.is_file())
    assert CLAUDE_KEY.encode() not in saved
    assert b"B" * 1000 not in saved
