"""A worker asked to stop (SIGTERM, as systemd, `docker stop` and Kubernetes ask) while it runs
a loop's command: with `--grace`, the command finishes and another worker goes on with the run;
without, the command is cut off and the server learns at once, long before the heartbeat
timeout would have told it, so the run asks a person (the command is not idempotent) within
seconds (Ctrl-C does the same). Either way the worker exits 0 and says what it did."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from .conftest import Workers, loopdsl

pytestmark = pytest.mark.slow

LOOP = """\
loopdsl: 1
name: stops
start: work
states:
  work:
    shell: "echo started >> starts.txt; sleep {seconds}; echo finished >> finishes.txt"
    next: done
  done: {{end: completed}}
"""


def _start_run_on_a_worker(tmp_path: Path, workers: Workers, seconds: int, *worker_args: str
                           ) -> tuple[Path, str, subprocess.Popen[str]]:
    """A run whose command is running on a worker started with `worker_args`; that worker."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "loop.yaml").write_text(LOOP.format(seconds=seconds))
    first = workers.start(repo, models=False, extra_args=worker_args)
    started = loopdsl("run", "loop.yaml", "--temporal", workers.address, "--task-queue", workers.queue, "--detach",
                      cwd=repo)
    assert started.returncode == 0, started.stderr
    deadline = time.monotonic() + 60
    while not (repo / "starts.txt").exists():
        assert time.monotonic() < deadline, "the command never started"
        time.sleep(0.05)
    workers.start(repo, models=False)  # the one that goes on with the run
    return repo, started.stdout.strip(), first


def _status(workers: Workers, repo: Path, run_id: str, until: str, limit_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + limit_s
    while True:
        shown = loopdsl("show", run_id, "--temporal", workers.address, "--json", cwd=repo)
        assert shown.returncode == 0, shown.stderr
        run = json.loads(shown.stdout)["run"]
        if run["status"] == until or time.monotonic() > deadline:
            return run
        time.sleep(0.2)


def _stop(worker: subprocess.Popen[str], limit_s: float, number: int = signal.SIGTERM) -> tuple[int, str, float]:
    """The signal to the worker alone (not its commands); its exit code, stderr and how long it took."""
    began = time.monotonic()
    os.kill(worker.pid, number)
    code = worker.wait(limit_s)
    _, err = worker.communicate()
    return code, err, time.monotonic() - began


def test_with_grace_the_running_command_finishes_and_the_run_goes_on_elsewhere(tmp_path: Path,
                                                                                workers: Workers) -> None:
    repo, run_id, first = _start_run_on_a_worker(tmp_path, workers, 3, "--grace", "60")
    code, err, took = _stop(first, 60)
    assert code == 0, err
    assert "stopping (SIGTERM): no new work is taken; running states get up to 60 s to finish" in err
    assert "Traceback" not in err
    assert (repo / "finishes.txt").read_text() == "finished\n", "the command was cut off"
    assert took < 30, took
    run = _status(workers, repo, run_id, "completed", 60)
    assert run["status"] == "completed" and run["path"] == ["work", "done"], run
    assert (repo / "starts.txt").read_text() == "started\n", "the command ran twice"


@pytest.mark.parametrize(("number", "called"), [(signal.SIGTERM, "SIGTERM"), (signal.SIGINT, "Ctrl-C")])
def test_without_grace_the_command_is_cut_off_and_the_run_asks_at_once(tmp_path: Path, workers: Workers, number: int,
                                                                      called: str) -> None:
    repo, run_id, first = _start_run_on_a_worker(tmp_path, workers, 60)
    code, err, took = _stop(first, 30, number)
    assert code == 0, err
    assert f"stopping ({called}): no new work is taken; running states are cut off" in err
    assert "Traceback" not in err
    assert took < 10, took
    # The default heartbeat timeout is 30 s: a worker that died instead would leave the run
    # waiting on its command that long before anyone learnt of it.
    run = _status(workers, repo, run_id, "waiting", 20)
    assert run["status"] == "waiting", run.get("error")
    assert run["waiting"]["reason"] == "interrupted" and run["waiting"]["state"] == "work", run
    assert not (repo / "finishes.txt").exists()
