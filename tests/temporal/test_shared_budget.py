"""Budget under concurrency: 200 fanned-out children whose model calls run as activities
on two workers, against a loopback stub, under one 10,000-token cap that binds."""
from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from tests.stub_server import StubServer

from .conftest import Workers, loopdsl
from .replay import replay

pytestmark = pytest.mark.slow

PARENT = """\
loopdsl: 1
name: fan
budget: {tokens: 10000, steps: 1000}
start: make
states:
  make:
    set: {items: ITEMS}
    next: each
  each:
    loop: child.yaml
    for_each: "make.items"
    with: {n: "{{ item }}"}
    concurrency: 25
    tolerate_failures: 200
    next: done
  done: {end: completed}
"""
CHILD = """\
loopdsl: 1
name: child
inputs:
  n: {type: integer}
models:
  m: {model: openai/gpt-4o-mini, api_base: "API_BASE", max_tokens: 50}
start: ask
states:
  ask:
    llm: {model: m, prompt: "item {{ inputs.n }}"}
    next: done
  done: {end: completed}
"""


def _fan_out(tmp_path: Path, workers: Workers, n: int, cap: int, concurrency: int) -> tuple[dict, StubServer]:
    repo = tmp_path / "repo"
    repo.mkdir()
    stub = StubServer().start()
    for _ in range(n):
        stub.reply_text("ok", prompt_tokens=5, completion_tokens=45)  # 50 a call
    parent = PARENT.replace("ITEMS", json.dumps(list(range(n)))).replace("10000", str(cap))
    (repo / "fan.yaml").write_text(parent.replace("concurrency: 25", f"concurrency: {concurrency}"))
    (repo / "child.yaml").write_text(CHILD.replace("API_BASE", stub.api_base))
    workers.start(repo, count=2, OPENAI_API_KEY="sk-stub")
    out = loopdsl("run", "fan.yaml", "--temporal", workers.address, "--task-queue", workers.queue, "--json",
                  "--quiet", cwd=repo, timeout=600)
    stub.stop()
    assert out.stdout, out.stderr
    return json.loads(out.stdout.splitlines()[-1]), stub


MID = """\
loopdsl: 1
name: mid
inputs:
  n: {type: integer}
budget: {tokens: 60}
start: each
states:
  each:
    loop: child.yaml
    for_each: "[1, 2]"
    with: {n: "{{ item }}"}
    concurrency: 2
    tolerate_failures: 1
    next: done
  done: {end: completed}
"""


def test_nested_children_share_every_cap_and_show_lists_them(tmp_path: Path, workers: Workers) -> None:
    """root -> 3 x mid (own cap: one call) -> 2 x child each: the mid caps bind through the
    root's mirrors, grandchildren settle through their parents, `show` lists the children."""
    repo = tmp_path / "repo"
    repo.mkdir()
    with StubServer() as stub:
        for _ in range(6):
            stub.reply_text("ok", prompt_tokens=5, completion_tokens=45)
        (repo / "fan.yaml").write_text(PARENT.replace("ITEMS", "[0, 1, 2]").replace("child.yaml", "mid.yaml"))
        (repo / "mid.yaml").write_text(MID)
        (repo / "child.yaml").write_text(CHILD.replace("API_BASE", stub.api_base))
        workers.start(repo, count=2, OPENAI_API_KEY="sk-stub")
        out = loopdsl("run", "fan.yaml", "--temporal", workers.address, "--task-queue", workers.queue, "--json",
                      "--quiet", cwd=repo, timeout=300)
        summary = json.loads(out.stdout.splitlines()[-1])
        assert summary["status"] == "completed", out.stdout + out.stderr
        # Each mid's cap of 60 admits one 50-token call of its two children: three calls in all.
        assert len(stub.requests) == 3 and stub.billed_tokens == 150 == summary["spent"]["tokens"], summary
        assert summary["spent"]["outstanding"] == []
        shown = loopdsl("show", summary["run_id"], "--temporal", workers.address, cwd=tmp_path)
        assert shown.returncode == 0, shown.stderr
        for i in range(3):
            assert f"{summary['run_id']}/each/{i}: completed  path each -> done  50 tokens" in shown.stdout, shown.stdout
        mid = loopdsl("show", f"{summary['run_id']}/each/0", "--temporal", workers.address, "--json", cwd=tmp_path)
        view = json.loads(mid.stdout)
        assert view["run"]["ledger"]["tokens"] == 50
        assert sorted(c["status"] for c in view["children"]) == ["budget_exhausted", "completed"]
        # The root (signal handlers, mirrors), a middle child and a leaf replay without a difference.
        for run_id in (summary["run_id"], f"{summary['run_id']}/each/0", f"{summary['run_id']}/each/0/each/1"):
            replay(workers.address, run_id, repo)


def test_two_hundred_children_never_pass_the_cap(tmp_path: Path, workers: Workers) -> None:
    started = time.monotonic()
    summary, stub = _fan_out(tmp_path, workers, 200, 10_000, 25)
    spent, paid = summary["spent"]["tokens"], len(stub.requests)
    assert stub.billed_tokens <= 10_000 and spent <= 10_000, (stub.billed_tokens, summary)
    assert spent == stub.billed_tokens == paid * 50  # every paid call charged exactly, none lost
    # The cap binds: most children are paid, the last ones are refused by the budget.
    assert 150 <= paid < 200, (paid, summary["status"])
    print(f"200 children: {paid} paid, {spent} tokens, {time.monotonic() - started:.1f}s")


async def _terminate_child_mid_call(address: str, run_id: str, stub: StubServer) -> dict:
    from temporalio.client import Client

    client = await Client.connect(address)
    deadline = time.monotonic() + 120
    while not stub.requests:  # the child's model call is in flight (the stub answers in 60 s)
        assert time.monotonic() < deadline, "the child never called the model"
        await asyncio.sleep(0.1)
    await client.get_workflow_handle(f"{run_id}/each/0").terminate("test: the child is killed mid-call")
    return dict(await asyncio.wait_for(client.get_workflow_handle(run_id).result(), 120))


def test_a_child_terminated_mid_call_is_charged_its_whole_reservation(tmp_path: Path, workers: Workers) -> None:
    from loopdsl.adapters.scripted import scripted_prompt_tokens

    repo = tmp_path / "repo"
    repo.mkdir()
    with StubServer() as stub:
        stub.reply_slow(60)
        (repo / "fan.yaml").write_text(PARENT.replace("ITEMS", "[0]"))
        (repo / "child.yaml").write_text(CHILD.replace("API_BASE", stub.api_base))
        workers.start(repo, OPENAI_API_KEY="sk-stub")
        out = loopdsl("run", "fan.yaml", "--temporal", workers.address, "--task-queue", workers.queue, "--detach",
                      cwd=repo)
        run_id = out.stdout.strip().splitlines()[-1]
        record = asyncio.run(_terminate_child_mid_call(workers.address, run_id, stub))
    # The call may have been paid: the root charges what the child held, in full, never 0.
    reserved = scripted_prompt_tokens([{"role": "user", "content": "item 0"}]) + 50
    assert record["status"] == "completed" and record["ledger"]["tokens"] == reserved, record["ledger"]
    assert record["ledger"]["outstanding"] == []
    assert record["results"]["each"]["items"][0]["status"] == "aborted"
