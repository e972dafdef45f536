"""`loop:` states: run another loop file as a child, or one child per item (fan-out).

A child sees only its `with` inputs (checked against its `inputs`), its own states
and the secrets it declares. It spends from a ledger nested in the parent's, so its
caps are the smaller of its own and what the parent has left, and reservations of
concurrent children are checked against the parent atomically (no awaits inside).
"""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from .inputs import InputError, coerce_inputs
from .llmcall import StepFailure
from .model import Loop, LoopAction
from .runstate import COMPLETED, RunState
from .templates import Expression, RenderError

if TYPE_CHECKING:
    from .compile import CompiledState
    from .engine import Engine


class ChildRecorder:
    """Children keep their state in the parent's run; paid responses go to the parent's store."""

    def __init__(self, parent: Any):
        self.parent = parent

    def commit(self, run: RunState, events: list[dict[str, Any]]) -> None:
        pass  # the parent commits its own state, which carries finished children's results

    def get_response(self, key: str) -> dict[str, Any] | None:
        return self.parent.get_response(key)

    def put_response(self, key: str, value: dict[str, Any]) -> None:
        self.parent.put_response(key, value)

    def get_cached(self, key: str) -> dict[str, Any] | None:
        return self.parent.get_cached(key)

    def put_cached(self, key: str, value: dict[str, Any]) -> None:
        self.parent.put_cached(key, value)


def child_loop_path(parent: Loop, ref: str) -> Path:
    from .packages import resolve_loop_ref

    if ref.startswith("pkg:"):
        return resolve_loop_ref(ref)
    return (parent.base_dir / ref).resolve()


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


async def run_child_state(parent: "Engine", cs: "CompiledState", ctx: dict[str, Any]) -> dict[str, Any]:
    from .api import load, new_run_state
    from .compile import compile_loop
    from .engine import Engine, Ports

    action = cs.state.action
    assert isinstance(action, LoopAction)
    child = load(child_loop_path(parent.loop, action.path))
    compiled = compile_loop(child)
    if cs.for_each is not None:
        try:
            items = list(cs.for_each(ctx))
        except (RenderError, TypeError) as exc:
            raise StepFailure("parse", f"for_each of '{cs.state.name}': {exc}") from None
    else:
        items = [None]
    limit = asyncio.Semaphore(max(1, action.concurrency))
    base_id = f"{parent.run.run_id}/{cs.state.name}"

    async def one(index: int, item: Any) -> dict[str, Any]:
        scope = dict(ctx)
        if cs.for_each is not None:
            scope["item"], scope["index"] = item, index
        try:
            values = coerce_inputs(child, _render_with(cs, scope))
        except (InputError, RenderError) as exc:
            return {"status": "failed", "outputs": {}, "error": {"kind": "parse", "message": str(exc)}}
        meta = {"item": item, "index": index} if cs.for_each is not None else {}
        run_id = f"{base_id}/{index}" if cs.for_each is not None else base_id
        state = new_run_state(child, run_id, values, meta)
        secrets = {k: v for k, v in parent.ports.secret_values.items() if k in child.secrets}
        ports = Ports(
            provider=parent._get_provider,
            recorder=ChildRecorder(parent.ports.recorder),
            human=parent.ports.human,
            workdir=parent.ports.workdir,
            env={k: v for k, v in parent.ports.env.items() if k not in parent.ports.secret_values or k in secrets},
            secret_values=secrets,
            skills=dict(parent.ports.skills) | _child_skills(child),
            listeners=[_forward_to(parent, run_id)],
            sleep=parent.ports.sleep,
            use_cache=parent.ports.use_cache,
            keep_events=False,
        )
        async with limit:
            engine = Engine(compiled, state, ports, ledger=parent.ledger.child(child.budget, name=f"sub-loop {run_id}"))
            await engine.execute()
        out: dict[str, Any] = {"status": state.status, "outputs": state.outputs, "run_id": run_id}
        if state.status != COMPLETED:
            out["error"] = state.error
        return out

    results = await asyncio.gather(*(one(i, item) for i, item in enumerate(items)))
    if cs.for_each is None:
        only = results[0]
        if only["status"] != COMPLETED:
            err = only.get("error") or {}
            kind = str(err["kind"]) if err.get("kind") in _KINDS else "gate"
            raise StepFailure(kind, f"sub-loop {action.path} ended {only['status']}: {err.get('message', '')}",
                              result={"status": only["status"], "outputs": only["outputs"]})
        return {"status": only["status"], "outputs": only["outputs"], **only["outputs"]}
    failures = sum(1 for r in results if r["status"] != COMPLETED)
    shaped = [{"status": r["status"], "outputs": r["outputs"]} for r in results]
    if failures > action.tolerate_failures:
        raise StepFailure("gate", f"{failures} of {len(results)} children of '{cs.state.name}' failed "
                          f"(tolerate_failures: {action.tolerate_failures})", result={"items": shaped, "failures": failures})
    return {"items": shaped, "failures": failures}


_KINDS = frozenset({"rate_limit", "server_error", "timeout", "connection", "auth", "context_window",
                    "shell_exit", "gate", "parse", "no_transition", "budget"})


def _forward_to(parent: "Engine", run_id: str) -> Callable[[dict[str, Any]], None]:
    """Child events nest under the parent's run, tagged with the child's run id."""

    def forward(event: dict[str, Any]) -> None:
        parent.emit("child", run_id=run_id, event=event)

    return forward


def _child_skills(child: Loop) -> dict[str, str]:
    from .api import _skills

    return _skills(child)
