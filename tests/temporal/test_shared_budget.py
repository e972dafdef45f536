"""Budget under concurrency: 200 fanned-out children whose model calls run as activities
on two workers, against a loopback stub, under one 10,000-token cap that binds."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.stub_server import StubServer

from .conftest import Workers, loopdsl

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


def test_two_hundred_children_never_pass_the_cap(tmp_path: Path, workers: Workers) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    with StubServer() as stub:
        for _ in range(200):
            stub.reply_text("ok", prompt_tokens=5, completion_tokens=45)  # 50 a call: 200 would be 10,000
        (repo / "fan.yaml").write_text(PARENT.replace("ITEMS", json.dumps(list(range(200)))))
        (repo / "child.yaml").write_text(CHILD.replace("API_BASE", stub.api_base))
        workers.start(repo)
        workers.start(repo)
        started = time.monotonic()
        out = loopdsl("run", "fan.yaml", "--temporal", workers.address, "--task-queue", workers.queue, "--json",
                      "--quiet", cwd=repo, timeout=300)
        assert out.stdout, out.stderr
        summary = json.loads(out.stdout.splitlines()[-1])
        spent = summary["spent"]["tokens"]
        paid = len(stub.requests)
        assert spent <= 10_000, summary
        assert paid * 50 <= 10_000, paid
        assert spent == paid * 50  # every paid call charged exactly, none lost
        # The cap binds: most children are paid, the last ones are refused by the budget.
        assert 150 <= paid < 200, (paid, summary["status"])
        print(f"200 children: {paid} paid, {spent} tokens, {time.monotonic() - started:.1f}s")
