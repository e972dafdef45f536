"""`loop:` states: run another loop file as a child, or one child per item (fan-out).

A child sees only its `with` inputs (checked against its `inputs`), its own states
and the secrets it declares. It spends from a ledger nested in the parent's, so its
caps are the smaller of its own and what the parent has left, and reservations of
concurrent children are checked against the parent atomically (no awaits inside).
"""
from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable, Mapping

from ..budget import BudgetExceeded, Ledger
from ...language.inputs import InputError, coerce_inputs
from ..errors import StepFailure
from ...language.model import ERROR_KINDS, LoopAction
from ..run_state import BUDGET_EXHAUSTED, COMPLETED, FAILED, WAITING, RunState, history_from_events
from ...language.templates import Expression, RenderError
from ..ports import ChildLoop, ItemWorktree, Ports, call_port
from ...language.agent_model import AgentAction, WRITING_BUILTINS
from ...language.errors import LoopdslError
from .checkpoint import wait_for_person

if TYPE_CHECKING:
    from ...language.compile import CompiledState
    from ..engine import Engine


class ChildRunLog:
    """A child's commits: into the parent's run store (when it has one) under the child's
    own record, each followed by a commit of the parent, whose budget figures include the
    child's spending. (Paid responses need no such port: a child uses its parent's
    response store, keyed by the child's run id, so a child re-run after a crash replays
    its completed calls instead of paying again.)"""

    def __init__(self, parent: Any, store_id: str, parent_run_id: str, commit_parent: Callable[[], None],
                 redact: Callable[[Any], Any]):
        self.redact = redact  # the child's inputs may hold a value its parent got from a secret
        self.store = getattr(parent, "store", None)
        self.durable = True  # the engine calls commit at every commit point; a storeless one is a no-op
        self.store_id = store_id
        self.parent_run_id = parent_run_id
        self.commit_parent = commit_parent
        # The parent's run lock fences the child's commits too.
        self.lock = getattr(parent, "lock", None)
        self.created = False

    def load(self) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
        """The child's committed record and events, when an earlier process started it."""
        if self.store is None:
            return None
        from ..errors import StoreError

        try:
            return self.store.load_run(self.store_id), self.store.events(self.store_id)
        except StoreError:
            return None

    def commit(self, run: RunState, events: list[dict[str, Any]]) -> None:
        if self.store is None:
            return
        record = self.redact(run.to_json())
        record["parent"] = self.parent_run_id
        if not self.created and self.load() is None:  # the first commit of this child
            self.store.create_run(self.store_id, record, lock=self.lock)
        self.created = True
        self.store.commit(self.store_id, record, events, lock=self.lock)
        self.commit_parent()


def _render_with(cs: "CompiledState", ctx: Mapping[str, Any]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name, template in cs.with_values.items():
        if isinstance(template, Expression):
            values[name] = template(ctx)
        elif hasattr(template, "render"):
            values[name] = template.render(ctx)
        else:
            values[name] = template
    return values


async def run_child_state(parent: "Engine", cs: "CompiledState", ctx: dict[str, Any],
                          attempt: int = 1) -> dict[str, Any]:
    action = cs.state.action
    assert isinstance(action, LoopAction)
    children = parent.ports.children
    if children is None:  # a wiring mistake of the code that built the engine, not of a loop file
        raise RuntimeError("this engine has no child-run port (Ports.children): the API provides one")
    child = children.open(parent.loop, action.path)
    items = _items(cs, ctx)
    concurrent = cs.for_each is not None and action.concurrency > 1 and len(items) > 1
    problem = child_workspace_problem(parent, child, action.path, concurrent=concurrent)
    if problem is not None:  # the loops' setup is wrong: retrying or routing cannot help
        raise StepFailure("parse", problem, fatal=True)
    limit = asyncio.Semaphore(max(1, action.concurrency))
    visit = parent.run.visits.get(cs.state.name, 1)
    # Each attempt of the state (its `retry:`) runs children of its own: an attempt after a
    # failed child runs it again instead of reading back the failed record.
    label = cs.state.name + (f"@{visit}@{attempt}" if attempt > 1 else f"@{visit}" if visit > 1 else "")
    # Display ids nest under the parent (`<parent>/<state>[/<index>]`); store keys use '.'.
    base_id = f"{parent.run.run_id}/{label}"
    shared = _shared_child_ports(parent, child)
    # Concurrent items that write: each in a worktree of its own (checked above: there is a git port).
    own = await _item_worktrees(parent, label, len(items)) if concurrent and writing_agents(child) else None

    async def one(index: int, item: Any) -> dict[str, Any]:
        if cs.for_each is None:
            return await _run_child(parent, cs, child, shared, base_id, dict(ctx), {}, limit)
        scope = dict(ctx, item=item, index=index)
        return await _run_child(parent, cs, child, shared, f"{base_id}/{index}", scope, {"item": item, "index": index},
                                limit, own[index] if own else None)

    results = await asyncio.gather(*(one(i, item) for i, item in enumerate(items)))
    if own:
        await _finish_items(parent, label, own, results)
    _wait_if_a_child_waits(parent, cs, results)
    if cs.for_each is None:
        return _one_child_result(action, results[0])
    return _fan_out_result(cs, action, results)


def child_workspace_problem(parent: "Engine", child: ChildLoop, ref: str, *, concurrent: bool) -> str | None:
    """Why a child loop may not run in its caller's workspace, or None.

    A child runs in its caller's workspace. One that declares `workspace: {worktree: true}`
    expects a run branch to write on: under a caller without a worktree that would be a
    person's checkout, so it is refused. Children of a `for_each` running concurrently
    whose agents hold writing tools or coding-agent CLIs each get a worktree of their own
    (adapters/git_workspace.py), made from the caller's: a caller without one is refused."""
    loop = child.compiled.loop
    if loop.workspace.worktree and not (parent.loop.workspace.worktree or parent.ports.git is not None):
        return (f"the sub-loop {ref} declares `workspace: {{worktree: true}}` but loop '{parent.loop.name}' runs "
                "without a worktree, so the child would write into a person's checkout; set "
                "`workspace: {worktree: true}` on the calling loop")
    writers = writing_agents(child) if concurrent else []
    if writers and parent.ports.git is None:
        return (f"the sub-loop {ref} has agent '{writers[0]}' with writing tools or a coding-agent CLI, and "
                f"for_each runs its children concurrently: each needs a worktree of its own, made from the "
                f"caller's, but loop '{parent.loop.name}' runs without a worktree; set "
                "`workspace: {worktree: true}` on the calling loop, or `concurrency: 1`")
    return None


def writing_agents(child: ChildLoop) -> list[str]:
    """The child's agent states that can change files: writing built-in tools or a CLI."""
    return [s.name for s in child.compiled.loop.states.values() if isinstance(s.action, AgentAction)
            and (s.action.cli is not None or any(u.name in WRITING_BUILTINS for u in s.action.tools))]


async def _item_worktrees(parent: "Engine", label: str, count: int) -> list[ItemWorktree]:
    git = parent.ports.git
    assert git is not None  # child_workspace_problem refused a fan-out of writers without one
    try:
        return list(await call_port(git.item_worktrees, label, count))
    except LoopdslError as exc:  # a branch or directory in the way: the run cannot go on safely
        raise StepFailure("workspace", f"making the worktrees of '{label}' items: {exc.message}"
                          + (f"; {exc.hint}" if exc.hint else ""), fatal=True) from None


async def _finish_items(parent: "Engine", label: str, own: list[ItemWorktree], results: list[dict[str, Any]]) -> None:
    """Each item's worktree ends like a run's: committed on its branch and removed when the
    item completed, kept otherwise (and while it waits for a person, untouched)."""
    for index, (item, result) in enumerate(zip(own, results)):
        if result["status"] == WAITING:
            continue
        message = f"loopdsl: {parent.run.loop} run {parent.run.run_id}, item {index} of '{label}'"
        info = await asyncio.to_thread(item.finish, result["status"] == COMPLETED, message, parent.redact.values)
        if info.get("error"):  # its changes hold a secret: not committed, the item failed
            result.update(status=FAILED, error={"kind": "workspace", "message": info.pop("error")})
        result["workspace"] = info


def _items(cs: "CompiledState", ctx: Mapping[str, Any]) -> list[Any]:
    if cs.for_each is None:
        return [None]
    try:
        items = cs.for_each(ctx)
    except (RenderError, TypeError) as exc:
        raise StepFailure("parse", f"for_each of '{cs.state.name}': {exc}") from None
    if not isinstance(items, (list, tuple)):  # a string would fan out one child per character
        raise StepFailure("parse", f"for_each of '{cs.state.name}' is {_a(type(items).__name__)}, not a list: "
                                   "make it one (e.g. `changed.stdout.splitlines()`, `[inputs.path]`)")
    return list(items)


def _a(kind: str) -> str:
    names = {"str": "a string", "dict": "a mapping", "int": "a number", "float": "a number", "NoneType": "nothing",
             "bool": "a boolean"}
    return names.get(kind, f"a {kind}")


async def _run_child(parent: "Engine", cs: "CompiledState", child: ChildLoop, shared: Ports, run_id: str,
                     scope: dict[str, Any], meta: dict[str, Any], limit: asyncio.Semaphore,
                     own: ItemWorktree | None = None) -> dict[str, Any]:
    from ..engine import Engine
    from ..run_keys import child_run_id

    run_log = ChildRunLog(parent.ports.run_log, child_run_id(run_id), parent.run.run_id, parent.commit,
                          parent.redact.redact_obj)
    state = _child_state(parent, cs, child, run_log, run_id, scope, meta)
    if isinstance(state, dict):  # finished before a crash, or its inputs do not fit: not run
        return state
    if own is not None and own.path is None:  # its worktree was finished, yet the child never ended
        return {"status": FAILED, "outputs": {}, "run_id": run_id, "error": {
            "kind": "workspace", "message": f"the worktree of {run_id} was finished before the child ended; "
            f"its branch {own.branch} holds what it did: start a new run"}}
    loop = child.compiled.loop
    async with limit:
        elsewhere = getattr(parent.ports.children, "run", None)  # a host that runs children apart (Temporal)
        if elsewhere is not None:
            action = cs.state.action
            assert isinstance(action, LoopAction)
            hosted = await elsewhere(parent, action.path, child, state, action.concurrency if cs.for_each else 1)
            if hosted is not None:
                return dict(hosted)
        name = f"sub-loop {run_id}"
        ledger = (Ledger.from_json(loop.budget, state.ledger, parent=parent.ledger, name=name) if state.ledger
                  else parent.ledger.child(loop.budget, name=name))
        ports = replace(shared, run_log=run_log, env=dict(shared.env), listeners=[_forward_to(parent, run_id)])
        if own is not None:  # a concurrent item that writes: its own worktree and branch
            ports = replace(ports, workdir=own.path, git=own.git)
        engine = Engine(child.compiled, state, ports, ledger=ledger, parent=parent)
        await engine.execute()
    out: dict[str, Any] = {"status": state.status, "outputs": state.outputs, "run_id": run_id}
    if state.status != COMPLETED:
        out["error"] = state.error
    if state.status == WAITING:
        out["waiting"] = state.waiting
    return out


def _child_state(parent: "Engine", cs: "CompiledState", child: ChildLoop, run_log: ChildRunLog, run_id: str,
                 scope: Mapping[str, Any], meta: dict[str, Any]) -> RunState | dict[str, Any]:
    """The child's run state: the one an earlier process committed, or a new one."""
    earlier = run_log.load()
    if earlier is None:
        try:
            values = coerce_inputs(child.compiled.loop, _render_with(cs, scope))
        except (InputError, RenderError) as exc:
            return {"status": "failed", "outputs": {}, "error": {"kind": "parse", "message": str(exc)}}
        children = parent.ports.children
        assert children is not None  # checked by run_child_state
        return children.new_state(child.compiled.loop, run_id, values, meta)
    state = RunState.from_json(earlier[0])
    if state.is_final:  # finished before a crash: keep, do not re-run
        return {"status": state.status, "outputs": state.outputs, "run_id": run_id, "error": state.error}
    state.history = history_from_events(earlier[1])
    handed = parent.run.meta.get("child_decision") or {}
    if state.status == WAITING and handed.get("child") == run_id:
        state.decision = handed["decision"]  # a person decided on the parent's run
        parent.run.meta.pop("child_decision", None)
    return state


def _shared_child_ports(parent: "Engine", child: ChildLoop) -> Ports:
    """The ports all children of one `loop:` state share: computed once, not once per item."""
    mine = parent.ports
    secrets = {k: v for k, v in mine.secret_values.items() if k in child.compiled.loop.secrets}
    return Ports(
        provider=parent._get_provider,
        responses=mine.responses,
        human=mine.human,
        workdir=mine.workdir,
        env={k: v for k, v in mine.env.items() if k not in mine.secret_values or k in secrets},
        secret_values=secrets,
        inherited_secrets=parent.redact.values,
        skills=dict(mine.skills) | dict(child.skills),
        clock=mine.clock,
        shell=mine.shell,
        confine_cwd=mine.confine_cwd,
        children=mine.children,
        real_waits=mine.real_waits,
        use_cache=mine.use_cache,
        keep_events=False,
        tool_kinds=mine.tool_kinds,
        coding_cli=mine.coding_cli,
        git=mine.git,  # a child runs in its caller's workspace, so its agents are guarded alike
    )


def _wait_if_a_child_waits(parent: "Engine", cs: "CompiledState", results: list[dict[str, Any]]) -> None:
    waiting = [r for r in results if r["status"] == WAITING]
    if waiting and getattr(parent.ports.run_log, "store", None) is not None:
        # A child waits for a person: so does the parent. `loopdsl approve PARENT` decides
        # for that child, and `resume` hands the decision down (see waiting.resume_waiting).
        first = waiting[0]
        asked = first.get("waiting") or {}
        wait_for_person(parent, cs.state, reason="child", child=first["run_id"],
                        message=f"sub-loop {first['run_id']} at '{asked.get('state')}': {asked.get('message', '')}",
                        choices=tuple(asked.get("choices") or ("approve", "reject")), timeout=None)


def _one_child_result(action: LoopAction, only: dict[str, Any]) -> dict[str, Any]:
    err = only.get("error") or {}
    if only["status"] == BUDGET_EXHAUSTED:  # the shared budget ran out inside the child: the parent is out of it too
        raise BudgetExceeded(str(err.get("which") or "tokens"),
                             f"sub-loop {action.path} stopped: {err.get('message', 'budget exhausted')}")
    if only["status"] != COMPLETED:
        kind = str(err["kind"]) if err.get("kind") in ERROR_KINDS else "gate"
        raise StepFailure(kind, f"sub-loop {action.path} ended {only['status']}: {err.get('message', '')}",
                          result={"status": only["status"], "outputs": only["outputs"]})
    return {"status": only["status"], "outputs": only["outputs"], **only["outputs"]}


def _fan_out_result(cs: "CompiledState", action: LoopAction, results: list[dict[str, Any]]) -> dict[str, Any]:
    exhausted = [r for r in results if r["status"] == BUDGET_EXHAUSTED]
    failures = sum(1 for r in results if r["status"] != COMPLETED)
    shaped = [{"status": r["status"], "outputs": r["outputs"], **r.get("workspace", {})} for r in results]
    if failures > action.tolerate_failures and exhausted:
        err = exhausted[0].get("error") or {}
        raise BudgetExceeded(str(err.get("which") or "tokens"),
                             f"{len(exhausted)} of {len(results)} children of '{cs.state.name}' stopped at the budget: "
                             f"{err.get('message', '')}")
    if failures > action.tolerate_failures:
        raise StepFailure("gate", f"{failures} of {len(results)} children of '{cs.state.name}' failed "
                          f"(tolerate_failures: {action.tolerate_failures})", result={"items": shaped, "failures": failures})
    return {"items": shaped, "failures": failures}


def _forward_to(parent: "Engine", run_id: str) -> Callable[[dict[str, Any]], None]:
    """Child events nest under the parent's run, tagged with the child's run id."""

    def forward(event: dict[str, Any]) -> None:
        parent.emit("child", run_id=run_id, event=event)

    return forward
