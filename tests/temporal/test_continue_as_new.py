"""A long run stays within Temporal's history limits: at a state's entry, once its history
passes the bound (shrunk here), the workflow continues as new with the run's state, and
the run ends as it would have in one history: same path, outputs, spend, no call twice."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from tests.stub_server import StubServer

from .conftest import Workers, loopdsl
from .replay import replay

pytestmark = pytest.mark.slow

LOOP = """\
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
      - {{to: ask, when: "run.visits >= 12"}}
      - {{to: tick}}
  ask:
    llm: {{model: m, prompt: "how many?"}}
    next: done
  done: {{end: completed, output: {{said: "{{{{ ask.text }}}}", ticks: "{{{{ history.tick | length }}}}"}}}}
"""


async def _executions(address: str, run_id: str) -> int:
    from temporalio.client import Client

    client = await Client.connect(address)
    return len([wf async for wf in client.list_workflows(f"WorkflowId = '{run_id}'")])


def test_a_long_run_continues_as_new_at_state_boundaries(tmp_path: Path, workers: Workers) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    with StubServer() as stub:
        stub.reply_text("twelve", prompt_tokens=10, completion_tokens=2)
        (repo / "loop.yaml").write_text(LOOP.format(api_base=stub.api_base))
        workers.start(repo)
        out = loopdsl("run", "loop.yaml", "--temporal", workers.address, "--task-queue", workers.queue, "--json",
                      "--quiet", cwd=repo, LOOPDSL_TEMPORAL_HISTORY_EVENTS="25")
        assert out.returncode == 0, out.stderr + out.stdout[-2000:]
        summary = json.loads(out.stdout.splitlines()[-1])
        assert len(stub.requests) == 1
    assert summary["status"] == "completed"
    assert summary["path"] == ["tick"] * 12 + ["ask", "done"]
    assert summary["outputs"] == {"said": "twelve", "ticks": 12}  # the per-state history was carried
    assert summary["spent"]["tokens"] == 12 and summary["spent"]["steps"] == 13
    assert (repo / "ticks.txt").read_text().count("tick") == 12  # no command ran twice
    events = [json.loads(line) for line in out.stdout.splitlines()[:-1]]
    assert [e["type"] for e in events].count("enter") == 13  # the follower saw every execution's events
    assert asyncio.run(_executions(workers.address, summary["run_id"])) >= 3
    replay(workers.address, summary["run_id"], repo)  # the last execution, from its carried state


CARRIED = """\
loopdsl: 1
name: heavy
inputs: {blob: {type: string}}
start: one
states:
  one: {shell: "true", idempotent: true, next: two}
  two: {shell: "true", idempotent: true, next: three}
  three: {shell: "true", idempotent: true, next: done}
  done: {end: completed}
"""


def test_a_state_too_large_to_carry_into_a_new_history_ends_the_run_failed_not_stuck(tmp_path: Path,
                                                                                     workers: Workers) -> None:
    """At a continue-as-new over the payload limit (a 1.2 MB input is carried twice, in the
    request and in the run), the server refused the new run's input and every workflow task
    failed from then on: the run never ended. Now it ends `failed`, saying why."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "loop.yaml").write_text(CARRIED)
    (repo / "inputs.json").write_text(json.dumps({"blob": "x" * 1_200_000}))
    workers.start(repo, models=False)
    out = loopdsl("run", "loop.yaml", "--inputs", "inputs.json", "--temporal", workers.address, "--task-queue",
                  workers.queue, "--json", "--quiet", cwd=repo, LOOPDSL_TEMPORAL_HISTORY_EVENTS="5", timeout=60)
    assert out.returncode == 1, out.stderr[-2000:]
    summary = json.loads(out.stdout.splitlines()[-1])
    assert summary["status"] == "failed"
    shown = json.loads(loopdsl("show", summary["run_id"], "--temporal", workers.address, "--json", cwd=repo).stdout)
    assert "more than a Temporal workflow can carry into a new history" in shown["run"]["error"]["message"]
