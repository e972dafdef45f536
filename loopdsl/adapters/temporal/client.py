"""The client side: connect, start a run, follow it, decide, abort, list and show runs."""
from __future__ import annotations

import asyncio
import uuid
from typing import Any, Callable

from temporalio.client import Client, WorkflowExecutionStatus, WorkflowQueryFailedError, WorkflowUpdateFailedError
from temporalio.service import RPCError

from ...language.errors import EXIT_CHANGED, LoopdslError
from ...runtime.redaction import without_own_credentials
from ...runtime.run_state import ABORT_REASON_LIMIT
from .connection import Connection
from .wire import ABORT_SIGNAL, DECIDE_UPDATE, PROGRESS_QUERY, WORKFLOW

# A server that cannot be reached is the address or the network: a usage error (docs/cli.md's table).
EXIT_UNREACHABLE = 2
FOLLOW_POLL_S = 0.2
# How long `runs` waits for a running run's worker to say where the run is.
LIST_WAIT_S = 5.0
# Started, task scheduled, task started: a history this short has no completed workflow task.
NO_TASK_DONE_EVENTS = 4


class TemporalError(LoopdslError):
    """The Temporal server or a run on it said no."""


async def connect(conn: Connection, timeout_s: float = 5.0) -> Client:
    try:
        return await asyncio.wait_for(Client.connect(conn.address, **conn.client_kwargs()), timeout_s)
    except (asyncio.TimeoutError, RuntimeError, OSError, RPCError, ValueError) as exc:  # ValueError: `host:99999`
        raise TemporalError(f"cannot reach the Temporal server at {conn.describe()}: {conn.hide(str(exc)) or type(exc).__name__}",
                            "start it (`temporal server start-dev`) or pass --temporal HOST:PORT / set LOOPDSL_TEMPORAL; "
                            "for a cluster or Temporal Cloud check --namespace, the TLS options and LOOPDSL_TEMPORAL_API_KEY",
                            exit_code=EXIT_UNREACHABLE) from None


def new_run_id(loop_name: str) -> str:
    return f"{loop_name}-{uuid.uuid4().hex[:8]}"


async def start(client: Client, request: dict[str, Any], *, task_queue: str, run_id: str) -> Any:
    # No retry policy: a failed run is ended, never restarted behind the engine's back.
    return await client.start_workflow(WORKFLOW, request, id=run_id, task_queue=task_queue,
                                       memo={"loop": run_id.rsplit("-", 1)[0], "loop_path": request["loop_path"]})


async def progress(client: Client, run_id: str, since: int = 0) -> dict[str, Any]:
    handle = client.get_workflow_handle(run_id)
    try:
        return await handle.query(PROGRESS_QUERY, since)
    except RPCError as exc:
        raise TemporalError(f"run {run_id}: {exc}", "`loopdsl runs --temporal ...` lists the runs") from None
    except WorkflowQueryFailedError as exc:  # a worker could not rebuild the run (replay) to answer
        hint = "see the worker's log"
        if "files changed" in str(exc):
            hint = ("a worker rebuilds a run from the files it started with: restore them in the worker's checkout, "
                    "then decide (--force moves a run onto edited files only on a worker that loaded both versions)")
        raise TemporalError(f"run {run_id}: its worker cannot rebuild it: {exc}", hint) from None


async def follow(client: Client, run_id: str, on_event: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Prints the run's events as they come; returns the run when it ends or waits."""
    handle = client.get_workflow_handle(run_id)
    since = 0
    while True:
        desc = await handle.describe()
        if desc.status != WorkflowExecutionStatus.RUNNING:
            result = await handle.result() if desc.status == WorkflowExecutionStatus.COMPLETED else None
            try:
                state = await progress(client, run_id, since)
            except TemporalError:
                state = {"run": result or {}, "events": []}
            for event in state["events"]:
                on_event(event)
            return result or state["run"]
        if desc.history_length < NO_TASK_DONE_EVENTS:
            # No worker has run the workflow's first task yet (none polls, or one is starting):
            # a query now would wait for one and fail after the server's deadline (~30 s).
            await asyncio.sleep(FOLLOW_POLL_S)
            continue
        state = await progress(client, run_id, since)
        for event in state["events"]:
            on_event(event)
        since = state["next"]
        if state["run"].get("status") == "waiting" and not state["events"]:
            return state["run"]
        await asyncio.sleep(FOLLOW_POLL_S)


async def decide(client: Client, run_id: str, choice: str, comment: str, by: str,
                 force: bool = False) -> dict[str, Any]:
    """`force`: the run goes on with the worker's files as they are now (see LoopWorkflow._check_files)."""
    handle = client.get_workflow_handle(run_id)
    state = (await progress(client, run_id))["run"]
    waiting = state.get("waiting") or {}
    if state.get("status") != "waiting" or not waiting:
        raise TemporalError(f"run {run_id} is not waiting for a decision (status: {state.get('status')})",
                            f"`loopdsl show {run_id} --temporal ...` shows where the run is")
    # One id per call: the SDK's own retries of this call are deduplicated, and no other
    # decision (a racing person's, or one at a later wait of the same state and visit, such
    # as the next tool approval) is ever answered with this one's outcome.
    update_id = f"{run_id}/decide/{uuid.uuid4().hex}"
    # As locally (api.durable.decide): a credential of this process's environment pasted in a
    # comment never reaches the history.
    comment = without_own_credentials(comment)
    try:
        return await handle.execute_update(DECIDE_UPDATE, {"decision": choice, "comment": comment, "by": by,
                                                           "force": force},
                                           id=update_id)
    except (RPCError, WorkflowUpdateFailedError) as exc:
        said = str(exc) if isinstance(exc, RPCError) else str(getattr(exc.cause, "message", None) or exc.cause)
        if any(words in said for words in _ENDED_FIRST):  # another decision ended the run meanwhile
            raise TemporalError(f"run {run_id} ended before this decision reached it; this one was not recorded",
                                f"`loopdsl show {run_id} --temporal ...` shows it", exit_code=EXIT_CHANGED) from None
        if isinstance(exc, RPCError):
            raise TemporalError(f"run {run_id}: {said}",
                                f"`loopdsl show {run_id} --temporal ...` shows where the run is") from None
        if said.startswith(("the run already has a decision", "another decision is being checked")):
            # Another person's decision won (or is being recorded): as locally, exit 5, nothing recorded.
            raise TemporalError(f"run {run_id}: {said}; this one was not recorded",
                                f"`loopdsl show {run_id} --temporal ...` shows it", exit_code=EXIT_CHANGED) from None
        raise TemporalError(f"run {run_id}: {said}",
                            f"`loopdsl show {run_id} --temporal ...` shows where the run is") from None


# What the server says of an update that reached a run as it closed, or after it had.
_ENDED_FIRST = ("already completed", "aborted by closing workflow")


async def abort(client: Client, run_id: str, reason: str = "") -> None:
    """Cancel a loopdsl run that is still going (as locally, an ended run is not aborted, and a
    workflow of another type, on the same namespace, is not loopdsl's to cancel)."""
    handle = client.get_workflow_handle(run_id)
    try:
        desc = await handle.describe()
        if desc.workflow_type != WORKFLOW:
            raise TemporalError(f"{run_id} is not a loopdsl run (its workflow type is {desc.workflow_type!r})",
                                "`loopdsl runs --temporal ...` lists the runs")
        if desc.status != WorkflowExecutionStatus.RUNNING:
            status = desc.status.name.lower() if desc.status is not None else "unknown"
            raise TemporalError(f"run {run_id} already ended ({status})", f"`loopdsl show {run_id} --temporal ...` shows it")
        # As a decision's comment: a credential of this process's environment never reaches the history.
        await handle.signal(ABORT_SIGNAL, {"reason": without_own_credentials(reason)[:ABORT_REASON_LIMIT]})
        await handle.cancel()
    except RPCError as exc:
        raise TemporalError(f"run {run_id}: {exc}") from None


async def snapshot(client: Client, run_id: str) -> dict[str, Any]:
    """The run and all its events: from the workflow while a worker has it, else its result."""
    events: list[dict[str, Any]] = []
    children: list[dict[str, Any]] = []
    since = 0
    while True:
        try:
            part = await asyncio.wait_for(progress(client, run_id, since), 10)
        except asyncio.TimeoutError:
            raise TemporalError(f"run {run_id}: no worker answered", "start a worker: `loopdsl worker --temporal ...`",
                                exit_code=EXIT_UNREACHABLE) from None
        events.extend(part["events"])
        children.extend(part.get("children") or [])
        if not part["events"]:
            return {"run": part["run"], "events": events, "children": children}
        since = part["next"]


async def _status_of(client: Client, wf: Any) -> str:
    """What the loop says of a listed run: a closed run's from its result (read from the
    history, no worker needed), a running one's from a query its worker answers."""
    status = wf.status.name.lower() if wf.status else "unknown"
    try:
        if wf.status == WorkflowExecutionStatus.COMPLETED:
            result = await asyncio.wait_for(client.get_workflow_handle(wf.id, run_id=wf.run_id).result(), LIST_WAIT_S)
            return str(result.get("status") or status) if isinstance(result, dict) else status
        if wf.status == WorkflowExecutionStatus.RUNNING:
            return str((await asyncio.wait_for(progress(client, wf.id), LIST_WAIT_S))["run"].get("status", status))
    except (asyncio.TimeoutError, TemporalError, RPCError):
        pass
    return status


async def list_runs(client: Client, limit: int = 50) -> list[dict[str, Any]]:
    """Runs newest first, with the loop's status of each."""
    # Sub-loop runs are child workflows: listed by `show PARENT`, not here (as locally).
    listed = [wf async for wf in client.list_workflows(f"WorkflowType = '{WORKFLOW}' AND ParentWorkflowId IS NULL",
                                                       limit=limit)]
    # Side by side: a run whose worker is gone waits out the whole LIST_WAIT_S, once per
    # listing rather than once per such run.
    statuses = await asyncio.gather(*(_status_of(client, wf) for wf in listed))
    rows = []
    for wf, status in zip(listed, statuses):
        try:
            memo = await wf.memo()
        except Exception:  # a workflow of this type started by someone else, its memo in a codec we lack
            memo = {}
        rows.append({"run_id": wf.id, "loop": str(memo.get("loop", "")) if isinstance(memo, dict) else "", "status": status,
                     "started": wf.start_time.isoformat(timespec="seconds") if wf.start_time else ""})
    return rows
