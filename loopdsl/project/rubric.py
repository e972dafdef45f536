"""The audit rubric: one rule id per check, weights summing to 100 (published in docs/audit.md)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Rule:
    id: str
    weight: int
    title: str


RUBRIC: tuple[Rule, ...] = (
    Rule("budget-caps", 15, "every run is capped: steps and wall_time, plus tokens and cost_usd when it calls models"),
    Rule("bounded-cycles", 15, "lint finds no unbounded cycle (max_visits, or a budget cap, bounds each)"),
    Rule("gated-model-calls", 10, "a deterministic check decides every model call"),
    Rule("separate-evaluator", 5, "each evaluator differs from the generators lint says it judges (model or temperature)"),
    Rule("guarded-side-effects", 10, "writes happen in a worktree or after a checkpoint; external effects after a checkpoint"),
    Rule("declared-secrets", 10, "credentials that commands use are declared in `secrets`"),
    Rule("complete-skills", 5, "every llm state carries a skill with WHEN, READ, JUDGE, OUTPUT and STOP"),
    Rule("schedule-set", 5, "a valid schedule (cron and timezone)"),
    Rule("tests-pass", 15, "loop tests exist for the loop and pass"),
    Rule("lint-clean", 5, "lint reports no error and no warning"),
    Rule("recent-runs", 5, "a completed run in the store within the last N days"),
)

RULES = {rule.id: rule for rule in RUBRIC}
assert sum(rule.weight for rule in RUBRIC) == 100, "the audit weights must sum to 100"
