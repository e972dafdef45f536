"""Agents through the real paths: LiteLLM over HTTP to the loopback stubs (OpenAI and
Anthropic Messages formats, answering by the conversation so far), and the `loopdsl run` /
`show` CLI driven by a reply script with tool calls."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from stub_server import StubReply, StubServer, tool_call

from loopdsl.adapters.litellm import ensure_litellm
from loopdsl.adapters.store.run_store import RunStore

import loopdsl
from cli_forked import loopdsl_command

pytestmark = pytest.mark.xdist_group("litellm")  # LiteLLM imported in-process: once a run, on one worker

OPENAI, ANTHROPIC = "openai/gpt-4o-mini", "anthropic/claude-haiku-4-5"
PRICE = "price: {input_per_mtok: 1, output_per_mtok: 2}"


def agent_loop(tmp_path: Path, model: str, api_base: str) -> Path:
    (tmp_path / "a.txt").write_text("one\ntwo\nthree\n")
    path = tmp_path / "loop.yaml"
    path.write_text(textwrap.dedent(f"""\
        loopdsl: 1
        name: http-agent
        models:
          m: {{model: {model}, api_base: {api_base}, max_tokens: 100, {PRICE}}}
        tools:
          count_lines:
            description: Count the lines of a file.
            params: {{file: {{type: string}}}}
            required: [file]
            shell: wc -l -- {{{{ args.file }}}}
        start: work
        states:
          work:
            agent: {{model: m, prompt: How many lines has a.txt?, tools: [count_lines], max_turns: 4}}
            next: done
          done: {{end: completed}}
        """))
    return path


def openai_turn(body: Any) -> StubReply:
    results = [m for m in body["messages"] if m["role"] == "tool"]
    if not results:
        return StubReply(text=None, tool_calls=[tool_call("count_lines", {"file": "a.txt"}, "call_a")],
                         prompt_tokens=40, completion_tokens=9)
    return StubReply(text=f"It has {json.loads(results[0]['content'])['stdout'].split()[0]} lines.",
                     prompt_tokens=70, completion_tokens=6)


def anthropic_turn(body: Any) -> StubReply:
    blocks = [b for m in body["messages"] if isinstance(m["content"], list) for b in m["content"]]
    results = [b for b in blocks if b.get("type") == "tool_result"]
    if not results:
        return StubReply(text="Let me count.", tool_calls=[tool_call("count_lines", {"file": "a.txt"}, "toolu_1")],
                         prompt_tokens=40, completion_tokens=9)
    content = results[0]["content"]
    text = content if isinstance(content, str) else "".join(part.get("text", "") for part in content)
    return StubReply(text=f"It has {json.loads(text)['stdout'].split()[0]} lines.", prompt_tokens=70,
                     completion_tokens=6)


@pytest.mark.parametrize("model", [OPENAI, ANTHROPIC])
def test_an_agent_over_litellm_http_spends_what_the_stub_billed(stub_server: StubServer, tmp_path: Path,
                                                                model: str) -> None:
    ensure_litellm()
    stub_server.responder = anthropic_turn if model == ANTHROPIC else openai_turn
    base = stub_server.anthropic_api_base if model == ANTHROPIC else stub_server.api_base
    result = loopdsl.run(agent_loop(tmp_path, model, base), workdir=tmp_path)
    assert result.status == "completed", result.state.error
    work = result.state.results["work"]
    assert work["text"] == "It has 3 lines." and work["turns"] == 2
    assert len(stub_server.requests) == 2 and stub_server.billed == {"prompt_tokens": 110, "completion_tokens": 15}
    assert result.state.ledger["tokens"] == 125
    assert result.state.ledger["cost_usd"] == pytest.approx((110 * 1 + 15 * 2) / 1e6)


def test_loopdsl_run_shows_each_tool_call_and_show_lists_them(tmp_path: Path) -> None:
    loop = agent_loop(tmp_path, OPENAI, "http://127.0.0.1:9/v1")
    script = tmp_path / "replies.yaml"
    script.write_text("work:\n  - tool_calls: [{name: count_lines, args: {file: a.txt}}]\n  - It has 3 lines.\n")
    store = tmp_path / "store"
    ran = subprocess.run([*loopdsl_command(), "run", str(loop), "--script", str(script),
                          "--store", str(store)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    [line] = [ln for ln in ran.stderr.splitlines() if ln.strip().startswith("tool ")]
    assert line.strip().startswith("tool count_lines a.txt ok ") and line.strip().endswith("s")
    run_id = RunStore(store).list_runs()[0]["run_id"]
    shown = subprocess.run([*loopdsl_command(), "show", run_id, "--store", str(store)],
                           cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert "tool calls:" in shown.stdout and "work #1 turn 1: tool count_lines a.txt ok" in shown.stdout
    runs = subprocess.run([*loopdsl_command(), "show", run_id, "--store", str(store), "--json"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert runs.returncode == 0, runs.stderr
    events = [e for e in json.loads(runs.stdout)["events"] if e["type"] == "tool_call"]
    assert [(e["name"], e["summary"], e["ok"]) for e in events] == [("count_lines", "a.txt", True)]
