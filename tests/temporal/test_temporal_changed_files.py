"""A loop file edited on the worker while a run waits at a checkpoint: the decision is
refused (the run keeps waiting, the message names the file and the way on) unless it is
forced, as `loopdsl resume --force` is locally; a forced run goes on with the new file."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from .conftest import Workers, loopdsl
from .replay import replay
from .test_temporal_runs import run_id_of

pytestmark = pytest.mark.slow

LOOP = """\
loopdsl: 1
name: edits
start: make
states:
  make:
    shell: "echo made"
    next: approve
  approve:
    checkpoint: {message: "Keep it?"}
    transitions:
      - {to: done, when: "approve.decision == 'approve'"}
      - {to: dropped}
  done: {end: completed, output: {said: "VERSION"}}
  dropped: {end: failed}
"""


def _shown(run_id: str, address: str, cwd: Path, until_not: str | None = None) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while True:
        shown = loopdsl("show", run_id, "--temporal", address, "--json", cwd=cwd)
        assert shown.returncode == 0, shown.stderr
        view = json.loads(shown.stdout)
        if until_not is None or view["run"]["status"] != until_not or time.monotonic() > deadline:
            return view
        time.sleep(0.3)


def _waiting_run(tmp_path: Path, workers: Workers) -> tuple[Path, str]:
    """A repository with the first version of LOOP, its worker, and a run waiting at 'approve'."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "loop.yaml").write_text(LOOP.replace("VERSION", "first"))
    workers.start(repo, models=False)
    started = loopdsl("run", "loop.yaml", "--temporal", workers.address, "--task-queue", workers.queue, cwd=repo)
    assert started.returncode == 4, started.stdout + started.stderr
    return repo, run_id_of(started.stderr)


def test_a_loop_file_edited_at_a_checkpoint_is_refused_unless_forced(tmp_path: Path, workers: Workers) -> None:
    from loopdsl.adapters.temporal import loops

    repo, run_id = _waiting_run(tmp_path, workers)
    # The replay below stands for the worker that ran the run from its start: it saw both versions.
    loops.set_root(repo)
    loops.load("loop.yaml", None)

    (repo / "loop.yaml").write_text(LOOP.replace("VERSION", "second"))
    refused = loopdsl("approve", run_id, "--temporal", workers.address, cwd=repo)
    assert refused.returncode not in (0, 4), refused.stdout + refused.stderr
    assert "files changed since the run started: loop.yaml" in refused.stderr, refused.stderr
    assert "--force" in refused.stderr and "still waits at 'approve'" in refused.stderr
    assert "Traceback" not in refused.stderr
    view = _shown(run_id, workers.address, repo)
    assert view["run"]["status"] == "waiting" and view["run"]["decision"] is None, view["run"]
    assert "decision" not in [e["type"] for e in view["events"]]

    forced = loopdsl("approve", run_id, "--temporal", workers.address, "--force", "-m", "new loop", cwd=repo,
                     LOOPDSL_USER="reviewer")
    assert forced.returncode == 0, forced.stderr
    assert "recorded 'approve' by reviewer" in forced.stdout
    view = _shown(run_id, workers.address, repo, until_not="waiting")
    run = view["run"]
    assert run["status"] == "completed", run
    assert run["outputs"] == {"said": "second"}, "the forced run goes on with the file as it is now"
    accepted = [e for e in view["events"] if e["type"] == "files_accepted"]
    assert len(accepted) == 1 and accepted[0]["files"] == ["loop.yaml"] and accepted[0]["by"] == "reviewer"
    assert run["meta"]["files"]["loop.yaml"] == loops.load("loop.yaml", None).files["loop.yaml"]

    replay(workers.address, run_id, repo)  # the check and the reload are deterministic


def test_an_unchanged_loop_file_needs_no_force_and_local_decisions_refuse_it(tmp_path: Path,
                                                                             workers: Workers) -> None:
    repo, run_id = _waiting_run(tmp_path, workers)
    local = loopdsl("approve", run_id, "--force", cwd=repo)
    assert local.returncode == 2 and "resume" in local.stderr and "Traceback" not in local.stderr, local.stderr
    decided = loopdsl("reject", run_id, "--temporal", workers.address, cwd=repo)
    assert decided.returncode == 0, decided.stderr
    run = _shown(run_id, workers.address, repo, until_not="waiting")["run"]
    assert run["status"] == "failed" and run["path"] == ["make", "approve", "dropped"], run
    assert "files_accepted" not in [e["type"] for e in _shown(run_id, workers.address, repo)["events"]]
    replay(workers.address, run_id, repo)


def test_a_fresh_worker_with_edited_files_says_why_it_cannot_rebuild_the_run(tmp_path: Path, workers: Workers) -> None:
    repo, run_id = _waiting_run(tmp_path, workers)
    workers.stop_all()
    (repo / "loop.yaml").write_text(LOOP.replace("VERSION", "second"))
    workers.start(repo, models=False)  # it never loaded the version the run started with
    for args in (("show", run_id), ("approve", run_id, "--force")):
        out = loopdsl(*args, "--temporal", workers.address, cwd=repo)
        assert out.returncode == 2, out.stdout + out.stderr
        assert "files changed since the run started: loop.yaml" in out.stderr and "restore them" in out.stderr
        assert "internal error" not in out.stderr, out.stderr
    (repo / "loop.yaml").write_text(LOOP.replace("VERSION", "first"))  # restored: the run goes on
    decided = loopdsl("approve", run_id, "--temporal", workers.address, cwd=repo)
    assert decided.returncode == 0, decided.stderr
    run = _shown(run_id, workers.address, repo, until_not="waiting")["run"]
    assert run["status"] == "completed" and run["outputs"] == {"said": "first"}, run
