"""The stdio transport under an MCP client session, owned by loopdsl rather than the SDK.

The `mcp` SDK's own `stdio_client` adds the parent's USER, SHELL and LOGNAME to the server's
environment, prints the server's stderr to ours unredacted, hides the process id and only
kills the group it started. Here the server gets exactly the environment it is given, its
own session (so its process group is ours to kill, children included), stderr is kept as a
bounded tail that is only ever shown redacted, and a message larger than
`MAX_MESSAGE_BYTES` stops the server instead of growing memory without bound.

`connect()` yields the two anyio memory streams `mcp.ClientSession` expects and, on exit,
closes the server's stdin (the MCP shutdown request), waits briefly, then stops every
process of the command (SIGTERM, then SIGKILL: a server that ignores shutdown goes too).
"""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..runtime.process_tree import CommandRef, kill_now, new_marker, spawn_in_session, start_time, stop_command
from ..runtime.redaction import Redactor
from .library_logs import guard_library_logs

MAX_MESSAGE_BYTES = 16 * 1024 * 1024  # one JSON-RPC line from the server
STDERR_KEEP = 8 * 1024  # bytes of the server's stderr tail kept for error messages
_STDIN_CLOSE_GRACE = 0.5  # seconds a server gets to exit on its own once stdin closes
_TERM_GRACE = 0.5  # then SIGTERM, and SIGKILL after this many seconds


class StdioServer:
    """One MCP server process. Not reusable: connect once."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], *, cwd: Path | None,
                 redactor: Redactor, on_start: Callable[[CommandRef], None] | None = None) -> None:
        self._argv = tuple(argv)
        self._on_start = on_start  # told the ref as soon as the server runs (the run records it)
        self._env = dict(env)
        self._cwd = cwd
        self._redactor = redactor
        self._marker = new_marker()
        self._proc: asyncio.subprocess.Process | None = None
        self._stderr = bytearray()
        self._stderr_cut = False
        self._stderr_done = asyncio.Event()
        self.ref: CommandRef | None = None
        self.protocol_error: str | None = None
        self.skipped_lines = 0  # stdout lines that were not JSON-RPC messages

    @property
    def returncode(self) -> int | None:
        return None if self._proc is None else self._proc.returncode

    async def wait(self) -> int:
        """Until the server process exits (never returns before it started)."""
        while self._proc is None:
            await asyncio.sleep(0.05)
        return await self._proc.wait()

    async def settle(self, timeout: float) -> None:
        """Give a server that is exiting a moment to be reaped and to flush its stderr,
        so a message about it can name its exit code and last words."""
        if self._proc is None:
            return
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.gather(self._proc.wait(), self._stderr_done.wait()), timeout)

    def stderr_tail(self, limit: int = 2000) -> str:
        """The end of the server's stderr, redacted. `Redactor.error` also hides runs of 8 or
        more characters of a secret, so a secret cut in half by the kept window is hidden too."""
        text = self._redactor.error(self._stderr.decode("utf-8", errors="replace")).strip()
        if self._stderr_cut or len(text) > limit:
            text = "..." + text[-limit:]
        return text

    @contextlib.asynccontextmanager
    async def connect(self) -> AsyncIterator[tuple[Any, Any]]:
        import anyio  # the mcp SDK's stream types; only loaded when an MCP tool is used

        guard_library_logs()  # the SDK logs what a server sent it, secrets included
        proc = await spawn_in_session(
            self._argv, marker=self._marker, env=dict(self._env), stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=self._cwd,
            limit=MAX_MESSAGE_BYTES)
        self._proc = proc
        self.ref = CommandRef(proc.pid, self._marker, start_time(proc.pid))
        if self._on_start is not None:
            self._on_start(self.ref)
        to_session, from_server = anyio.create_memory_object_stream(0)
        to_server, from_session = anyio.create_memory_object_stream(0)
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(self._pump_stdout, proc.stdout, to_session)
                group.start_soon(self._pump_stdin, proc.stdin, from_session)
                group.start_soon(self._pump_stderr, proc.stderr)
                try:
                    yield from_server, to_server
                finally:
                    group.cancel_scope.cancel()
        finally:
            for stream in (to_session, from_server, to_server, from_session):
                stream.close()
            await self.stop()

    async def stop(self) -> None:
        """Close stdin, give the server a moment, then stop every process of the command."""
        proc, ref = self._proc, self.ref
        if proc is None or ref is None:
            return
        if proc.stdin is not None:
            with contextlib.suppress(Exception):  # already closed, or the pipe broke
                proc.stdin.close()
        if proc.returncode is None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(proc.wait(), _STDIN_CLOSE_GRACE)
        await stop_command(ref, _TERM_GRACE, exited=lambda: proc.returncode is not None)
        with contextlib.suppress(asyncio.TimeoutError):  # reap; SIGKILL was sent
            await asyncio.wait_for(proc.wait(), 1.0)

    def kill_now(self) -> None:
        """SIGKILL the command's processes without waiting (a cancelled start or close)."""
        if self.ref is not None:
            kill_now(self.ref)

    async def _pump_stdout(self, stdout: asyncio.StreamReader, sink: Any) -> None:
        import anyio  # see connect()
        import mcp.types as types  # optional dependency, only loaded when an MCP tool is used
        from mcp.shared.message import SessionMessage  # same

        async with sink:
            while True:
                try:
                    line = await stdout.readline()
                except (ValueError, asyncio.LimitOverrunError):
                    self.protocol_error = f"sent a message larger than {MAX_MESSAGE_BYTES} bytes"
                    self.kill_now()
                    return
                if not line:
                    return
                try:
                    message = types.JSONRPCMessage.model_validate_json(line)
                except ValueError:  # not JSON-RPC (a stray print): skipped, as a log line would be
                    self.skipped_lines += 1
                    continue
                try:
                    await sink.send(SessionMessage(message))
                except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                    return

    async def _pump_stdin(self, stdin: asyncio.StreamWriter, source: Any) -> None:
        async with source:
            async for item in source:
                data = item.message.model_dump_json(by_alias=True, exclude_none=True) + "\n"
                try:
                    stdin.write(data.encode("utf-8", errors="replace"))  # a lone surrogate must not end the transport
                    await stdin.drain()
                except (BrokenPipeError, ConnectionResetError):
                    return  # the server is gone: closing `source` fails the pending request

    async def _pump_stderr(self, stderr: asyncio.StreamReader) -> None:
        # The window keeps room for a secret's longest redacted form (4 bytes a character)
        # past the tail shown, so redaction sees it whole.
        keep = STDERR_KEEP + 4 * self._redactor.longest
        try:
            while chunk := await stderr.read(64 * 1024):
                self._stderr += chunk
                if len(self._stderr) > keep:
                    del self._stderr[: len(self._stderr) - keep]
                    self._stderr_cut = True
        finally:
            self._stderr_done.set()
