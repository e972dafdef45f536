"""`loopdsl run --dry-run`: walk the graph with no side effects and project the spend.

Nothing runs: no command, no model call, and LiteLLM is not imported. The worst-case
projection is the one `loopdsl cost` computes (docs/cost.md): every state at its
`max_visits`, every retry and fallback used, every call at `max_tokens` with prompts at
their worst rendered size, then capped by the budget. The dry run adds what a reviewer
wants before a first run: which states can run, in order, with their gates and edges.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..language.model import Gate, Loop
from .cost import CallPlan, Figure, plan_calls, worst_case


@dataclass
class StatePlan:
    name: str
    kind: str
    gates_before: list[str]
    gates_after: list[str]
    visits: int | None  # None: unbounded by max_visits
    targets: list[str] = field(default_factory=list)
    call: CallPlan | None = None  # for llm / evaluate states


@dataclass
class DryRun:
    loop: Loop
    states: list[StatePlan]
    unreachable: list[str]
    calls: list[CallPlan]  # this loop's and its sub-loops'
    worst: Figure

    def to_json(self) -> dict[str, Any]:
        b = self.loop.budget
        return {
            "loop": self.loop.name,
            "states": [{**{k: v for k, v in plan.__dict__.items() if k != "call"},
                        "call": plan.call.to_json() if plan.call else None} for plan in self.states],
            "unreachable": self.unreachable,
            "calls": [c.to_json() for c in self.calls],
            "worst_case": self.worst.to_json(),
            "budget": {"tokens": b.tokens, "cost_usd": b.cost_usd, "steps": b.steps, "wall_time_s": b.wall_time},
            "publish": publish_writes(self.loop),
        }

    def to_text(self) -> str:
        lines = [f"dry run of '{self.loop.name}': nothing is executed", "", "states that can run (from start):"]
        for plan in self.states:
            visits = "unbounded" if plan.visits is None else f"≤{plan.visits} visit(s)"
            line = f"  {plan.name:<18} {plan.kind:<10} {visits}"
            if plan.call is not None:
                cost = "unknown price" if plan.call.worst_cost_per_attempt is None else f"${plan.call.worst_cost_per_attempt:.4f}"
                line += f"  worst {plan.call.attempts} attempt(s)/visit x {plan.call.worst_tokens_per_attempt:,} tokens, {cost}/attempt"
            lines.append(line)
            if plan.gates_before:
                lines.append(f"  {'':<18} before: {', '.join(plan.gates_before)}")
            if plan.gates_after:
                lines.append(f"  {'':<18} after:  {', '.join(plan.gates_after)}")
            if plan.targets:
                lines.append(f"  {'':<18} -> {', '.join(plan.targets)}")
        if self.unreachable:
            lines.append(f"unreachable: {', '.join(self.unreachable)}")
        children = sorted({c.loop for c in self.calls if c.loop != self.loop.name})
        if children:
            lines.append(f"sub-loops' model calls included: {', '.join(children)}")
        writes = publish_writes(self.loop)
        if writes:
            ends = ", ".join(self.loop.publish.ends) or "every completed end"
            lines.append(f"publishes to GitHub after {ends} (not in a dry run): {'; '.join(writes)}")
        worst, b = self.worst, self.loop.budget
        uncapped = ("unbounded" if worst.uncapped_tokens is None else
                    f"{worst.uncapped_tokens:,} tokens, " + _usd(worst.uncapped_cost_usd))
        lines.append("")
        lines.append(f"worst case without the budget: {uncapped}")
        lines.append(f"budget:     tokens {b.tokens}, cost_usd {b.cost_usd}, steps {b.steps}, "
                     f"wall_time {'-' if b.wall_time is None else f'{b.wall_time:g}s'}")
        capped = f" (capped by {', '.join(worst.capped_by)})" if worst.capped_by else ""
        tokens = "unbounded" if worst.tokens is None else f"{worst.tokens:,}"
        lines.append(f"projected:  at most {tokens} tokens and {_usd(worst.cost_usd)}{capped}; see `loopdsl cost`")
        return "\n".join(lines)


def _usd(value: float | None) -> str:
    return "an unknown cost" if value is None else f"${value:.4f}"


def publish_writes(loop: Loop) -> list[str]:
    """The GitHub writes the loop's `publish:` declares, in the order they are made."""
    p = loop.publish
    if p is None:
        return []
    writes = []
    if p.pull_request is not None:
        branch = "the run's branch" if p.pull_request.branch == "run" else f"branch {p.pull_request.branch}"
        writes.append(f"pull request of {branch}")
    if p.issue is not None:
        writes.append("issue")
    for key, part in (("comment", p.comment), ("labels", p.labels)):
        if part is not None:
            writes.append(f"{key} on {part.on.replace('_', ' ')}")
    if p.review is not None:
        writes.append(f"review ({p.review.event})")
    return writes


def _gate_names(gates: tuple[Gate, ...]) -> list[str]:
    return [g.label for g in gates]


def dry_run(loop: Loop) -> DryRun:
    order = list(loop.graph.breadth_first((loop.start,)))
    seen = set(order)
    calls = plan_calls(loop)
    own_calls = {c.state: c for c in calls if c.loop == loop.name}
    plans = []
    for name in order:
        state = loop.states[name]
        plans.append(StatePlan(
            name=name,
            kind=state.end and f"end:{state.end}" or state.kind,
            gates_before=_gate_names(state.gates_before),
            gates_after=_gate_names(state.gates_after),
            visits=state.max_visits if state.max_visits is not None else (None if name in loop.graph.cyclic else 1),
            targets=sorted({edge.dest for edge in loop.graph.out[name]}),
            call=own_calls.get(name),
        ))
    unreachable = [n for n in loop.states if n not in seen]
    return DryRun(loop, plans, unreachable, calls, worst_case(loop, calls))
