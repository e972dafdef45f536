"""A worker runs only the loops of the repository it serves.

Whoever may start workflows on the namespace writes the request a worker acts on. A request
naming a loop file (or a reply script) elsewhere on the worker's disk, by `../`, an absolute
path or a symlink out of the repository, ends the run before any of that loop runs; the
client refuses such a loop before it starts anything.
"""
from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from loopdsl.adapters.temporal import client as client_mod
from loopdsl.adapters.temporal.connection import Connection
from loopdsl.cli.temporal_commands import _request
from loopdsl.language.files import file_sha256
from loopdsl.lint.pipeline import load_loop

from .conftest import Workers, loopdsl

pytestmark = pytest.mark.slow

LOOP = """\
loopdsl: 1
name: {name}
start: work
states:
  work:
    shell: "echo ran > {marker}"
    next: done
  done: {{end: completed}}
"""


def _layout(tmp_path: Path) -> tuple[Path, Path, Path]:
    """The worker's repository (one loop of its own) and a loop outside it that leaves a marker."""
    repo, outside = tmp_path / "repo", tmp_path / "outside"
    repo.mkdir()
    outside.mkdir()
    marker = tmp_path / "outside-loop-ran"
    (repo / "loop.yaml").write_text(LOOP.format(name="own", marker="own-ran"))
    (outside / "evil.yaml").write_text(LOOP.format(name="evil", marker=marker))
    (repo / "linked.yaml").symlink_to(outside / "evil.yaml")
    return repo, outside, marker


def test_the_client_refuses_a_loop_outside_the_repository(tmp_path: Path, workers: Workers) -> None:
    repo, outside, marker = _layout(tmp_path)
    for ref in ("../outside/evil.yaml", str(outside / "evil.yaml"), "linked.yaml"):
        done = loopdsl("run", ref, "--temporal", workers.address, "--task-queue", workers.queue, cwd=repo)
        assert done.returncode == 2, (ref, done.stdout, done.stderr)
        assert "is outside the repository the worker serves" in done.stderr, done.stderr
        assert "copy it into this one" in done.stderr
        assert "Traceback" not in done.stderr
    assert not marker.exists()


async def _start_crafted(address: str, queue: str, request: dict[str, Any]) -> dict[str, Any]:
    client = await client_mod.connect(Connection(address=address))
    run_id = client_mod.new_run_id("crafted")
    await client_mod.start(client, request, task_queue=queue, run_id=run_id)
    return await asyncio.wait_for(client.get_workflow_handle(run_id).result(), 60)


def test_a_crafted_request_for_a_file_outside_ends_the_run_before_it_runs(tmp_path: Path, workers: Workers,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    repo, outside, marker = _layout(tmp_path)
    (outside / "replies.yaml").write_text("work: []\n")
    monkeypatch.chdir(repo)
    # What the client sends for the repository's own loop, then pointed elsewhere.
    honest = _request(load_loop(repo / "loop.yaml"), "loop.yaml", None, {}, repo, force=False)
    workers.start(repo, models=False)
    evil = {str(outside / "evil.yaml"): file_sha256(outside / "evil.yaml")}
    # Each with the hashes the worker would find, as a requester who knows the files would send.
    crafted = {("../outside/evil.yaml", None): evil, (str(outside / "evil.yaml"), None): evil,
               ("linked.yaml", None): evil,
               ("loop.yaml", "../outside/replies.yaml"): {**honest["files"],
                                                          "../outside/replies.yaml": file_sha256(outside / "replies.yaml")}}
    for (loop_path, script), files in crafted.items():
        request = {**honest, "loop_path": loop_path, "script": script, "files": files, "publish": False}
        summary = asyncio.run(_start_crafted(workers.address, workers.queue, request))
        assert summary["status"] == "failed", summary
        error = json.dumps(summary)
        what = "reply script" if script else "loop file"
        assert f"{what} {script or loop_path} is outside the repository the worker serves" in error, error
    time.sleep(0.2)
    assert not marker.exists()
    assert not (repo / "own-ran").exists()
    # The worker still serves its own repository.
    own = loopdsl("run", "loop.yaml", "--temporal", workers.address, "--task-queue", workers.queue, cwd=repo)
    assert own.returncode == 0, own.stderr
    assert (repo / "own-ran").read_text() == "ran\n"
