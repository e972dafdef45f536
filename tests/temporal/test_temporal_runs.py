"""Loops run as Temporal workflows on a real dev server, driven through the CLI.

Model calls go through LiteLLM to a loopback stub as activities; commands run in the
worker's checkout; a checkpoint is a durable wait that `approve --temporal` ends from
anywhere, and that refuses a decision after its timeout.
"""
from __future__ import annotations

import json
import subprocess
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from ports import free_port

from tests.stub_server import StubServer

from cli_forked import loopdsl_command

from .conftest import Workers, cli_env, loopdsl
from .replay import replay

pytestmark = pytest.mark.slow

LOOP = """\
loopdsl: 1
name: asks
models:
  m: {{model: openai/gpt-4o-mini, api_base: "{api_base}", max_tokens: 50}}
start: ask
states:
  ask:
    llm: {{model: m, prompt: "name a file"}}
    next: make
  make:
    shell: "echo made > made.txt; echo {{{{ ask.text }}}}"
    gates:
      after:
        - name: made-a-file
          shell: test -s made.txt
    next: approve
  approve:
    checkpoint: {{message: "Keep {{{{ make.stdout }}}}?"{timeout}}}
    {on_timeout}
    transitions:
      - {{to: done, when: "approve.decision == 'approve'"}}
      - {{to: dropped}}
  done: {{end: completed, output: {{said: "{{{{ ask.text }}}}", by: "{{{{ approve.by }}}}"}}}}
  dropped: {{end: failed}}
{late}"""


def write_loop(repo: Path, api_base: str, timeout: str | None = None) -> Path:
    repo.mkdir(parents=True, exist_ok=True)
    text = LOOP.format(api_base=api_base, timeout=f", timeout: {timeout}" if timeout else "",
                       on_timeout="on_timeout: late" if timeout else "",
                       late="  late: {end: escalated}\n" if timeout else "")
    (repo / "loop.yaml").write_text(text)
    return repo / "loop.yaml"


def run_id_of(stderr: str) -> str:
    for line in stderr.splitlines():
        if line.startswith("run ") and " started " in line:
            return line.split()[1]
    raise AssertionError(stderr)


def _wait_for(workers: Workers, repo: Path, run_id: str, check: Any, limit_s: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + limit_s
    while True:
        run = json.loads(loopdsl("show", run_id, "--temporal", workers.address, "--json", cwd=repo).stdout)["run"]
        if check(run) or time.monotonic() > deadline:
            return dict(run)
        time.sleep(0.2)


def start_scripted(repo: Path, workers: Workers, timeout: str | None = None) -> subprocess.CompletedProcess[str]:
    """The loop run with its model's reply from a script, on a `--no-models` worker: the tests
    using it are about the checkpoint (the first test makes the real model call)."""
    write_loop(repo, "http://127.0.0.1:9/v1", timeout)  # never called: the script answers
    (repo / "replies.yaml").write_text("ask:\n  - text: notes\n")
    workers.start(repo, models=False)
    return loopdsl("run", "loop.yaml", "--script", "replies.yaml", "--temporal", workers.address, "--task-queue",
                   workers.queue, cwd=repo)


def test_a_run_waits_without_a_worker_and_is_approved_from_elsewhere(tmp_path: Path, workers: Workers) -> None:
    repo, elsewhere = tmp_path / "repo", tmp_path / "elsewhere"
    elsewhere.mkdir()
    with StubServer() as stub:
        stub.reply_text("notes", prompt_tokens=12, completion_tokens=3)
        write_loop(repo, stub.api_base)
        first = workers.start(repo)
        started = loopdsl("run", "loop.yaml", "--temporal", workers.address, "--task-queue", workers.queue, cwd=repo)
        assert started.returncode == 4, started.stdout + started.stderr
        assert "waiting at 'approve'" in started.stdout and "--temporal" in started.stdout
        run_id = run_id_of(started.stderr)
        assert (repo / "made.txt").read_text() == "made\n"  # the command ran in the worker's checkout
        assert len(stub.requests) == 1

        # No process holds the waiting run: its only worker goes away, another comes.
        workers.stop_all()
        assert first.poll() is not None
        workers.start(repo, models=False)  # the rest of the run calls no model: it is replayed from history
        decided = loopdsl("approve", run_id, "--temporal", workers.address, "-m", "fine", cwd=elsewhere,
                          LOOPDSL_USER="reviewer")
        assert decided.returncode == 0, decided.stderr
        assert "recorded 'approve' by reviewer" in decided.stdout

        deadline = time.monotonic() + 30
        while True:
            shown = loopdsl("show", run_id, "--temporal", workers.address, "--json", cwd=elsewhere)
            assert shown.returncode == 0, shown.stderr
            view = json.loads(shown.stdout)
            if view["run"]["status"] != "waiting" or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        run = view["run"]
        assert run["status"] == "completed", run
        assert run["path"] == ["ask", "make", "approve", "done"]
        assert run["outputs"] == {"said": "notes", "by": "reviewer"}
        assert run["ledger"]["tokens"] == 15
        assert len(stub.requests) == 1, "the paid reply was read from history, not asked again"
        assert [e["type"] for e in view["events"]].count("llm") == 1

        again = loopdsl("approve", run_id, "--temporal", workers.address, cwd=elsewhere)
        assert again.returncode != 0 and "not waiting" in again.stderr
        listed = loopdsl("runs", "--temporal", workers.address, "--json", cwd=elsewhere)
        assert any(r["run_id"] == run_id and r["status"] == "completed" for r in json.loads(listed.stdout))
        assert any(e["type"] == "gate" and e.get("gate") == "made-a-file" and e["passed"] for e in view["events"])

    # Its history (a model call, a gate, a checkpoint and its Update, two workers) replays
    # against the current code with the engine sandboxed: the workflow is deterministic.
    history = replay(workers.address, run_id, repo)
    kinds = {e.event_type for e in history.events}
    from temporalio.api.enums.v1 import EventType

    assert {EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED} <= kinds


def test_a_decision_after_the_timeout_is_refused_and_on_timeout_taken(tmp_path: Path, workers: Workers) -> None:
    repo = tmp_path / "repo"
    started = start_scripted(repo, workers, "2s")
    assert started.returncode == 4, started.stderr
    run_id = run_id_of(started.stderr)
    time.sleep(2.5)
    late = loopdsl("approve", run_id, "--temporal", workers.address, cwd=repo)
    assert late.returncode != 0
    assert "refused" in late.stderr or "not waiting" in late.stderr, late.stderr
    shown = loopdsl("show", run_id, "--temporal", workers.address, "--json", cwd=repo)
    run = json.loads(shown.stdout)["run"]
    assert run["status"] == "escalated" and run["path"][-1] == "late", run
    assert run["decision"] is None
    # The refused Update left no trace; the durable timer that ended the wait replays.
    from temporalio.api.enums.v1 import EventType

    kinds = {e.event_type for e in replay(workers.address, run_id, repo).events}
    assert EventType.EVENT_TYPE_TIMER_FIRED in kinds
    assert EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED not in kinds


def test_a_decision_within_the_timeout_is_taken(tmp_path: Path, workers: Workers) -> None:
    repo = tmp_path / "repo"
    started = start_scripted(repo, workers, "60s")
    assert started.returncode == 4, started.stderr
    run_id = run_id_of(started.stderr)
    bad = loopdsl("decide", run_id, "maybe", "--temporal", workers.address, cwd=repo)
    assert bad.returncode != 0 and "not a choice" in bad.stderr
    ok = loopdsl("reject", run_id, "--temporal", workers.address, cwd=repo)
    assert ok.returncode == 0, ok.stderr
    deadline = time.monotonic() + 30
    while json.loads(loopdsl("show", run_id, "--temporal", workers.address, "--json", cwd=repo).stdout)["run"][
            "status"] == "waiting" and time.monotonic() < deadline:
        time.sleep(0.3)
    # With no worker left, `runs` still says how the loop ended (`failed`, where Temporal says
    # only that the workflow completed): from the run's result, without waiting for a worker.
    workers.stop_all()
    listed = loopdsl("runs", "--temporal", workers.address, "--json", cwd=repo)
    assert {"run_id": run_id, "status": "failed"}.items() <= next(
        r for r in json.loads(listed.stdout) if r["run_id"] == run_id).items(), listed.stdout


def test_an_unreachable_server_is_a_clear_error(tmp_path: Path) -> None:
    out = loopdsl("runs", "--temporal", f"127.0.0.1:{free_port()}", cwd=tmp_path, timeout=60)
    assert out.returncode == 2
    assert "cannot reach the Temporal server" in out.stderr and "Traceback" not in out.stderr


def test_abort_cancels_a_waiting_run(tmp_path: Path, workers: Workers) -> None:
    repo = tmp_path / "repo"
    started = start_scripted(repo, workers)
    assert started.returncode == 4, started.stderr
    run_id = run_id_of(started.stderr)
    # The reason reaches the run (it was dropped), without a credential of the aborting process.
    token = "ghp_" + "Ab3dE" * 8
    stopped = loopdsl("abort", run_id, "--temporal", workers.address, "--reason", f"superseded by #12 ({token})",
                      cwd=repo, GITHUB_TOKEN=token)
    assert stopped.returncode == 0, stopped.stderr
    run = _wait_for(workers, repo, run_id, lambda run: run["status"] != "waiting")
    assert run["status"] == "aborted" and run["path"] == ["ask", "make", "approve"], run
    assert run["error"]["kind"] == "aborted", run["error"]
    assert run["error"]["message"].startswith("aborted with `loopdsl abort`: superseded by #12 ("), run["error"]
    assert token[:8] not in json.dumps(run)
    # As locally: an ended run is not aborted again (it said "abort requested", exit 0).
    again = loopdsl("abort", run_id, "--temporal", workers.address, cwd=repo)
    assert again.returncode == 2 and "already ended" in again.stderr, again.stderr


def test_without_the_extra_the_cli_says_how_to_install_it(tmp_path: Path) -> None:
    # A `temporalio` that cannot be imported, first on the path: as if the extra were missing.
    shadow = tmp_path / "shadow" / "temporalio"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError(\"No module named 'temporalio'\")\n")
    from .conftest import ROOT

    out = loopdsl("runs", "--temporal", "127.0.0.1:1", cwd=tmp_path,
                  PYTHONPATH=f"{tmp_path / 'shadow'}:{ROOT}")
    assert out.returncode == 2, out.stderr
    assert "pip install 'loopdsl[temporal]'" in out.stderr and "Traceback" not in out.stderr


def test_abort_with_a_reason_ends_a_run_whose_command_is_running(tmp_path: Path, workers: Workers) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "loop.yaml").write_text("loopdsl: 1\nname: long\nstart: work\nstates:\n"
                                    "  work: {shell: 'touch started; sleep 60', next: done}\n"
                                    "  done: {end: completed}\n")
    workers.start(repo, models=False)
    started = loopdsl("run", "loop.yaml", "--temporal", workers.address, "--task-queue", workers.queue, "--detach",
                      cwd=repo)
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.strip()
    deadline = time.monotonic() + 30
    while not (repo / "started").exists():
        assert time.monotonic() < deadline, "the command never started"
        time.sleep(0.05)
    stopped = loopdsl("abort", run_id, "--temporal", workers.address, "--reason", "wrong branch", cwd=repo)
    assert stopped.returncode == 0, stopped.stderr
    run = _wait_for(workers, repo, run_id, lambda run: run["status"] != "running")
    assert run["status"] == "aborted", run["error"]
    assert run["error"] == {"state": "work", "kind": "aborted", "message": "aborted with `loopdsl abort`: wrong branch"}


def test_abort_during_a_model_call_ends_the_run_without_calling_again(tmp_path: Path, workers: Workers) -> None:
    repo = tmp_path / "repo"
    with StubServer() as stub:
        stub.reply_slow(60)
        stub.reply_text("notes")  # what a retry would get
        write_loop(repo, stub.api_base)
        (repo / "loop.yaml").write_text((repo / "loop.yaml").read_text().replace(
            'prompt: "name a file"}',
            'prompt: "name a file"}\n    retry: {max_attempts: 3, on: [timeout, connection, server_error]}'))
        workers.start(repo)
        started = loopdsl("run", "loop.yaml", "--temporal", workers.address, "--task-queue", workers.queue, "--detach",
                          cwd=repo)
        assert started.returncode == 0, started.stderr
        run_id = started.stdout.strip()
        deadline = time.monotonic() + 60
        while not stub.requests:
            assert time.monotonic() < deadline, "the model was never called"
            time.sleep(0.05)
        stopped = loopdsl("abort", run_id, "--temporal", workers.address, "--reason", "not today", cwd=repo)
        assert stopped.returncode == 0, stopped.stderr
        run = _wait_for(workers, repo, run_id, lambda run: run["status"] != "running")
        assert run["status"] == "aborted", (run["status"], run["path"], run["error"])
        assert run["error"] == {"state": "ask", "kind": "aborted", "message": "aborted with `loopdsl abort`: not today"}
        assert run["path"] == ["ask"]
        time.sleep(1)
        assert len(stub.requests) == 1  # a cancelled call is not a timeout to retry


NOTES = """\
loopdsl: 1
name: notes
models:
  m: {model: openai/gpt-4o-mini, max_tokens: 100}
tools:
  note:
    description: add a note
    params: {text: {type: string}}
    required: [text]
    shell: "echo {{ args.text }} >> notes.txt"
    approve: true
start: work
states:
  work:
    agent: {model: m, prompt: "Write two notes.", tools: [note], max_turns: 5}
    next: done
  done: {end: completed}
"""


def test_each_wait_of_one_state_takes_its_own_decision(tmp_path: Path, workers: Workers) -> None:
    """Two tool approvals in one visit of an agent state: the second `approve` was answered
    with the first one's outcome (same update id) and the run waited for good."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "loop.yaml").write_text(NOTES)
    # No decision in the script (a person gives them), so no further turn either: once both calls
    # ran, the agent's next turn finds the script used up, and the run ends there.
    (repo / "replies.yaml").write_text("work:\n  - tool_calls: [{name: note, args: {text: first}}, "
                                       "{name: note, args: {text: second}}]\n")
    workers.start(repo, models=False)
    started = loopdsl("run", "loop.yaml", "--script", "replies.yaml", "--temporal", workers.address, "--task-queue",
                      workers.queue, "--detach", cwd=repo)
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.strip()
    for comment in ("one", "two"):
        _wait_for(workers, repo, run_id, lambda run: run["status"] == "waiting" and run["decision"] is None)
        decided = loopdsl("approve", run_id, "--temporal", workers.address, "--comment", comment, cwd=repo)
        assert decided.returncode == 0, decided.stderr
    run = _wait_for(workers, repo, run_id, lambda run: run["status"] != "waiting")
    assert (repo / "notes.txt").read_text() == "first\nsecond\n"
    assert run["status"] == "failed" and run["error"]["kind"] == "reply_script", run["error"]


def test_of_two_racing_decisions_one_is_recorded_and_the_other_says_so(tmp_path: Path, workers: Workers) -> None:
    repo = tmp_path / "repo"
    started = start_scripted(repo, workers)
    assert started.returncode == 4, started.stderr
    run_id = run_id_of(started.stderr)
    racing = [subprocess.Popen([*loopdsl_command(), choice, run_id, "--temporal", workers.address], cwd=repo,
                               env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for choice in ("approve", "reject")]
    outcomes = sorted((proc.wait(60), proc.communicate()[1]) for proc in racing)
    # Exactly one is recorded (both said so before). The other finds the winner recorded or being
    # recorded (exit 5), or, later still, the run moved on (exit 2); either way it says it.
    assert outcomes[0][0] == 0 and outcomes[1][0] in (2, 5), outcomes
    assert ("this one was not recorded" if outcomes[1][0] == 5 else "not waiting for a decision") in outcomes[1][1]
    run = _wait_for(workers, repo, run_id, lambda run: run["status"] != "waiting")
    assert run["status"] in ("completed", "failed"), run  # the winner's route: done, or dropped


def test_an_agent_calls_its_tools_through_a_real_model_call(tmp_path: Path, workers: Workers) -> None:
    """Only scripted agents had run on Temporal: with a model, the reservation's token count
    refused the tools (a TypeError) and the request left them out."""
    from tests.stub_server import tool_call

    repo = tmp_path / "repo"
    repo.mkdir()
    with StubServer() as stub:
        stub.reply_tool_calls(tool_call("note", {"text": "first"}, "call_a"))
        stub.reply_text("wrote it")
        (repo / "loop.yaml").write_text(NOTES.replace("approve: true", "idempotent: true").replace(
            "model: openai/gpt-4o-mini,", f'model: openai/gpt-4o-mini, api_base: "{stub.api_base}",'))
        workers.start(repo, OPENAI_API_KEY="sk-stub-key-1234")
        done = loopdsl("run", "loop.yaml", "--temporal", workers.address, "--task-queue", workers.queue, "--json",
                       "--quiet", cwd=repo)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr
        summary = json.loads(done.stdout.splitlines()[-1])
        assert summary["status"] == "completed", summary
        assert (repo / "notes.txt").read_text() == "first\n"
        first, second = (request.body for request in stub.requests)
        assert [t["function"]["name"] for t in first["tools"]] == ["note"]
        answer = second["messages"][-1]  # the tool's result went back to the model
        assert (answer["role"], answer["tool_call_id"]) == ("tool", "call_a"), answer
        assert summary["spent"]["tokens"] == 2 * (11 + 7)
