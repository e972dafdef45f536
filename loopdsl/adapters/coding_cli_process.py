"""The coding-agent CLI as a process: started in its own session with the prompt on stdin,
its stdout read line by line into the event reader and the meter, its stderr kept as a
bounded tail, and its whole process group killed at the end, at the timeout, at the
reservation, on cancellation or when a callback raises (see `coding_cli`)."""
from __future__ import annotations

import asyncio
import contextlib
import inspect
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..runtime.process_tree import CommandRef, kill_now, new_marker, spawn_in_session, start_time, stop_command
from ..runtime.redaction import Redactor
from ..runtime.tools.base import safe_output
from .coding_cli_events import CodexReader, Meter, StreamState, TokenPrices, parse_line, reader_for
from .coding_cli_rollout import POLL_S, RolloutTail
from .coding_cli_stream import LineSplitter, TailBuffer
from .coding_cli_tools import ToolTracker

EVENT_LIMIT = 8 * 1024  # bytes of one event passed whole to on_event; larger ones are cut
STDERR_KEEP = 16 * 1024


class CliRun:
    """The state of one CLI process being read: what was said, spent and decided."""

    def __init__(self, kind: str, key_env: str, max_turns: int | None, reservation_usd: float, prices: TokenPrices,
                 redactor: Redactor, charge: Callable[[float], Any],
                 on_event: Callable[[dict[str, Any]], Any] | None) -> None:
        self.kind, self.key_env, self.max_turns = kind, key_env, max_turns
        self.reservation_usd = reservation_usd
        self.reader = reader_for(kind)
        self.meter = Meter(prices)
        self.redactor, self.charge, self.on_event = redactor, charge, on_event
        self.budget_hit = asyncio.Event()
        self.hopeless = asyncio.Event()  # the events say the CLI can only fail (a refused key)
        self.events = 0
        self.skipped = 0
        self.live: RolloutTail | None = None  # codex: its session log, for spend between events
        self.tools = ToolTracker(kind, redactor)

    @property
    def state(self) -> StreamState:
        return self.reader.state

    async def line(self, raw: bytes, oversized: bool) -> None:
        event = None if oversized else parse_line(raw)
        if event is None:
            self.skipped += 1
            return
        self.events += 1
        self.reader.feed(event)
        # Money first: the charge is recorded even if logging the event then fails.
        await self._charge_new()
        if self.state.hopeless is not None:
            self.hopeless.set()
        if self.on_event is not None:
            logged = self._for_log(event, raw)
            logged["tools"] = self.tools.feed(event)
            await _maybe_await(self.on_event(logged))

    async def close_tools(self) -> None:
        """Ends, as failed, the tool uses the CLI never reported a result for."""
        notes = self.tools.unfinished()
        if notes and self.on_event is not None:
            await _maybe_await(self.on_event({"cli": self.kind, "event": None, "spent_usd": self.meter.charged_usd,
                                              "tools": notes}))

    async def _charge_new(self) -> None:
        delta = self.meter.take_delta(self.state)
        if delta > 0:
            allowed = await _maybe_await(self.charge(delta))
            if allowed is False or self.meter.charged_usd >= self.reservation_usd:
                self.budget_hit.set()

    async def poll_live(self) -> None:
        """Charge what codex's session log says was used since the last look."""
        if self.live is None or not isinstance(self.reader, CodexReader):
            return
        for total in self.live.totals():
            self.reader.live_total(total)
        await self._charge_new()

    async def watch_live(self) -> None:
        while self.live is not None:
            await self.poll_live()
            await asyncio.sleep(POLL_S)

    def _for_log(self, event: dict[str, Any], raw: bytes) -> dict[str, Any]:
        if len(raw) <= EVENT_LIMIT:
            logged = self.redactor.redact_obj(event)
        else:
            # Cut from the line itself: redacted whole first, then capped (safe_output).
            excerpt, _ = safe_output(raw.decode("utf-8", errors="replace"), limit=EVENT_LIMIT,
                                     redact=self.redactor)
            logged = {"type": str(event.get("type"))[:100], "excerpt": excerpt, "cut": True}
        return {"cli": self.kind, "event": logged, "spent_usd": self.meter.charged_usd}


async def _maybe_await(value: Any) -> Any:
    """Callbacks may be plain functions or coroutines (a store that commits asynchronously)."""
    return await value if inspect.isawaitable(value) else value


@dataclass
class Outcome:
    exit_code: int | None
    stderr: str
    timed_out: bool = False
    budget_killed: bool = False
    gave_up: bool = False  # stopped early: its events said it could only fail
    start_error: str | None = None


async def supervise(argv: Sequence[str], env: dict[str, str], workspace: Path, prompt: str, run: CliRun,
                    timeout: float | None, grace: float,
                    on_start: Callable[[CommandRef], Any] | None) -> Outcome:
    """Start the CLI, watch it (`_watch`), and kill its whole group whatever happened."""
    marker = new_marker()
    try:
        proc = await spawn_in_session(
            argv, marker=marker, env=env, cwd=str(workspace), stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    except FileNotFoundError:
        return Outcome(127, "", start_error=f"{argv[0]}: command not found (set the alias's cli_path)")
    except OSError as exc:
        return Outcome(126, "", start_error=f"cannot run {argv[0]}: {exc.strerror or exc}")
    # start_new_session makes the CLI a session and group leader: its pid is the pgid.
    ref = CommandRef(proc.pid, marker, start_time(proc.pid))
    stderr = TailBuffer(STDERR_KEEP)
    err_reader = asyncio.ensure_future(stderr.drain(proc.stderr))
    exited = lambda: proc.returncode is not None  # noqa: E731
    reader: asyncio.Future[None] | None = None
    try:
        if on_start is not None:
            await _maybe_await(on_start(ref))
        reader = asyncio.ensure_future(_read_stdout(proc, run))
        outcome = await _watch(proc, run, reader, prompt, timeout, grace)
        # Whatever it left behind (a background child, a process holding the pipes) goes too;
        # at a budget kill nobody waits for a polite exit.
        await stop_command(ref, 0.0 if outcome.budget_killed else grace, exited=exited)
        await _until_exited(proc, grace + 1.0)
        # Events already written before the kill are spend too: read what the pipe still holds.
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(reader), 1.0)
        await run.poll_live()  # and what the session log holds
        await run.close_tools()
    except BaseException:
        try:
            await asyncio.shield(stop_command(ref, grace, exited=exited))
        except asyncio.CancelledError:
            kill_now(ref)
        err_reader.cancel()
        raise
    finally:
        if reader is not None:
            reader.cancel()
    with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
        await asyncio.wait_for(err_reader, 1.0)
    outcome.exit_code = proc.returncode
    outcome.stderr = stderr.text()
    return outcome


async def _until_exited(proc: asyncio.subprocess.Process, limit: float) -> None:
    """Wait (at most `limit` s) for the process itself to be reaped. Polled: asyncio's
    `wait()` also waits for every pipe to close, which a leftover grandchild can delay."""
    deadline = time.monotonic() + limit
    while proc.returncode is None and time.monotonic() < deadline:
        await asyncio.sleep(0.02)


async def _watch(proc: asyncio.subprocess.Process, run: CliRun, reader: asyncio.Future[None], prompt: str,
                 timeout: float | None, grace: float) -> Outcome:
    """Feed the prompt and read the events until the CLI is done, the budget is hit, or time
    runs out; the caller then kills the group. Done is: stdout closed and the CLI exited
    (given `grace` s), or the CLI exited and `grace` s passed with its stdout still held
    open by something it left behind."""
    deadline = None if timeout is None else time.monotonic() + timeout
    feeder = asyncio.ensure_future(_feed(proc, prompt))
    budget = asyncio.ensure_future(run.budget_hit.wait())
    hopeless = asyncio.ensure_future(run.hopeless.wait())
    exited = asyncio.ensure_future(_until_exited(proc, math.inf))
    live = asyncio.ensure_future(run.watch_live())
    outcome = Outcome(None, "")
    try:
        done, _ = await asyncio.wait({reader, budget, exited, hopeless}, timeout=timeout,
                                     return_when=asyncio.FIRST_COMPLETED)
        if done and not run.budget_hit.is_set() and not run.hopeless.is_set():
            # One of them finished: wait (briefly) for the other, stdout or the exit.
            other = exited if reader in done else reader
            await asyncio.wait({other, budget}, timeout=_left(grace, deadline),
                               return_when=asyncio.FIRST_COMPLETED)
        if reader.done():
            reader.result()  # a raising callback propagates from here
        outcome.budget_killed = run.budget_hit.is_set()
        outcome.gave_up = run.hopeless.is_set() and not outcome.budget_killed
        outcome.timed_out = not done and not outcome.budget_killed
    finally:
        for task in (feeder, budget, exited, live, hopeless):
            task.cancel()
    if live.done() and not live.cancelled() and live.exception() is not None:
        raise live.exception()  # type: ignore[misc]  # a raising charge callback, as for stdout
    return outcome


def _left(grace: float, deadline: float | None) -> float:
    return grace if deadline is None else max(0.0, min(grace, deadline - time.monotonic()))


async def _feed(proc: asyncio.subprocess.Process, prompt: str) -> None:
    if proc.stdin is None:
        return
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        proc.stdin.write(prompt.encode("utf-8", errors="replace"))
        await proc.stdin.drain()
        proc.stdin.close()


async def _read_stdout(proc: asyncio.subprocess.Process, run: CliRun) -> None:
    if proc.stdout is None:
        return
    splitter = LineSplitter()
    while True:
        chunk = await proc.stdout.read(64 * 1024)
        for line, oversized in splitter.feed(chunk):
            await run.line(line, oversized)
        if not chunk:
            return


