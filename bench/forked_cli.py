"""Start many `loopdsl` CLI processes without paying Python's and LiteLLM's import in each.

A kill test starts a fresh CLI process per kill point, and each real run imports LiteLLM
(seconds of CPU) before it gets killed. `ForkServer` starts one Python process that imports
the CLI and LiteLLM once, then forks a child per command: each child is a real process of
its own (own pid, killable with SIGKILL, own stdout/stderr files) running the same
`loopdsl.cli.main` as `python -m loopdsl`, only with its imports already done.

The server reaps its children (so their CPU is counted as the test's children's CPU) and
answers `poll` for the test, which is not their parent. Children that are still alive when
the server is closed are killed and reaped.
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

# The server: imports once, then per line of stdin either forks a command or polls a child.
_SERVER = r"""
import atexit, gc, json, os, sys, threading
import importlib
import loopdsl.adapters.store.run_store as store
if 'CRASH_LOCK_TTL' in os.environ:  # the crash tests' short lock lifetime, as crash_torture sets it
    store.RunStore.lock.__wrapped__.__kwdefaults__['ttl'] = float(os.environ['CRASH_LOCK_TTL'])
from loopdsl.adapters.litellm_loading import ensure_litellm
from loopdsl.cli import main
ensure_litellm()
for name in filter(None, os.environ.get('FORKED_CLI_PRELOAD', '').split(',')):
    # What the forked commands import besides (e.g. temporalio); `module:function` also calls
    # that function once, for what a process computes once and keeps (a memoized value).
    module, _, function = name.partition(':')
    loaded = importlib.import_module(module)
    if function:
        getattr(loaded, function)()
gc.freeze()  # the imported objects stay out of the children's collections (no copy-on-write)
children = set()
def answer(value):
    sys.stdout.write(json.dumps(value) + "\n"); sys.stdout.flush()
def status(code):
    return -os.WTERMSIG(code) if os.WIFSIGNALED(code) else os.WEXITSTATUS(code)
answer("ready")
while True:
    line = sys.stdin.readline()
    if not line:
        for pid in children:
            try: os.kill(pid, 9)
            except OSError: pass
            os.waitpid(pid, 0)
        sys.exit(0)
    req = json.loads(line)
    if "poll" in req:
        pid, code = os.waitpid(req["poll"], os.WNOHANG)
        if pid:
            children.discard(pid)
        answer(status(code) if pid else None)
        continue
    pid = os.fork()
    if pid == 0:
        break
    children.add(pid)
    answer(pid)
# The child: the command's own directory, environment and output files, then the CLI.
if req.get("session"):
    os.setsid()  # its own session and process group, as Popen(start_new_session=True)
os.chdir(req["cwd"])
os.environ.clear(); os.environ.update(req["env"])
for fd, path, mode in ((0, os.devnull, os.O_RDONLY), (1, req["out"], os.O_WRONLY), (2, req["err"], os.O_WRONLY)):
    os.dup2(os.open(path, mode), fd)
sys.argv = ["loopdsl", *req["args"]]
try:
    main()
    code = 0
except SystemExit as exit:
    code = exit.code if isinstance(exit.code, int) else (0 if exit.code is None else 1)
    if exit.code is not None and not isinstance(exit.code, int):
        print(exit.code, file=sys.stderr)
# Python's own exit, but for tearing down every module LiteLLM brought (seconds of CPU,
# and each page it touches is copied): wait for threads, run atexit hooks, flush.
threading._shutdown()
atexit._run_exitfuncs()
sys.stdout.flush(); sys.stderr.flush()
os._exit(code)
"""


class ForkedProcess:
    """The part of `subprocess.Popen` the kill tests use: pid, poll, communicate, returncode."""

    def __init__(self, server: ForkServer, pid: int, out: Path, err: Path):
        self.server, self.pid, self._out, self._err = server, pid, out, err
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.server.ask({"poll": self.pid})
        return self.returncode

    def err_text(self) -> str:
        """What the command has written to stderr so far."""
        return self._err.read_text(encoding="utf-8")

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(["loopdsl"], timeout or 0)
            time.sleep(0.005)
        assert self.returncode is not None
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        self.wait(timeout)
        return self._out.read_text(encoding="utf-8"), self._err.read_text(encoding="utf-8")


class ForkServer:
    """One importing process; `launch` forks a CLI child from it (see the module docstring)."""

    def __init__(self, scratch: Path, env: dict[str, str]):
        self.scratch, self.env, self._count = scratch, env, 0
        scratch.mkdir(parents=True, exist_ok=True)
        self._proc = subprocess.Popen([sys.executable, "-c", _SERVER], env=env, stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True)
        assert self._read() == "ready"

    def _read(self) -> object:
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line:
            raise AssertionError(f"the fork server ended (exit {self._proc.wait()})")
        return json.loads(line)

    def ask(self, request: dict[str, object]) -> object:
        assert self._proc.stdin is not None
        self._proc.stdin.write(json.dumps(request) + "\n")
        self._proc.stdin.flush()
        return self._read()

    def launch(self, args: Iterable[str], cwd: Path, env: dict[str, str] | None = None, *,
               new_session: bool = False) -> ForkedProcess:
        self._count += 1
        out, err = self.scratch / f"{self._count}.out", self.scratch / f"{self._count}.err"
        out.touch()
        err.touch()
        pid = self.ask({"args": list(args), "cwd": str(cwd), "env": env or self.env, "out": str(out), "err": str(err),
                        "session": new_session})
        assert isinstance(pid, int)
        return ForkedProcess(self, pid, out, err)

    def close(self) -> None:
        """Kill and reap what is still running, then end the server (reaped here)."""
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._proc.send_signal(signal.SIGKILL)
            self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()
