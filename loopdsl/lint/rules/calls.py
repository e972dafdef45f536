"""Lint rules about what states call: models, prices, gates, skills, checkpoints (sub-loops
are in sub_loops.py)."""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ...language.price_checks import params_cost_diagnostics, price_diagnostic
from ...language.prices import max_output_tokens
from ...language.diagnostics import Diagnostic, Severity
from ...language.files import is_file
from ...language.agent_model import AgentAction
from ...language.model import (
    BUILTIN_GATES,
    EvaluateAction,
    Gate,
    LlmAction,
    ModelAlias,
    State,
)
from ..registry import LintContext, did_you_mean, quoted_list, rule, state_key
from .templates import names_read
from ...language.skills import check_skill
from ...language.schedules import cron_problem, time_zone

# ================================================================ models


def _call(state: State) -> LlmAction | EvaluateAction | AgentAction | None:
    """A state that calls a model through an alias (an agent running a CLI does not)."""
    if isinstance(state.action, AgentAction):
        return state.action if state.action.cli is None else None
    return state.action if isinstance(state.action, (LlmAction, EvaluateAction)) else None


@rule
def unknown_model(ctx: LintContext) -> Iterator[Diagnostic]:
    for state in ctx.states.values():
        call = _call(state)
        if call is None or call.model in ctx.loop.models:
            continue
        yield ctx.diag(
            "unknown-model",
            f'state "{state.name}" uses unknown model "{call.model}"{did_you_mean(call.model, ctx.loop.models)}',
            state.path + (state.kind, "model"),
            value=True,
            hint=f"`model` names an alias under `models:` (defined: {quoted_list(ctx.loop.models)}); "
            f"add e.g. `{call.model.split('/')[-1].replace('-', '_').replace('.', '_')}: "
            f"{{model: provider/model-name, max_tokens: 1000}}`",
        )


@rule
def llm_max_tokens(ctx: LintContext) -> Iterator[Diagnostic]:
    for state in ctx.states.values():
        call = _call(state)
        if call is None or call.max_tokens is not None:
            continue
        alias = ctx.loop.models.get(call.model)
        if alias is None or alias.max_tokens is not None:
            continue  # an unknown alias is reported by unknown-model
        yield ctx.diag(
            "llm-max-tokens",
            f'{state.kind} call in state "{state.name}" has no max_tokens (neither on the call nor '
            f'on model alias "{alias.name}")',
            state.path + (state.kind,),
            hint=f"set `max_tokens` on the call or on `models.{alias.name}`: the budget reserves "
            "the worst case before each call, so the output must be capped",
        )


@rule
def max_tokens_over_limit(ctx: LintContext) -> Iterator[Diagnostic]:
    """A `max_tokens` more than a model of the alias can write: the provider refuses such a
    call (OpenAI and Anthropic answer 400), and the budget reserves that much before it."""
    places: list[tuple[float, ModelAlias, tuple[Any, ...]]] = [
        (alias.max_tokens, alias, ("models", name, "max_tokens")) for name in ctx.local_models
        if (alias := ctx.loop.models.get(name)) is not None and alias.max_tokens is not None]
    for state in ctx.states.values():
        call = _call(state)
        alias = ctx.loop.models.get(call.model) if call is not None else None
        if call is not None and alias is not None and call.max_tokens is not None:
            places.append((call.max_tokens, alias, state.path + (state.kind, "max_tokens")))
    for max_tokens, alias, path in places:
        for model in (alias.model, *alias.fallbacks):
            limit = max_output_tokens(model)
            if limit is not None and limit > 0 and max_tokens > limit:
                yield ctx.diag("max-tokens-over-limit", f"max_tokens {max_tokens:,} is more than {model} writes "
                               f"({limit:,} tokens, LiteLLM's table): the provider refuses the call",
                               path, value=True, severity=Severity.WARNING,
                               hint=f"lower it to {limit} or less")
                break


@rule
def params_cost(ctx: LintContext) -> Iterator[Diagnostic]:
    for name in ctx.local_models:
        alias = ctx.loop.models.get(name)
        if alias is not None:
            yield from params_cost_diagnostics(ctx.path, ctx.at, alias)


@rule
def unknown_price(ctx: LintContext) -> Iterator[Diagnostic]:
    for name in ctx.local_models:
        alias = ctx.loop.models.get(name)
        if alias is None or alias.price is not None:
            continue
        candidates = [(alias.model, ("models", name, "model"))] + [
            (fallback, ("models", name, "fallbacks", i)) for i, fallback in enumerate(alias.fallbacks)
        ]
        for model, path in candidates:
            found = price_diagnostic(ctx.path, ctx.at(path, value=True), name, model)
            if found is not None:
                yield found


def _effective(ctx: LintContext, state: State) -> tuple[str, Any] | None:
    call = _call(state)
    if call is None:
        return None
    alias: ModelAlias | None = ctx.loop.models.get(call.model)
    if alias is None:
        return None
    temperature = call.temperature if call.temperature is not None else alias.temperature
    return alias.model, temperature


def _judged_states(ctx: LintContext, evaluator: State) -> list[str]:
    action = evaluator.action
    assert isinstance(action, EvaluateAction)
    read: set[str] = set()
    for text in (action.prompt, action.system or "", *action.criteria):
        read |= names_read(text)
    named = [n for n in ctx.states if n in read and ctx.states[n].kind == "llm"]
    if named:
        return named
    return [p for p in ctx.predecessors.get(evaluator.name, []) if ctx.states[p].kind == "llm"]


@rule
def evaluator_mirrors_generator(ctx: LintContext) -> Iterator[Diagnostic]:
    for state in ctx.states.values():
        if state.kind != "evaluate":
            continue
        mine = _effective(ctx, state)
        if mine is None:
            continue
        for judged in _judged_states(ctx, state):
            if _effective(ctx, ctx.states[judged]) != mine:
                continue
            line, col = ctx.at(state_key(judged))
            temperature = "unset" if mine[1] is None else mine[1]
            yield ctx.diag(
                "evaluator-mirrors-generator",
                f'evaluator "{state.name}" judges "{judged}" with the same model ({mine[0]}) and '
                f"temperature ({temperature})",
                state.path + ("evaluate", "model"),
                value=True,
                severity=Severity.WARNING,
                hint="a model tends to approve its own output: use a different model (or at least a "
                "different temperature) for the evaluator",
                related=((ctx.path, line, col, f'generator "{judged}" is here'),),
            )
            break


# ================================================================ gates


def _all_gate_uses(ctx: LintContext) -> Iterator[tuple[Gate, str]]:
    """(gate, phase) for every gate in states, plus local named gates ('definition')."""
    for state in ctx.states.values():
        for gate in state.gates_before:
            yield gate, "before"
        for gate in state.gates_after:
            yield gate, "after"
    for name in ctx.local_gates:
        named = ctx.loop.gates.get(name)
        if named is not None:
            yield named, "definition"


def _ref_path(ctx: LintContext, gate: Gate) -> tuple[Any, ...]:
    raw: Any = ctx.doc.data
    for key in gate.path:
        raw = raw[key] if isinstance(raw, (dict, list)) else None  # type: ignore[index]
    return gate.path + ("ref",) if isinstance(raw, dict) else gate.path


@rule
def unknown_gate(ctx: LintContext) -> Iterator[Diagnostic]:
    for gate, _phase in _all_gate_uses(ctx):
        if gate.kind != "ref" or gate.ref in ctx.loop.gates:
            continue
        ref = str(gate.ref)
        yield ctx.diag(
            "unknown-gate",
            f'unknown gate "{ref}"{did_you_mean(ref, list(ctx.loop.gates) + list(BUILTIN_GATES))}',
            _ref_path(ctx, gate),
            value=True,
            hint=f"name a gate defined under `gates:` or imported (defined: {quoted_list(ctx.loop.gates)}), "
            f"or a built-in: {', '.join(BUILTIN_GATES)}",
        )


@rule
def gate_needs_value(ctx: LintContext) -> Iterator[Diagnostic]:
    for state in ctx.states.values():
        for gate in state.gates_before:
            target = gate
            if gate.kind == "ref" and gate.ref in ctx.loop.gates:
                target = ctx.loop.gates[str(gate.ref)]
            if target.kind == "builtin" and not gate.value and not target.value:
                yield ctx.diag(
                    "gate-needs-value",
                    f'built-in gate "{target.builtin}" in `before` of state "{state.name}" has no '
                    "`value`: before the action runs there is no result to check",
                    gate.path,
                    hint=f'give it what to check, e.g. `{{builtin: {target.builtin}, value: "{{{{ inputs.code }}}}"}}`, '
                    "or move it to `after`",
                )


# ================================================================ skills and checkpoints


@rule
def skill_files(ctx: LintContext) -> Iterator[Diagnostic]:
    for state in ctx.states.values():
        call = state.action
        if not isinstance(call, (LlmAction, AgentAction)) or not call.skill:  # an agent's skill is read alike
            continue
        path = state.path + ("agent" if isinstance(call, AgentAction) else "llm", "skill")
        file = ctx.source.parent / call.skill
        if not is_file(file):
            yield ctx.diag(
                "missing-file",
                f'skill file "{call.skill}" does not exist',
                path,
                value=True,
                hint=f"the path is relative to the loop file's folder ({loop_folder(ctx)})",
            )
            continue
        for problem in check_skill(file):
            yield ctx.diag(
                "skill-sections",
                problem,
                path,
                value=True,
                severity=Severity.WARNING,
                hint="a SKILL.md has the headings WHEN, READ, JUDGE, OUTPUT and STOP (e.g. `## When`), "
                "so the model knows when the skill applies, what to read, how to judge, what to "
                "answer and when to stop",
            )


def loop_folder(ctx: LintContext) -> str:
    """The linted file's folder as the user sees it (relative paths in the loop start there)."""
    parent = str(Path(ctx.path).parent)
    return "the current folder" if parent in ("", ".") else parent


@rule
def checkpoint_unattended(ctx: LintContext) -> Iterator[Diagnostic]:
    if not ctx.loop.unattended:
        return
    for state in ctx.states.values():
        if state.kind == "checkpoint":
            yield ctx.diag(
                "checkpoint-unattended",
                f'checkpoint "{state.name}" waits for a person, but the loop is marked `unattended: true`',
                state.path + ("checkpoint",),
                hint="replace the checkpoint with an `evaluate` state or a gate, or drop `unattended: true`",
            )


# ================================================================ schedule


@rule
def bad_schedule(ctx: LintContext) -> Iterator[Diagnostic]:
    schedule = ctx.loop.schedule
    if schedule is None:
        return
    problem = cron_problem(schedule.cron)
    if problem is not None:
        # Quoted as JSON: a line break in it must not break the finding's one line.
        yield ctx.diag("bad-schedule", f"{json.dumps(schedule.cron, ensure_ascii=False)} {problem[0]}", ("schedule", "cron"), value=True,
                       hint=problem[1])
    if time_zone(schedule.timezone) is None:
        yield ctx.diag(
            "bad-schedule",
            f'unknown time zone "{schedule.timezone}"',
            ("schedule", "timezone"),
            value=True,
            hint='use an IANA name such as "UTC", "Europe/Paris" or "America/New_York"',
        )
