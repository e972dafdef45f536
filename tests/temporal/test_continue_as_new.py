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
