"""`loopdsl show RUN --transcript` and the web UI's run page show each model call's prompt
and reply: a real `loopdsl run` with scripted replies whose prompt carries a declared
secret, a `<script>` and a terminal escape; and a response stored before prompts were kept."""
from __future__ import annotations

import json
import os
import re
import subprocess
import urllib.request
from pathlib import Path

import pytest
from cli_forked import loopdsl_command
from cli_in_process import cli_in_process
from ports import free_port

SECRET = "s3cr3t-transcript-value-42"
LOOP = """loopdsl: 1
name: transcript
models:
  m: {model: anthropic/claude-haiku-4-5, max_tokens: 100}
secrets: [MY_TOKEN]
budget: {cost_usd: 1, tokens: 100000}
start: ask
states:
  ask:
    llm: {model: m, prompt: "Token {{ secrets.MY_TOKEN }}. Review <script>alert(1)</script> please", system: "be brief"}
    next: done
  done: {end: completed}
"""
REPLIES = 'ask:\n  - text: "looks fine \\e[2J <b>bold</b>"\n'
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def loopdsl(*args: str, cwd: Path, real: bool = False) -> subprocess.CompletedProcess[str]:
    """The `loopdsl run` that makes the run is a real subprocess; `show` runs in-process
    (tests/cli_in_process.py: the same exit codes and output)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPDSL_")}
    env["MY_TOKEN"] = SECRET
    if not real:
        return cli_in_process(args, cwd, env, only_env=True)
    return subprocess.run([*loopdsl_command(), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)


def make_run(base: Path) -> tuple[Path, Path, str]:
    (base / "loop.yaml").write_text(LOOP, encoding="utf-8")
    (base / "replies.yaml").write_text(REPLIES, encoding="utf-8")
    store = base / "store"
    run = loopdsl("run", "loop.yaml", "--script", "replies.yaml", "--store", str(store), "--json", cwd=base,
                  real=True)
    assert run.returncode == 0, run.stderr
    run_id = json.loads(run.stdout.splitlines()[-1])["run_id"]
    return base, store, run_id


@pytest.fixture(scope="module")
def done_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    return make_run(tmp_path_factory.mktemp("transcript"))


def test_show_transcript_prints_the_prompt_redacted_and_the_reply_inert(done_run: tuple[Path, Path, str]) -> None:
    base, store, run_id = done_run
    shown = loopdsl("show", run_id, "--store", str(store), "--transcript", cwd=base)
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert "=== call 1: ask attempt 1, llm, model" in out
    assert "--- system" in out and "be brief" in out
    assert "--- user" in out and "Token ***. Review <script>alert(1)</script> please" in out
    assert "looks fine \\x1b[2J <b>bold</b>" in out  # the escape shown, not sent raw
    assert SECRET not in out and not RAW.search(out)


def test_show_transcript_json_includes_the_messages(done_run: tuple[Path, Path, str]) -> None:
    base, store, run_id = done_run
    shown = loopdsl("show", run_id, "--store", str(store), "--transcript", "--json", cwd=base)
    assert shown.returncode == 0, shown.stderr
    assert SECRET not in shown.stdout and not RAW.search(shown.stdout)
    (call,) = json.loads(shown.stdout)["transcript"]
    assert call["state"] == "ask" and call["kind"] == "llm" and call["stored"]
    assert [m["role"] for m in call["messages"]] == ["system", "user"]
    assert "Token ***" in call["messages"][1]["content"]
    assert call["reply"] == "looks fine \x1b[2J <b>bold</b>"  # JSON keeps the real text


def test_the_secret_is_nowhere_in_the_store(done_run: tuple[Path, Path, str]) -> None:
    _, store, _ = done_run
    for path in store.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path


def test_the_ui_run_page_shows_the_prompt_escaped(done_run: tuple[Path, Path, str]) -> None:
    base, store, run_id = done_run
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPDSL_")}
    proc = subprocess.Popen([*loopdsl_command(), "ui", "--port", str(port), "--store", str(store)],
                            cwd=base, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        page = ""
        for _ in range(150):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/runs/{run_id}", timeout=10) as reply:
                    page = reply.read().decode()
                break
            except OSError:
                assert proc.poll() is None
                subprocess.run(["sleep", "0.2"], check=True)
    finally:
        proc.terminate()
        proc.communicate(timeout=10)
    assert '<details class="call">' in page
    assert "Token ***. Review &lt;script&gt;alert(1)&lt;/script&gt; please" in page
    assert "<script>" not in page and SECRET not in page
    assert "&lt;b&gt;bold&lt;/b&gt;" in page


def test_a_response_stored_before_prompts_were_kept_still_shows(tmp_path: Path) -> None:
    from loopdsl.adapters.store.run_store import RunStore

    base, store, run_id = make_run(tmp_path)
    with RunStore(store) as st:
        full = st.resolve(run_id)
        (event,) = [e for e in st.events(full) if e.get("type") == "llm"]
        old = {k: v for k, v in st.get_response(event["key"]).items() if k != "messages"}
        st.put_response(event["key"], old)  # as an older loopdsl wrote it
    shown = loopdsl("show", run_id, "--store", str(store), "--transcript", cwd=base)
    assert shown.returncode == 0, shown.stderr
    assert "--- prompt: not stored" in shown.stdout and "looks fine" in shown.stdout
    as_json = json.loads(loopdsl("show", run_id, "--store", str(store), "--transcript", "--json", cwd=base).stdout)
    assert as_json["transcript"][0]["messages"] is None


AGENT_LOOP = """loopdsl: 1
name: agent-transcript
models:
  m: {model: anthropic/claude-haiku-4-5, max_tokens: 100}
secrets: [MY_TOKEN]
budget: {cost_usd: 1, tokens: 100000}
tools:
  shout:
    description: Echo a word back.
    params: {word: {type: string}}
    required: [word]
    shell: echo "heard {{ args.word }} $MY_TOKEN"
    secrets: [MY_TOKEN]
start: work
states:
  work:
    agent: {model: m, prompt: "Shout <i>loud</i>, token {{ secrets.MY_TOKEN }}", tools: [shout], max_turns: 3}
    next: done
  done: {end: completed}
"""
AGENT_REPLIES = """work:
  - tool_calls: [{name: shout, args: {word: hello}}]
    text: "calling"
  - "all done"
"""


def test_an_agents_transcript_has_its_prompt_turns_and_tool_results(tmp_path: Path) -> None:
    (tmp_path / "loop.yaml").write_text(AGENT_LOOP, encoding="utf-8")
    (tmp_path / "replies.yaml").write_text(AGENT_REPLIES, encoding="utf-8")
    store = str(tmp_path / "store")
    run = loopdsl("run", "loop.yaml", "--script", "replies.yaml", "--store", store, "--json", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    run_id = json.loads(run.stdout.splitlines()[-1])["run_id"]
    shown = loopdsl("show", run_id, "--store", store, "--transcript", "--json", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert SECRET not in shown.stdout
    first, second = json.loads(shown.stdout)["transcript"]
    assert (first["kind"], first["turn"], second["turn"]) == ("agent turn", 1, 2)
    assert "Shout <i>loud</i>, token ***" in first["messages"][-1]["content"]
    assert first["reply"] == "calling" and [t["name"] for t in first["tool_calls"]] == ["shout"]
    (result,) = first["tool_results"]
    assert result["ok"] and "heard hello ***" in result["content"]
    assert second["messages"] is None and second["reply"] == "all done"
    text = loopdsl("show", run_id, "--store", store, "--transcript", cwd=tmp_path).stdout
    assert "--- tool call shout (call_1_1)" in text and "--- tool result shout (call_1_1, ok)" in text
    assert "prompt: not stored" not in text  # a later turn's prompt is the conversation above it
