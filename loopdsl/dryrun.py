"""`loopdsl run --dry-run`: walk the graph with no side effects and project the spend.

Nothing runs: no command, no model call, and LiteLLM is not imported (prices come
from its JSON table, prompt sizes from a conservative byte estimate). The worst case
assumes every state reaches its `max_visits` with every retry used and every
fallback tried, each call at `max_tokens`; the budget then caps that.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from .budget import conservative_tokens, reservation_for
from .model import EvaluateAction, Gate, LlmAction, Loop, ModelAlias
from .prices import model_price
from .project.graphs import in_cycle


@dataclass
class StatePlan:
    name: str
    kind: str
    gates_before: list[str]
    gates_after: list[str]
    visits: int | None  # None: unbounded by max_visits
    calls: int = 0  # worst-case model calls per visit (attempts x fallback chain)
    tokens_per_call: int = 0
    cost_per_call: float | None = 0.0
    targets: list[str] = field(default_factory=list)


@dataclass
class DryRun:
    loop: Loop
    states: list[StatePlan]
    unreachable: list[str]

    def worst_case(self) -> tuple[int, float | None, bool]:
        """(tokens, cost_usd, bounded): sum over states of visits x calls x per-call worst case."""
        tokens, cost, bounded = 0, 0.0, True
        for plan in self.states:
            if not plan.calls:
                continue
            visits = plan.visits
            if visits is None:
                bounded = False
                visits = 1
            tokens += visits * plan.calls * plan.tokens_per_call
            if plan.cost_per_call is None or cost is None:
                cost = None  # type: ignore[assignment]
            else:
                cost += visits * plan.calls * plan.cost_per_call
        return tokens, cost, bounded

    def to_json(self) -> dict[str, Any]:
        tokens, cost, bounded = self.worst_case()
        b = self.loop.budget
        return {
            "loop": self.loop.name,
            "states": [plan.__dict__ for plan in self.states],
            "unreachable": self.unreachable,
            "worst_case": {"tokens": tokens, "cost_usd": cost, "bounded_by_max_visits": bounded},
            "budget": {"tokens": b.tokens, "cost_usd": b.cost_usd, "steps": b.steps, "wall_time_s": b.wall_time},
            "projected": {
                "tokens": min(tokens, b.tokens) if b.tokens is not None else tokens,
                "cost_usd": min(cost, b.cost_usd) if (cost is not None and b.cost_usd is not None) else cost,
            },
        }

    def to_text(self) -> str:
        data = self.to_json()
        lines = [f"dry run of '{self.loop.name}': nothing is executed", "", "states that can run (from start):"]
        for plan in self.states:
            visits = "unbounded" if plan.visits is None else f"≤{plan.visits} visit(s)"
            line = f"  {plan.name:<18} {plan.kind:<10} {visits}"
            if plan.calls:
                cost = "unknown price" if plan.cost_per_call is None else f"${plan.cost_per_call:.4f}"
                line += f"  worst {plan.calls} call(s)/visit x {plan.tokens_per_call} tokens, {cost}/call"
            lines.append(line)
            if plan.gates_before:
                lines.append(f"  {'':<18} before: {', '.join(plan.gates_before)}")
            if plan.gates_after:
                lines.append(f"  {'':<18} after:  {', '.join(plan.gates_after)}")
            if plan.targets:
                lines.append(f"  {'':<18} -> {', '.join(plan.targets)}")
        if self.unreachable:
            lines.append(f"unreachable: {', '.join(self.unreachable)}")
        worst = data["worst_case"]
        budget = data["budget"]
        cost_text = "unknown" if worst["cost_usd"] is None else f"${worst['cost_usd']:.4f}"
        lines.append("")
        lines.append(f"worst case: {worst['tokens']} tokens, {cost_text}" + ("" if worst["bounded_by_max_visits"] else " (some cycles have no max_visits: counted once)"))
        lines.append(f"budget:     tokens {budget['tokens']}, cost_usd {budget['cost_usd']}, steps {budget['steps']}, wall_time {budget['wall_time_s'] if budget['wall_time_s'] is None else str(budget['wall_time_s']) + 's'}")
        proj = data["projected"]
        proj_cost = "unknown" if proj["cost_usd"] is None else f"${proj['cost_usd']:.4f}"
        lines.append(f"projected:  at most {proj['tokens']} tokens and {proj_cost} (the budget caps the worst case)")
        return "\n".join(lines)


def _gate_names(gates: tuple[Gate, ...]) -> list[str]:
    return [g.label for g in gates]


def call_worst_case(loop: Loop, alias: ModelAlias, prompt_tokens: int, max_tokens: int) -> tuple[int, float | None]:
    """The reservation the engine would make for one call (None cost: a model has no price)."""
    priced = [(m, alias.price if (m == alias.model and alias.price) else model_price(m))
              for m in (alias.model, *alias.fallbacks)]
    try:
        return reservation_for(priced, prompt_tokens, max_tokens)
    except ValueError:
        return prompt_tokens + max_tokens, None


def prompt_tokens_estimate(loop: Loop, action: LlmAction | EvaluateAction) -> int:
    text = action.prompt + (action.system or "")
    if isinstance(action, LlmAction) and action.skill:
        try:
            text += (loop.base_dir / action.skill).read_text(encoding="utf-8")
        except OSError:
            pass
    if isinstance(action, EvaluateAction):
        text += " ".join(action.criteria) + " " * 300  # the evaluator instructions we add
    return conservative_tokens(text)


def dry_run(loop: Loop) -> DryRun:
    order: list[str] = []
    seen = {loop.start}
    queue = deque([loop.start])
    while queue:
        name = queue.popleft()
        order.append(name)
        for _trigger, dest, _path in loop.states[name].targets():
            if dest in loop.states and dest not in seen:
                seen.add(dest)
                queue.append(dest)
    plans = []
    for name in order:
        state = loop.states[name]
        plan = StatePlan(
            name=name,
            kind=state.end and f"end:{state.end}" or state.kind,
            gates_before=_gate_names(state.gates_before),
            gates_after=_gate_names(state.gates_after),
            visits=state.max_visits if state.max_visits is not None else (None if in_cycle(loop, name) else 1),
            targets=sorted({d for _t, d, _p in state.targets()}),
        )
        action = state.action
        if isinstance(action, (LlmAction, EvaluateAction)) and action.model in loop.models:
            alias = loop.models[action.model]
            max_tokens = action.max_tokens or alias.max_tokens or 0
            plan.calls = state.retry.max_attempts * (1 + len(alias.fallbacks))
            plan.tokens_per_call, plan.cost_per_call = call_worst_case(loop, alias, prompt_tokens_estimate(loop, action), max_tokens)
        plans.append(plan)
    unreachable = [n for n in loop.states if n not in seen]
    return DryRun(loop, plans, unreachable)
