"""The engine's ports as workflow code: every effect is an activity, every clock reading
`workflow.now()`, every wait a durable timer. Only decisions run here.

Paid model replies come back as activity results, so they are in the workflow's history:
a replay (on this worker or another) reads them from there and never calls again.
"""
from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import (ActivityError, ApplicationError, CancelledError, TimeoutError as ActivityTimeout,
                                   TimeoutType)

from ...language.model import Loop
from ...runtime.errors import StepFailure
from ...runtime.model_port import LlmRequest, LlmResponse, ProviderError, stored_tool_calls
from ...runtime.run_state import RUNNING, WAITING, RunState, stamp_time
from ...runtime.shell import ShellResult
from ..scripted import scripted_prompt_tokens
from .wire import LLM, NO_TIMEOUT, SHELL, WORKER_STOPPED

if TYPE_CHECKING:
    from .workflow import LoopWorkflow

# Temporal never retries an activity: the engine counts attempts (and pays for them).
ONCE = RetryPolicy(maximum_attempts=1)
# Beyond a call's own timeout, time for the worker to hand back the result.
MARGIN = timedelta(seconds=30)


def activity_options(heartbeat_s: float, timeout_s: float | None) -> dict[str, Any]:
    """The one place activity options are made; every activity runs at most once."""
    options = {"retry_policy": ONCE, "heartbeat_timeout": timedelta(seconds=heartbeat_s),
               "start_to_close_timeout": timedelta(seconds=timeout_s) + MARGIN if timeout_s else NO_TIMEOUT}
    assert options["retry_policy"].maximum_attempts == 1
    return options


def stop_if_cancelled(exc: ActivityError) -> None:
    """Raise asyncio's CancelledError when `exc` is the activity's end because the run was
    cancelled (`loopdsl abort`), so the engine ends the run `aborted` as on a local Ctrl-C.
    Taken for a lost worker or a timeout, a cancelled model call was retried and the run went on."""
    if isinstance(exc.cause, CancelledError):
        raise asyncio.CancelledError() from None


def worker_lost(exc: BaseException) -> bool:
    """The activity's worker stopped answering (killed, or its host gone) or was asked to stop."""
    cause = exc.cause if isinstance(exc, ActivityError) else None
    if isinstance(cause, ApplicationError):
        return cause.type == WORKER_STOPPED
    return isinstance(cause, ActivityTimeout) and cause.type in (TimeoutType.HEARTBEAT, TimeoutType.START_TO_CLOSE)


class WorkflowClock:
    """Time and random draws as the workflow sees them: recorded on first execution and the
    same on every replay (`workflow.now()`, durable timers, the workflow's seeded random)."""

    def monotonic(self) -> float:
        return workflow.time()

    def uniform(self, low: float, high: float) -> float:
        return workflow.random().uniform(low, high)

    def token_hex(self, nbytes: int) -> str:
        return workflow.random().randbytes(nbytes).hex()

    def utc_now(self) -> str:
        return workflow.now().isoformat(timespec="milliseconds")

    def now(self) -> datetime:
        return workflow.now()

    async def sleep(self, seconds: float) -> None:
        if seconds > 0:
            await asyncio.sleep(seconds)  # a durable timer in workflow code


class WorkflowModel:
    """The model port: a call is one `loopdsl.llm` activity. Prompt tokens are reserved
    by the conservative byte estimate (no tokenizer in workflow code), which holds a cap
    at least as tightly as the local backend's count."""

    def __init__(self, loop: Loop, heartbeat_s: float):
        self.loop = loop
        self.heartbeat_s = heartbeat_s

    def count_tokens(self, model: str, messages: Sequence[Mapping[str, Any]],
                     tools: Sequence[Mapping[str, Any]] = ()) -> int:
        return scripted_prompt_tokens(messages, tools)  # the tools' definitions are sent, so reserved for

    def _key_env(self, request: LlmRequest) -> str | None:
        # The key itself never enters workflow history: the activity reads it by name.
        for alias in self.loop.models.values():
            if alias.model == request.model and alias.api_base == request.api_base:
                return alias.api_key_env
        return None

    async def complete(self, request: LlmRequest, *, state: str) -> LlmResponse:
        arg = {"model": request.model, "messages": [dict(m) for m in request.messages], "max_tokens": request.max_tokens,
               "temperature": request.temperature, "api_base": request.api_base, "timeout": request.timeout,
               "params": dict(request.params), "priced": request.priced, "api_key_env": self._key_env(request),
               "state": state, "secrets": sorted(self.loop.secrets),  # names only: the reply is redacted of them
               # An agent's turn: what it may call, as the local provider sends it.
               "tools": [dict(t) for t in request.tools], "tool_choice": request.tool_choice,
               "parallel_tool_calls": request.parallel_tool_calls,
               "response_schema": dict(request.response_schema) if request.response_schema is not None else None}
        try:
            out = await workflow.execute_activity(LLM, arg, **activity_options(self.heartbeat_s, request.timeout))
        except ActivityError as exc:
            stop_if_cancelled(exc)
            # Lost mid-call: the request may have been paid. The engine charges it in full.
            raise ProviderError("timeout", f"{request.model}: the worker making the call was lost ({exc.cause})",
                                billed=worker_lost(exc)) from None
        if "error" in out:
            err = out["error"]
            raise ProviderError(err["kind"], err["message"], err.get("retry_after"), billed=err.get("billed"))
        reply = dict(out["response"])
        return LlmResponse(**{**reply, "tool_calls": stored_tool_calls(reply)})


class WorkflowShell:
    """The shell port: one `loopdsl.shell` activity, in the serving worker's checkout. A
    command whose worker died is run again when its state is idempotent; otherwise a
    person decides first, as after a crash on the local backend."""

    def __init__(self, host: "LoopWorkflow", root: Path, workdir: Path, heartbeat_s: float,
                 secrets: Sequence[str], seal: str):
        self.host, self.root, self.workdir, self.heartbeat_s = host, root, workdir, heartbeat_s
        self.secrets = sorted(secrets)  # the only names the activity may put in (sealed.py)
        self.seal = seal  # the placeholders' seal: the activity unseals only values carrying it

    async def __call__(self, *, script: str | None = None, argv: Sequence[str] | None = None, cwd: Path,
                       env: Mapping[str, str], timeout: float | None, redact: Callable[[str], str] = str,
                       marker: str | None = None, on_start: Callable[[Any], None] | None = None) -> ShellResult:
        arg = {"script": script, "argv": list(argv) if argv is not None else None,
               "cwd": under(cwd, self.workdir), "workdir": under(self.workdir, self.root),
               "env": dict(env), "timeout": timeout, "marker": marker,
               "seal": self.seal, "secrets": self.secrets}
        while True:
            try:
                out = await workflow.execute_activity(SHELL, arg, **activity_options(self.heartbeat_s, timeout))
                break
            except ActivityError as exc:
                stop_if_cancelled(exc)
                if not worker_lost(exc):
                    raise
                if self._non_idempotent(marker):
                    await self.host.ask_to_rerun()
        if "cwd_error" in out:
            raise StepFailure("parse", f"the command's cwd: {out['cwd_error']}")
        out.pop("command", None)
        out.pop("host", None)
        return ShellResult(**{k: (redact(v) if isinstance(v, str) else v) for k, v in out.items()})

    def _non_idempotent(self, marker: str | None) -> bool:
        # The engine commits a `pending` marker before a non-idempotent command only.
        pending = self.host.run.pending if self.host.run else None
        return bool(pending and pending.get("kind") == "shell" and (pending.get("command") or {}).get("marker") == marker)


class WorkflowRunLog:
    """Commits keep the run in workflow state for queries; the history is the durable log."""

    durable = True

    def __init__(self, on_commit: Callable[[RunState, list[dict[str, Any]]], None]):
        self.on_commit = on_commit

    def commit(self, run: RunState, events: list[dict[str, Any]]) -> None:
        self.on_commit(run, events)


class WorkflowHuman:
    """Decisions from a reply script (in workflow state), else none: the run waits for an Update."""

    def __init__(self, scripted: Any, clock: WorkflowClock):
        self.scripted, self.clock = scripted, clock

    async def decide(self, state: str, message: str, choices: tuple[str, ...]) -> dict[str, Any] | None:
        entry = self.scripted.decision(state) if self.scripted is not None else None
        if entry is None:
            return None
        return {"decision": entry["decision"], "comment": entry.get("comment", ""), "by": "script",
                "at": self.clock.utc_now()}


def under(path: str | Path, root: Path) -> str:
    """`path` relative to the worker's root, by the names alone (no file system, no cwd:
    this is workflow code): another worker resolves it against its own root."""
    return str(Path(path).relative_to(root))


def reading_run_files() -> Any:
    """The one place workflow code reads files: the worker's cache of compiled loops, whose
    miss (a replay on a worker that never ran the run) reads the run's files and checks
    them against the hashes recorded at its start, so every replay compiles the same loop
    or stops with FilesChanged. The sandbox refuses `open` even to passed-through code."""
    return workflow.unsafe.sandbox_unrestricted()


def waiting_left(run: RunState, now: datetime) -> float | None:
    """Seconds a waiting run's checkpoint still accepts a decision (None: no timeout)."""
    waiting = run.waiting or {}
    timeout = waiting.get("timeout_s")
    if timeout is None:
        return None
    return float(timeout) - (now - stamp_time(waiting["since"])).total_seconds()


__all__ = ["RUNNING", "WAITING", "WorkflowClock", "WorkflowModel", "WorkflowShell", "WorkflowRunLog", "WorkflowHuman",
           "activity_options", "reading_run_files", "waiting_left"]
