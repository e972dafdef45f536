"""The server behind tests/cli_forked.py: imports loopdsl once, then forks one CLI per request.

Run as `python cli_forked_server.py SOCKET`; it ends when its stdin (a pipe from the pytest
worker that started it) closes, killing what it still runs. Besides the CLI's modules it
imports those FORKED_CLI_PRELOAD names (`module` or `module:function`, comma-separated; the
function is called once, for what a process computes once and keeps).

A request is a connection to SOCKET that sends the command's stdin, stdout and stderr
(SCM_RIGHTS) with its argv, directory, environment, and optionally its umask and whether it
gets a session of its own. The server forks a child that takes those as its own and runs
`python -m loopdsl ARGS` as that module would run (runpy); it sends the child's pid at once
and its exit status at the end. Bytes the client sends later are signals to pass on; the
client's end of the connection closing (killed, timed out) kills the child. One thread:
listening socket, connections and children (pidfds) are all waited on by one selector, so
the fork never copies a held lock.
"""
from __future__ import annotations

import atexit
import gc
import importlib
import json
import os
import runpy
import selectors
import signal
import socket
import struct
import sys
import tempfile
import threading
import traceback
from pathlib import Path
from typing import NoReturn

import loopdsl

# What a command imports besides its own module, imported here so no child pays for it.
# Not LiteLLM: it reads its settings from the environment as it is imported, and what a
# command's environment says about it is part of what the tests check.
_PRELOAD = ("loopdsl.api.runs", "loopdsl.lint.pipeline", "loopdsl.runtime.engine", "loopdsl.language.compile",
            "loopdsl.adapters.scripted", "loopdsl.runtime.actions.agent", "loopdsl.runtime.actions.subloop",
            "loopdsl.adapters.temporal.client", "tree_sitter", "tree_sitter_bash", "loopdsl.language.shell_flow",
            "loopdsl.language.shell_commands", "croniter")
_HEADER = struct.Struct("!I")  # the length of the request's JSON, sent before it
_NUMBER = struct.Struct("!i")  # the child's pid, then its exit code or minus the signal that ended it


def _preload() -> None:
    import click

    from loopdsl.cli import cli

    context = click.Context(cli)
    loads = [lambda name=name: cli.get_command(context, name) for name in cli.list_commands(context)]
    loads += [lambda target=target: importlib.import_module(target) for target in _PRELOAD]
    for load in loads:  # each command's module (the group imports them lazily), then the rest
        try:
            load()
        except ImportError:  # an optional extra (the UI, Temporal) not installed: its commands import it then
            pass
    _warm()
    for name in filter(None, os.environ.get("FORKED_CLI_PRELOAD", "").split(",")):
        module, _, function = name.partition(":")
        loaded = importlib.import_module(module)
        if function:
            getattr(loaded, function)()


def _warm() -> None:
    """Compute once what most commands compute and keep, by linting the bundled loops: the
    validators of loop, test and reply files (jsonschema's import and the schemas' build: ~80 ms
    of a command that loads a loop), the YAML resolver's and Jinja's lexer's regular expressions
    and LiteLLM's price table (read for every model a lint prices)."""
    from loopdsl.language.schema_files import SCHEMA_FILES, validator
    from loopdsl.lint.pipeline import lint_file

    for kind in SCHEMA_FILES:
        validator(kind)
    for loop in sorted(Path(loopdsl.__file__).parent.glob("data/loops/*.yaml")):
        lint_file(loop)


def _receive(conn: socket.socket) -> tuple[dict, list[int]]:
    data, fds, _flags, _addr = socket.recv_fds(conn, 1 << 16, 3)
    while len(data) < _HEADER.size or len(data) < _HEADER.size + _HEADER.unpack_from(data)[0]:
        more = conn.recv(1 << 16)
        if not more:
            raise ConnectionError("the client went away mid-request")
        data += more
    return json.loads(data[_HEADER.size:]), fds


def _child(request: dict, fds: list[int], inherited: list[int]) -> NoReturn:
    """In the forked child: become the client's process, then run the CLI and exit as it does."""
    for fd in inherited:
        os.close(fd)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    if request.get("session"):
        os.setsid()  # its own session and process group, as Popen(start_new_session=True)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.chdir(request["cwd"])
    if "umask" in request:
        os.umask(request["umask"])
    os.environ.clear()
    os.environ.update(request["env"])
    tempfile.tempdir = None  # a real process reads TMPDIR from its own environment: so does this one
    sys.argv = ["loopdsl", *request["args"]]
    try:
        runpy.run_module("loopdsl", run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exit:
        code = exit.code if isinstance(exit.code, int) else 0 if exit.code is None else 1
        if exit.code is not None and not isinstance(exit.code, int):
            print(exit.code, file=sys.stderr)
    except BaseException:  # what the interpreter would print for an uncaught exception
        traceback.print_exc()
        code = 1
    # Python's exit but for tearing down every preloaded module: that touches each object's
    # reference count, so the child copied the server's whole heap (measured: half the CPU of
    # a short command). Non-daemon threads are joined, atexit hooks run (logging, tracing and
    # weakref finalizers among them), the standard streams are flushed.
    threading._shutdown()  # type: ignore[attr-defined]  # what Py_Finalize calls first
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _status(wait_status: int) -> int:
    return -os.WTERMSIG(wait_status) if os.WIFSIGNALED(wait_status) else os.WEXITSTATUS(wait_status)


def serve(path: str) -> None:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "accept")
    selector.register(sys.stdin.fileno(), selectors.EVENT_READ, "parent")
    children: dict[int, tuple[socket.socket, int]] = {}  # pid -> (client connection, pidfd)
    gc.freeze()  # the preloaded objects stay out of the children's collections (fewer copied pages)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    while True:
        for key, _events in selector.select():
            kind = key.data
            if kind == "parent":  # the pytest worker ended: so does every child, then the server
                for pid in children:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                return
            if kind == "accept":
                conn, _ = listener.accept()
                try:
                    request, fds = _receive(conn)
                except (ConnectionError, ValueError, OSError):
                    conn.close()
                    continue
                inherited = [listener.fileno(), sys.stdin.fileno(), selector.fileno(), conn.fileno(),
                             *(c.fileno() for c, _ in children.values()), *(p for _, p in children.values())]
                pid = os.fork()
                if pid == 0:
                    _child(request, fds, inherited)
                for fd in fds:
                    os.close(fd)
                pidfd = os.pidfd_open(pid)
                children[pid] = (conn, pidfd)
                try:
                    conn.sendall(_NUMBER.pack(pid))
                except OSError:  # the client is gone already: its connection's end kills the child below
                    pass
                selector.register(conn, selectors.EVENT_READ, ("client", pid))
                selector.register(pidfd, selectors.EVENT_READ, ("exit", pid))
                continue
            what, pid = kind
            conn, pidfd = children[pid]
            if what == "client":
                try:
                    sent = conn.recv(64)
                except OSError:
                    sent = b""
                for number in sent or [signal.SIGKILL]:  # the client gone: its command goes too
                    try:
                        os.kill(pid, number)
                    except ProcessLookupError:
                        pass
                if not sent:
                    selector.unregister(conn)
                continue
            _, wait_status = os.waitpid(pid, 0)
            del children[pid]
            selector.unregister(pidfd)
            os.close(pidfd)
            try:
                selector.unregister(conn)
            except KeyError:
                pass
            try:
                conn.sendall(_NUMBER.pack(_status(wait_status)))
            except OSError:
                pass
            conn.close()


if __name__ == "__main__":
    _preload()
    serve(sys.argv[1])
