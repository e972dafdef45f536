"""`publish:` on Temporal: planned in the workflow at a `completed` end, each write made by
an activity on a worker holding the token; real git (a bare `origin`), real HTTP to the
loopback fake GitHub (tests/github_fake.py) that records every write."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from github_fake import FakeGitHub
from patterns.conftest import commit_file, git, init_repo

from .conftest import Workers, loopdsl
from .replay import replay

pytest.importorskip("githubkit")
pytestmark = pytest.mark.slow

SECRET = "s3cr3t-value-4b3a2c1d"
LOOP = """\
loopdsl: 1
name: temporal-publish
inputs: {note: {type: string, default: all good}}
secrets: [GITHUB_TOKEN, API_KEY]
workspace: {worktree: true}
start: edit
states:
  edit:
    shell: "echo {{ inputs.note }} > fix.txt && echo edited"
    next: done
  done: {end: completed}
publish:
  pull_request:
    title: "Fix: {{ inputs.note }}"
    body: "By the loop: {{ inputs.note }} ({{ edit.stdout | trim }})"
    branch: run
  comment: {on: pull_request, body: "Opened by run {{ run.id }}"}
"""


@pytest.fixture
def fake():
    with FakeGitHub() as server:
        yield server


def _project(tmp_path: Path, loop: str = LOOP) -> Path:
    repo = init_repo(tmp_path / "repo")
    git(tmp_path, "init", "-q", "--bare", str(tmp_path / "remote.git"))
    git(repo, "remote", "add", "origin", str(tmp_path / "remote.git"))
    git(repo, "push", "-q", "origin", "main")
    commit_file(repo, "loop.yaml", loop, "the loop")
    return repo


def _github_env(fake: FakeGitHub, tmp_path: Path) -> dict[str, str]:
    return {"GITHUB_API_URL": fake.url, "GITHUB_REPOSITORY": fake.repository, "GITHUB_TOKEN": fake.token,
            "API_KEY": SECRET, "HOME": str(tmp_path)}


def _run(repo: Path, workers: Workers, *args: str, **env: str) -> Any:
    return loopdsl("run", "loop.yaml", "--temporal", workers.address, "--task-queue", workers.queue, *args,
                   cwd=repo, **env)


def _summary(stdout: str) -> dict[str, Any]:
    return json.loads(stdout.splitlines()[-1])


async def _result(address: str, run_id: str) -> dict[str, Any]:
    from temporalio.client import Client

    client = await Client.connect(address)
    return await client.get_workflow_handle(run_id).result()


def test_a_run_on_temporal_opens_one_pull_request_of_its_pushed_branch(fake: FakeGitHub, tmp_path: Path,
                                                                      workers: Workers) -> None:
    repo = _project(tmp_path)
    workers.start(repo, models=False, **_github_env(fake, tmp_path))
    done = _run(repo, workers, "--json", "-i", "note=fixed it, cc @octocat")

    assert done.returncode == 0, done.stderr
    run_id = _summary(done.stdout)["run_id"]
    [opened] = fake.writes_to("POST", r"/pulls$")
    assert opened.body["head"] == f"loopdsl/{run_id}" and opened.body["base"] == "main"
    assert "@\u200doctocat" in opened.body["body"] and "@octocat" not in opened.body["body"]  # a printed value mentions nobody, as locally
    pushed = git(tmp_path / "remote.git", "rev-parse", f"refs/heads/loopdsl/{run_id}").strip()
    assert pushed == git(repo, "rev-parse", f"loopdsl/{run_id}").strip()
    [comment] = fake.writes_to("POST", r"/issues/1/comments$")
    assert f"Opened by run {run_id}" in comment.body["body"]
    kinds = [(e["type"], e.get("kind")) for e in map(json.loads, done.stdout.splitlines()[:-1])
             if e["type"].startswith("publish")]
    assert kinds == [("publish_planned", None), ("publish_intent", "pull_request"), ("published", "pull_request"),
                     ("publish_intent", "comment"), ("published", "comment")]
    result = asyncio.run(_result(workers.address, run_id))
    assert result["meta"]["publish"]["status"] == "done"
    assert [r["action"] for r in result["meta"]["publish"]["results"]] == ["created", "created"]
    replay(workers.address, run_id, repo)  # the publishing workflow is deterministic


def test_a_secret_in_a_body_writes_nothing_and_exits_6(fake: FakeGitHub, tmp_path: Path, workers: Workers) -> None:
    repo = _project(tmp_path)
    workers.start(repo, models=False, **_github_env(fake, tmp_path))
    # Only the worker knows the secret's value: the workflow plans with placeholders, the activity
    # scans what it is about to write for the values themselves.
    done = _run(repo, workers, "--quiet", "-i", f"note=key {SECRET}")

    assert done.returncode == 6, done.stderr
    assert "nothing was written: title holds the value of a declared secret" in done.stderr, done.stderr
    assert SECRET not in done.stderr
    assert fake.requests == []


def test_no_publish_plans_and_writes_nothing(fake: FakeGitHub, tmp_path: Path, workers: Workers) -> None:
    repo = _project(tmp_path)
    workers.start(repo, models=False, **_github_env(fake, tmp_path))
    done = _run(repo, workers, "--json", "--no-publish")

    assert done.returncode == 0, done.stderr
    result = asyncio.run(_result(workers.address, _summary(done.stdout)["run_id"]))
    assert result["meta"]["publish"]["status"] == "planned"
    assert [i["kind"] for i in result["meta"]["publish"]["items"]] == ["pull_request", "comment"]
    assert fake.requests == []


def test_a_worker_without_the_token_refuses_the_run_before_it_starts(fake: FakeGitHub, tmp_path: Path,
                                                                     workers: Workers) -> None:
    repo = _project(tmp_path)
    env = {k: v for k, v in _github_env(fake, tmp_path).items() if k != "GITHUB_TOKEN"}
    workers.start(repo, models=False, **env)
    done = _run(repo, workers)

    assert done.returncode == 1, done.stderr
    assert "GITHUB_TOKEN" in done.stdout and "--no-publish" in done.stdout
    assert not (repo / "fix.txt").exists() and fake.requests == []


def test_a_worker_killed_while_opening_the_pull_request_never_opens_a_second(fake: FakeGitHub, tmp_path: Path,
                                                                            workers: Workers) -> None:
    repo = _project(tmp_path)
    env = _github_env(fake, tmp_path)
    first = workers.start(repo, models=False, **env)
    fake.hold_after("POST", r"/pulls$")  # the pull request is opened; the answer never reaches the worker
    started = _run(repo, workers, "--detach", LOOPDSL_TEMPORAL_HEARTBEAT_S="2")
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.strip().splitlines()[-1]
    try:
        assert fake.held.wait(120), "the run never reached the held write"
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
        fake.release()
    workers.start(repo, models=False, **env)
    began = time.monotonic()
    result = asyncio.run(asyncio.wait_for(_result(workers.address, run_id), 120))

    assert time.monotonic() - began < 120
    assert result["status"] == "completed" and result["meta"]["publish"]["status"] == "done", result.get("meta")
    assert len(fake.writes_to("POST", r"/pulls$")) == 1
    assert len(fake.writes_to("POST", r"/issues/1/comments$")) == 1
    assert [r["action"] for r in result["meta"]["publish"]["results"]] == ["updated", "created"]
    replay(workers.address, run_id, repo)
