"""Durable runs: create, resume, decide and abort runs kept in the run store.

Each operation holds the run's lock for as long as it advances the run, so two
processes can never advance one run; the lock's heartbeat keeps it while a long
call is in flight and lets it expire soon after a killed holder.
"""
from __future__ import annotations

import asyncio
import contextlib
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from .runs import (LoopFileChildren, RunResult, UsageError, load, load_script, loop_files, make_ports, new_run_state,
                   open_store, ready_to_call_models, uses_model_client)
from .changed_files import changed_files, diff_summary
from .run_environment import secret_values
from ..language.compile import CompiledLoop, compile_loop
from ..language.files import is_file, read_capped
from ..runtime.engine import Engine, utc_now
from ..adapters.otel import traced
from ..runtime.notify import notify_engine, notify_run
from ..runtime.publish_apply import publish_pending
from .publishing import publish_engine
from ..runtime.redaction import Redactor, without_own_credentials
from ..runtime.sealed_inputs import new_seal, unseal_inputs
from ..adapters.webhook import WebhookNotifier
from ..adapters.coding_cli_home import sweep_dead_makers_homes
from ..runtime.run_state import (ABORT_REASON_LIMIT, ABORTED, COMPLETED, FAILED, RUNNING, WAITING, RunState,
                                 aborted_error, history_from_events, stamp_time)
from ..adapters.store.ports import StoreResponses, StoreRunLog, stored_record
from ..adapters.store.run_store import RunChanged, RunLock, RunStore
from ..adapters.git_workspace import GitWorkspace
from ..adapters.git_worktree import (
    SecretInCommit,
    WorkspaceError,
    Worktree,
    create_worktree,
    find_repo_root,
    finish_worktree,
    open_worktree,
)

GROUP_WAIT_POLL_S = 2.0
# How long `approve`/`reject`/`decide` wait for another process's hold on the run's lock.
DECIDE_LOCK_WAIT_S = 3.0


class RunConflict(Exception):
    """Another run of the same concurrency group is active and the loop says skip or fail."""

    def __init__(self, message: str, skipped: bool):
        super().__init__(message)
        self.message = message
        self.skipped = skipped


class _KeepWaiting(Exception):
    pass


def _respect_group(compiled: CompiledLoop, store: RunStore) -> None:
    """Return when no other run of the group is active; else raise RunConflict or _KeepWaiting."""
    conc = compiled.loop.concurrency
    if conc is None:
        return
    active = store.active_runs(conc.group)
    if not active:
        return
    others = ", ".join(active)
    if conc.on_conflict == "skip":
        raise RunConflict(f"skipped: run(s) {others} of group '{conc.group}' still active", skipped=True)
    if conc.on_conflict == "fail":
        raise RunConflict(f"run(s) {others} of group '{conc.group}' still active", skipped=False)
    raise _KeepWaiting()


def _source_text(compiled: CompiledLoop) -> str:
    source = compiled.loop.source
    try:
        return read_capped(source).decode("utf-8") if source else ""
    except OSError:
        return ""


def _prepare_workspace(compiled: CompiledLoop, state: RunState, store: RunStore, workdir: Path) -> Path:
    loop = compiled.loop
    if not loop.workspace.worktree:
        return workdir
    repo = find_repo_root(workdir)
    if repo is None:
        raise UsageError(
            f"loop '{loop.name}' runs in a git worktree (workspace.worktree: true) but {workdir} is not in a git repository",
            "run it from inside the repository it works on, or set workspace.worktree: false",
        )
    wt = create_worktree(repo, store.worktrees_dir, state.run_id, loop.workspace.base)
    state.meta["worktree"] = {"path": str(wt.path), "branch": wt.branch, "repo": str(wt.repo),
                              "base_commit": wt.base_commit, "kept": True}
    return wt.path


def _finish_workspace(state: RunState, engine: Engine) -> None:
    info = state.meta.get("worktree")
    if not info or not info.get("kept"):
        return
    wt = Worktree(repo=Path(info["repo"]), path=Path(info["path"]), branch=info["branch"], base_commit=info["base_commit"])
    if state.status == COMPLETED:
        try:
            sha = finish_worktree(wt, f"loopdsl: {state.loop} run {state.run_id}\n\nPath: {' -> '.join(state.path)}",
                                  engine.redact.values)
        except SecretInCommit as exc:  # the run did its work, but its result cannot be kept as it is
            error = {"state": state.current, "kind": "workspace", "message": f"{exc.message}; {exc.hint}"}
            state.status, state.error = FAILED, error
            engine.emit("failed", **error)
            engine.emit("end", status=FAILED, state=state.current, outputs=state.outputs, spent=engine.ledger.spent())
            engine.commit()
            return
        info.update(kept=False, commit=sha)
    engine.ports.run_log.commit(state, [])


async def _execute(compiled: CompiledLoop, state: RunState, store: RunStore, lock: RunLock, *, workdir: Path,
                   script: Any, provider: Any, human: Any, cache: bool,
                   listeners: Iterable[Callable[[dict[str, Any]], None]],
                   first: list[dict[str, Any]] | None = None, real_waits: bool = True,
                   tool_stubs: Mapping[str, Any] | None = None,
                   notify: bool = True, publish: bool = True) -> RunResult:
    secrets = secret_values(compiled.loop)
    state.inputs = unseal_inputs(state.inputs, secrets, state.meta.get("seal"))  # as recorded: sealed
    ports = make_ports(compiled.loop, script=script, provider=provider, human=human, workdir=workdir,
                       listeners=listeners, run_log=StoreRunLog(store, state.run_id, lock, secrets),
                       responses=StoreResponses(store, lock), use_cache=cache, asked=state.meta.get("asked"),
                       real_waits=real_waits, tool_stubs=tool_stubs,
                       notify=notify)
    ports.children = LoopFileChildren(state.meta.get("files") or {})
    info = state.meta.get("worktree")
    if info and info.get("kept"):
        ports.git = GitWorkspace(Path(info["repo"]), Path(info["path"]), info["branch"])
    engine = Engine(compiled, state, ports)
    with traced(engine, resumed=bool(first) and first[0].get("type") == "resume"):
        for event in first or ():
            engine.emit(event.pop("type"), **event)
        try:
            if not state.is_final:  # a completed run resumed only to finish its `publish:`
                await engine.execute()
        except BaseException:  # recorded as failed, or aborted (Ctrl-C): say so, then let it out
            with contextlib.suppress(Exception):  # the run's own error matters more than a failed notice of it
                notify_engine(engine, store.directory)
            raise
        _finish_workspace(state, engine)
        try:
            publish_engine(engine, publish)
        finally:  # a failed publish is told too: the run completed, its writes did not
            notify_engine(engine, store.directory)
    return RunResult(state, engine.events, store.directory)


async def run_durable(compiled: CompiledLoop, values: Mapping[str, Any], *, script: Any, provider: Any, human: Any,
                      store: RunStore, workdir: Path, cache: bool,
                      listeners: Iterable[Callable[[dict[str, Any]], None]], real_waits: bool = True,
                      tool_stubs: Mapping[str, Any] | None = None,
                      notify: bool = True, publish: bool = True) -> RunResult:
    loop = compiled.loop  # its reply script, if any, was read and checked before (runs.load_script)
    run_id = store.new_run_id()
    meta = {
        # Absolute: a resume from another folder must find this file, not a namesake there.
        "loop_path": str(loop.source.resolve()) if loop.source else "",
        "files": loop_files(loop),
        "loop_text": _source_text(compiled),
        "workdir": str(workdir),
        "group": loop.concurrency.group if loop.concurrency else None,
        "script": str(Path(script).resolve()) if script else None,
        "seal": new_seal(),  # of the secrets given as inputs (runtime/sealed_inputs.py)
    }
    if loop.publish is not None:  # due from the start: a run killed right at its end still publishes
        meta["publish"] = {"status": "due", "items": []}
    state = new_run_state(loop, run_id, values, meta)
    with store.lock(run_id) as lock:
        record = stored_record(state, secret_values(loop))
        if loop.concurrency is not None:
            # Check-and-create under the group's lock: two runs starting together cannot both get in.
            while True:
                with store.lock(f"group-{loop.concurrency.group}", wait=30.0):
                    try:
                        _respect_group(compiled, store)
                    except _KeepWaiting:
                        pass
                    else:
                        store.create_run(run_id, record, lock=lock)
                        break
                await asyncio.sleep(GROUP_WAIT_POLL_S)
        else:
            store.create_run(run_id, record, lock=lock)
        try:
            run_dir = _prepare_workspace(compiled, state, store, workdir)
        except WorkspaceError as exc:
            state.status, state.error, state.ended_at = "failed", {"kind": "workspace", "message": exc.message}, utc_now()
            StoreRunLog(store, run_id, lock).commit(state, [{"seq": 1, "t": utc_now(), "type": "end", "status": "failed"}])
            raise UsageError(exc.message, exc.hint) from None
        started = {"type": "start", "loop": loop.name, "run_id": run_id, "inputs": dict(values), "workdir": str(run_dir),
                   "caps": budget_caps(loop)}
        return await _execute(compiled, state, store, lock, workdir=run_dir, script=script, provider=provider,
                              human=human, cache=cache, listeners=listeners, first=[started], real_waits=real_waits,
                              tool_stubs=tool_stubs, notify=notify, publish=publish)


def budget_caps(loop: Any) -> dict[str, Any]:
    """The caps a person watching a run sees beside its spending (None: uncapped)."""
    return {"tokens": loop.budget.tokens, "cost_usd": loop.budget.cost_usd, "steps": loop.budget.steps}


async def resume_durable(run_ref: str, *, store: str | Path | RunStore | None = None, script: Any = None,
                         provider: Any = None, human: Any = None, force: bool = False, cache: bool = False,
                         listeners: Iterable[Callable[[dict[str, Any]], None]] = (),
                         publish: bool = True) -> RunResult:
    """Continue a run; `publish=False` plans a completed end's `publish:` writes and makes none
    (a job without a write token: a later `resume` makes them)."""
    store = open_store(store, Path.cwd(), create=False)
    run_id = store.resolve(run_ref)
    with store.lock(run_id) as lock:
        state = RunState.from_json(store.load_run(run_id))
        if state.is_final and not (state.status == COMPLETED and publish_pending(state)):
            raise UsageError(f"run {run_id} already ended with status {state.status}", "`loopdsl show " + run_id + "` shows it")
        state.history = history_from_events(store.events(run_id))
        if (state.pending or {}).get("kind") == "cli":  # a kill cut a CLI attempt off: its home stayed
            sweep_dead_makers_homes()
        if not state.meta.get("loop_path"):
            raise UsageError(f"run {run_id} records no loop file to resume it from",
                             "a sub-loop's run resumes with its parent's: `loopdsl resume PARENT_RUN_ID`")
        if not is_file(Path(state.meta["loop_path"])):  # no --force can help: there is no loop to go on with
            raise UsageError(f"run {run_id}'s loop file {state.meta['loop_path']} is gone (moved or deleted)",
                             f"put it back at that path to resume the run, or `loopdsl abort {run_id}` to end it")
        changed = changed_files(state)
        if changed and not force:
            raise UsageError(diff_summary(state, changed), "resume with --force to continue against the changed files")
        compiled = compile_loop(load(state.meta["loop_path"]))
        _check_states_known(state, compiled)
        if changed:  # forced: the files as they are now are the run's (its sub-loops are checked against them)
            state.meta["files"] = loop_files(compiled.loop)
        workdir = Path(state.meta.get("workdir") or Path.cwd())
        info = state.meta.get("worktree")
        if info and not state.is_final:  # a completed run's work is committed, its worktree gone
            wt = open_worktree(Path(info["repo"]), store.worktrees_dir, run_id)
            if wt is None:
                raise UsageError(f"the worktree of run {run_id} ({info['path']}) is gone", "abort the run: `loopdsl abort " + run_id + "`")
            workdir = wt.path
        if state.is_final:  # only its `publish:` is left: no model is called, no reply script read
            script = None
        elif script is None and state.meta.get("script"):
            script = state.meta["script"]  # checked against the loop when the run started
        elif script is not None:
            load_script(compiled.loop, script)  # one given now: checked as a run's start checks it
        listeners = list(listeners)
        if uses_model_client(script, provider) and not state.is_final:
            await ready_to_call_models(compiled.loop, listeners)
        first = [{"type": "resume", "from_state": state.current, "status": state.status, "forced": bool(changed),
                  "caps": budget_caps(compiled.loop), "spent": {k: state.ledger.get(k, 0) for k in ("tokens", "cost_usd", "steps")}}]
        return await _execute(compiled, state, store, lock, workdir=workdir, script=script, provider=provider,
                              human=human, cache=cache, listeners=listeners, first=first, publish=publish)


def _check_states_known(state: RunState, compiled: CompiledLoop) -> None:
    """The states a stored record says the run is at must be the loop's (the record is hostile:
    edited, or written against another loop file with the same hash)."""
    named = [state.current, *([state.waiting["state"]] if state.waiting else [])]
    unknown = [name for name in named if name not in compiled.states]
    if unknown:
        raise UsageError(f"run {state.run_id} is at state {unknown[0][:60]!r}, which {state.meta['loop_path']} does "
                         "not have: its record does not match the loop file",
                         f"abort the run (`loopdsl abort {state.run_id}`) and start it again")


def decide(run_ref: str, choice: str, comment: str = "", *, store: str | Path | RunStore | None = None,
           by: str | None = None) -> RunState:
    """Record a person's decision on a waiting run (approve, reject or a custom choice)."""
    from ..adapters.humans import decision

    store = open_store(store, Path.cwd(), create=False)
    run_id = store.resolve(run_ref)
    # Waits for a concurrent decision's short hold on the lock, then sees it was decided.
    with store.lock(run_id, wait=DECIDE_LOCK_WAIT_S) as lock:
        state = RunState.from_json(store.load_run(run_id))
        if state.decision is not None and state.status == WAITING:
            raise _decided_already(run_id, state.decision)
        if state.status != WAITING or not state.waiting:
            raise UsageError(f"run {run_id} is not waiting for a decision (status: {state.status})")
        waiting = state.waiting
        choices = waiting.get("choices") or ["approve", "reject"]
        if choice not in choices:
            raise UsageError(f"'{choice}' is not a choice of checkpoint '{waiting['state']}'",
                             f"choices: {', '.join(choices)}" + ("; use `loopdsl decide RUN CHOICE`" if choice in ("approve", "reject") else ""))
        timeout = waiting.get("timeout_s")
        if timeout is not None:
            waited = (datetime.now(timezone.utc) - stamp_time(waiting["since"])).total_seconds()
            if waited > timeout:
                raise UsageError(
                    f"checkpoint '{waiting['state']}' timed out ({waited:.0f}s waited, timeout {timeout:g}s); the decision is refused",
                    f"`loopdsl resume {run_id}` takes its on_timeout route",
                )
        # A person may paste a credential in a comment; this process read no loop's secrets, but
        # knows the credentials of its own environment (a CI job's token, a provider key).
        comment = without_own_credentials(comment)
        state.decision = decision(choice, comment, by=by)
        state.seq += 1
        event = {"seq": state.seq, "t": utc_now(), "type": "decision", "state": waiting["state"], **state.decision}
        StoreRunLog(store, run_id, lock).commit(state, [event], expect=_undecided(run_id, state.waiting))
        return state


def _decided_already(run_id: str, decision: Mapping[str, Any]) -> RunChanged:
    return RunChanged(
        f"run {run_id} already has a decision: '{decision.get('decision')}' by {decision.get('by')} at "
        f"{decision.get('at')}; this one was not recorded",
        f"`loopdsl resume {run_id}` acts on the recorded decision; `loopdsl show {run_id}` shows it",
    )


def _undecided(run_id: str, waiting: Mapping[str, Any]) -> Callable[[dict[str, Any]], None]:
    """The compare of the decision's compare-and-set: the run still waits at the same
    checkpoint with no decision (checked in the commit's own transaction)."""

    def check(current: dict[str, Any]) -> None:
        if current.get("decision"):
            raise _decided_already(run_id, current["decision"])
        if current.get("status") != WAITING or current.get("waiting") != waiting:
            raise RunChanged(f"run {run_id} moved on while the decision was being recorded "
                             f"(status: {current.get('status')}); it was not recorded",
                             f"`loopdsl show {run_id}` shows where the run is now")

    return check


def abort(run_ref: str, *, store: str | Path | RunStore | None = None, reason: str = "") -> RunState:
    store = open_store(store, Path.cwd(), create=False)
    run_id = store.resolve(run_ref)
    with store.lock(run_id) as lock:
        state = RunState.from_json(store.load_run(run_id))
        if state.is_final:
            raise UsageError(f"run {run_id} already ended with status {state.status}")
        # As a decision's comment: a credential of this process's environment never reaches the store.
        reason = without_own_credentials(reason)[:ABORT_REASON_LIMIT]
        state.status, state.ended_at, state.pending = ABORTED, utc_now(), None
        state.error = aborted_error(state.current, reason)
        state.seq += 1
        event = {"seq": state.seq, "t": utc_now(), "type": "end", "status": ABORTED, "reason": reason}
        StoreRunLog(store, run_id, lock).commit(state, [event])
        _notify_aborted(state, store, lock)
        return state


def _notify_aborted(state: RunState, store: RunStore, lock: RunLock) -> None:
    """`notify:` for a run aborted from outside: no engine runs it, so the loop is read again."""
    try:
        loop = load(state.meta["loop_path"])
    except Exception:  # a loop file gone or broken since the run started: its `notify:` is unknown
        return
    if not loop.notify:
        return
    secrets = secret_values(loop)
    redactor = Redactor(secrets.values())
    events: list[dict[str, Any]] = []

    def emit(type_: str, **data: Any) -> None:
        state.seq += 1
        event = redactor.redact_obj({"seq": state.seq, "t": utc_now(), "type": type_, **data})
        if isinstance(event.get("message"), str):
            event["message"] = redactor.error(event["message"])
        events.append(event)

    if notify_run(loop, state, WebhookNotifier(), secret_values=secrets, redact=redactor, emit=emit,
                  store_dir=str(store.directory)):
        StoreRunLog(store, state.run_id, lock).commit(state, events)


__all__ = ["run_durable", "resume_durable", "decide", "abort", "RunConflict", "RUNNING"]
