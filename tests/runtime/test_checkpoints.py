"""Checkpoints wait for people: exit 4, approve/reject/decide with who and when, timeouts.

Runs and decisions go through the CLI where its output or exit code is the point (in-process,
tests/cli_in_process.py, but for two real processes); resumes run in-process (`loopdsl.resume`) against the same on-disk store.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

import loopdsl
from loopdsl.adapters.store.run_store import RunStore

sys.path.insert(0, str(Path(__file__).parents[1]))
from cli_in_process import cli_in_process  # noqa: E402
from cli_forked import loopdsl_command  # noqa: E402
from on_a_terminal import TerminalSession  # noqa: E402

DATA = Path(__file__).parents[1] / "data" / "durable"


def _cli(args: list[str], cwd: Path, **env: str | None) -> subprocess.CompletedProcess[str]:
    """The command's answer, in this process (tests/cli_in_process.py); `None` unsets a variable."""
    return cli_in_process(args, cwd, env)


def _cli_process(args: list[str], cwd: Path, **env: str | None) -> subprocess.CompletedProcess[str]:
    """`python -m loopdsl ARGS` as a process of its own (a run waiting with no terminal;
    who decides, read from the process's environment and git)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("LOOPDSL_")}
    for key, value in env.items():
        if value is None:
            environ.pop(key, None)
        else:
            environ[key] = value
    return subprocess.run([*loopdsl_command(), *args], check=False, cwd=cwd, env=environ, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=60)


def _waiting_run(tmp_path: Path, loop: str, **inputs: str) -> tuple[Path, str]:
    store = tmp_path / "store"
    result = loopdsl.run(DATA / loop, inputs=inputs, store=store, workdir=tmp_path)
    assert result.status == "waiting" and result.exit_code == 4
    return store, result.run_id


def _near_now(stamp: str) -> bool:
    at = datetime.fromisoformat(stamp)
    return at.tzinfo is not None and abs(datetime.now(timezone.utc) - at) < timedelta(seconds=60)


def test_run_at_a_checkpoint_exits_4_and_says_how_to_decide(tmp_path: Path) -> None:
    store = tmp_path / "store"
    done = _cli_process(["run", str(DATA / "checkpoint.yaml"), "--store", str(store)], tmp_path)
    assert done.returncode == 4, done.stderr
    run_id = RunStore(store).list_runs()[0]["run_id"]
    out = done.stdout
    assert f"run {run_id}: waiting" in out
    assert "waiting at 'ask': Ship release 1.2?" in out  # the message is rendered
    assert f"loopdsl approve {run_id} --store {store}" in out and f"loopdsl reject {run_id} --store {store}" in out
    assert f"loopdsl resume {run_id} --store {store}" in out
    record = RunStore(store).load(run_id)
    assert record["status"] == "waiting" and record["current"] == "ask"
    assert _near_now(record["waiting"]["since"])
    assert record["waiting"]["choices"] == ["approve", "reject"]


def test_approve_records_who_and_when_and_later_templates_see_it(tmp_path: Path) -> None:
    store, run_id = _waiting_run(tmp_path, "checkpoint.yaml")
    done = _cli(["approve", run_id, "--store", str(store), "--comment", "looks right"], tmp_path, LOOPDSL_USER="alice")
    assert done.returncode == 0, done.stderr
    assert f"run {run_id}: recorded 'approve' by alice at " in done.stdout
    assert f"loopdsl resume {run_id}" in done.stdout
    decided = RunStore(store).load(run_id)["decision"]
    assert decided["decision"] == "approve" and decided["by"] == "alice" and decided["comment"] == "looks right"
    assert _near_now(decided["at"])

    result = loopdsl.resume(run_id, store=store)
    assert result.status == "completed" and result.path == ["prepare", "ask", "shipped"]
    assert result.outputs == {"said": "approve by alice: looks right", "at": decided["at"]}
    assert result.state.results["ask"]["decision"] == "approve"
    decisions = [e for e in RunStore(store).events(run_id) if e["type"] == "decision"]
    assert decisions and decisions[0]["by"] == "alice"

    # `show` (text) says who decided, when and why, once (docs/tutorials/04 promises it).
    shown = _cli(["show", run_id, "--store", str(store)], tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert f'  ask: approve by alice at {decided["at"]}: "looks right"' in shown.stdout.splitlines()
    assert shown.stdout.count("ask: approve by alice") == 1


def test_a_person_at_the_terminal_decides_there_and_a_wrong_choice_is_asked_again(tmp_path: Path) -> None:
    """On a real terminal (a pty) the run asks, refuses an answer that is not a choice, takes
    the decision and comment typed, and goes on in the same process."""
    store = tmp_path / "store"
    session = TerminalSession(["run", str(DATA / "checkpoint.yaml"), "--store", str(store)], tmp_path,
                              {"LOOPDSL_USER": "dana"})
    try:
        asked = session.read_until(b"[later]: ", 60)
        assert b"[ask] Ship release 1.2?" in asked and b"decision (approve, reject, later) [later]: " in asked, asked
        session.type(b"maybe\n")
        again = session.read_until(b"[later]: ", 30)
        assert b"Error: 'maybe' is not one of 'approve', 'reject', 'later'." in again, session.seen
        session.type(b"  approve \n")
        assert b"comment: " in session.read_until(b"comment: ", 30), session.seen
        session.type(b"ship it\n")
        session.read_until(None, 60)
    finally:
        code = session.exit_code(10)
    assert code == 0, session.seen
    with RunStore(store) as runs:
        (record,) = runs.list_runs()
    assert record["status"] == "completed" and record["path"] == ["prepare", "ask", "shipped"], record
    assert record["outputs"]["said"] == "approve by dana: ship it"


def test_show_lists_a_decision_recorded_before_the_resume(tmp_path: Path) -> None:
    store, run_id = _waiting_run(tmp_path, "checkpoint.yaml")
    assert "decisions:" not in _cli(["show", run_id, "--store", str(store)], tmp_path).stdout
    _cli(["reject", run_id, "--store", str(store)], tmp_path, LOOPDSL_USER="bob")
    shown = _cli(["show", run_id, "--store", str(store)], tmp_path).stdout
    assert "decisions:" in shown and "  ask: reject by bob at " in shown


def test_reject_takes_the_other_route(tmp_path: Path) -> None:
    store, run_id = _waiting_run(tmp_path, "checkpoint.yaml")
    done = _cli(["reject", run_id, "--store", str(store), "-m", "not yet"], tmp_path, LOOPDSL_USER="bob")
    assert done.returncode == 0, done.stderr
    result = loopdsl.resume(run_id, store=store)
    assert result.status == "failed" and result.path[-1] == "dropped"
    assert result.outputs["said"] == "reject by bob: not yet"


def test_without_loopdsl_user_the_git_identity_decides(tmp_path: Path) -> None:
    store, run_id = _waiting_run(tmp_path, "checkpoint.yaml")
    home = tmp_path / "home"
    home.mkdir()
    (home / ".gitconfig").write_text("[user]\n\tname = Grace Hopper\n\temail = grace@example.com\n")
    done = _cli_process(["approve", run_id, "--store", str(store)], tmp_path, LOOPDSL_USER=None, HOME=str(home),
                XDG_CONFIG_HOME=str(home), GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=None)
    assert done.returncode == 0, done.stderr
    assert RunStore(store).load(run_id)["decision"]["by"] == "Grace Hopper <grace@example.com>"


def test_decide_records_a_custom_choice_and_refuses_others(tmp_path: Path) -> None:
    store, run_id = _waiting_run(tmp_path, "checkpoint_choices.yaml")
    wrong = _cli(["decide", run_id, "maybe", "--store", str(store)], tmp_path, LOOPDSL_USER="carol")
    assert wrong.returncode == 2
    assert "'maybe' is not a choice of checkpoint 'ask'" in wrong.stderr and "ship, hold, scrap" in wrong.stderr
    approve = _cli(["approve", run_id, "--store", str(store)], tmp_path, LOOPDSL_USER="carol")
    assert approve.returncode == 2 and "'approve' is not a choice" in approve.stderr and "ship, hold, scrap" in approve.stderr
    assert "Traceback" not in wrong.stderr + approve.stderr
    assert RunStore(store).load(run_id)["decision"] is None  # refusals record nothing

    done = _cli(["decide", run_id, "hold", "--store", str(store), "-m", "wait for QA"], tmp_path, LOOPDSL_USER="carol")
    assert done.returncode == 0 and "recorded 'hold' by carol" in done.stdout
    result = loopdsl.resume(run_id, store=store)
    assert result.status == "escalated" and result.outputs == {"route": "held by carol"}
    assert result.state.results["ask"]["comment"] == "wait for QA"


def test_approve_on_custom_choices_points_to_decide(tmp_path: Path) -> None:
    store, run_id = _waiting_run(tmp_path, "checkpoint_choices.yaml")
    approve = _cli(["approve", run_id, "--store", str(store)], tmp_path)
    assert approve.returncode == 2 and "loopdsl decide" in approve.stderr


def test_a_decision_on_a_run_that_is_not_waiting_is_refused(tmp_path: Path) -> None:
    store, run_id = _waiting_run(tmp_path, "checkpoint.yaml")
    from loopdsl.api.durable import decide

    decide(run_id, "approve", store=store, by="dave")
    assert loopdsl.resume(run_id, store=store).status == "completed"
    again = _cli(["approve", run_id, "--store", str(store)], tmp_path)
    assert again.returncode == 2 and "is not waiting for a decision (status: completed)" in again.stderr


def test_checkpoint_timeout_refuses_late_decisions_and_takes_on_timeout(tmp_path: Path) -> None:
    store = tmp_path / "store"
    late = loopdsl.run(DATA / "checkpoint_timeout.yaml", inputs={"which": "late"}, store=store, workdir=tmp_path)
    strict = loopdsl.run(DATA / "checkpoint_timeout.yaml", inputs={"which": "strict"}, store=store, workdir=tmp_path)
    assert late.status == strict.status == "waiting"
    # Within the timeout a decision would be taken; after it, it is refused.
    time.sleep(1.3)
    refused = _cli(["approve", late.run_id, "--store", str(store)], tmp_path, LOOPDSL_USER="erin")
    assert refused.returncode == 2
    assert "checkpoint 'late' timed out" in refused.stderr and "the decision is refused" in refused.stderr
    assert f"loopdsl resume {late.run_id}` takes its on_timeout route" in refused.stderr
    assert RunStore(store).load(late.run_id)["decision"] is None

    routed = loopdsl.resume(late.run_id, store=store)
    assert routed.status == "escalated" and routed.path[-1] == "timed_out" and routed.outputs == {"note": "nobody decided"}
    ended = loopdsl.resume(strict.run_id, store=store)  # no on_timeout: the run ends failed
    assert ended.status == "failed" and ended.state.error["kind"] == "timeout"
    assert "no decision within 1s" in ended.state.error["message"]


def test_decision_in_time_is_taken_even_if_resumed_after_the_timeout(tmp_path: Path) -> None:
    store = tmp_path / "store"
    late = loopdsl.run(DATA / "checkpoint_timeout.yaml", inputs={"which": "late"}, store=store, workdir=tmp_path)
    from loopdsl.api.durable import decide

    decide(late.run_id, "approve", store=store, by="frank")
    time.sleep(1.2)  # the timeout runs from `waiting` to the decision, not to the resume
    result = loopdsl.resume(late.run_id, store=store)
    assert result.status == "completed" and result.path[-1] == "approved"


def test_unattended_loop_with_a_checkpoint_is_a_lint_error(tmp_path: Path) -> None:
    store = tmp_path / "store"
    done = _cli(["run", str(DATA / "checkpoint_unattended.yaml"), "--store", str(store)], tmp_path)
    assert done.returncode == 2
    assert "checkpoint-unattended" in done.stderr and "unattended: true" in done.stderr
    assert "Traceback" not in done.stderr
    assert not store.exists() or RunStore(store).list_runs() == []  # nothing was started


@pytest.mark.parametrize("decider", ["approve", "reject"])
def test_decisions_on_an_unknown_run_are_clear_errors(tmp_path: Path, decider: str) -> None:
    store = tmp_path / "store"
    RunStore(store).close()
    done = _cli([decider, "nosuchrun", "--store", str(store)], tmp_path)
    assert done.returncode == 2 and "no run matches 'nosuchrun'" in done.stderr and "Traceback" not in done.stderr
