"""Checkpoints and waiting: the part of the engine that deals with people.

A run stops (`waiting`, exit 4) when a checkpoint has no decision, when an interrupted
non-idempotent command needs a person's go-ahead, or when a sub-loop waits; `approve`,
`reject` or `decide` record a decision, and the next resume continues from here.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...language.compile import TIME_OUT, CompiledState
from ..errors import StepFailure
from .llm import render_or_fail
from ..commands import leftover_pids
from ..process_tree import CommandRef
from ...language.model import CheckpointAction, State
from ..run_state import FAILED, RUNNING, WAITING, stamp_time

if TYPE_CHECKING:
    from ..engine import Engine


class Waiting(Exception):
    """The run must stop and wait for a person."""


async def checkpoint(engine: "Engine", cs: CompiledState, ctx: dict[str, Any]) -> dict[str, Any]:
    state = cs.state
    action = state.action
    assert isinstance(action, CheckpointAction)
    if engine.run.decision is None:
        message = render_or_fail(cs.message, ctx, "rendering the checkpoint message") if cs.message else action.message
        asked = engine._monotonic()
        decision = await engine.ports.human.decide(state.name, message, action.choices)
        engine._segment_start += engine._monotonic() - asked  # time waiting for a person is not run time
        if decision is None:
            wait_for_person(engine, state, reason="checkpoint", message=message, choices=action.choices, timeout=action.timeout)
        assert decision is not None
        engine._count_asked(state.name)
        if decision.get("decision") not in action.choices:
            raise StepFailure("parse", f"decision {decision.get('decision')!r} is not one of {', '.join(action.choices)}")
        engine.run.decision = {"decision": decision["decision"], "comment": decision.get("comment", ""),
                             "by": decision.get("by") or "unknown", "at": decision.get("at") or engine.ports.clock.utc_now()}
        engine.emit("decided", state=state.name, **engine.run.decision)
    decision = engine.run.decision
    engine.run.decision = None
    return dict(decision)

def wait_for_person(engine: "Engine", state: State, *, reason: str, message: str, choices: tuple[str, ...],
                     timeout: float | None, child: str | None = None) -> None:
    engine.run.status = WAITING
    engine.run.waiting = {"state": state.name, "since": engine.ports.clock.utc_now(), "message": message,
                        "choices": list(choices), "timeout_s": timeout, "reason": reason}
    if child is not None:
        engine.run.waiting["child"] = child
    engine.emit("waiting", state=state.name, message=message, choices=list(choices), reason=reason)
    engine.commit()
    raise Waiting()


async def settle_interrupted_command(engine: "Engine", state: State, pending: dict[str, Any]) -> None:
    """Before a shell state cut off by a crash runs again: its command may still be running
    (loopdsl was killed, not the command). An idempotent one is stopped, a non-idempotent
    one needs a person's go-ahead first (and is stopped once given)."""
    ref = CommandRef.from_json(pending.get("command"))
    running = leftover_pids(ref)
    if not state.idempotent and not engine.run.meta.pop("rerun_approved", False):
        if running:
            assert ref is not None
            message = (f"shell state '{state.name}' was cut off mid-way by a crash and its command is still running "
                       f"(process group {ref.pgid}); approve to stop it and run it again, reject to end the run "
                       "and leave it running")
        else:
            message = (f"shell state '{state.name}' was cut off mid-way by a crash; "
                       "approve to run it again, reject to end the run")
        wait_for_person(engine, state, reason="interrupted", message=message, choices=("approve", "reject"),
                        timeout=None)
    await engine.commands.stop_leftover(ref, engine.emit, state=state.name, clock=engine.ports.clock)


def resume_waiting(engine: "Engine") -> bool:
    """After approve/reject/decide: continue, take on_timeout, or keep waiting."""
    run = engine.run
    waiting = run.waiting or {}
    state = engine.loop.states[waiting.get("state", run.current)]
    decision = run.decision
    timeout = waiting.get("timeout_s")
    if timeout is not None:
        since = stamp_time(waiting["since"])
        decided_at = stamp_time(decision["at"]) if decision else engine.ports.clock.now()
        if (decided_at - since).total_seconds() > timeout:
            run.status, run.waiting, run.decision = RUNNING, None, None
            engine.emit("checkpoint_timeout", state=state.name, timeout_s=timeout)
            if not engine._follow(TIME_OUT, state.on_timeout):
                engine._finish(FAILED, None, error={"state": state.name, "kind": "timeout",
                                                  "message": f"no decision within {timeout:g}s"})
            return run.status == RUNNING
    if decision is None:
        return False
    run.status, run.waiting = RUNNING, None
    if waiting.get("reason") == "interrupted":
        run.decision = None
        if decision.get("decision") != "approve":
            engine._finish(FAILED, None, error={"state": state.name, "kind": "shell_exit",
                                              "message": "a person declined to re-run the interrupted command"})
            return False
        run.meta["rerun_approved"] = True
    elif waiting.get("reason") == "child":
        # The decision belongs to the sub-loop that is waiting; its `loop:` state hands it over.
        run.decision = None
        run.meta["child_decision"] = {"child": waiting.get("child"), "decision": decision}
    engine.emit("decided", state=state.name, **{k: decision.get(k) for k in ("decision", "comment", "by", "at")})
    engine._segment_start = engine._monotonic()
    return True

