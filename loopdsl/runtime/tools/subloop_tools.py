"""Sub-loop tools: a `tools:` entry with `loop:`, run like a `loop:` state when the model
calls it (DSL.md, v1.1 precise rules, "Sub-loop tools").

The call's arguments (defaults applied, checked against `params`) become the child's
inputs. The child runs in the caller's workspace as a child run keyed by (run, state,
visit, attempt, call id), spends from a ledger nested in the caller's (its steps and
spending count against the parent), and must be `unattended` (nobody could answer it
inside a tool call). The model sees `{status, outputs, error}`; a child that ran out of
budget ends the parent run too.
"""
from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from ...language.agent_model import ToolDef, ToolUse
from ...language.inputs import InputError, coerce_inputs
from ..budget import BudgetExceeded
from ..run_state import BUDGET_EXHAUSTED, COMPLETED, RunState
from .base import ToolOutcome, ToolSpec, check_names, safe_output
from .registry import ToolEnv
from .shell_tools import apply_defaults, argument_errors


class SubLoopToolBox:
    def __init__(self, tools: Sequence[tuple[ToolDef, ToolUse]], env: ToolEnv) -> None:
        self.env = env
        self.tools = {tool.name: (tool, use) for tool, use in tools}
        self._specs = check_names([ToolSpec(t.name, t.description, t.parameters_schema(), idempotent=t.idempotent)
                                   for t, _use in tools])

    def specs(self) -> Sequence[ToolSpec]:
        return list(self._specs.values())

    async def call(self, name: str, args: Mapping[str, Any], *, call_id: str, timeout: float) -> ToolOutcome:
        started = time.monotonic()
        tool, use = self.tools[name]
        full = apply_defaults(tool, args, use.with_)
        problem = argument_errors(tool, full)
        if problem is not None:
            return ToolOutcome.failure(problem)
        try:
            state = await asyncio.wait_for(self._run(tool, full, call_id), timeout)
        except asyncio.TimeoutError:
            return ToolOutcome.failure(f"the sub-loop took longer than {timeout:g}s", time.monotonic() - started)
        except _Refused as exc:
            return ToolOutcome.failure(str(exc), time.monotonic() - started)
        if state.status == BUDGET_EXHAUSTED:
            error = state.error or {}
            raise BudgetExceeded(str(error.get("which") or "cost_usd"), str(error.get("message") or "budget exhausted"))
        result = {"status": state.status, "outputs": state.outputs, "error": state.error}
        text, cut = safe_output(json.dumps(result, ensure_ascii=False, default=str), limit=self.env.output_limit,
                                redact=self.env.redact)
        return ToolOutcome(ok=state.status == COMPLETED, result=result if not cut else text,
                           error=None if state.status == COMPLETED else f"the sub-loop ended {state.status}",
                           truncated=cut, duration_s=time.monotonic() - started)

    async def _run(self, tool: ToolDef, args: Mapping[str, Any], call_id: str) -> RunState:
        from ..actions.subloop import ChildRunLog, _forward_to, _shared_child_ports, child_workspace_problem
        from ..engine import Engine
        from ..run_keys import child_run_id

        parent = self.env.engine
        children = parent.ports.children
        if children is None or tool.loop is None:
            raise _Refused("sub-loop tools cannot run here (no child-run port)")
        child = children.open(parent.loop, tool.loop)
        loop = child.compiled.loop
        if not loop.unattended:
            raise _Refused(f"the sub-loop {tool.loop} is not `unattended: true`; nobody could answer it inside a tool call")
        problem = child_workspace_problem(parent, child, tool.loop, concurrent=False)
        if problem is not None:
            raise _Refused(problem)
        ids = self.env.ids
        run_id = f"{parent.run.run_id}/{ids.get('state')}@{ids.get('visit')}.{ids.get('attempt')}/{call_id}"
        run_log = ChildRunLog(parent.ports.run_log, child_run_id(run_id), parent.run.run_id, parent.commit,
                              parent.redact.redact_obj)
        earlier = run_log.load()
        if earlier is not None:
            state = RunState.from_json(earlier[0])
            if state.is_final:
                return state
        else:
            try:
                values = coerce_inputs(loop, dict(args))
            except InputError as exc:
                raise _Refused(f"the arguments do not fit the sub-loop's inputs: {exc}") from None
            state = children.new_state(loop, run_id, values, {})
        ledger = parent.ledger.child(loop.budget, name=f"sub-loop {run_id}")
        ports = replace(_shared_child_ports(parent, child), run_log=run_log, listeners=[_forward_to(parent, run_id)])
        await Engine(child.compiled, state, ports, ledger=ledger, parent=parent).execute()
        return state

    async def aclose(self) -> None:
        return None


class _Refused(Exception):
    """A call that cannot run: the model is told why."""


async def open_subloop_tools(tools: Sequence[tuple[ToolDef, ToolUse]], env: ToolEnv) -> SubLoopToolBox:
    return SubLoopToolBox(tools, env)
