"""How people decide for a loop workflow: a checkpoint's wait and the `decide` Update that
ends it (checked twice: by its validator, and again by its handler), and the waits after a
worker was lost mid-way (a command that is not idempotent, a tool call that is not).

A mixin of LoopWorkflow, which owns the state these read and write.
"""
from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ApplicationError

from ...runtime.actions.agent_resume import INTERRUPTED_CHOICES
from ...runtime.engine import Engine
from ...runtime.errors import StepFailure
from ...runtime.run_state import RUNNING, WAITING, RunState
from .wf_ports import WorkflowClock, activity_options, waiting_left
from .wire import DECIDE_UPDATE, PREPARE

# Runs started before decisions checked the worker's files replay without that activity.
FILES_AT_DECISION = "files-checked-at-decision"
# A timer ends a fraction after the checkpoint's timeout, so the decision window has closed.
TIMEOUT_SLACK_S = 0.05


class PeopleDecide:
    """The waits and the `decide` Update of the loop workflow."""

    run: RunState | None
    engine: Engine | None
    remote: Any
    clock: WorkflowClock
    events: list[dict[str, Any]]
    _deciding: bool
    _reload: bool
    _heartbeat_s: float

    async def _wait_for_decision(self) -> None:
        run = self.run
        assert run is not None
        left = waiting_left(run, workflow.now())
        if left is None:
            await workflow.wait_condition(lambda: run.decision is not None)
            return
        try:
            await workflow.wait_condition(lambda: run.decision is not None,
                                          timeout=timedelta(seconds=max(left, 0.0) + TIMEOUT_SLACK_S))
        except asyncio.TimeoutError:
            pass  # the rebuilt engine takes `on_timeout` (resume_waiting compares the times)

    async def ask_to_rerun(self) -> None:
        """A non-idempotent command's worker died mid-way: a person decides (approve reruns it)."""
        state = self.run.current if self.run else ""
        decision = await self._ask_after_loss("interrupted", ("approve", "reject"),
                                              f"shell state '{state}' was cut off mid-way when its worker was lost; "
                                              "approve to run it again, reject to end the run")
        if decision != "approve":
            raise StepFailure("shell_exit", "a person declined to re-run the interrupted command")

    async def ask_about_tool_call(self, name: str, call_id: str) -> str:
        """A call of a tool that is not idempotent was cut off with its worker: "rerun", "skip"
        (the model is told) or "fail", as a person chooses (an unattended loop fails)."""
        state = self.run.current if self.run else ""
        message = (f"agent '{state}': tool call {call_id} ({name}) was cut off when its worker was lost and its "
                   "tool is not idempotent; rerun it, skip it (the model is told it was interrupted) or fail")
        if self.engine is not None and self.engine.loop.unattended:
            raise StepFailure("interrupted", message)
        return await self._ask_after_loss("tool_interrupted", INTERRUPTED_CHOICES, message)

    async def _ask_after_loss(self, reason: str, choices: tuple[str, ...], message: str) -> str:
        run = self.run
        assert run is not None
        state = run.current
        run.status = WAITING
        run.waiting = {"state": state, "since": self.clock.utc_now(), "reason": reason, "timeout_s": None,
                       "choices": list(choices), "message": message}
        self.events.append({"seq": run.seq, "t": self.clock.utc_now(), "type": "waiting", "state": state,
                            "reason": reason, "message": message})
        await workflow.wait_condition(lambda: run.decision is not None)
        decision = run.decision or {}
        run.status, run.waiting, run.decision = RUNNING, None, None
        return str(decision.get("decision"))

    @workflow.update(name=DECIDE_UPDATE)
    async def decide(self, d: dict[str, Any]) -> dict[str, Any]:
        try:  # again: two decisions accepted in one activation both passed the validator
            self.check_decision(d)
        except ValueError as exc:
            raise ApplicationError(str(exc), type="DecisionRefused", non_retryable=True) from None
        run = self.run
        assert run is not None and run.waiting is not None
        if workflow.patched(FILES_AT_DECISION):
            self._deciding = True
            try:
                await self._check_files(run, d)
            finally:
                self._deciding = False
        run.decision = {"decision": d["decision"], "comment": d.get("comment", ""), "by": d.get("by") or "unknown",
                        "at": self.clock.utc_now()}
        self.events.append({"seq": run.seq, "t": run.decision["at"], "type": "decision",
                            "state": run.waiting["state"], **run.decision})
        return {"run_id": run.run_id, "state": run.waiting["state"], **run.decision}

    async def _check_files(self, run: RunState, d: dict[str, Any]) -> None:
        """The run goes on from its checkpoint on a worker's files: as `loopdsl resume` does,
        a decision is refused when they differ from the recorded hashes, unless forced (then
        the run takes the files as they are now, and an event says which changed)."""
        state = run.waiting["state"] if run.waiting else run.current
        child = self.remote is not None  # its loop comes down its parent's refs: it keeps the recorded files
        force = bool(d.get("force")) and not child
        out = await workflow.execute_activity(  # `child`: only load and hash (no worktree, no publish check)
            PREPARE, {"loop_path": run.meta["loop_path"], "script": run.meta.get("script"), "run_id": run.run_id,
                      "child": True, "fresh": True, "files": None if force else run.meta.get("files")},
            **activity_options(self._heartbeat_s, 120))
        if "error" in out:
            how = ("restore them on the worker" + ("" if child else ", or decide again with --force to go on with "
                                                        "the files as they are now")
                   if out["kind"] == "changed_files" else "fix the loop file on the worker and decide again")
            raise ApplicationError(f"{out['error']}; the decision is refused and the run still waits at "
                                   f"'{state}': {how}", type="FilesChanged", non_retryable=True)
        if run.status != WAITING or not run.waiting or run.decision is not None:
            raise ApplicationError(f"the run stopped waiting at '{state}' while its files were checked",
                                   non_retryable=True)
        recorded = run.meta.get("files") or {}
        changed = sorted(p for p in set(recorded) | set(out["files"]) if recorded.get(p) != out["files"].get(p))
        if changed:
            run.meta["files"], self._reload = out["files"], True
            self.events.append({"seq": run.seq, "t": self.clock.utc_now(), "type": "files_accepted", "state": state,
                                "files": changed, "by": d.get("by") or "unknown"})

    @decide.validator
    def check_decision(self, d: dict[str, Any]) -> None:
        """Refused here, a decision leaves no trace in the history."""
        run = self.run
        if run is None or run.status != WAITING or not run.waiting:
            raise ValueError(f"the run is not waiting for a decision (status: {run.status if run else 'starting'})")
        if run.decision is not None or self._deciding:
            if run.decision is None:
                raise ValueError("another decision is being checked against the run's files")
            raise ValueError(f"the run already has a decision: '{run.decision['decision']}' by {run.decision['by']}")
        choices = run.waiting.get("choices") or ["approve", "reject"]
        if not isinstance(d, dict) or d.get("decision") not in choices:
            raise ValueError(f"'{d.get('decision') if isinstance(d, dict) else d}' is not a choice of checkpoint "
                             f"'{run.waiting['state']}' (choices: {', '.join(choices)})")
        left = waiting_left(run, workflow.now())
        if left is not None and left < 0:
            raise ValueError(f"checkpoint '{run.waiting['state']}' timed out (timeout {run.waiting['timeout_s']:g}s); "
                             "the decision is refused and its on_timeout route is taken")
