"""Fixtures of the web UI tests: a run waiting at a checkpoint behind a hostile model reply
(made by the real `loopdsl run`), and `loopdsl ui` served by a real process on a free port."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from ui_support import LOOP, REPLIES, WaitingRun, cli, free_port


@pytest.fixture
def waiting_run(tmp_path: Path) -> WaitingRun:
    """A real run (shell state with a gate, a scripted model reply that is an XSS attempt)
    that stops at a checkpoint whose message repeats the reply."""
    (tmp_path / "hostile.yaml").write_text(LOOP, encoding="utf-8")
    (tmp_path / "hostile.replies.yaml").write_text(REPLIES, encoding="utf-8")
    store = tmp_path / "store"
    done = cli(["run", "hostile.yaml", "--script", "hostile.replies.yaml", "--store", str(store), "--json"], tmp_path)
    assert done.returncode == 4, done.stderr
    runs = cli(["runs", "--store", str(store), "--json"], tmp_path)
    run_id = json.loads(runs.stdout)[0]["run_id"]
    return WaitingRun(tmp_path, store, run_id)


@pytest.fixture
def serve_ui() -> Iterator[Callable[..., str]]:
    """Start `loopdsl ui ARGS` on a free port; the base URL (on 127.0.0.1) once it answers."""
    procs: list[subprocess.Popen[str]] = []

    def start(*args: str, cwd: Path, **env: str) -> str:
        port = free_port()
        environ = {k: v for k, v in os.environ.items() if not k.startswith("LOOPDSL_")}
        environ.update(env)
        proc = subprocess.Popen([sys.executable, "-m", "loopdsl", "ui", "--port", str(port), *args], cwd=cwd,
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
