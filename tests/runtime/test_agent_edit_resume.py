"""An edit_file call cut off by a crash: its expected post-edit hash is recorded when it
starts, and on resume a file that already has it counts as done (not run again, no person
asked); a file without it leaves the decision to a person, as for any non-idempotent tool.

The crash is made real (SIGKILL while the next turn hangs), then the call's stored record
is put back to what the store held between its `tool_started` commit and its result: the
`started` record, rebuilt from the committed `tool_started` event."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from git_repos import make_repo

from loopdsl.adapters.store.run_store import RunStore
from loopdsl.runtime.actions.agent_turns import agent_key

DRIVER = Path(__file__).with_name("agent_edit_crash_driver.py")
LOOP = """\
loopdsl: 1
name: editor
workspace: {worktree: true}
models:
  m: {model: openai/gpt-4o-mini, max_tokens: 50, price: {input_per_mtok: 1, output_per_mtok: 2}}
start: work
states:
  work:
    agent: {model: m, prompt: Fix calc.py., tools: [edit_file], max_turns: 4, output: json}
    next: done
  done: {end: completed}
"""


def _driver(tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    env = dict(os.environ, HANG_FLAG=str(tmp_path / "hang"), PYTHONUNBUFFERED="1")
    env.pop("LOOPDSL_STORE", None)
    return subprocess.Popen([sys.executable, str(DRIVER), *args], cwd=tmp_path, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def crashed_after_the_edit(tmp_path: Path) -> tuple[Path, str, Path]:
    store = tmp_path / "store"
    repo = make_repo(tmp_path / "repo", {"calc.py": "def add(a, b):\n    return a - b\n", "loop.yaml": LOOP})
    proc = _driver(tmp_path, "run", str(store), str(repo))
    deadline = time.monotonic() + 60
    while not (tmp_path / "hang").exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate()
    probe = RunStore(store)
    [run_id] = [r["run_id"] for r in probe.list_runs()]
    [started] = [e for e in probe.events(run_id) if e["type"] == "tool_started"]
    assert started["name"] == "edit_file" and len(started["edit_sha256"]) == 64
    key = agent_key("tool", run=run_id, state="work", visit=1, attempt=1, turn=1, call="call_1_1")
    assert probe.get_response(key)["status"] == "done"
    probe.put_response(key, {"status": "started", "args_hash": started["args_hash"], "edit_sha256": started["edit_sha256"]})
    return store, run_id, Path(probe.load_run(run_id)["meta"]["worktree"]["path"])


def resume(tmp_path: Path, store: Path, run_id: str) -> str:
    out, err = _driver(tmp_path, "resume", str(store), run_id).communicate(timeout=120)
    assert out.strip(), err
    return str(json.loads(out.strip().splitlines()[-1])["status"])


def test_a_cut_off_edit_already_done_is_reused(tmp_path: Path) -> None:
    store, run_id, worktree = crashed_after_the_edit(tmp_path)
    assert resume(tmp_path, store, run_id) == "completed"
    result = RunStore(store).load_run(run_id)["results"]["work"]
    [call] = result["tool_calls"]
    assert call["ok"] is True and call["result"]["path"] == "calc.py"  # taken as done, not rerun (it would fail)
    assert "stopped_leftover" not in {e["type"] for e in RunStore(store).events(run_id)}
    assert result["changed_files"] == ["calc.py"]


def test_a_cut_off_edit_not_done_waits_for_a_person(tmp_path: Path) -> None:
    store, run_id, worktree = crashed_after_the_edit(tmp_path)
    (worktree / "calc.py").write_text("def add(a, b):\n    return a - b\n")  # as if the crash came before the write
    assert resume(tmp_path, store, run_id) == "waiting"
    waiting = RunStore(store).load_run(run_id)
    assert "was cut off by a crash" in json.dumps(waiting)
