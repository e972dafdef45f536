"""MCP tools: one stdio MCP server entry of a loop's `tools:`, as a `ToolBox` for one attempt.

    box = await McpToolBox.open(entry, redactor=r)             # starts, initializes, lists
    stored = box.definitions()                                  # kept in the first request
    box = await McpToolBox.open(entry, redactor=r, definitions=stored)  # on resume: no listing
    outcome = await box.call("issues__get_issue", {"n": 1}, call_id="call_1_1", timeout=120)
    await box.aclose()                                          # always, in a finally

The `mcp` SDK runs on anyio task groups, which must be entered and left by the same task.
So one background task owns the whole stack (transport, `ClientSession`) from start to
close, and the agent's task only sends requests through the session, which any task may
do; `aclose` may therefore be called from any task, also after a cancellation.

Everything the server says is hostile: descriptions and schemas are redacted and capped
before the model sees them, results are redacted then capped (`safe_output`), and a server
that hangs, dies or floods is a `ToolOutcome` error or an `McpStartError`, never a hang.
Rules: DSL.md, "Language v1.1", precise rules "MCP", "Names", "Timeouts", "Processes and
environment".
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import __version__
from ..language.agent_model import McpAllow
from ..runtime.errors import StepFailure
from ..runtime.redaction import Redactor
from ..runtime.tools.base import DEFAULT_TOOL_OUTPUT_LIMIT, ToolOutcome, ToolSpec, check_names, safe_output
from .mcp_results import render_result
from .mcp_stdio import StdioServer

DEFAULT_STARTUP_TIMEOUT_S = 30.0
DESCRIPTION_LIMIT = 1024  # characters of a server's tool description offered to the model
SCHEMA_LIMIT = 64 * 1024  # bytes of one tool's inputSchema, as JSON
MAX_LIST_PAGES = 50  # tools/list pages read before the listing is refused
BASE_ENV_VARS = ("PATH", "HOME", "LANG", "TERM", "TMPDIR")
TOOL_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
_CONNECTION_CLOSED = -32000  # mcp.types.CONNECTION_CLOSED: the SDK's code for a closed transport
_CLOSE_GRACE_S = 5.0  # aclose: the owning task's orderly shutdown, before it is cancelled


class McpStartError(StepFailure):
    """The server could not be started, initialized or listed, or does not offer an allowed
    tool. `kind` is `timeout` (startup_timeout ran out) or `connection` (anything else); the
    message names the entry and ends with the server's redacted stderr tail."""


@dataclass(frozen=True)
class AllowedTool:
    name: str  # the server's tool name
    offered: str  # the name the model calls it by


@dataclass(frozen=True)
class McpEntry:
    """One `tools:` entry with `mcp:`, its env values already resolved (a literal, or the
    value of the declared secret a `"$X"` names)."""

    name: str
    command: tuple[str, ...]
    env: Mapping[str, str]
    allow: tuple[AllowedTool, ...]
    startup_timeout: float = DEFAULT_STARTUP_TIMEOUT_S
    idempotent: bool = False  # the loop author's word, never the server's annotations

    @classmethod
    def build(cls, name: str, command: Sequence[str], env: Mapping[str, str],
              allow: Sequence[McpAllow | str | Mapping[str, Any]], startup_timeout: float | None = None,
              idempotent: bool = False) -> McpEntry:
        """`allow` items are `McpAllow`s, or what `McpAllow.parse` reads: a tool name or `{name, as}`."""
        allowed = [AllowedTool(a.name, a.offered_as(name)) for a in map(McpAllow.parse, allow)]
        timeout = DEFAULT_STARTUP_TIMEOUT_S if startup_timeout is None else float(startup_timeout)
        return cls(name, tuple(command), dict(env), tuple(allowed), timeout, idempotent)


def server_environment(entry_env: Mapping[str, str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """PATH HOME LANG TERM TMPDIR from loopdsl's own environment, plus the entry's `env`."""
    source = os.environ if environ is None else environ
    env = {key: source[key] for key in BASE_ENV_VARS if key in source}
    env.update(entry_env)
    return env


class McpToolBox:
    """The allowed tools of one MCP server, alive for one agent attempt. Build with `open`."""

    def __init__(self, entry: McpEntry, *, redactor: Redactor, output_limit: int,
                 cwd: Path | None, environ: Mapping[str, str] | None,
                 on_start: Callable[[Any], None] | None = None) -> None:
        self.entry = entry
        self._redactor = redactor
        self._limit = output_limit
        self._server = StdioServer(entry.command, server_environment(entry.env, environ),
                                   cwd=cwd, redactor=redactor, on_start=on_start)
        self._specs: dict[str, ToolSpec] | None = None
        self._targets = {allowed.offered: allowed.name for allowed in entry.allow}
        self._session: Any = None
        self._task: asyncio.Task[None] | None = None
        self._closing = asyncio.Event()
        self._lock = asyncio.Lock()

    @classmethod
    async def open(cls, entry: McpEntry, *, redactor: Redactor,
                   output_limit: int = DEFAULT_TOOL_OUTPUT_LIMIT,
                   definitions: Sequence[Mapping[str, Any]] | None = None,
                   cwd: Path | None = None, environ: Mapping[str, str] | None = None,
                   on_start: Callable[[Any], None] | None = None) -> McpToolBox:
        """Start the server, initialize and (unless `definitions`, stored by an earlier run
        of this attempt, are given) list its tools once; `on_start(ref)` as soon as the
        server process runs (the engine records it for `resume`). Raises `McpStartError`; on any
        failure or cancellation the server is already stopped."""
        box = cls(entry, redactor=redactor, output_limit=output_limit, cwd=cwd, environ=environ, on_start=on_start)
        if definitions is not None:
            box._specs = check_names(specs_from_definitions(entry, definitions))
        try:
            await box._start()
        except BaseException:
            box._server.kill_now()  # first, synchronously: a second cancellation may come
            await box.aclose()
            raise
        return box

    @property
    def command_ref(self) -> Any:
        """The server's `CommandRef` (process group, marker), for the `tool_started` record."""
        return self._server.ref

    def specs(self) -> Sequence[ToolSpec]:
        return tuple(self._specs.values()) if self._specs else ()

    def definitions(self) -> list[dict[str, Any]]:
        """The offered tools as function definitions: store them with the first request and
        pass them back to `open` on resume, which then never lists the server's tools."""
        return [spec.definition() for spec in self.specs()]

    def stderr_tail(self, limit: int = 2000) -> str:
        return self._server.stderr_tail(limit)

    async def call(self, name: str, args: Mapping[str, Any], *, call_id: str,
                   timeout: float) -> ToolOutcome:
        started = time.monotonic()
        target = self._targets.get(name) if self._specs and name in self._specs else None
        if target is None:
            return ToolOutcome.failure(f"unknown tool {name!r}")
        async with self._lock:  # one request at a time: the cancel notice needs its id
            try:
                error, result = await self._request(target, dict(args), timeout)
            except Exception as exc:  # the SDK's or the transport's: the call failed, the run goes on
                error, result = await self._failure_text(exc), None
        duration = time.monotonic() - started
        if result is None:
            return ToolOutcome.failure(self._safe_error(error or "no result"), duration)
        try:
            rendered = render_result(result)
        except (ValueError, TypeError, RecursionError) as exc:  # e.g. structuredContent nested too deep
            return ToolOutcome.failure(f"MCP result could not be shown: {type(exc).__name__}", duration)
        text, truncated = safe_output(rendered, limit=self._limit, redact=self._redactor)
        if result.isError:
            return ToolOutcome(ok=False, error=text, truncated=truncated, duration_s=duration)
        return ToolOutcome(ok=True, result=text, truncated=truncated, duration_s=duration)

    async def aclose(self) -> None:
        """Stop the session and kill the server's process group; idempotent, never raises."""
        self._closing.set()
        task = self._task
        try:
            if task is not None and not task.done():
                # asyncio.wait neither raises the task's outcome nor swallows our own cancellation.
                await asyncio.wait({task}, timeout=_CLOSE_GRACE_S)
                if not task.done():  # stuck leaving the SDK's contexts: kill, then cancel it
                    self._server.kill_now()
                    task.cancel()
                    await asyncio.wait({task}, timeout=_CLOSE_GRACE_S)
            await self._server.stop()  # also when the owning task never got that far
        except BaseException:
            self._server.kill_now()  # cancelled while closing: no process outlives the attempt
            raise
        finally:
            if task is not None and task.done() and not task.cancelled():
                task.exception()  # mark it retrieved (`_serve` keeps its own failures)

    async def _start(self) -> None:
        ready: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        # An opener cancelled mid-start never reads the failure; retrieving it here keeps
        # asyncio from printing it at garbage collection.
        ready.add_done_callback(lambda done: done.cancelled() or done.exception())
        self._task = asyncio.create_task(self._serve(ready), name=f"mcp {self.entry.name}")
        what = f"MCP server {self.entry.name!r}"
        try:
            listed = await asyncio.wait_for(asyncio.shield(ready), self.entry.startup_timeout)
        except asyncio.TimeoutError:
            raise McpStartError("timeout", self._redactor.error(
                f"{what} did not start within {self.entry.startup_timeout:g}s (startup_timeout)"
                + self._stderr_note())) from None
        except Exception as exc:
            await self._server.settle(0.5)
            raise McpStartError("connection", self._redactor.error(
                f"{what} failed to start: {_describe(exc)}{self._exit_note()}{self._stderr_note()}")) from None
        if self._specs is None:
            self._specs = check_names(self._specs_from_listing(listed))

    async def _serve(self, ready: asyncio.Future[Any]) -> None:
        """The one task that enters and leaves the SDK's context managers."""
        from mcp import ClientSession  # optional dependency, only loaded when an MCP tool is used
        from mcp.types import Implementation  # same

        try:
            async with contextlib.AsyncExitStack() as stack:
                streams = await stack.enter_async_context(self._server.connect())
                # No sampling, elicitation or roots callbacks: the SDK then declares none.
                session = await stack.enter_async_context(ClientSession(
                    *streams, client_info=Implementation(name="loopdsl", version=__version__)))
                await session.initialize()
                listed = None if self._specs is not None else await _list_tools(session)
                self._session = session
                ready.set_result(listed)
                await self._closing.wait()
        except Exception as exc:
            if not ready.done():
                ready.set_exception(exc)
        finally:
            if not ready.done():  # cancelled before it was ready (only aclose does that)
                ready.set_exception(RuntimeError("the MCP session was closed while starting"))

    async def _request(self, tool: str, args: dict[str, Any], timeout: float) -> tuple[str | None, Any]:
        """(error, None) or (None, CallToolResult). Races the call against the server's exit
        and the timeout; on timeout the server is told to cancel the request."""
        import mcp.types as types  # optional dependency, only loaded when an MCP tool is used

        if self._session is None or self._server.returncode is not None:
            return self._gone("is not running"), None
        request = types.ClientRequest(types.CallToolRequest(
            params=types.CallToolRequestParams(name=tool, arguments=args)))
        request_id = getattr(self._session, "_request_id", None)  # the id send_request will take
        call = asyncio.ensure_future(self._session.send_request(request, types.CallToolResult))
        died = asyncio.ensure_future(self._server.wait())
        try:
            done, _ = await asyncio.wait({call, died}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for future in (call, died):
                future.cancel()
        if call in done:
            return None, call.result()  # an McpError (JSON-RPC error) is raised here
        await asyncio.wait({call}, timeout=1.0)  # let it unwind; our own cancellation still propagates
        if call.done() and not call.cancelled():
            call.exception()  # retrieved: a result that lost the race is of no use now
        if died in done:
            await self._server.settle(0.5)
            return self._gone("exited during the call"), None
        await self._cancel_notice(request_id)
        skipped = self._server.skipped_lines
        note = f" (the server wrote {skipped} stdout line(s) that were not JSON-RPC messages)" if skipped else ""
        return f"timed out after {timeout:g}s{note}", None

    async def _cancel_notice(self, request_id: Any) -> None:
        import mcp.types as types  # see _request

        if not isinstance(request_id, int):
            return
        notice = types.ClientNotification(types.CancelledNotification(
            params=types.CancelledNotificationParams(requestId=request_id, reason="timed out")))
        with contextlib.suppress(Exception, asyncio.TimeoutError):
            await asyncio.wait_for(self._session.send_notification(notice), 1.0)

    def _specs_from_listing(self, listed: Sequence[Any]) -> list[ToolSpec]:
        by_name = {tool.name: tool for tool in listed}
        specs = []
        for allowed in self.entry.allow:
            tool = by_name.get(allowed.name)
            if tool is None:
                offered = ", ".join(sorted(by_name)[:30]) or "none"
                raise McpStartError("connection", self._redactor.error(
                    f"MCP server {self.entry.name!r} has no tool {allowed.name!r} listed in `allow`"
                    f" (it offers: {offered})"))
            specs.append(self._spec(allowed, tool.description, tool.inputSchema))
        return specs

    def _spec(self, allowed: AllowedTool, description: str | None, schema: Any) -> ToolSpec:
        where = f"MCP tool {allowed.name!r} of {self.entry.name!r}"
        if not TOOL_NAME.match(allowed.offered):
            raise McpStartError("connection", f"{where} would be offered as {allowed.offered!r}, which is not"
                                f" a tool name ({TOOL_NAME.pattern}); rename it with allow: [{{name, as}}]")
        text = self._redactor(description or "").strip() or f"{allowed.name} (MCP server {self.entry.name})"
        if len(text) > DESCRIPTION_LIMIT:
            text = text[: DESCRIPTION_LIMIT - 3] + "..."
        parameters = _parameters(self._redactor.redact_obj(schema))
        if parameters is None:
            raise McpStartError("connection", self._redactor.error(
                f"{where} has an inputSchema that is not a JSON object schema of at most {SCHEMA_LIMIT} bytes"))
        return ToolSpec(allowed.offered, text, parameters, idempotent=self.entry.idempotent)

    async def _failure_text(self, exc: Exception) -> str:
        """A JSON-RPC error from a live server is its message; anything else (the SDK's
        "Connection closed", a closed stream) most likely means the server went away."""
        code = getattr(getattr(exc, "error", None), "code", None)
        if code is None or code == _CONNECTION_CLOSED:
            await self._server.settle(0.5)
            if self._server.returncode is not None or self._server.protocol_error:
                return self._gone("exited during the call")
        return f"MCP call failed: {_describe(exc)}"

    def _gone(self, what: str) -> str:
        code = self._server.returncode
        problem = self._server.protocol_error
        detail = f" ({problem})" if problem else (f" (exit code {code})" if code is not None else "")
        return f"MCP server {self.entry.name!r} {what}{detail}{self._stderr_note()}"

    def _exit_note(self) -> str:
        code = self._server.returncode
        return f" (exit code {code})" if code is not None else ""

    def _stderr_note(self) -> str:
        tail = self._server.stderr_tail(1000)
        return f"; its stderr ends: {tail}" if tail else ""

    def _safe_error(self, message: str) -> str:
        return safe_output(self._redactor.error(message), limit=self._limit, redact=self._redactor)[0]


def specs_from_definitions(entry: McpEntry, definitions: Sequence[Mapping[str, Any]]) -> list[ToolSpec]:
    """ToolSpecs back from stored function definitions (already redacted and capped when they
    were listed). A definition that names no allowed tool means the store and the loop file
    disagree: a programming error here, not the server's."""
    offered = {allowed.offered for allowed in entry.allow}
    specs = []
    for definition in definitions:
        function = definition.get("function") or {}
        name = function.get("name")
        if name not in offered:
            raise ValueError(f"stored MCP definition {name!r} is not an allowed tool of {entry.name!r}")
        specs.append(ToolSpec(name, str(function.get("description", "")), dict(function.get("parameters") or {}),
                              idempotent=entry.idempotent))
    return specs


async def _list_tools(session: Any) -> list[Any]:
    """Every page of tools/list, once. A later `tools/list_changed` is ignored: the SDK's
    default message handler drops notifications, and nothing here lists again."""
    import mcp.types as types  # optional dependency, only loaded when an MCP tool is used

    tools: list[Any] = []
    cursor = None
    for _ in range(MAX_LIST_PAGES):
        page = await session.list_tools(params=types.PaginatedRequestParams(cursor=cursor) if cursor else None)
        tools.extend(page.tools)
        cursor = page.nextCursor
        if not cursor:
            return tools
    raise RuntimeError(f"tools/list still had more pages after {MAX_LIST_PAGES}")


def _parameters(schema: Any) -> dict[str, Any] | None:
    """The inputSchema as function parameters: an object schema, bounded in size."""
    if not isinstance(schema, Mapping) or schema.get("type", "object") != "object":
        return None
    try:
        size = len(json.dumps(schema, ensure_ascii=False).encode("utf-8"))
    except (TypeError, ValueError, RecursionError):
        return None
    if size > SCHEMA_LIMIT:
        return None
    return {"type": "object", **schema}


def _describe(exc: BaseException) -> str:
    """A short text for an exception, looking inside anyio's exception groups."""
    while getattr(exc, "exceptions", None):  # an ExceptionGroup (no builtin name on 3.10)
        exc = exc.exceptions[0]  # type: ignore[attr-defined]
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
