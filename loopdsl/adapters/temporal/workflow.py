"""The loop workflow: the engine of the local backend, hosted through workflow ports.

A run is one workflow (run id = workflow id). Its budget, history, results and events
live in workflow state; a checkpoint is a wait on a durable timer that an Update (`decide`,
with a validator) ends (wf_decisions.py); abort is cancellation, after a signal with its
reason. After a wait the engine is rebuilt on the
same run state, exactly as `loopdsl resume` rebuilds it from the run store; a run whose
history grows past its bound continues as new at a state's entry on that same state.
"""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from temporalio import workflow

from ...runtime.engine import Engine, MemoryResponses, Ports
from ...runtime.shell import named_cwd
from ...runtime.run_state import (ABORT_REASON_LIMIT, ABORTED, COMPLETED, FAILED, RUNNING, WAITING, RunState,
                                 aborted_error)
from . import loops
from .budget_tree import BudgetTree
from .child_runs import ChildSignals, HoldingModel, WorkflowChildRuns, start_child
from .schedules import scheduled_start
from .sealed import placeholders
from .payloads import FIELD_LIMIT, RESULT_LIMIT, cut_text, recent_events, size_of, summary_within_limit
from .wf_decisions import PeopleDecide
from .wf_git import WorkflowGit
from .wf_publish import publish_run
from .wf_tools import remote_kinds
from .wf_ports import (
    WorkflowClock,
    WorkflowHuman,
    WorkflowModel,
    WorkflowRunLog,
    WorkflowShell,
    activity_options,
    reading_run_files,
    under,
)
from .wire import (ABORT_SIGNAL, DEFAULT_HEARTBEAT_S, EVENTS_PER_QUERY, FINISH, MAX_HEARTBEAT_S, MIN_HEARTBEAT_S,
                   PREPARE, PROGRESS_QUERY, WORKFLOW)

# Events a run's history may hold before it continues as new at a state's entry: Temporal
# warns at 10,240 and terminates at 51,200; a state's own events stay far below the gap.
MAX_HISTORY_EVENTS = 10_000


def _heartbeat(value: Any) -> float:
    """The request's heartbeat, within the accepted range: a started workflow cannot refuse its input,
    and a NaN or negative one failed every workflow task of the run."""
    try:
        seconds = float(value or DEFAULT_HEARTBEAT_S)
    except (TypeError, ValueError):
        return DEFAULT_HEARTBEAT_S
    return min(max(seconds, MIN_HEARTBEAT_S), MAX_HEARTBEAT_S) if seconds == seconds else DEFAULT_HEARTBEAT_S


class AtStateBoundary(BaseException):
    """Raised by the run log at a state's entry to leave the engine and continue as new;
    a BaseException so that no `except Exception` of the engine records it as a failure."""


@workflow.defn(name=WORKFLOW)
class LoopWorkflow(ChildSignals, PeopleDecide):
    def __init__(self) -> None:
        self.run: RunState | None = None
        self.engine: Engine | None = None
        self.tree = BudgetTree(lambda: self.engine.ledger if self.engine else None)  # type: ignore[arg-type,return-value]
        self.children: WorkflowChildRuns | None = None
        self.events: list[dict[str, Any]] = []
        self.clock = WorkflowClock()
        self._base = 0  # events before this execution (kept by the ones it continues)
        self._max_events = MAX_HISTORY_EVENTS
        self._heartbeat_s = DEFAULT_HEARTBEAT_S
        self._deciding = False  # a decision's file check is under way: a second one is refused
        self._reload = False  # a forced decision took the files as they are now
        self._abort_reason: str | None = None  # `loopdsl abort --reason`, sent before its cancellation

    # ------------------------------------------------------------ the run
    @workflow.run
    async def run_loop(self, req: dict[str, Any]) -> dict[str, Any]:
        heartbeat_s = self._heartbeat_s = _heartbeat(req.get("heartbeat_s"))
        self._max_events = int(req.get("max_history_events") or MAX_HISTORY_EVENTS)
        if req.get("carried"):
            loaded, first = self._carry_on(req), {}
        else:
            started = await self._start(req, heartbeat_s)
            if started is None:
                return self.summary()
            loaded, first = started
        run = self.run
        assert run is not None
        self.children = WorkflowChildRuns(self, req)
        ports = self._ports(loaded, heartbeat_s)
        while True:
            engine = self.engine = Engine(loaded.compiled, run, ports, ledger=self.remote)
            if first:
                engine.emit("start", **first)
                first = {}
            try:
                await engine.execute()
            except AtStateBoundary:  # nothing is pending here: the run goes on in a fresh history
                # The record leaves out the per-state history (the local store rebuilds it from events).
                carried = {**run.to_json(), "history": run.history,
                           **({"remote": self.remote.carry()} if self.remote is not None else {})}
                tail = recent_events(self.events, FIELD_LIMIT * 2)  # for a follower that has not read them yet
                carry = {**req, "carried": carried, "events": tail,
                         "events_base": self._base + len(self.events) - len(tail)}
                size = size_of(carry)
                if size > RESULT_LIMIT:  # the server would refuse it, and the run would hang there
                    self._end_too_large(size)
                    break
                workflow.continue_as_new(carry)
            except asyncio.CancelledError:  # the engine recorded `aborted`; this says by whom and why
                self._abort(self._abort_reason)
                break
            except Exception:  # the engine recorded `failed` with the message
                workflow.logger.exception("run %s stopped", run.run_id)
                break
            if run.status != WAITING:
                break
            try:
                await self._wait_for_decision()
            except asyncio.CancelledError:
                self._abort(self._abort_reason)
                break
            if self._reload:  # the engine goes on with the loop as its files are now
                self._reload = False
                with reading_run_files():
                    loaded = loops.load(run.meta["loop_path"], run.meta.get("script"), run.meta["files"])
                ports = self._ports(loaded, heartbeat_s)
        if run.status == COMPLETED and run.meta.get("worktree") and not req.get("child"):
            await self._commit_worktree(run, heartbeat_s)
        if run.status == COMPLETED and self.engine is not None and not req.get("child"):
            await publish_run(self.engine, heartbeat_s, apply=req.get("publish", True) is not False)
        if self.remote is not None:  # the child's last settlements, for the root
            return {**self.summary(), "settle": self.remote.take_settlements()}
        return self.summary()

    async def _start(self, req: dict[str, Any], heartbeat_s: float) -> tuple[loops.LoadedLoop, dict[str, Any]] | None:
        """A new run: its files loaded (and a worktree made) by an activity; None if that failed."""
        prep = await workflow.execute_activity(
            PREPARE, {"loop_path": req["loop_path"], "script": req.get("script"), "run_id": workflow.info().workflow_id,
                      "timezone": req.get("timezone"), "child": bool(req.get("child")),
                      "publish": req.get("publish", True) is not False,
                      "scheduled": scheduled_start() if req.get("timezone") else None,
                      "files": None if req.get("force") else req.get("files")},
            **activity_options(heartbeat_s, 120))
        if "error" in prep:
            run = self.run = self._new_state(req, prep, req.get("loop_name", ""), req.get("start", ""))
            run.status, run.ended_at = FAILED, self.clock.utc_now()
            run.error = {"state": run.current, "kind": prep["kind"], "message": prep["error"]}
            return None
        with reading_run_files():
            loaded = loops.load(req["loop_path"], req.get("script"), prep["files"])
            if req.get("child"):  # a sub-loop or fan-out child: child_runs.py
                loaded, run, self.remote = start_child(loaded, req, workflow.info().task_queue,
                                                       req["child"].get("worktree"))
        if req.get("child"):
            self.run = run
        else:
            run = self.run = self._new_state(req, prep, loaded.compiled.loop.name, loaded.compiled.loop.start)
        if prep.get("worktree"):
            run.meta["worktree"] = prep["worktree"]
        first = {"loop": loaded.compiled.loop.name, "run_id": run.run_id, "inputs": dict(run.inputs),
                 "workdir": prep.get("host", ""), "caps": _caps(loaded.compiled.loop)}
        return loaded, first

    def _carry_on(self, req: dict[str, Any]) -> loops.LoadedLoop:
        """After continue-as-new: the run as it was committed at a state's entry, its loop
        from the files it recorded (a reply script skips the replies already used)."""
        run = self.run = RunState.from_json(req["carried"])
        self._base = int(req.get("events_base") or 0)
        self.events = list(req.get("events") or [])
        with reading_run_files():
            loaded = loops.load(run.meta["loop_path"], run.meta.get("script"), run.meta["files"])
            if req.get("child"):  # its loop down the refs again, its ledger as it was carried
                loaded, _, self.remote = start_child(loaded, req, workflow.info().task_queue,
                                                     req["child"].get("worktree"))
                self.remote.resume(run.ledger, req["carried"].get("remote") or {})
        return loaded

    def _at_commit(self, run: RunState, events: list[dict[str, Any]]) -> None:
        """At a state's entry (nothing pending, no activity, child or timer open) with the
        history past its bound or Temporal suggesting it: continue as new (TEMPORAL.md 2)."""
        if not (events and events[-1].get("type") == "enter" and run.status == RUNNING and run.pending is None):
            return
        info = workflow.info()
        if info.is_continue_as_new_suggested() or info.get_current_history_length() > self._max_events:
            raise AtStateBoundary()

    async def _commit_worktree(self, run: RunState, heartbeat_s: float) -> None:
        info = run.meta["worktree"]
        out = await workflow.execute_activity(
            FINISH, {"worktree": info, "message": f"loopdsl: {run.loop} run {run.run_id}\n\nPath: {' -> '.join(run.path)}"},
            **activity_options(heartbeat_s, 600))
        if "error" in out:
            run.status, run.error = FAILED, {"state": run.current, "kind": "workspace", "message": out["error"]}
            self.events.append({"seq": run.seq + 1, "t": self.clock.utc_now(), "type": "failed", **run.error})
            return
        info.update(kept=False, commit=out["commit"])

    def _new_state(self, req: dict[str, Any], prep: dict[str, Any], name: str, start: str) -> RunState:
        info = workflow.info()
        return RunState(run_id=info.workflow_id, loop=name, start=start, current=start, path=[start], visits={start: 1},
                        inputs=dict(req.get("inputs") or {}), started_at=self.clock.utc_now(),
                        date=_run_date(req, prep),
                        meta={"loop_path": req["loop_path"], "files": prep.get("files", {}), "backend": "temporal",
                              "task_queue": info.task_queue, "script": req.get("script")})

    def _ports(self, loaded: loops.LoadedLoop, heartbeat_s: float) -> Ports:
        scripted = None
        if loaded.script is not None:
            from ..scripted import ScriptedProvider

            scripted = ScriptedProvider.from_data(loaded.script)
            asked = self.run.meta.get("asked") if self.run else None
            if asked:  # continued as new: the replies the run already used are behind it
                scripted.skip_used(asked)
        model: Any = scripted if scripted is not None else WorkflowModel(loaded.compiled.loop, heartbeat_s)
        if self.remote is not None:
            model = HoldingModel(model, self.remote)
        root = loops.root()
        worktree = (self.run.meta.get("worktree") or {}) if self.run else {}
        workdir = root / worktree["path"] if worktree else root
        secrets, seal = loaded.compiled.loop.secrets, workflow.info().run_id  # a fresh seal per workflow run
        return Ports(provider=lambda: model, run_log=WorkflowRunLog(self._at_commit), responses=MemoryResponses(),
                     human=WorkflowHuman(scripted, self.clock), workdir=workdir, env={}, skills=loaded.skills,
                     secret_values=placeholders(secrets, seal),
                     listeners=[self.events.append], clock=self.clock,
                     shell=WorkflowShell(self, root, workdir, heartbeat_s, secrets, seal),
                     keep_events=False,
                     children=self.children, git=WorkflowGit(worktree, heartbeat_s) if worktree.get("branch") else None,
                     confine_cwd=lambda base, cwd: base / named_cwd(cwd),
                     tool_kinds=remote_kinds(self._run_arg(workdir, root), lambda t: activity_options(heartbeat_s, t),
                                             self.ask_about_tool_call))

    def _run_arg(self, workdir: Path, root: Path) -> dict[str, Any]:
        """Where a worker finds this run's loop and checkout (relative to its own root)."""
        meta = self.run.meta if self.run else {}
        return {"loop_path": meta.get("loop_path"), "script": meta.get("script"), "files": meta.get("files"),
                "workdir": under(workdir, root)}

    def _end_too_large(self, size: int) -> None:
        """The run cannot go on in a new history: what it carries (its inputs, and every state's
        results, which its templates may read) is over what one workflow input may hold."""
        run = self.run
        assert run is not None
        run.status, run.ended_at, run.pending, run.waiting = FAILED, self.clock.utc_now(), None, None
        run.error = {"state": run.current, "kind": "internal", "message": (
            f"the run's state ({size:,} bytes: its inputs and every state's results so far) is more than a Temporal "
            f"workflow can carry into a new history ({RESULT_LIMIT:,} bytes); run this loop on the local backend, "
            "or keep what its states print smaller")}

    def _abort(self, reason: str | None) -> None:
        """End the run `aborted`: with `loopdsl abort`'s reason when it sent one (None: cancelled
        some other way, such as Temporal's own tools)."""
        run = self.run
        assert run is not None
        run.status, run.ended_at, run.pending, run.waiting = ABORTED, self.clock.utc_now(), None, None
        run.error = (aborted_error(run.current, reason) if reason is not None else
                     {"state": run.current, "kind": "aborted", "message": "the run's workflow was cancelled"})

    @workflow.signal(name=ABORT_SIGNAL)
    def abort_requested(self, arg: Any) -> None:
        reason = arg.get("reason") if isinstance(arg, dict) else None  # a hostile sender's value, kept as text
        self._abort_reason = str(reason)[:ABORT_REASON_LIMIT] if reason is not None else ""

    # ------------------------------------------------------------ reading and deciding
    def summary(self) -> dict[str, Any]:
        run = self.run
        return {} if run is None else summary_within_limit(run.to_json())

    @workflow.query(name=PROGRESS_QUERY)
    def progress(self, since: int = 0) -> dict[str, Any]:
        """The run as it stands, and its events after `since` (at most EVENTS_PER_QUERY)."""
        run = self.summary()
        since = max(since - self._base, 0)
        room = 2 * RESULT_LIMIT - size_of(run)  # a query's answer stays under gRPC's 4 MB
        tail: list[dict[str, Any]] = []
        for event in self.events[since:since + EVENTS_PER_QUERY]:
            event, _ = cut_text(event)
            room -= size_of(event)
            if tail and room < 0:
                break  # the rest comes with the next query
            tail.append(event)
        return {"run": run, "events": tail, "next": self._base + since + len(tail),
                "children": self.children.summaries if self.children and not since else []}



def _run_date(req: dict[str, Any], prep: dict[str, Any]) -> str:
    """`run.date`: given by the client, or (a scheduled start) the worker's today in the
    schedule's time zone, read by the `prepare` activity (zone data is not workflow code's)."""
    return str(req.get("date") or prep.get("date") or workflow.now().date().isoformat())


def _caps(loop: Any) -> dict[str, Any]:
    return {"tokens": loop.budget.tokens, "cost_usd": loop.budget.cost_usd, "steps": loop.budget.steps}


__all__ = ["LoopWorkflow"]
