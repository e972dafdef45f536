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
"""
from __future__ import annotations

import atexit
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

_HERE = Path(__file__).resolve().parent
_FRESH = [sys.executable, "-m", "loopdsl"]
_server: subprocess.Popen[bytes] | None = None
_socket = ""


def forked() -> bool:
    """Whether `loopdsl_command()` forks (not turned off, and the system has what it needs)."""
    return (os.environ.get("LOOPDSL_TEST_FRESH_CLI") != "1" and hasattr(os, "fork")
            and hasattr(os, "pidfd_open") and hasattr(socket, "send_fds"))


def _start() -> str:
    """This worker's server, started on first use; it ends when this process does."""
    global _server, _socket
    if _server is None:
        folder = tempfile.mkdtemp(prefix="loopdsl-cli-")
        _socket = os.path.join(folder, "s")
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
        _server = subprocess.Popen([sys.executable, str(_HERE / "cli_forked_server.py"), _socket], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, env=env, cwd=folder)
        assert _server.stdout is not None
        if _server.stdout.readline() != b"ready\n":
            raise RuntimeError(f"the loopdsl fork server did not start (exit {_server.wait()})")
        atexit.register(_stop)
    return _socket


def _stop() -> None:
    if _server is not None and _server.stdin is not None:
        _server.stdin.close()  # the server kills what it still runs, then ends
        _server.wait(timeout=30)
    shutil.rmtree(os.path.dirname(_socket), ignore_errors=True)
    shutil.rmtree(_bin_folder(), ignore_errors=True)


def _bin_folder() -> Path:
    return Path(tempfile.gettempdir()) / f"loopdsl-cli-bin-{os.getpid()}"


def loopdsl_command() -> list[str]:
    """The argv prefix that runs `loopdsl ARGS` (see the module docstring)."""
    if not forked():
        return list(_FRESH)
    return [sys.executable, "-I", "-S", str(_HERE / "cli_forked_client.py"), _start()]


def loopdsl_bin() -> Path:
    """A folder whose `loopdsl` runs as `loopdsl_command()` does: put it first on PATH."""
    folder = _bin_folder()
    script = folder / "loopdsl"
    if not script.exists():
        folder.mkdir(exist_ok=True)
        script.write_text("#!/bin/sh\nexec " + shlex.join(loopdsl_command()) + ' "$@"\n', encoding="utf-8")
        script.chmod(0o755)
    return folder
