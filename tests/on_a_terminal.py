"""`loopdsl` on a real terminal: a child process whose controlling terminal is a pty we type into."""
from __future__ import annotations

import os
import pty
import select
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path


# A shell at a terminal starts a command with SIGINT at its default. A test process started in
# the background by a non-interactive shell (`pytest &`) inherits SIGINT ignored, passes that
# on, and a `loopdsl` that inherits it rightly ignores Ctrl-C; this puts Python's own handler back.
_CTRL_C_ABLE = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
                "sys.argv[0] = 'loopdsl'; runpy.run_module('loopdsl', run_name='__main__', alter_sys=True)")


def interruptible_loopdsl(*args: str) -> list[str]:
    """The argv of `python -m loopdsl ARGS` as a terminal's shell would start it: SIGINT (what
    Ctrl-C sends) interrupts it whatever disposition this process inherited."""
    return [sys.executable, "-c", _CTRL_C_ABLE, *args]


class TerminalSession:
    """`python -m loopdsl ARGS` as a session leader on a fresh pty, in `cwd`, with this
    process's environment less its LOOPDSL_* variables (as tests/cli_in_process.py), plus `env`."""

    def __init__(self, args: Sequence[str], cwd: Path, env: Mapping[str, str] | None = None):
        environ = {k: v for k, v in os.environ.items() if not k.startswith("LOOPDSL_")} | dict(env or {})
        self.seen = b""
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: a session leader whose controlling terminal is the pty
            try:
                os.chdir(cwd)
                signal.signal(signal.SIGINT, signal.SIG_DFL)  # as a terminal's shell starts it (above)
                os.execve(sys.executable, [sys.executable, "-m", "loopdsl", *args], environ)
            finally:
                os._exit(127)

    def read_until(self, marker: bytes | None, seconds: float) -> bytes:
        """What the terminal shows until `marker` appears in the new output (None: until it
        closes), never blocking past `seconds`; everything shown is kept in `seen`."""
        start = len(self.seen)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and (marker is None or marker not in self.seen[start:]):
            ready, _, _ = select.select([self.fd], [], [], 0.2)
            if not ready:
                continue
            try:
                chunk = os.read(self.fd, 4096)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            self.seen += chunk
        return self.seen[start:]

    def type(self, keys: bytes) -> None:
        os.write(self.fd, keys)

    def exit_code(self, seconds: float) -> int:
        """The child's exit code once it ends; still running after `seconds`, it is killed, and
        what the kernel says of it (state, signal masks, where it sleeps) goes into `seen`."""
        deadline = time.monotonic() + seconds
        while (done := os.waitpid(self.pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        if done[0] == 0:
            self.seen += b"\n[still running] " + process_state(self.pid)
            os.kill(self.pid, signal.SIGKILL)
            done = os.waitpid(self.pid, 0)
        os.close(self.fd)
        return os.waitstatus_to_exitcode(done[1])


def process_state(pid: int) -> bytes:
    """What the kernel says of a process: its state, signal masks and where it sleeps."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        wchan = Path(f"/proc/{pid}/wchan").read_text()
    except OSError as exc:
        return repr(exc).encode()
    lines = [line for line in status.splitlines() if line.startswith(("State", "Sig", "Shd", "Threads"))]
    return ("; ".join(lines) + f"; wchan {wchan}").encode()
