"""`loopdsl cost`: what one run of a loop can cost (worst case) and usually costs (typical).

Definitions (docs/cost.md says the same in prose):

worst case, per run
    Every reachable model state runs `max_visits` times (once when no cycle leads back to
    it; when a cycle without `max_visits` does, `budget.steps` times, else unbounded), each
    visit uses every attempt of its `retry.max_attempts`, and each attempt calls every
    model of the alias's fallback chain, each at its own price, with the prompt at its
    worst rendered size (prompt_size.py) and the completion at `max_tokens`. Sub-loops
    count the same way for every visit of the state that runs them (`for_each`: unbounded
    item count). Then the budget caps the sum: at most `budget.steps` attempts (the
    dearest ones), `budget.tokens` tokens and `budget.cost_usd` dollars.
typical, per run
    Every reachable model state once, one attempt, the primary model only, the prompt at
    its template size (no inserted values) and the completion at max_tokens / 2.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from ..runtime.budget import rates_for
from ..language.agent_model import AgentAction
from ..language.model import EvaluateAction, LlmAction, Loop, LoopAction, ModelAlias, Price
from ..language.skills import read_skill
from .prompt_size import prompt_size

UNBOUNDED = None


@dataclass
class CallPlan:
    loop: str
    state: str
    alias: str
    models: list[str]
    visits: int | None  # None: unbounded
    attempts: int
    prompt_tokens_worst: int
    prompt_tokens_typical: int
    max_tokens: int
    worst_tokens_per_attempt: int
    worst_cost_per_attempt: float | None
    typical_tokens: int
    typical_cost: float | None

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Figure:
    tokens: int | None  # None: unbounded
    cost_usd: float | None  # None: unknown price or unbounded
    uncapped_tokens: int | None = None
    uncapped_cost_usd: float | None = None
    capped_by: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class CostReport:
    loop: Loop
    calls: list[CallPlan]
    worst: Figure
    typical: Figure
    runs_per_month: float | None
    cadence: str  # how runs_per_month was found
    measured: dict[str, Any] | None
    notes: list[str] = field(default_factory=list)

    def monthly(self, figure: Figure) -> dict[str, float | None]:
        runs = self.runs_per_month
        if runs is None:
            return {"tokens": None, "cost_usd": None}
        return {"tokens": None if figure.tokens is None else round(figure.tokens * runs),
                "cost_usd": None if figure.cost_usd is None else figure.cost_usd * runs}

    def to_json(self) -> dict[str, Any]:
        b = self.loop.budget
        return {
            "loop": self.loop.name, "file": str(self.loop.source) if self.loop.source else None,
            "budget": {"tokens": b.tokens, "cost_usd": b.cost_usd, "steps": b.steps, "wall_time_s": b.wall_time},
            "calls": [c.to_json() for c in self.calls],
            "per_run": {"worst": self.worst.to_json(), "typical": self.typical.to_json()},
            "runs_per_month": self.runs_per_month, "cadence": self.cadence,
            "per_month": {"worst": self.monthly(self.worst), "typical": self.monthly(self.typical)},
            "measured": self.measured, "notes": self.notes,
        }


def price_of(alias: ModelAlias, model: str) -> Price | None:
    from ..language.prices import model_price

    if model == alias.model and alias.price is not None:
        return alias.price
    return model_price(model)


def _cost(price: Price | None, prompt: int, completion: float) -> float | None:
    if price is None:
        return None
    input_per_mtok, output_per_mtok = rates_for(price, prompt)  # the tier this prompt falls in
    return (prompt * input_per_mtok + completion * output_per_mtok) / 1_000_000


# A count past this bounds nothing a run could reach, and products of counts past a float's
# range (`max_visits: 1e308`) would stop the arithmetic below.
_COUNT_CEILING = 10**15


def _count(value: float, loop: Loop) -> int:
    """A state's visits or attempts as the cost model uses them: each takes at least one step,
    so never more than `budget.steps`."""
    return min(int(value), loop.budget.steps if loop.budget.steps is not None else _COUNT_CEILING)


def _visits(loop: Loop, name: str) -> int | None:
    state = loop.states[name]
    if state.max_visits is not None:
        return _count(state.max_visits, loop)
    if name not in loop.graph.cyclic:
        return 1
    return loop.budget.steps  # each visit takes at least one step; None: unbounded


def _skill_text(loop: Loop, action: LlmAction | EvaluateAction) -> str:
    return _read_skill(loop, action.skill) if isinstance(action, LlmAction) else ""


def plan_calls(loop: Loop, multiplier: int | None = 1, _seen: frozenset[Path] = frozenset()) -> list[CallPlan]:
    """One CallPlan per reachable model state of `loop` and of its sub-loops."""
    from ..language.prices import max_input_tokens
    from .discover import child_path

    plans: list[CallPlan] = []
    live = loop.graph.reachable
    for name in loop.states:
        if name not in live:
            continue
        state = loop.states[name]
        action = state.action
        visits = _visits(loop, name)
        if isinstance(action, LoopAction):
            path = child_path(loop, action)
            if path is None or path in _seen:
                continue
            from ..language.diagnostics import LoopError
            from ..lint.pipeline import load_loop

            try:
                child = load_loop(path)
            except LoopError:
                continue
            per_visit = None if action.for_each else 1
            times = None if (visits is None or per_visit is None or multiplier is None) else visits * per_visit * multiplier
            for plan in plan_calls(child, times, _seen | {path}):
                plans.append(plan)
            continue
        if isinstance(action, AgentAction):
            plans.extend(_agent_plan(loop, name, action, visits, multiplier))
            continue
        if not isinstance(action, (LlmAction, EvaluateAction)) or action.model not in loop.models:
            continue
        alias = loop.models[action.model]
        max_tokens = int(action.max_tokens or alias.max_tokens or 0)
        size = prompt_size(loop, action, _skill_text(loop, action))
        chain = [alias.model, *alias.fallbacks]
        worst_prompt = max(size.worst_tokens(max_input_tokens(m)) for m in chain)
        costs = [_cost(price_of(alias, m), size.worst_tokens(max_input_tokens(m)), max_tokens) for m in chain]
        typical_prompt = size.typical_tokens()
        plans.append(CallPlan(
            loop=loop.name, state=name, alias=action.model, models=chain,
            visits=None if (visits is None or multiplier is None) else visits * multiplier,
            attempts=_count(state.retry.max_attempts, loop),
            prompt_tokens_worst=worst_prompt, prompt_tokens_typical=typical_prompt, max_tokens=max_tokens,
            worst_tokens_per_attempt=sum(size.worst_tokens(max_input_tokens(m)) + max_tokens for m in chain),
            worst_cost_per_attempt=None if any(c is None for c in costs) else sum(c for c in costs if c is not None),
            typical_tokens=typical_prompt + max_tokens // 2,
            typical_cost=_cost(price_of(alias, alias.model), typical_prompt, max_tokens // 2),
        ))
    return plans


def _agent_plan(loop: Loop, name: str, action: AgentAction, visits: int | None, multiplier: int | None) -> list[CallPlan]:
    from ..language.prices import max_input_tokens
    from .agent_cost import agent_worst

    if action.cli is None and action.model not in loop.models:
        return []
    alias = loop.models.get(action.model)
    chain = [alias.model, *alias.fallbacks] if alias is not None else []
    skill = _read_skill(loop, action.skill)
    worst = agent_worst(loop, action, skill, _cost, [price_of(alias, m) for m in chain] if alias else [],
                        [max_input_tokens(m) for m in chain])
    max_tokens = int(action.max_tokens or (alias.max_tokens if alias else 0) or 0)
    return [CallPlan(
        loop=loop.name, state=name, alias=action.model or str(action.cli), models=chain,
        visits=None if (visits is None or multiplier is None) else visits * multiplier,
        attempts=_count(loop.states[name].retry.max_attempts, loop),
        prompt_tokens_worst=worst["prompt"], prompt_tokens_typical=worst["prompt"], max_tokens=max_tokens,
        worst_tokens_per_attempt=worst["tokens"], worst_cost_per_attempt=worst["cost"],
        typical_tokens=worst["prompt"] + max_tokens // 2,
        typical_cost=None if not chain else _cost(price_of(alias, alias.model), worst["prompt"], max_tokens // 2)
        if alias else worst["cost"],
    )]


def _read_skill(loop: Loop, skill: str | None) -> str:
    """The skill's text, or "" when there is none or it cannot be read (lint says why)."""
    if not skill:
        return ""
    try:
        return read_skill(loop.base_dir / skill)
    except (OSError, ValueError):  # ValueError: not UTF-8
        return ""


def _dearest(units: list[tuple[int, float]], count: int | None) -> float:
    """Sum of the `count` largest values, each unit being (multiplicity, value)."""
    total = 0.0
    left = count
    for multiplicity, value in sorted(units, key=lambda u: u[1], reverse=True):
        take = multiplicity if left is None else min(multiplicity, left)
        total += take * value
        if left is not None:
            left -= take
            if left <= 0:
                break
    return total


def worst_case(loop: Loop, plans: list[CallPlan]) -> Figure:
    budget = loop.budget
    unbounded = any(p.visits is None for p in plans)
    unknown = any(p.worst_cost_per_attempt is None for p in plans)
    steps = budget.steps
    fig = Figure(tokens=None, cost_usd=None)
    if not unbounded:
        fig.uncapped_tokens = sum((p.visits or 0) * p.attempts * p.worst_tokens_per_attempt for p in plans)
        fig.uncapped_cost_usd = None if unknown else sum(
            (p.visits or 0) * p.attempts * (p.worst_cost_per_attempt or 0.0) for p in plans)
    # Every attempt is a step: at most `steps` attempts, so at most the `steps` dearest ones.
    if steps is not None and plans:
        token_units = [((p.visits or steps) * p.attempts, float(p.worst_tokens_per_attempt)) for p in plans]
        tokens: float | None = _dearest(token_units, steps)
        cost: float | None = None
        if not unknown:
            cost = _dearest([((p.visits or steps) * p.attempts, p.worst_cost_per_attempt or 0.0) for p in plans], steps)
        if unbounded or (fig.uncapped_tokens is not None and tokens is not None and tokens < fig.uncapped_tokens):
            fig.capped_by.append("steps")
    else:
        tokens = fig.uncapped_tokens
        cost = fig.uncapped_cost_usd
    if budget.tokens is not None and (tokens is None or tokens > budget.tokens):
        tokens = budget.tokens
        fig.capped_by.append("tokens")
    if budget.cost_usd is not None and (cost is None and not unknown or cost is not None and cost > budget.cost_usd):
        cost = budget.cost_usd
        fig.capped_by.append("cost_usd")
    if unknown and budget.cost_usd is not None and cost is None:
        cost = budget.cost_usd
        fig.capped_by.append("cost_usd")
    fig.tokens = None if tokens is None else int(tokens)
    fig.cost_usd = cost
    return fig


def typical_case(plans: list[CallPlan]) -> Figure:
    unknown = any(p.typical_cost is None for p in plans)
    return Figure(tokens=sum(p.typical_tokens for p in plans),
                  cost_usd=None if unknown else sum(p.typical_cost for p in plans))  # type: ignore[misc]


def measured(loop: Loop, store_dir: Path) -> dict[str, Any] | None:
    from ..runtime.run_state import FINAL_STATUSES
    from ..adapters.store.run_store import MARKER_NAME, RunStore
    from ..runtime.errors import StoreError

    if not (store_dir / MARKER_NAME).exists():
        return None
    try:
        with RunStore(store_dir) as store:
            records = [r for r in store.list_runs(check=True) if r.get("loop") == loop.name and r.get("status") in FINAL_STATUSES]
    except StoreError:
        return None
    if not records:
        return None
    ledgers = [r.get("ledger") or {} for r in records]
    n = len(ledgers)
    return {"runs": n, "store": str(store_dir),
            "mean_cost_usd": sum(float(l.get("cost_usd", 0) or 0) for l in ledgers) / n,
            "mean_tokens": sum(float(l.get("tokens", 0) or 0) for l in ledgers) / n,
            "mean_steps": sum(float(l.get("steps", 0) or 0) for l in ledgers) / n,
            "max_cost_usd": max(float(l.get("cost_usd", 0) or 0) for l in ledgers)}


def estimate(loop: Loop, *, cadence: str | None = None, window_start: datetime | None = None,
             store_dir: Path | None = None, prs_per_month: float | None = None) -> CostReport:
    """`cadence` per-pr counts one run per pull request: `prs_per_month` of them."""
    from .schedule import CADENCE_RUNS, WINDOW_DAYS, require_schedule, runs_in_window

    plans = plan_calls(loop)
    notes: list[str] = []
    if any(p.visits is None for p in plans):
        notes.append("a model state can run without bound (a cycle without max_visits and no budget.steps, "
                     "or a for_each sub-loop): the worst case is only what the budget caps")
    if any(p.worst_cost_per_attempt is None for p in plans):
        notes.append("a model has no price in LiteLLM's table and no `price:` on its alias: costs are unknown")
    runs: float | None = None
    how = "no schedule (give --cadence)"
    if cadence == "per-pr":
        runs, how = float(prs_per_month or 0), f"--cadence per-pr, one run per pull request, {prs_per_month:g} a month"
    elif cadence:
        runs, how = CADENCE_RUNS[cadence], f"--cadence {cadence}"
    elif loop.schedule is not None:
        cron, tz = require_schedule(loop)
        runs = float(runs_in_window(cron, tz, window_start))
        start = (window_start.date().isoformat() if window_start else "today")
        how = f"schedule {cron!r} ({loop.schedule.timezone}), {WINDOW_DAYS} days from {start}"
    return CostReport(loop, plans, worst_case(loop, plans), typical_case(plans), runs, how,
                      measured(loop, store_dir) if store_dir else None, notes)


# ---------------------------------------------------------------- text


def _usd(value: float | None) -> str:
    if value is None:
        return "unknown"
    return f"${value:,.4f}" if value < 100 else f"${value:,.2f}"


def _tok(value: float | None) -> str:
    return "unbounded" if value is None else f"{int(round(value)):,}"


def format_text(report: CostReport) -> str:
    loop = report.loop
    lines = [f"cost of {loop.name}" + (f" ({loop.source})" if loop.source else ""), ""]
    if report.calls:
        lines.append(f"  {'state':<22} {'model':<30} {'visits':>6} {'tries':>5} {'prompt<=':>9} {'max_out':>7} {'worst/attempt':>13} {'typical':>9}")
        for p in report.calls:
            label = p.state if p.loop == loop.name else f"{p.loop}.{p.state}"
            model = p.models[0] + (f" (+{len(p.models) - 1} fallback)" if len(p.models) > 1 else "")
            visits = "inf" if p.visits is None else str(p.visits)
            lines.append(f"  {label:<22} {model:<30} {visits:>6} {p.attempts:>5} {p.prompt_tokens_worst:>9,} {p.max_tokens:>7,} "
                         f"{_usd(p.worst_cost_per_attempt):>13} {_usd(p.typical_cost):>9}")
    else:
        lines.append("  no model calls: a run costs nothing in tokens")
    w, t = report.worst, report.typical
    uncapped = "unbounded" if w.uncapped_tokens is None else f"{_tok(w.uncapped_tokens)} tokens, {_usd(w.uncapped_cost_usd)}"
    capped = f" (capped by budget {', '.join(w.capped_by)}; uncapped: {uncapped})" if w.capped_by else ""
    lines += ["", f"  per run      worst case: {_tok(w.tokens)} tokens, {_usd(w.cost_usd)}{capped}",
              f"               typical:    {_tok(t.tokens)} tokens, {_usd(t.cost_usd)}"]
    if report.runs_per_month is None:
        lines.append(f"  per month    unknown: {report.cadence}")
    else:
        mw, mt = report.monthly(w), report.monthly(t)
        lines += [f"  per month    {report.runs_per_month:g} runs ({report.cadence})",
                  f"               worst case: {_usd(mw['cost_usd'])}, {_tok(mw['tokens'])} tokens",
                  f"               typical:    {_usd(mt['cost_usd'])}, {_tok(mt['tokens'])} tokens"]
    m = report.measured
    if m:
        lines.append(f"  measured     {m['runs']} past run(s) in {m['store']}: mean {_usd(m['mean_cost_usd'])}, "
                     f"{_tok(m['mean_tokens'])} tokens, {m['mean_steps']:.1f} steps (max {_usd(m['max_cost_usd'])})")
    for note in report.notes:
        lines.append(f"  note: {note}")
    lines.append("  (definitions: docs/cost.md)")
    return "\n".join(lines)
