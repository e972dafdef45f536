"""A resumed agent attempt meets a tool call it recorded before a crash.

Each call is recorded `started` (with its arguments' hash) before it runs and `done` (with
the same hash and what the model saw) after. On resume the call comes again from the
stored model reply: it must be the call that was recorded, else the store was changed or
the conversation is rebuilt differently, and the run fails rather than guess. A call
started but never finished has what is left of its process stopped, then reruns if its
tool is idempotent, counts as done (an edit_file whose file has the recorded post-edit
hash), or waits for a person (`rerun|skip|fail`; an unattended loop fails `interrupted`).
"""
from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

from ...language import bounded_json
from ..errors import StepFailure
from ..process_tree import CommandRef
from .checkpoint import wait_for_person

if TYPE_CHECKING:
    from .agent import AgentAttempt

INTERRUPTED_CHOICES = ("rerun", "skip", "fail")


def args_hash(call: dict[str, Any]) -> str:
    """The hash of a call's arguments as the model sent them, kept with its start and result."""
    return hashlib.sha256(str(call.get("arguments")).encode()).hexdigest()


async def same_call(attempt: "AgentAttempt", stored: dict[str, Any], call: dict[str, Any]) -> None:
    """A record of this call id from before a crash: what is left of a cut-off call is
    stopped first, then the stored reply's call must hash as the recorded one. If not,
    running it again or skipping it would both act on a guess: the run fails (neither
    retried nor routed by `on_failure`), saying so."""
    cut_off = stored.get("status") != "done"
    if cut_off:
        ref = CommandRef.from_json(stored.get("process"))
        await attempt.engine.commands.stop_leftover(ref, attempt.engine.emit, state=attempt.state.name)
    recorded, now = stored.get("args_hash"), args_hash(call)
    if recorded is None or recorded == now:
        return  # None: a result stored before results kept the hash (started records always had it)
    what = "was cut off by a crash" if cut_off else "finished before the crash"
    raise StepFailure(
        "interrupted",
        f"agent '{attempt.state.name}': tool call {call['id']} ({call.get('name')}) {what}, but the stored "
        f"reply now asks for it with other arguments (hash {str(recorded)[:12]} recorded, {now[:12]} now): the "
        "run store was changed, or this loopdsl rebuilds the conversation differently. Neither running it "
        "again nor skipping it is safe, so the run fails; check the workspace and start a new run",
        result=attempt.result("error"), fatal=True)


async def cut_off(attempt: "AgentAttempt", stored: dict[str, Any], name: str, call: dict[str, Any]) -> str:
    """A call started before a crash and never finished (what was left of it is already
    stopped, `same_call`): "rerun" it (idempotent, or a person said so), "skip" it, or take
    it as "done" (an edit_file whose file already has the hash recorded when it started)."""
    if attempt.specs[name].idempotent:
        return "rerun"
    edit_done = getattr(attempt.boxes[name], "edit_done", None) if stored.get("edit_sha256") else None
    path = call_path(call)
    if edit_done is not None and path is not None and edit_done(path, stored["edit_sha256"]):
        return "done"
    engine, state = attempt.engine, attempt.state
    decision = engine.run.decision
    if decision is not None and decision.get("decision") in INTERRUPTED_CHOICES:
        engine.run.decision = None
        if decision["decision"] == "fail":
            raise StepFailure("interrupted", f"a person chose to fail after tool call {call['id']} ({name}) "
                              "was cut off", result=attempt.result("error"))
        return str(decision["decision"])
    message = (f"agent '{state.name}': tool call {call['id']} ({name}) was cut off by a crash and "
               "its tool is not idempotent; rerun it, skip it (the model is told it was interrupted) or fail")
    if engine.loop.unattended:
        raise StepFailure("interrupted", message, result=attempt.result("error"))
    wait_for_person(engine, state, reason="tool_interrupted", message=message,
                    choices=INTERRUPTED_CHOICES, timeout=None)
    raise AssertionError("unreachable")  # wait_for_person raises Waiting


def call_path(call: dict[str, Any]) -> str | None:
    raw = call.get("arguments")
    try:
        args = bounded_json.loads(raw if isinstance(raw, str) else json.dumps(raw))
    except (ValueError, bounded_json.JsonLimitError):
        return None
    path = args.get("path") if isinstance(args, dict) else None
    return path if isinstance(path, str) else None
