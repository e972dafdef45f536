"""What a person reads about spending (the progress line, the summary, `show`) comes from one
source, the ledger: a call charged without a reply and spending restored on resume count the
same everywhere."""
from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import loopdsl
from loopdsl.adapters.terminal import Progress, show_text, summary
from loopdsl.adapters.store.run_store import RunStore
from stub_server import StubServer
from test_engine_http import loop_file

pytestmark = pytest.mark.xdist_group("litellm")  # LiteLLM imported in-process: once a run, on one worker

BRACKET = re.compile(r"\[tokens (\d+)(/\d+)? \| cost \$([\d.]+)(/\$[\d.]+)? \| steps (\d+)(/\d+)?\]")


def _per_state_tokens(text: str) -> int:
    lines = text.split("per state:\n", 1)[1].splitlines()
    rows = [ln for ln in lines if ln.startswith("  ") and "attempt(s)" in ln]
    return sum(int(re.search(r"(\d+) tokens", row).group(1)) for row in rows)  # type: ignore[union-attr]


@pytest.mark.slow
def test_a_timed_out_call_is_counted_alike_by_progress_summary_and_show(stub_server: StubServer, tmp_path: Path) -> None:
    stub_server.reply_slow(4.0)
    loop = loop_file(tmp_path, stub_server, alias_extra="timeout: 0.5s", top_extra="budget: {tokens: 5000}")
    out = io.StringIO()
    work = tmp_path / "work"
    work.mkdir()
    store = tmp_path / "store"
    result = loopdsl.run(loop, workdir=work, store=store, listeners=[Progress({}, stream=out)])
    assert result.status == "failed" and result.tokens > 0
    shown = [BRACKET.search(line) for line in out.getvalue().splitlines()]
    last = [m for m in shown if m][-1]
    assert int(last.group(1)) == result.tokens  # the progress line agrees with the summary
    assert last.group(2) == "/5000"  # the caps came with the run's start event
    assert "failed (timeout), charged" in out.getvalue()

    with RunStore(store) as st:
        events = st.events(result.run_id)
    text = show_text(result.state, events)
    assert f"ask #1 openai/stubby: failed (timeout), charged {result.tokens} tokens" in text
    assert _per_state_tokens(summary(result.state)) == result.tokens


@pytest.mark.slow
def test_after_a_crash_resume_keeps_the_caps_and_the_per_state_table_adds_up(stub_server: StubServer, tmp_path: Path) -> None:
    # The first call hangs; the process is killed while it is in flight (its reservation is
    # charged on resume), and the resumed run's call is answered.
    stub_server.reply_slow(60.0)
    stub_server.reply_text("answer", prompt_tokens=20, completion_tokens=10)
    loop = loop_file(tmp_path, stub_server, top_extra="budget: {tokens: 5000, cost_usd: 1}")
    work = tmp_path / "work"
    work.mkdir()
    store = tmp_path / "store"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPDSL_")}
    proc = subprocess.Popen([sys.executable, "-m", "loopdsl", "run", str(loop), "--store", str(store), "--quiet"],
                            cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 60
    while not stub_server.requests:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the call never reached the stub"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)

    with RunStore(store) as st:
        (record,) = st.list_runs()
    out = io.StringIO()
    result = loopdsl.resume(record["run_id"], store=store, listeners=[Progress({}, stream=out)])
    assert result.status == "completed", result.state.error
    assert len(stub_server.requests) == 2
    brackets = [m for m in map(BRACKET.search, out.getvalue().splitlines()) if m]
    assert brackets and all(m.group(2) == "/5000" and m.group(4) == "/$1.0000" for m in brackets)
    assert int(brackets[-1].group(1)) == result.tokens
    text = summary(result.state)
    assert _per_state_tokens(text) == result.tokens
    assert result.state.usage["ask"]["tokens"] == result.tokens
