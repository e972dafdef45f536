"""A run stopped by anything the process survives is recorded as ended, never left `running`;
a run whose process was killed outright shows as `interrupted (resume RUN)`."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import pytest

import loopdsl
from loopdsl.adapters.store.run_store import RunStore

sys.path.insert(0, str(Path(__file__).parents[1]))
from cli_in_process import cli_in_process  # noqa: E402
from on_a_terminal import TerminalSession, interruptible_loopdsl  # noqa: E402

DATA = Path(__file__).parents[1] / "data" / "durable"


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("LOOPDSL_")}


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """A command's answer, in this process (tests/cli_in_process.py); the runs that are
    interrupted, killed or Ctrl-C'd are real processes."""
    return cli_in_process(args, cwd)


def _start_sleeper(tmp_path: Path, store: Path) -> subprocess.Popen[str]:
    """`loopdsl run` holding its run in a long shell state, in its own session (as a terminal would
    put it in its own process group), once it has started the command."""
    marks = tmp_path / "marks"
    marks.mkdir()
    proc = subprocess.Popen(
        interruptible_loopdsl("run", str(DATA / "sleeper.yaml"), "--store", str(store),
                              "--input", f"marks={marks}", "--input", "seconds=30"),
        cwd=tmp_path, env=_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )
    deadline = time.monotonic() + 30
    while not list(marks.iterdir()):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the shell state never started"
        time.sleep(0.05)
    return proc


def _only_run(store: Path) -> dict[str, Any]:
    with RunStore(store) as st:
        records = st.list_runs()
    assert len(records) == 1
    return records[0]


def test_ctrl_c_records_the_run_aborted_and_exits_130(tmp_path: Path) -> None:
    store = tmp_path / "store"
    proc = _start_sleeper(tmp_path, store)
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal sends to the foreground group
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    record = _only_run(store)
    assert record["status"] == "aborted"
    assert record["error"]["kind"] == "interrupted"
    assert record["ended_at"]
    # An ended run is not resumable, and `runs` says what it is.
    table = _cli(["runs", "--store", str(store)], tmp_path)
    assert "aborted" in table.stdout and "interrupted" not in table.stdout


def test_a_killed_run_shows_as_interrupted_with_the_command_that_continues_it(tmp_path: Path) -> None:
    store = tmp_path / "store"
    proc = _start_sleeper(tmp_path, store)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    run_id = _only_run(store)["run_id"]
    table = _cli(["runs", "--store", str(store)], tmp_path)
    assert table.returncode == 0, table.stderr
    row = table.stdout.splitlines()[1]
    assert f"interrupted (resume {run_id})" in row
    listed = _cli(["runs", "--store", str(store), "--json"], tmp_path)
    import json

    (entry,) = json.loads(listed.stdout)
    assert entry["status"] == "running" and entry["interrupted"] is True


def test_a_running_run_whose_process_is_alive_is_not_called_interrupted(tmp_path: Path) -> None:
    store = tmp_path / "store"
    proc = _start_sleeper(tmp_path, store)
    try:
        table = _cli(["runs", "--store", str(store)], tmp_path)
        assert "interrupted" not in table.stdout
        assert " running " in table.stdout
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)


LLM_LOOP = """\
loopdsl: 1
name: asks
models:
  m: {model: openai/gpt-4o-mini, max_tokens: 50}
budget: {tokens: 10000}
start: ask
states:
  ask: {llm: {model: m, prompt: "hello"}, next: again}
  again: {llm: {model: m, prompt: "again"}, next: done}
  done: {end: completed}
"""


def test_a_reply_script_that_runs_out_ends_the_run_failed_with_its_error(tmp_path: Path) -> None:
    loop = tmp_path / "asks.yaml"
    loop.write_text(LLM_LOOP)
    script = tmp_path / "asks.replies.yaml"
    script.write_text("ask: [\"hi\"]\n")
    store = tmp_path / "store"
    done = _cli(["run", str(loop), "--script", str(script), "--store", str(store)], tmp_path)
    assert done.returncode == 2, done.stderr
    assert "reply script" in done.stderr and "Traceback" not in done.stderr
    record = _only_run(store)
    assert record["status"] == "failed"
    assert record["error"]["kind"] == "reply_script" and record["error"]["state"] == "again"


class _BrokenProvider:
    """A provider port with a bug in it: the engine must still record how the run ended."""

    async def complete(self, request: Any, *, state: str) -> Any:
        raise RuntimeError("provider bug")

    def count_tokens(self, model: str, messages: Sequence[Mapping[str, str]]) -> int:
        return 5


def test_an_internal_error_ends_the_run_failed_and_still_propagates(tmp_path: Path) -> None:
    loop = tmp_path / "asks.yaml"
    loop.write_text(LLM_LOOP)
    store = tmp_path / "store"
    with pytest.raises(RuntimeError, match="provider bug"):
        loopdsl.run(loop, provider=_BrokenProvider(), store=store, workdir=tmp_path)
    record = _only_run(store)
    assert record["status"] == "failed"
    assert record["error"] == {"state": "ask", "kind": "internal", "message": "RuntimeError: provider bug"}
    assert record["pending"] is None
    # Nothing was sent, so nothing stays reserved or charged.
    assert record["ledger"]["tokens"] == 0 and record["ledger"]["outstanding"] == []


def test_the_exit_code_table_lists_130() -> None:
    doc = (Path(__file__).parents[2] / "docs" / "cli.md").read_text(encoding="utf-8")
    assert "| 130 |" in textwrap.dedent(doc)


def test_ctrl_c_at_a_checkpoint_prompt_records_the_run_aborted(tmp_path: Path) -> None:
    """On a real terminal (a pty): Ctrl-C at the prompt stops the run at once (asyncio's
    handler alone would wait for a second Ctrl-C), even when it lands the moment the prompt
    shows, and is recorded as an interruption."""
    store = tmp_path / "store"
    session = TerminalSession(["run", str(DATA / "checkpoint.yaml"), "--store", str(store)], tmp_path)
    try:
        assert b"decision" in session.read_until(b"decision", 60), session.seen
        session.type(b"\x03")  # the terminal turns it into SIGINT for the foreground group
        session.read_until(None, 30)
    finally:
        code = session.exit_code(10)
    seen = session.seen
    assert code == 130, seen
    assert b"Traceback" not in seen
    record = _only_run(store)
    assert record["status"] == "aborted" and record["error"]["kind"] == "interrupted"
