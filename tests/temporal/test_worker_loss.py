"""Two workers on one task queue; the one running a loop's command is killed with SIGKILL.
The other finishes the run, replaying the paid model reply from the workflow history
(the stub sees exactly one request, as in an uninterrupted run). A non-idempotent command
cut off this way asks a person first, as after a crash on the local backend. The command's
first attempt outlasts the kill (30 s); an attempt after it ends at once."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.stub_server import StubServer

from .conftest import Workers, loopdsl
from .replay import replay

pytestmark = pytest.mark.slow

LOOP = """\
loopdsl: 1
name: survives
models:
  m: {{model: openai/gpt-4o-mini, api_base: "{api_base}", max_tokens: 50}}
start: ask
states:
  ask:
    llm: {{model: m, prompt: "say something"}}
    next: slow
  slow:
    shell: "echo started >> starts.txt; if [ $(wc -l < starts.txt) -eq 1 ]; then sleep 30; fi; echo {{{{ ask.text }}}}"
    idempotent: {idempotent}
    next: done
  done: {{end: completed, output: {{said: "{{{{ slow.stdout }}}}"}}}}
"""


async def _worker_of_running_activity(address: str, run_id: str, limit_s: float = 180,
                                      activity: str = "loopdsl.shell") -> int:
    from temporalio.client import Client

    client = await Client.connect(address)
    handle = client.get_workflow_handle(run_id)
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        desc = await handle.describe()
        assert desc.status is not None and desc.status.name == "RUNNING", f"the run ended first: {desc.status}"
        for pending in desc.raw_description.pending_activities:
            if pending.activity_type.name == activity and pending.last_worker_identity:
                return int(pending.last_worker_identity.split("@", 1)[0])  # the SDK's identity: pid@host
        await asyncio.sleep(0.1)
    raise AssertionError("the shell activity never started")


def _run_until_the_command_runs(tmp_path: Path, workers: Workers, stub: StubServer, idempotent: bool) -> tuple[Path, str]:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "loop.yaml").write_text(LOOP.format(api_base=stub.api_base, idempotent=str(idempotent).lower()))
    workers.start(repo, count=2)
    started = loopdsl("run", "loop.yaml", "--temporal", workers.address, "--task-queue", workers.queue, "--detach",
                      cwd=repo, LOOPDSL_TEMPORAL_HEARTBEAT_S="4")
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.strip()
    pid = asyncio.run(_worker_of_running_activity(workers.address, run_id))
    assert pid in [p.pid for p in workers.procs]
    deadline = time.monotonic() + 60  # the activity started; kill once its command runs (mid-state)
    while not (repo / "starts.txt").exists():
        assert time.monotonic() < deadline, "the command never started"
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    return repo, run_id


def _show(workers: Workers, run_id: str, repo: Path, until: str, limit_s: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + limit_s
    while True:
        shown = loopdsl("show", run_id, "--temporal", workers.address, "--json", cwd=repo)
        assert shown.returncode == 0, shown.stderr
        view = json.loads(shown.stdout)
        if view["run"]["status"] == until or time.monotonic() > deadline:
            return view
        time.sleep(0.5)


def test_the_other_worker_finishes_without_paying_twice(tmp_path: Path, workers: Workers) -> None:
    with StubServer() as stub:
        stub.reply_text("hello", prompt_tokens=10, completion_tokens=2)
        repo, run_id = _run_until_the_command_runs(tmp_path, workers, stub, idempotent=True)
        view = _show(workers, run_id, repo, "completed")
        run = view["run"]
        assert run["status"] == "completed", run
        assert run["outputs"] == {"said": "hello\n"}
        assert run["path"] == ["ask", "slow", "done"]
        assert len(stub.requests) == 1, "a model call was paid twice"
        assert run["ledger"]["tokens"] == 12
        assert (repo / "starts.txt").read_text().count("started") == 2  # the idempotent command ran again
        replay(workers.address, run_id, repo)  # the history with the lost activity replays


def test_a_cut_off_non_idempotent_command_asks_a_person(tmp_path: Path, workers: Workers) -> None:
    with StubServer() as stub:
        stub.reply_text("hello")
        repo, run_id = _run_until_the_command_runs(tmp_path, workers, stub, idempotent=False)
        view = _show(workers, run_id, repo, "waiting")
        waiting = view["run"]["waiting"]
        assert waiting["reason"] == "interrupted" and waiting["state"] == "slow", view["run"]
        assert (repo / "starts.txt").read_text().count("started") == 1
        ok = loopdsl("approve", run_id, "--temporal", workers.address, cwd=repo)
        assert ok.returncode == 0, ok.stderr
        run = _show(workers, run_id, repo, "completed")["run"]
        assert run["status"] == "completed" and len(stub.requests) == 1
        assert (repo / "starts.txt").read_text().count("started") == 2
        replay(workers.address, run_id, repo)


AGENT = """\
loopdsl: 1
name: cutoff
models:
  m: {model: openai/gpt-4o-mini, max_tokens: 50}
tools:
  slow:
    description: a step that may not run twice unasked
    shell: "echo started >> starts.txt; if [ $(wc -l < starts.txt) -eq 1 ]; then sleep 30; fi; echo ran"
start: work
states:
  work:
    agent: {model: m, prompt: "go", tools: [slow], max_turns: 3}
    next: done
  done: {end: completed}
"""


def test_a_cut_off_call_of_a_tool_that_is_not_idempotent_asks_a_person(tmp_path: Path, workers: Workers) -> None:
    """It was told to the model as a failed call, and the run went on: a model that calls
    again would have run it twice, unasked."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "loop.yaml").write_text(AGENT)
    (repo / "replies.yaml").write_text("work:\n  - tool_calls: [{name: slow}]\n  - finished\n")
    workers.start(repo, count=2, models=False)
    started = loopdsl("run", "loop.yaml", "--script", "replies.yaml", "--temporal", workers.address, "--task-queue",
                      workers.queue, "--detach", cwd=repo, LOOPDSL_TEMPORAL_HEARTBEAT_S="4")
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.strip()
    pid = asyncio.run(_worker_of_running_activity(workers.address, run_id, activity="loopdsl.tool"))
    deadline = time.monotonic() + 60
    while not (repo / "starts.txt").exists():
        assert time.monotonic() < deadline, "the tool's command never started"
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    waiting = _show(workers, run_id, repo, "waiting")["run"]["waiting"]
    assert waiting["reason"] == "tool_interrupted" and waiting["choices"] == ["rerun", "skip", "fail"], waiting
    assert "was cut off when its worker was lost" in waiting["message"]
    assert (repo / "starts.txt").read_text().count("started") == 1  # not run again, unasked
    chose = loopdsl("decide", run_id, "rerun", "--temporal", workers.address, cwd=repo)
    assert chose.returncode == 0, chose.stderr
    run = _show(workers, run_id, repo, "completed")["run"]
    assert run["status"] == "completed", run
    assert (repo / "starts.txt").read_text().count("started") == 2
    replay(workers.address, run_id, repo)
