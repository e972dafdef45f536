"""Two processes never drive one run, and two decisions never both count.

Real `loopdsl` processes on a real store: one is suspended (SIGSTOP) past its run lock's
ttl while another resumes the run; when the first is continued (SIGCONT) it must find the
run taken over, stop with exit 5 and write nothing more. Concurrent `approve` and `reject`
of one checkpoint: exactly one is recorded, the other exits 5.
"""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import crash_torture as ct

sys.path.insert(0, str(Path(__file__).parents[1]))
from cli_in_process import cli_in_process  # noqa: E402

from loopdsl.adapters.store.run_store import RunStore
from cli_forked import loopdsl_command

DATA = Path(__file__).parents[1] / "data" / "durable"
EXIT_CHANGED = 5


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """A command whose answer is the point, in this process (tests/cli_in_process.py);
    what two processes do at once runs in real ones."""
    return cli_in_process(args, cwd, {"LOOPDSL_USER": "crash-tester"})


def _run_id(store: Path, cwd: Path) -> str:
    listed = _cli(["runs", "--store", str(store), "--json"], cwd)
    assert listed.returncode == 0, listed.stderr
    return str(json.loads(listed.stdout)[0]["run_id"])


def _suspend_outside_a_write(pid: int, store: Path) -> None:
    """SIGSTOP the process between two of its store writes. Stopped inside one (its lock's
    heartbeat writes every fraction of a second), it would hold SQLite's write lock, and no
    other process could open the store until it is continued: a different case from the one
    here, met now and then on a loaded machine."""
    for _ in range(100):
        os.kill(pid, signal.SIGSTOP)
        probe = sqlite3.connect(store / "cache.db", timeout=0.2)
        try:
            probe.execute("BEGIN IMMEDIATE")  # the write lock, free unless the process holds it
            probe.rollback()
            return
        except sqlite3.OperationalError:
            os.kill(pid, signal.SIGCONT)
            time.sleep(0.02)
        finally:
            probe.close()
    raise AssertionError("the process was inside a store write at each of 100 tries")


def _finish(proc: subprocess.Popen[str], timeout: float = 60) -> tuple[int, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out + err


@pytest.mark.slow
def test_a_suspended_process_taken_over_stops_and_records_nothing(tmp_path: Path) -> None:
    marks, store = tmp_path / "marks", tmp_path / "store"
    marks.mkdir()
    loop = DATA / "takeover.yaml"
    first = ct.launch(["run", str(loop), "--store", str(store), "--input", f"marks={marks}"], tmp_path)
    try:
        ct.wait_until(lambda: ct.markers(marks, "slow") >= 1, first, what="the slow step")
        _suspend_outside_a_write(first.pid, store)
        time.sleep(ct.LOCK_TTL_S * 4)  # its lock expires: it cannot refresh it while stopped
        run_id = _run_id(store, tmp_path)
        code, output = _finish(ct.launch(["resume", run_id, "--store", str(store)], tmp_path))
        assert code == 0, output
        with RunStore(store) as probe:
            after_second = (probe.load(run_id), len(probe.events(run_id)))
        assert after_second[0]["status"] == "completed"
    finally:
        os.kill(first.pid, signal.SIGCONT)
    code, output = _finish(first)
    assert code == EXIT_CHANGED, output
    assert f"another process took over run {run_id}" in output and "recorded nothing more" in output
    assert "Traceback" not in output
    # The step that must run once ran once, and the first process wrote nothing more.
    assert (marks / "once.log").read_text() == "ran\n"
    with RunStore(store) as probe:
        assert (probe.load(run_id), len(probe.events(run_id))) == after_second


def test_a_commit_under_a_lock_taken_over_is_refused(tmp_path: Path) -> None:
    from loopdsl.adapters.store.run_store import RunChanged

    with RunStore(tmp_path / "store") as first, RunStore(tmp_path / "store") as second:
        first.create_run("r1", {"status": "running"})
        old = first.lock("r1", ttl=0.3)
        old._stop.set()  # as if suspended: no more heartbeats
        time.sleep(0.5)
        new = second.lock("r1", ttl=5)
        second.commit("r1", {"status": "running", "by": "second"}, [{"type": "x"}], lock=new)
        new.release()  # even after the new holder let go, the old one stays fenced off
        try:
            first.commit("r1", {"status": "failed", "by": "first"}, [{"type": "y"}], lock=old)
        except RunChanged:
            pass
        else:
            raise AssertionError("the commit of a taken-over lock went through")
        assert first.load("r1")["by"] == "second" and first.events("r1") == [{"type": "x"}]


def _waiting_run(tmp_path: Path) -> tuple[Path, str]:
    loop = tmp_path / "gate.yaml"
    loop.write_text(
        "loopdsl: 1\nname: gate\ndescription: waits for a person\nbudget: {steps: 10}\nstart: ask\n"
        "states:\n  ask:\n    checkpoint: {message: go?}\n    transitions:\n"
        "      - {to: yes, when: \"ask.decision == 'approve'\"}\n      - {to: no}\n"
        "  yes: {end: completed}\n  no: {end: failed}\n"
    )
    store = tmp_path / "store"
    done = _cli(["run", str(loop), "--store", str(store)], tmp_path)
    assert done.returncode == 4, done.stderr
    return store, _run_id(store, tmp_path)


def test_concurrent_approve_and_reject_record_exactly_one(tmp_path: Path) -> None:
    store, run_id = _waiting_run(tmp_path)
    procs = [subprocess.Popen([*loopdsl_command(), verb, run_id, "--store", str(store)], cwd=tmp_path,
                              env=ct.cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for verb in ("approve", "reject")]
    results = [_finish(p) for p in procs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, EXIT_CHANGED], results
    winner = "approve" if results[0][0] == 0 else "reject"
    loser_output = results[1][1] if winner == "approve" else results[0][1]
    assert f"run {run_id} already has a decision: '{winner}'" in loser_output
    with RunStore(store) as probe:
        assert probe.load(run_id)["decision"]["decision"] == winner
        assert [e["decision"] for e in probe.events(run_id) if e.get("type") == "decision"] == [winner]


def test_a_second_decision_after_the_first_is_refused(tmp_path: Path) -> None:
    store, run_id = _waiting_run(tmp_path)
    assert _cli(["approve", run_id, "--store", str(store)], tmp_path).returncode == 0
    late = _cli(["reject", run_id, "--store", str(store)], tmp_path)
    assert late.returncode == EXIT_CHANGED and "already has a decision: 'approve'" in late.stderr
    assert "recorded" not in late.stdout
    resumed = _cli(["resume", run_id, "--store", str(store)], tmp_path)
    assert resumed.returncode == 0, resumed.stderr


def test_a_response_stored_under_a_lock_taken_over_is_refused(tmp_path: Path) -> None:
    from loopdsl.adapters.store.run_store import RunChanged

    with RunStore(tmp_path / "store") as first, RunStore(tmp_path / "store") as second:
        first.create_run("r1", {"status": "running"})
        old = first.lock("r1", ttl=0.3)
        old._stop.set()  # as if suspended: no more heartbeats
        time.sleep(0.5)
        second.lock("r1", ttl=5).release()
        try:
            first.put_response("k", {"text": "late"}, lock=old)
        except RunChanged:
            pass
        else:
            raise AssertionError("a response was stored under a taken-over lock")
        assert first.get_response("k") is None
