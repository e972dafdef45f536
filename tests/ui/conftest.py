"""Fixtures of the web UI tests: a run waiting at a checkpoint behind a hostile model reply
(made by the real `loopdsl run`), and `loopdsl ui` served by a real process on a free port."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from ports import free_port
from ui_support import LOOP, REPLIES, WaitingRun, cli

from loopdsl.adapters.store.run_store import RunStore
from cli_forked import loopdsl_command


def _make_waiting_run(workdir: Path) -> WaitingRun:
    """A real run (shell state with a gate, a scripted model reply that is an XSS attempt)
    that stops at a checkpoint whose message repeats the reply."""
    (workdir / "hostile.yaml").write_text(LOOP, encoding="utf-8")
    (workdir / "hostile.replies.yaml").write_text(REPLIES, encoding="utf-8")
    store = workdir / "store"
    done = cli(["run", "hostile.yaml", "--script", "hostile.replies.yaml", "--store", str(store), "--json"], workdir)
    assert done.returncode == 4, done.stderr
    with RunStore(store) as st:
        [record] = st.list_runs()
    assert record["status"] == "waiting" and record["run_id"] in done.stdout
    return WaitingRun(workdir, store, record["run_id"])


@pytest.fixture(scope="session")
def _waiting_template(tmp_path_factory: pytest.TempPathFactory) -> WaitingRun:
    # once per test process: a `loopdsl run` and its Python start cost each test about a
    # second of CPU when every test made its own
    return _make_waiting_run(tmp_path_factory.mktemp("waiting-template"))


@pytest.fixture
def waiting_run(_waiting_template: WaitingRun, tmp_path: Path) -> WaitingRun:
    """The waiting run, for tests that view it or decide it: a copy of the template's folder,
    store included, so what a test records stays its own. Its record names the template's
    files, so a test that resumes the run uses `fresh_waiting_run`."""
    workdir = tmp_path / "run"
    shutil.copytree(_waiting_template.workdir, workdir)
    return WaitingRun(workdir, workdir / "store", _waiting_template.run_id)


@pytest.fixture
def fresh_waiting_run(tmp_path: Path) -> WaitingRun:
    """The waiting run, made in this test's own folder (resuming checks the loop's files)."""
    return _make_waiting_run(tmp_path)


@pytest.fixture
def serve_ui() -> Iterator[Callable[..., str]]:
    """Start `loopdsl ui ARGS` on a free port; the base URL (on 127.0.0.1) once it answers."""
    procs: list[subprocess.Popen[str]] = []

    def start(*args: str, cwd: Path, **env: str) -> str:
        port = free_port()
        environ = {k: v for k, v in os.environ.items() if not k.startswith("LOOPDSL_")}
        environ.update(env)
        proc = subprocess.Popen([*loopdsl_command(), "ui", "--port", str(port), *args], cwd=cwd,
                                env=environ, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        procs.append(proc)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()[1]
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                return f"http://127.0.0.1:{port}"
            except OSError:
                time.sleep(0.1)
        raise AssertionError("loopdsl ui did not start listening within 30 s")

    yield start
    for proc in procs:
        proc.terminate()
        try:
            proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
