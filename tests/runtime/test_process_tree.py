"""The process-tree stop against real processes: what only the tree links to the command."""
from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from loopdsl.runtime.process_tree import MARKER_VAR, CommandRef, kill_now, new_marker, start_time, stop_command

ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}


def _alive(pid: int) -> bool:
    """Running and not a zombie, as `ps` sees it (independent of the code under test)."""
    out = subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True, check=False).stdout
    return bool(out.strip()) and not out.strip().startswith("Z")


@pytest.mark.parametrize("how", ["stop", "kill_now"])
def test_a_child_known_only_through_its_dying_parent_is_stopped(tmp_path: Path, how: str) -> None:
    # The child leaves the session, clears its environment and lets go of every inherited
    # pipe: only its parent links it to the command. Signalling the group first kills that
    # parent, the child is re-parented to init, and a tree taken afterwards misses it.
    pid_file = tmp_path / "pid"
    script = (f"setsid env -i bash -c 'echo $$ > {pid_file}; exec sleep 61' </dev/null >/dev/null 2>&1 & "
              f"while [ ! -s {pid_file} ]; do sleep 0.01; done; sleep 100")
    marker = new_marker()
    leader = subprocess.Popen(["bash", "-c", script], env={**ENV, MARKER_VAR: marker}, start_new_session=True,
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    child = 0
    try:
        deadline = time.monotonic() + 15
        while not (pid_file.exists() and pid_file.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.01)
        child = int(pid_file.read_text())
        time.sleep(0.1)  # let `exec sleep 61` happen, so the child holds nothing of ours
        ref = CommandRef(leader.pid, marker, start_time(leader.pid))
        if how == "stop":
            asyncio.run(stop_command(ref, 0.3, exited=lambda: leader.poll() is not None))
        else:
            kill_now(ref)
        leader.wait(timeout=15)
        deadline = time.monotonic() + 15  # a bound, not a speed target
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child)
    finally:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(child, signal.SIGKILL) if child else None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(leader.pid, signal.SIGKILL)
        leader.wait(timeout=15)
