"""One attempt of a state: its before-gates, its action (the engine's `_action`), its
after-gates, within the state's `timeout` and what is left of `budget.wall_time`; and the
`set:` action, which computes values from the context."""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from ..language.compile import CompiledState
from ..language.model import State
from ..language.templates import Expression, RenderError
from .budget import BudgetExceeded
from .context import MISSING
from .errors import StepFailure
from .run_state import NotJsonValue, json_value

if TYPE_CHECKING:
    from .engine import Engine


async def bounded_attempt(engine: "Engine", cs: CompiledState, ctx: dict[str, Any], visit: int, attempt: int) -> dict[str, Any]:
    timeout = cs.state.timeout
    wall = engine.loop.budget.wall_time
    if timeout is None and wall is None:  # the common case: nothing to bound
        return await _attempt(engine, cs, ctx, visit, attempt)
    wall_left = None if wall is None else max(wall - engine._active_seconds(), 0.0)
    limit = min(t for t in (timeout, wall_left) if t is not None)
    body = _attempt(engine, cs, ctx, visit, attempt)
    try:
        return await asyncio.wait_for(body, limit)
    except asyncio.TimeoutError:
        if timeout is not None and limit == timeout:
            raise StepFailure("timeout", f"state '{cs.state.name}' took longer than its timeout of {timeout:g}s") from None
        raise BudgetExceeded("wall_time", f"the run passed its wall_time budget of {wall:g}s") from None


async def _attempt(engine: "Engine", cs: CompiledState, ctx: dict[str, Any], visit: int, attempt: int) -> dict[str, Any]:
    state = cs.state
    if state.gates_before:
        await _gates(engine, "before", state, ctx, None)
    result = await engine._action(cs, ctx, visit, attempt)
    if state.gates_after:
        previous = ctx.get(state.name, MISSING)
        ctx[state.name] = dict(result, ok=True, error=None)
        try:
            await _gates(engine, "after", state, ctx, result)
        except StepFailure as failure:
            failure.result = result
            raise
        finally:
            if previous is MISSING:
                ctx.pop(state.name, None)
            else:
                ctx[state.name] = previous
    return result


async def _gates(engine: "Engine", phase: str, state: State, ctx: dict[str, Any], result: dict[str, Any] | None) -> None:
    gates = state.gates_before if phase == "before" else state.gates_after
    outcomes = await engine.gates.run(gates, ctx, result)
    for o in outcomes:
        engine.emit("gate", state=state.name, phase=phase, gate=o.name, passed=o.passed,
                  message=o.message, duration_s=round(o.duration_s, 4))
    failed = [o for o in outcomes if not o.passed]
    if failed:
        raise StepFailure("gate", f"{phase}-gate '{failed[0].name}' failed: {failed[0].message}")


def set_values(cs: CompiledState, ctx: dict[str, Any]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name, value in cs.set_values.items():
        if isinstance(value, Expression):
            try:
                values[name] = json_value(value(ctx))
            except (RenderError, NotJsonValue) as exc:
                raise StepFailure("parse", f"set {name}: {exc}") from None
        else:
            values[name] = value
    return values
