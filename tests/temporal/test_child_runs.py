"""Sub-loops as child workflows: a child's checkpoint is decided by the child's id, from
anywhere, and the parent goes on; `runs` lists the parent, `show` its children."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from .conftest import Workers, loopdsl
from .replay import replay

pytestmark = pytest.mark.slow

PARENT = """\
loopdsl: 1
name: asks
start: each
states:
  each:
    loop: child.yaml
    for_each: "[7]"
    with: {n: "{{ item }}"}
    next: done
  done: {end: completed, output: {got: "{{ each['items'][0]['outputs']['n'] }}"}}
"""
CHILD = """\
loopdsl: 1
name: asked
inputs:
  n: {type: integer}
start: ask
states:
  ask:
    checkpoint: {message: "ship {{ inputs.n }}?"}
    next: done
  done: {end: completed, output: {n: "{{ inputs.n }}"}}
"""


def _show(run_id: str, address: str, cwd: Path) -> dict:
    out = loopdsl("show", run_id, "--temporal", address, "--json", cwd=cwd)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _status_once_started(run_id: str, address: str, cwd: Path) -> str | None:
    """The run's status; None while its workflow has not been started yet (the parent starts
    its child runs a moment after it starts itself)."""
    out = loopdsl("show", run_id, "--temporal", address, "--json", cwd=cwd)
    if out.returncode != 0 and "workflow not found" in out.stderr:
        return None
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["run"].get("status")


def test_a_childs_checkpoint_is_approved_by_its_id_and_the_parent_goes_on(tmp_path: Path, workers: Workers) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "asks.yaml").write_text(PARENT)
    (repo / "child.yaml").write_text(CHILD)
    workers.start(repo, models=False)
    out = loopdsl("run", "asks.yaml", "--temporal", workers.address, "--task-queue", workers.queue, "--detach", cwd=repo)
    run_id = out.stdout.strip().splitlines()[-1]
    child = f"{run_id}/each/0"
    deadline = time.monotonic() + 120
    while _status_once_started(child, workers.address, tmp_path) != "waiting":
        assert time.monotonic() < deadline, "the child never reached its checkpoint"
        time.sleep(0.3)
    assert _show(run_id, workers.address, tmp_path)["run"]["status"] == "running"  # it waits on its child
    decided = loopdsl("approve", child, "--temporal", workers.address, "-m", "from elsewhere", cwd=tmp_path)
    assert decided.returncode == 0 and f"run {child}: recorded 'approve'" in decided.stdout, decided.stderr
    while _show(run_id, workers.address, tmp_path)["run"].get("status") == "running":
        assert time.monotonic() < deadline, "the parent never ended"
        time.sleep(0.3)
    parent = _show(run_id, workers.address, tmp_path)
    assert parent["run"]["status"] == "completed" and parent["run"]["outputs"] == {"got": 7}, parent["run"]
    assert [(c["run_id"], c["status"]) for c in parent["children"]] == [(child, "completed")]
    listed = loopdsl("runs", "--temporal", workers.address, "--json", cwd=tmp_path)
    ids = [r["run_id"] for r in json.loads(listed.stdout)]
    assert run_id in ids and child not in ids
    replay(workers.address, run_id, repo)
    replay(workers.address, child, repo)


FAN = """\
loopdsl: 1
name: fan3
start: each
states:
  each:
    loop: nap.yaml
    for_each: "[0, 1, 2, 3, 4, 5, 6, 7, 8]"
    with: {n: "{{ item }}"}
    concurrency: 3
    next: done
  done: {end: completed}
"""
NAP = """\
loopdsl: 1
name: nap
inputs:
  n: {type: integer}
start: nap
states:
  nap:
    shell: "sleep 0.5"
    next: done
  done: {end: completed}
"""


async def _child_spans(address: str, run_id: str) -> list[tuple[float, float]]:
    from temporalio.client import Client

    client = await Client.connect(address)
    spans = []
    async for wf in client.list_workflows(f"ParentWorkflowId = '{run_id}'"):
        assert wf.start_time is not None and wf.close_time is not None
        spans.append((wf.start_time.timestamp(), wf.close_time.timestamp()))
    return spans


def test_fan_out_concurrency_holds_across_workers(tmp_path: Path, workers: Workers) -> None:
    import asyncio

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "fan3.yaml").write_text(FAN)
    (repo / "nap.yaml").write_text(NAP)
    workers.start(repo, models=False, count=2)
    out = loopdsl("run", "fan3.yaml", "--temporal", workers.address, "--task-queue", workers.queue, "--json", "--quiet",
                  cwd=repo)
    summary = json.loads(out.stdout.splitlines()[-1])
    assert summary["status"] == "completed", out.stderr
    spans = asyncio.run(_child_spans(workers.address, summary["run_id"]))
    assert len(spans) == 9
    # At no child's start were more than 3 children open (itself included).
    most = max(sum(1 for s, e in spans if s <= start < e) for start, _ in spans)
    assert 2 <= most <= 3, spans


OUTER = """\
loopdsl: 1
name: outer
budget: {tokens: 1000, steps: 50}
start: each
states:
  each:
    loop: look.yaml
    next: done
  done: {end: completed, output: {seen: "{{ each.outputs }}"}}
"""
LOOK = """\
loopdsl: 1
name: look
start: look
states:
  look:
    set: {tokens: "budget.remaining.tokens", steps: "budget.remaining.steps"}
    next: done
  done: {end: completed, output: {tokens: "{{ look.tokens }}", steps: "{{ look.steps }}"}}
"""


def test_a_child_sees_its_parents_remaining_budget_as_locally(tmp_path: Path, workers: Workers) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "outer.yaml").write_text(OUTER)
    (repo / "look.yaml").write_text(LOOK)
    local = loopdsl("run", "outer.yaml", "--no-store", "--json", "--quiet", cwd=repo)
    workers.start(repo)
    remote = loopdsl("run", "outer.yaml", "--temporal", workers.address, "--task-queue", workers.queue, "--json",
                     "--quiet", cwd=repo)
    outputs = [json.loads(out.stdout.splitlines()[-1])["outputs"] for out in (local, remote)]
    assert outputs[0] == outputs[1] == {"seen": {"tokens": 1000, "steps": 48}}, (outputs, remote.stderr)


TICKER = """\
loopdsl: 1
name: ticker
models:
  m: {{model: openai/gpt-4o-mini, api_base: "{api_base}", max_tokens: 50}}
start: tick
states:
  tick:
    shell: "echo tick >> ticks.txt"
    idempotent: true
    max_visits: 20
    transitions:
      - {{to: ask, when: "run.visits >= 8"}}
      - {{to: tick}}
  ask:
    llm: {{model: m, prompt: "how many?"}}
    next: done
  done: {{end: completed, output: {{said: "{{{{ ask.text }}}}"}}}}
"""
HOLDER = """\
loopdsl: 1
name: holder
budget: {tokens: 1000, steps: 100}
start: each
states:
  each:
    loop: ticker.yaml
    next: done
  done: {end: completed, output: {said: "{{ each.outputs.said }}"}}
"""


async def _executions(address: str, run_id: str) -> int:
    from temporalio.client import Client

    client = await Client.connect(address)
    return len([wf async for wf in client.list_workflows(f"WorkflowId = '{run_id}'")])


def test_a_child_that_continues_as_new_keeps_asking_the_root(tmp_path: Path, workers: Workers) -> None:
    import asyncio

    from tests.stub_server import StubServer

    repo = tmp_path / "repo"
    repo.mkdir()
    with StubServer() as stub:
        stub.reply_text("eight", prompt_tokens=10, completion_tokens=2)
        (repo / "holder.yaml").write_text(HOLDER)
        (repo / "ticker.yaml").write_text(TICKER.format(api_base=stub.api_base))
        workers.start(repo, OPENAI_API_KEY="sk-stub")
        out = loopdsl("run", "holder.yaml", "--temporal", workers.address, "--task-queue", workers.queue, "--json",
                      "--quiet", cwd=repo, LOOPDSL_TEMPORAL_HISTORY_EVENTS="25")
        summary = json.loads(out.stdout.splitlines()[-1])
        assert len(stub.requests) == 1
    assert summary["status"] == "completed" and summary["outputs"] == {"said": "eight"}, out.stderr[-2000:]
    # The child's spending reached the root exactly: its last call settled across its executions.
    assert summary["spent"]["tokens"] == 12 and summary["spent"]["steps"] == 1 + 9 and summary["spent"]["outstanding"] == []
    child = f"{summary['run_id']}/each"
    assert asyncio.run(_executions(workers.address, child)) >= 2  # it continued as new on the way
    replay(workers.address, child, repo)


def test_aborting_a_parent_ends_it_and_its_running_child_aborted(tmp_path: Path, workers: Workers) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "parent.yaml").write_text("loopdsl: 1\nname: parent\nstart: sub\nstates:\n"
                                      "  sub: {loop: child.yaml, next: after}\n"
                                      "  after: {shell: 'touch after', next: done}\n"
                                      "  done: {end: completed}\n")
    (repo / "child.yaml").write_text("loopdsl: 1\nname: child\nstart: work\nstates:\n"
                                     "  work: {shell: 'touch started; sleep 60', next: done}\n"
                                     "  done: {end: completed}\n")
    workers.start(repo, models=False)
    started = loopdsl("run", "parent.yaml", "--temporal", workers.address, "--task-queue", workers.queue, "--detach",
                      cwd=repo)
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.strip()
    deadline = time.monotonic() + 60
    while not (repo / "started").exists():
        assert time.monotonic() < deadline, "the child's command never started"
        time.sleep(0.05)
    stopped = loopdsl("abort", run_id, "--temporal", workers.address, "--reason", "stop it all", cwd=repo)
    assert stopped.returncode == 0, stopped.stderr
    while (run := _show(run_id, workers.address, repo)["run"])["status"] == "running":
        assert time.monotonic() < deadline + 30, run
        time.sleep(0.3)
    assert run["status"] == "aborted", (run["status"], run["path"], run["error"])
    assert run["error"]["message"] == "aborted with `loopdsl abort`: stop it all"
    assert not (repo / "after").exists()
