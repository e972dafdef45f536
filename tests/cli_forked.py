"""`loopdsl` as a real process of its own, without paying Python's start and loopdsl's imports.

The suite starts hundreds of `loopdsl` commands; each fresh `python -m loopdsl` spends about
0.3 s of CPU importing before it does anything. `loopdsl_command()` gives the argv prefix to
use instead of `[sys.executable, "-m", "loopdsl"]`: a small client (cli_forked_client.py,
milliseconds to start) that has a server of this pytest worker (cli_forked_server.py, which
imported loopdsl once) fork the command. The command is still a process of its own, with the
caller's stdin, stdout, stderr, directory, environment and umask, its own pid and exit code,
and it dies with the client (a timeout's kill). `loopdsl_bin()` is a folder holding a
`loopdsl` executable that does the same, for shell scripts that find `loopdsl` on PATH.

For tests whose point is what a command does. Tests of the process start itself (what a
command imports, interpreter options, locale, signals to a process group, a terminal) keep
`python -m loopdsl`. LOOPDSL_TEST_FRESH_CLI=1 makes `loopdsl_command()` the fresh process
everywhere, to check that a failure is not the server's.

`ForkServer` is that server with more imported (FORKED_CLI_PRELOAD: LiteLLM, the Temporal
worker), for tests that start many long commands and kill them (the crash tests, the Temporal
workers): `launch` forks one without a client process, its output to files, and returns a
`ForkedProcess`, which answers as much of `subprocess.Popen` as those tests use. It needs
what the forked commands need (fork, pidfds, SCM_RIGHTS: Linux), whatever that variable says.
"""
from __future__ import annotations

import atexit
import json
import os
import select
import shlex
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

_HERE = Path(__file__).resolve().parent
_FRESH = [sys.executable, "-m", "loopdsl"]
_HEADER = struct.Struct("!I")  # as cli_forked_server.py frames a request
_NUMBER = struct.Struct("!i")  # and its answers: the pid, then the exit status
_default: ForkServer | None = None


def forked() -> bool:
    """Whether `loopdsl_command()` forks (not turned off, and the system has what it needs)."""
    return (os.environ.get("LOOPDSL_TEST_FRESH_CLI") != "1" and hasattr(os, "fork")
            and hasattr(os, "pidfd_open") and hasattr(socket, "send_fds"))


class ForkedProcess:
    """A command `ForkServer.launch` forked: pid, poll, wait, communicate and returncode as
    `subprocess.Popen` has them, and its stderr so far. Closing the connection (this object
    collected) kills the command, as a killed client's does."""

    def __init__(self, conn: socket.socket, pid: int, out: Path, err: Path):
        self._conn, self.pid, self._out, self._err = conn, pid, out, err
        self._status = b""
        self.returncode: int | None = None

    def poll(self) -> int | None:
        while self.returncode is None:
            try:
                more = self._conn.recv(_NUMBER.size - len(self._status), socket.MSG_DONTWAIT)
            except BlockingIOError:
                return None
            if not more:
                raise AssertionError("the fork server closed the connection before the command ended")
            self._status += more
            if len(self._status) == _NUMBER.size:
                self.returncode = _NUMBER.unpack(self._status)[0]
                self._conn.close()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(["loopdsl"], timeout or 0)
            select.select([self._conn], [], [], left)
        return code

    def err_text(self) -> str:
        return self._err.read_text(encoding="utf-8")

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        self.wait(timeout)
        return self._out.read_text(encoding="utf-8"), self.err_text()


class ForkServer:
    """A cli_forked_server.py process, started with `env` (FORKED_CLI_PRELOAD names what it
    imports besides the CLI); it ends, killing what it still runs, at `close` or when the
    process that started it does. Output files go to `scratch`."""

    def __init__(self, scratch: Path, env: Mapping[str, str]):
        self.scratch, self.env, self._count = scratch, dict(env), 0
        scratch.mkdir(parents=True, exist_ok=True)
        self._folder = tempfile.mkdtemp(prefix="loopdsl-fork-")  # short: a socket path has a length limit
        self.socket = os.path.join(self._folder, "s")
        self._proc = subprocess.Popen([sys.executable, str(_HERE / "cli_forked_server.py"), self.socket],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=self.env, cwd=self._folder)
        assert self._proc.stdout is not None
        if self._proc.stdout.readline() != b"ready\n":
            raise RuntimeError(f"the loopdsl fork server did not start (exit {self._proc.wait()})")

    def command(self) -> list[str]:
        """The argv prefix of a client process that has this server fork `loopdsl ARGS`."""
        return [sys.executable, "-I", "-S", str(_HERE / "cli_forked_client.py"), self.socket]

    def launch(self, args: Iterable[str], cwd: Path, env: Mapping[str, str] | None = None, *,
               new_session: bool = False) -> ForkedProcess:
        """Fork `loopdsl ARGS` in `cwd` with `env` (default: the server's), stdin empty, stdout
        and stderr to files; `new_session` as Popen's `start_new_session`."""
        self._count += 1
        out, err = self.scratch / f"{self._count}.out", self.scratch / f"{self._count}.err"
        request = json.dumps({"args": list(args), "cwd": str(cwd), "env": dict(env or self.env),
                              "session": new_session}).encode()
        fds = [os.open(os.devnull, os.O_RDONLY)] + [os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                                                     for path in (out, err)]
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(self.socket)
            socket.send_fds(conn, [_HEADER.pack(len(request)) + request], fds)
        finally:
            for fd in fds:
                os.close(fd)
        pid = b""
        while len(pid) < _NUMBER.size:
            more = conn.recv(_NUMBER.size - len(pid))
            if not more:
                raise AssertionError(f"the fork server ended (exit {self._proc.wait()})")
            pid += more
        return ForkedProcess(conn, _NUMBER.unpack(pid)[0], out, err)

    def close(self) -> None:
        """Kill what still runs, then end the server (it reaps its children first)."""
        if self._proc.stdin is not None and not self._proc.stdin.closed:
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()
        shutil.rmtree(self._folder, ignore_errors=True)


def _server() -> ForkServer:
    """This worker's server for `loopdsl_command()`, started on first use."""
    global _default
    if _default is None:
        folder = Path(tempfile.mkdtemp(prefix="loopdsl-cli-"))
        _default = ForkServer(folder, {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")})
        atexit.register(_stop)
    return _default


def _stop() -> None:
    if _default is not None:
        _default.close()
        shutil.rmtree(_default.scratch, ignore_errors=True)
    shutil.rmtree(_bin_folder(), ignore_errors=True)


def _bin_folder() -> Path:
    return Path(tempfile.gettempdir()) / f"loopdsl-cli-bin-{os.getpid()}"


def loopdsl_command(env_changes: Mapping[str, str] | None = None) -> list[str]:
    """The argv prefix that runs `loopdsl ARGS` (see the module docstring). `env_changes`, what
    the caller sets in the command's environment: a PYTHONPATH there needs a fresh process,
    since only a start reads it."""
    if not forked() or "PYTHONPATH" in (env_changes or {}):
        return list(_FRESH)
    return _server().command()


def loopdsl_bin() -> Path:
    """A folder whose `loopdsl` runs as `loopdsl_command()` does: put it first on PATH."""
    folder = _bin_folder()
    script = folder / "loopdsl"
    if not script.exists():
        folder.mkdir(exist_ok=True)
        script.write_text("#!/bin/sh\nexec " + shlex.join(loopdsl_command()) + ' "$@"\n', encoding="utf-8")
        script.chmod(0o755)
    return folder
