"""Lint rules about the shape of the state graph: reachability, ways out, cycles."""
from __future__ import annotations

import difflib
from collections.abc import Iterator

from ...language.diagnostics import Diagnostic
from ..registry import LintContext, graph_rule, rule, state_key


def _reachable_despite_typos(ctx: LintContext) -> set[str]:
    """States reachable when each unknown destination is read as its did-you-mean: a state
    is not "unreachable" just because a misspelt `next` (reported by unknown-state) misses it."""
    names = sorted(ctx.states)
    return ctx.graph.reachable_reading(
        lambda dest: difflib.get_close_matches(str(dest), names, n=1, cutoff=0.6))


@graph_rule
def unreachable_state(ctx: LintContext) -> Iterator[Diagnostic]:
    if ctx.loop.start not in ctx.states:
        return  # unknown-state already explains; everything would be "unreachable"
    reachable = _reachable_despite_typos(ctx)
    for name in ctx.states:
        if name not in reachable:
            yield ctx.diag(
                "unreachable-state",
                f'state "{name}" can never be reached from start state "{ctx.loop.start}"',
                state_key(name),
                hint="point a `next`, `transitions`, `on_failure`, `on_exhausted` or `on_timeout` "
                "at it, or delete it",
            )


@graph_rule
def no_path_to_end(ctx: LintContext) -> Iterator[Diagnostic]:
    # A state with an unknown destination may have been meant to end: unknown-state says so.
    can_end = {
        n for n, s in ctx.states.items()
        if s.is_end or any(edge.dest not in ctx.states for edge in ctx.graph.out[n])
    }
    # Whatever leads to a state that can end can end too.
    can_end = ctx.graph.reaching(can_end)
    stuck = [n for n in ctx.states if n not in can_end and n in ctx.reachable]
    order = {n: i for i, n in enumerate(ctx.states)}
    # Report where the run gets stuck (a dead end, or a group of states that only lead to
    # each other), not every state upstream of it.
    components, sub_edges = ctx.graph.components(stuck)
    member_of = {n: i for i, comp in enumerate(components) for n in comp}
    for i, component in enumerate(components):
        if any(member_of[d] != i for n in component for d in sub_edges[n]):
            continue  # it flows into another stuck group, which is reported
        first = min(component, key=order.__getitem__)
        if len(component) == 1 and not sub_edges[first]:
            yield ctx.diag(
                "no-path-to-end",
                f'state "{first}" has no `next` or `transitions`, so the run cannot go on from it',
                state_key(first),
                hint="add `next: STATE` (or `transitions:`) leading towards an `end` state",
            )
            continue
        names = sorted(component, key=order.__getitem__)
        group = f'state "{first}" only leads back to itself' if len(names) == 1 else (
            "states " + ", ".join(f'"{n}"' for n in names) + " only lead to each other")
        yield ctx.diag(
            "no-path-to-end",
            f"no path leads to an `end` state: {group}",
            state_key(first),
            hint="route one of their transitions to a state with `end: completed|failed|escalated`",
        )


@graph_rule
def unbounded_cycle(ctx: LintContext) -> Iterator[Diagnostic]:
    budget = ctx.loop.budget
    if budget.steps is not None or budget.wall_time is not None:
        return  # every cycle is bounded by the run's step or time cap
    spend_capped = budget.tokens is not None or budget.cost_usd is not None
    # A cycle is bounded when it passes through a state with max_visits, or (under a token or
    # cost cap) through a state that spends tokens. Remove those states: what still cycles
    # is unbounded.
    free = [
        n
        for n, s in ctx.states.items()
        if n in ctx.reachable
        and s.max_visits is None
        and not (spend_capped and s.kind in ("llm", "evaluate"))
    ]
    order = {n: i for i, n in enumerate(ctx.states)}
    for component in ctx.graph.cycles_within(free):
        first = min(component, key=order.__getitem__)
        cycle = " -> ".join(ctx.graph.shortest_cycle(first, set(component)))
        caps = "`budget.steps` or `budget.wall_time`" + (
            "" if spend_capped else " (or `tokens`/`cost_usd` when the cycle calls a model)"
        )
        yield ctx.diag(
            "unbounded-cycle",
            f"cycle {cycle} can repeat forever: no state in it has `max_visits` and the budget "
            "does not bound it",
            state_key(first),
            hint=f"add `max_visits: N` (and `on_exhausted: STATE`) to a state of the cycle, or set {caps}",
        )


@rule
def no_default_transition(ctx: LintContext) -> Iterator[Diagnostic]:
    for state in ctx.states.values():
        if state.transitions and all(t.when is not None for t in state.transitions):
            last = state.transitions[-1].to
            if last not in ctx.states:  # suggest what unknown-state suggests, not the typo
                last = next(iter(difflib.get_close_matches(last, sorted(ctx.states), n=1, cutoff=0.6)), last)
            yield ctx.diag(
                "no-default-transition",
                f'transitions of state "{state.name}" have no default entry: when no `when` is '
                "true the run fails with no_transition",
                state.path + ("transitions",),
                hint=f"end the list with an entry without `when`, e.g. `- {{to: {last}}}`",
            )
