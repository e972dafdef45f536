"""`loop:` states on Temporal: each sub-loop or fan-out child is a child workflow.

The child's workflow id is its display id (`<parent>/<state>[@visit][/<index>]`), so
`loopdsl show` and `approve` reach it like any run. It runs the same loop file (the root's
recorded hashes cover sub-loops, so a worker whose copy differs refuses it), in the
caller's workspace, on the parent's task queue. Its budget is exact across workflows:
budget_tree.py. Semantics follow runtime/actions/subloop.py: the same results, statuses
and spending roll-up; `concurrency` is the engine's own semaphore, in workflow code.

A run driven by a reply script is one ordered sequence of replies shared by the parent and
its children: a child takes it from where the parent is, and hands back how far it got.
Concurrent children of a scripted run would interleave that sequence, so they run inside
the parent's workflow (as on the local backend) instead.
"""
from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Mapping

from temporalio import workflow
from temporalio.exceptions import ChildWorkflowError, TerminatedError
from temporalio.workflow import ParentClosePolicy

from ...language.model import Loop
from ...runtime.ports import ChildLoop
from ...runtime.run_state import ABORTED, FAILED, RunState
from . import loops
from .budget_tree import RemoteLedger, caps_json
from .wf_ports import reading_run_files
from .wire import ANSWER_SIGNAL, MAX_PENDING_CHILDREN, RESERVE_SIGNAL, WORKFLOW

if TYPE_CHECKING:
    from ...runtime.engine import Engine
    from .workflow import LoopWorkflow

# What `show PARENT` lists of each child (the child's own workflow keeps the rest).
SUMMARY_KEYS = ("run_id", "loop", "status", "path", "ledger", "outputs", "error")


class WorkflowChildRuns:
    """The child-runs port of a loop workflow (runtime/ports.ChildRuns, with `run`)."""

    def __init__(self, host: "LoopWorkflow", req: Mapping[str, Any]):
        self.host, self.req = host, req
        self.me = workflow.info().workflow_id
        child = req.get("child") or {}
        self.root = child.get("root") or self.me
        self.refs: list[str] = list(child.get("refs") or [])
        self.path: list[dict[str, Any]] = list(child.get("path") or [])
        self.pending = asyncio.Semaphore(MAX_PENDING_CHILDREN)
        self.summaries: list[dict[str, Any]] = []

    def open(self, parent: Loop, ref: str) -> ChildLoop:
        with reading_run_files():
            compiled, skills = loops.child(parent, ref)
        return ChildLoop(compiled, skills)

    def new_state(self, loop: Loop, run_id: str, inputs: Mapping[str, Any], meta: Mapping[str, Any]) -> RunState:
        return RunState(run_id=run_id, loop=loop.name, start=loop.start, current=loop.start, path=[loop.start],
                        visits={loop.start: 1}, inputs=dict(inputs), started_at=self.host.clock.utc_now(),
                        date=workflow.now().date().isoformat(), meta=dict(meta))

    async def run(self, parent: "Engine", ref: str, child: ChildLoop, state: RunState,
                  concurrency: int) -> dict[str, Any] | None:
        """Runs the child as a child workflow and returns what subloop.py expects of a child;
        None: run it in this workflow (a scripted run's concurrent children)."""
        if self.req.get("script") and concurrency > 1:
            return None
        cid = state.run_id
        req = {key: self.req.get(key) for key in ("loop_path", "script", "files", "heartbeat_s", "max_history_events")}
        req["child"] = {"root": self.root, "refs": [*self.refs, ref], "state": state.to_json(),
                        "path": [*self.path, {"id": cid, "caps": caps_json(child.compiled.loop.budget)}],
                        "asked": dict(parent.run.meta.get("asked") or {}),
                        "worktree": parent.run.meta.get("worktree")}
        parent.emit("child", run_id=cid, event={"type": "start", "loop": child.compiled.loop.name})
        async with self.pending:
            out = await self._await_child(cid, req, state)
        self._closed(cid, out.pop("settle", None) or [])
        if self.me != self.root and isinstance(parent.ledger, RemoteLedger):
            parent.ledger.absorb(out.get("ledger") or {})  # the root counted it on its mirrors already
        self._take_script_position(parent, out)
        self.summaries.append({k: out.get(k) for k in SUMMARY_KEYS})
        parent.emit("child", run_id=cid, event={"type": "end", "status": out["status"],
                                                "spent": {k: (out.get("ledger") or {}).get(k, 0)
                                                          for k in ("tokens", "cost_usd", "steps")}})
        result: dict[str, Any] = {"status": out["status"], "outputs": out.get("outputs") or {}, "run_id": cid}
        if out["status"] != "completed":
            result["error"] = out.get("error")
        if out["status"] == "waiting":
            result["waiting"] = out.get("waiting")
        return result

    async def _await_child(self, cid: str, req: dict[str, Any], state: RunState) -> dict[str, Any]:
        try:
            # No retry policy: a failed child is a result for the parent, never restarted.
            return dict(await workflow.execute_child_workflow(
                WORKFLOW, req, id=cid, task_queue=workflow.info().task_queue,
                parent_close_policy=ParentClosePolicy.REQUEST_CANCEL,
                memo={"loop": state.loop, "parent": self.me, "root": self.root}))
        except ChildWorkflowError as exc:
            ended = ABORTED if isinstance(exc.cause, TerminatedError) else FAILED
            return {**state.to_json(), "status": ended,
                    "error": {"state": state.current, "kind": "aborted" if ended == ABORTED else "internal",
                              "message": f"sub-loop {cid} ended without a result: {exc.cause or exc}"}}

    def _closed(self, cid: str, settle: list[dict[str, Any]]) -> None:
        """The root settles and closes the child's holds at once. A parent below the root
        passes the settlements on with its own (next request, or its result); whatever
        the child still holds is charged in full when this parent closes in turn."""
        if self.me == self.root:
            self.host.tree.on_closed(cid, settle)
        elif self.host.remote is not None:
            self.host.remote.settlements.extend(settle)

    def _take_script_position(self, parent: "Engine", out: Mapping[str, Any]) -> None:
        asked = (out.get("meta") or {}).get("asked")
        if not self.req.get("script") or not asked:
            return
        parent.run.meta["asked"] = dict(asked)
        provider = parent._get_provider()
        skip = getattr(provider, "skip_used", None)
        if skip is not None:
            skip(asked)


def start_child(loaded: loops.LoadedLoop, req: Mapping[str, Any], task_queue: str,
                worktree: Any) -> tuple[loops.LoadedLoop, RunState, RemoteLedger]:
    """In a child workflow: its loop (down the parent's chain of `loop:` refs), its run
    state as the parent made it, and its ledger, which asks the root."""
    child = req["child"]
    compiled, skills = loaded.compiled, dict(loaded.skills)
    for ref in child["refs"]:
        compiled, own = loops.child(compiled.loop, ref)
        skills = {**skills, **own}
    run = RunState.from_json(child["state"])
    run.meta.update(backend="temporal", task_queue=task_queue, parent=child["path"][-2]["id"] if len(child["path"]) > 1
                    else child["root"], asked=dict(child.get("asked") or {}),
                    # where a worker finds the run's files (the tool activity opens them there)
                    loop_path=req["loop_path"], script=req.get("script"), files=dict(loaded.files))
    if worktree:
        run.meta["worktree"] = worktree
    ledger = RemoteLedger(compiled.loop.budget, me=run.run_id, root=child["root"], path=child["path"],
                          name=f"sub-loop {run.run_id}")
    return replace(loaded, compiled=compiled, skills=skills), run, ledger


class HoldingModel:
    """A child's model port: before each call the root confirms the reservation (and any
    step not yet confirmed); everything else is the wrapped port's."""

    def __init__(self, inner: Any, ledger: RemoteLedger):
        self.inner, self.ledger = inner, ledger

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def complete(self, request: Any, **kwargs: Any) -> Any:
        await self.ledger.hold()  # the reservation just made, and the state's step
        return await self.inner.complete(request, **kwargs)


class ChildSignals:
    """The signal handlers of the loop workflow for budgets shared across child workflows
    (a mixin: the workflow class sets `tree` when it is a root, `remote` when a child)."""

    tree: Any = None
    remote: RemoteLedger | None = None

    @workflow.signal(name=RESERVE_SIGNAL)
    def on_reserve(self, req: dict[str, Any]) -> None:
        if self.tree is not None:
            self.tree.on_reserve(req)

    @workflow.signal(name=ANSWER_SIGNAL)
    def on_answer(self, answer: dict[str, Any]) -> None:
        if self.remote is not None:
            self.remote.on_answer(answer)
