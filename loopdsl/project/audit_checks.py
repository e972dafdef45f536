"""The audit's checks: each reads the loop model and says what the loop really guarantees.

A check returns a CheckResult: not applicable (the loop has nothing the rule is about),
passed, or failed with one Finding per lost point, each saying where, what and the fix.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

# CREDENTIAL_NAME: the interpreter passes an environment variable with such a name to commands
# only when it is declared in `secrets` (loopdsl.api.runs strips the others).
from ..runtime.redaction import CREDENTIAL_NAME
from ..language.model import EvaluateAction, LlmAction, Loop, LoopAction, ShellSpec, State
from . import effects
from .audit_types import AuditContext, CheckResult, Finding

__all__ = ["CHECKS", "AuditContext", "CheckResult", "Finding"]

_ENV_REF = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)")
# Tools that read a credential from the environment without the command naming it.
IMPLIED_CREDENTIALS: tuple[tuple[str, re.Pattern[str], tuple[str, ...]], ...] = (
    ("gh", re.compile(r"(?:^|[\s;&|(])gh\s"), ("GH_TOKEN", "GITHUB_TOKEN")),
)


def _where(loop: Loop, state: str | None = None) -> str:
    file = loop.source.name if loop.source else loop.name
    return f"{file}: state {state}" if state else file


def _model_states(loop: Loop) -> list[State]:
    live = loop.graph.reachable
    return [s for s in loop.states.values() if s.name in live and isinstance(s.action, (LlmAction, EvaluateAction))]


def _uses_models(tree: Sequence[Loop]) -> bool:
    return any(_model_states(loop) for loop in tree)


# ---------------------------------------------------------------- budget-caps


def check_budget(ctx: AuditContext) -> CheckResult:
    result = CheckResult("budget-caps")
    budget = ctx.loop.budget
    wanted = ["steps", "wall_time"]
    if _uses_models(ctx.tree):
        wanted = ["tokens", "cost_usd", *wanted]
    missing = [cap for cap in wanted if getattr(budget, cap) is None]
    for cap in missing:
        example = {"tokens": "tokens: 50000", "cost_usd": "cost_usd: 0.25", "steps": "steps: 40", "wall_time": "wall_time: 10m"}[cap]
        why = {"tokens": "nothing stops a run from spending tokens without end",
               "cost_usd": "nothing caps what a run costs",
               "steps": "a run may take any number of steps",
               "wall_time": "a stuck run is never stopped"}[cap]
        result.findings.append(Finding("budget-caps", _where(ctx.loop), f"budget has no `{cap}`: {why}",
                                       f"add `{example}` to `budget:` (`loopdsl cost {ctx.loop_arg}` shows what a run can spend)"))
    return result


# ---------------------------------------------------------------- bounded-cycles


def _from_lint(ctx: AuditContext, result: CheckResult, lint_rule: str, *, tree: bool = True) -> CheckResult:
    """Lose `result`'s point for every finding of `lint_rule` in the loop and (`tree`) its
    sub-loops: lint decides what the rule means, the audit only weighs it."""
    for d in ctx.tree_lint if tree else ctx.lint:
        if d.rule == lint_rule:
            result.findings.append(Finding(result.rule, f"{Path(d.path).name}:{d.line}:{d.col}",
                                           f"{d.message} [{d.rule}]", d.hint or f"see `loopdsl lint {ctx.loop_arg}`"))
    return result


def check_cycles(ctx: AuditContext) -> CheckResult:
    result = _from_lint(ctx, CheckResult("bounded-cycles"), "unbounded-cycle")
    if result.passed:
        result.note = "lint finds no unbounded cycle"
    return result


# ---------------------------------------------------------------- gated-model-calls


def decision_edge(loop: Loop, source: str, trigger: str) -> bool:
    """Whether taking this edge means a deterministic check decided the run should go on."""
    src = loop.states[source]
    if trigger == "route" and any(t.when for t in src.transitions):
        return True  # a `when` chose the route
    if trigger in ("next", "route") and (src.gates_after or src.gates_before):
        return True  # the source's result passed deterministic gates
    # A command's verdict (its exit status) sent the run here, e.g. tests failed -> summarise.
    return trigger == "fail" and src.kind == "shell"


def _undecided_path(loop: Loop, target: str) -> list[str] | None:
    """A path from the start to `target` on which no deterministic check decides anything, or None."""
    return loop.graph.shortest_path(
        loop.start, target, lambda edge: not decision_edge(loop, edge.source, edge.trigger))


def check_gates(ctx: AuditContext) -> CheckResult:
    result = CheckResult("gated-model-calls")
    states = [(loop, s) for loop in ctx.tree for s in _model_states(loop)]
    if not states:
        result.applicable, result.note = False, "no model calls"
        return result
    for loop, state in states:
        if state.gates_before:
            continue
        path = _undecided_path(loop, state.name)
        if path is None:
            continue
        how = "it is the start state" if len(path) == 1 else "the path " + " -> ".join(path) + " passes no check"
        result.findings.append(Finding(
            "gated-model-calls", _where(loop, state.name),
            f"nothing deterministic decides that the model call in {state.name} is needed: {how}",
            f"add `gates: {{before: [...]}}` to {state.name} (e.g. a shell check that there is work to do), "
            "or route to it with a `when` condition, or give a state before it `gates: {after: [...]}`"))
    return result


# ---------------------------------------------------------------- separate-evaluator


def check_evaluator(ctx: AuditContext) -> CheckResult:
    result = CheckResult("separate-evaluator")
    if not any(isinstance(s.action, EvaluateAction) for loop in ctx.tree for s in _model_states(loop)):
        result.applicable, result.note = False, "no evaluate states"
        return result
    return _from_lint(ctx, result, "evaluator-mirrors-generator")


# ---------------------------------------------------------------- guarded-side-effects


def _checkpoints(loop: Loop) -> set[str]:
    return {s.name for s in loop.states.values() if s.kind == "checkpoint"}


def check_side_effects(ctx: AuditContext) -> CheckResult:
    result = CheckResult("guarded-side-effects")
    shell_seen = False
    # A child runs in its parent's workspace, after whatever guarded the state that runs it.
    pending: list[tuple[Loop, bool, bool]] = [(ctx.loop, ctx.loop.workspace.worktree, False)]
    done: set[int] = set()
    while pending:
        loop, worktree, parent_guarded = pending.pop()
        if id(loop) in done:
            continue
        done.add(id(loop))
        worktree = worktree or loop.workspace.worktree
        guards = _checkpoints(loop)
        live = loop.graph.reachable
        for state in loop.states.values():
            if state.name not in live:
                continue
            guarded = parent_guarded or loop.graph.guarded_by(state.name, guards)
            if isinstance(state.action, LoopAction):
                path = _child(loop, state.action)
                for child in ctx.tree:
                    if child.source and path and child.source.resolve() == path:
                        pending.append((child, worktree, guarded))
                continue
            if not isinstance(state.action, ShellSpec):
                continue
            shell_seen = True
            external = effects.external_effects(state.action)
            if external and not guarded:
                result.findings.append(Finding(
                    "guarded-side-effects", _where(loop, state.name),
                    f"{state.name} acts outside the run's workspace ({', '.join(external)}) and can be reached without a checkpoint",
                    f"put a `checkpoint:` state on every path to {state.name} and route only its approval there"
                    + ("" if not ctx.loop.unattended else " (an `unattended: true` loop cannot wait: move this step out of it)")))
                continue
            local = effects.local_writes(state.action)
            if local and not worktree and not guarded:
                result.findings.append(Finding(
                    "guarded-side-effects", _where(loop, state.name),
                    f"{state.name} writes files ({', '.join(local)}) in the user's checkout: the loop has no worktree "
                    "and no checkpoint before it",
                    "set `workspace: {worktree: true}` so each run writes on a branch of its own, "
                    f"or put a `checkpoint:` before {state.name}"))
    if not shell_seen:
        result.applicable, result.note = False, "no shell states"
    return result


def _child(loop: Loop, action: LoopAction) -> Path | None:
    from .discover import child_path

    return child_path(loop, action)


# ---------------------------------------------------------------- declared-secrets


def _command_texts(state: State) -> list[str]:
    texts: list[str] = []
    specs: list[ShellSpec] = []
    if isinstance(state.action, ShellSpec):
        specs.append(state.action)
    specs.extend(g.shell for g in (*state.gates_before, *state.gates_after) if g.shell is not None)
    for spec in specs:
        texts.append(effects.command_text(spec))
        texts.extend(spec.env.values())
        if spec.cwd:
            texts.append(spec.cwd)
    return texts


def check_secrets(ctx: AuditContext) -> CheckResult:
    result = CheckResult("declared-secrets")
    any_command = False
    for loop in ctx.tree:
        declared = set(loop.secrets)
        sites: list[tuple[str, str, set[str]]] = []  # (where, text, names set by the command's own env)
        for state in loop.states.values():
            own_env = set(state.action.env) if isinstance(state.action, ShellSpec) else set()
            sites.extend((state.name, text, own_env) for text in _command_texts(state))
        for name, gate in loop.gates.items():
            if gate.shell is not None:
                sites.append((f"gate {name}", effects.command_text(gate.shell), set(gate.shell.env)))
        reported: set[tuple[str, str]] = set()

        def report(where: str, what: str, message: str, fix: str) -> None:
            if (where, what) not in reported:  # once per command site and credential (or tool)
                reported.add((where, what))
                result.findings.append(Finding("declared-secrets", _where(loop, where.removeprefix("gate ")), message, fix))

        for where, text, own_env in sites:
            any_command = True
            for var in _ENV_REF.findall(text):
                if CREDENTIAL_NAME.search(var) and var not in declared and var not in own_env and not var.startswith("LOOPDSL_"):
                    report(where, var, f"{where} reads ${var}, which looks like a credential but is not in `secrets`: "
                           "the interpreter does not pass undeclared credentials to commands",
                           f"add {var} to `secrets:` (e.g. `secrets: [{', '.join(sorted(declared | {var}))}]`)")
            for tool, pattern, names in IMPLIED_CREDENTIALS:
                if pattern.search(text) and not declared.intersection(names):
                    report(where, tool, f"{where} runs `{tool}`, which authenticates with {' or '.join(names)}, "
                           "and neither is in `secrets` (so in CI it cannot log in)", f"add {names[0]} to `secrets:`")
    if not any_command:
        result.applicable, result.note = False, "no commands"
    return result


# ---------------------------------------------------------------- complete-skills


def check_skills(ctx: AuditContext) -> CheckResult:
    result = CheckResult("complete-skills")
    llm_states = [(loop, s) for loop in ctx.tree for s in _model_states(loop) if isinstance(s.action, LlmAction)]
    if not llm_states:
        result.applicable, result.note = False, "no llm states"
        return result
    for loop, state in llm_states:
        if not state.action.skill:  # type: ignore[union-attr]
            result.findings.append(Finding(
                "complete-skills", _where(loop, state.name), f"{state.name} has no `skill`: the model gets no standing instructions",
                f"write skills/{loop.name}/SKILL.md with sections WHEN, READ, JUDGE, OUTPUT, STOP and set `skill:` on {state.name}"))
    # Whether a skill has its sections is lint's skill-sections rule.
    return _from_lint(ctx, result, "skill-sections")


# ---------------------------------------------------------------- schedule-set


def check_schedule(ctx: AuditContext) -> CheckResult:
    result = CheckResult("schedule-set")
    if ctx.loop.schedule is None:
        result.findings.append(Finding("schedule-set", _where(ctx.loop), "the loop has no `schedule`",
                                       'add `schedule: {cron: "0 9 * * 1-5", timezone: UTC}` (then loopdsl\'s schedule '
                                       "command lists its run times and exports it to a scheduler)"))
        return result
    # A sub-loop runs on its parent's schedule: only this file's schedule counts.
    return _from_lint(ctx, result, "bad-schedule", tree=False)


# ---------------------------------------------------------------- tests-pass


def check_tests(ctx: AuditContext) -> CheckResult:
    result = CheckResult("tests-pass")
    if not ctx.tests:
        result.findings.append(Finding(
            "tests-pass", _where(ctx.loop), "no loop test runs this loop",
            f"add {ctx.file.stem}.test.yaml next to it (`loop: {ctx.file.name}`, `script:`, `expect:`; the section "
            "'loopdsl test' of docs/cli.md shows one), then run it with loopdsl's test command"))
        return result
    passed = sum(1 for t in ctx.tests if t.passed)
    result.note = f"{passed}/{len(ctx.tests)} test(s) passed"
    for outcome in ctx.tests:
        if not outcome.passed:
            reason = outcome.failures[0] if outcome.failures else "failed"
            result.findings.append(Finding("tests-pass", outcome.label, f"test {outcome.name} fails: {reason}",
                                           f"run `loopdsl test {ctx.typed(outcome.file)}` and fix the loop, its replies or the expectation"))
    return result


# ---------------------------------------------------------------- lint-clean


def check_lint(ctx: AuditContext) -> CheckResult:
    result = CheckResult("lint-clean")
    for d in ctx.lint:
        result.findings.append(Finding("lint-clean", d.location(), f"{d.severity.value}: {d.message} [{d.rule}]",
                                       d.hint or f"see `loopdsl lint {ctx.loop_arg}`"))
    return result


# ---------------------------------------------------------------- recent-runs


def _parse_time(text: Any) -> datetime | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)


def check_recent_runs(ctx: AuditContext) -> CheckResult:
    result = CheckResult("recent-runs")
    # crontab, not github-actions: that export needs to know how CI installs loopdsl (--pip-spec).
    fix = (f"run it on its schedule: `loopdsl schedule {ctx.loop_arg} --export crontab` prints a crontab line "
           "(`--export github-actions` a workflow), so each run is recorded in the store"
           if ctx.loop.schedule is not None else
           "give it a `schedule:` (see schedule-set) and export that to a scheduler, so each run is recorded in the store")
    if ctx.runs is None:
        result.findings.append(Finding("recent-runs", _where(ctx.loop), f"no run store at {ctx.store_dir}: the loop has never run here", fix))
        return result
    since = ctx.now - timedelta(days=ctx.days)
    recent = [r for r in ctx.runs if r.get("status") == "completed"
              and (_parse_time(r.get("ended_at")) or _parse_time(r.get("updated_at")) or datetime.min.replace(tzinfo=timezone.utc)) >= since]
    if recent:
        result.note = f"{len(recent)} completed run(s) in the last {ctx.days} days"
        return result
    last = next((r for r in ctx.runs), None)
    detail = f" (latest: {last.get('run_id')} {last.get('status')} at {last.get('ended_at') or last.get('started_at')})" if last else ""
    result.findings.append(Finding("recent-runs", _where(ctx.loop),
                                   f"no completed run of {ctx.loop.name} in the last {ctx.days} days{detail}", fix))
    return result


CHECKS: tuple[Callable[[AuditContext], CheckResult], ...] = (
    check_budget, check_cycles, check_gates, check_evaluator, check_side_effects, check_secrets,
    check_skills, check_schedule, check_tests, check_lint, check_recent_runs,
)
