"""Compile a Loop into a `transitions` machine configuration, its routing table and an
action table.

Pure and deterministic: no provider, shell or disk. Every template and expression
is compiled here once, so a run never re-parses Jinja, and a syntax error surfaces
before anything runs. The engine dispatches through `CompiledLoop.fire`, which follows
the machine's own rule (a trigger's edges from the current state in priority order, the
first whose guard holds) on the same edges; `new_machine` builds the `transitions` machine
from them (`graph` draws it, and a test checks the two dispatch alike). Every action is
run by the engine, never inside a dispatch.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from .model import EvaluateAction, LlmAction, Loop, LoopAction, SetAction, ShellSpec, State
from .templates import (
    NO_FACTS,
    Expression,
    InputFacts,
    ShellCommand,
    Template,
    check_argv,
    check_env,
    compile_expression,
    compile_shell,
    compile_template,
)

from .state_graph import EXHAUST, FAIL, NEXT, ROUTE, TIME_OUT  # noqa: F401  (the engine fires these)


@dataclass(frozen=True)
class CompiledShell:
    spec: ShellSpec
    command: ShellCommand | None  # for `cmd`
    argv: tuple[Template, ...] | None  # for `argv`
    cwd: Template | None
    env: Mapping[str, Template]


@dataclass(frozen=True)
class CompiledState:
    """A state with every template it uses compiled once."""

    state: State
    shell: CompiledShell | None = None
    prompt: Template | None = None
    system: Template | None = None
    message: Template | None = None  # checkpoint message
    set_values: Mapping[str, Expression | Any] = field(default_factory=dict)
    for_each: Expression | None = None
    with_values: Mapping[str, Template | Any] = field(default_factory=dict)
    output: Mapping[str, Template | Any] = field(default_factory=dict)
    guards: tuple[tuple[str, Expression | None], ...] = ()  # (destination, compiled when)


@dataclass(frozen=True)
class MachineConfig:
    """What `transitions.Machine` is built from (also what `graph` draws)."""

    states: tuple[str, ...]
    initial: str
    final: tuple[str, ...]
    # (trigger, source, dest, when-source or None) in firing priority order.
    transitions: tuple[tuple[str, str, str, str | None], ...]


# The edges out of each state by trigger, in firing order: (destination, compiled `when`).
Routes = Mapping[str, Mapping[str, tuple[tuple[str, "Expression | None"], ...]]]


@dataclass(frozen=True)
class CompiledLoop:
    loop: Loop
    config: MachineConfig
    states: Mapping[str, CompiledState]
    outputs: Mapping[str, Template | Any]
    routes: Routes = field(default_factory=dict)

    def fire(self, source: str, trigger: str, ctx: Mapping[str, Any] | None = None) -> str | None:
        """Where `trigger` leads from `source`: the first of its edges whose guard holds in
        `ctx` (an edge without one always does), or None when none does. The `transitions`
        machine's rule, without its per-event objects: this runs at every step."""
        for dest, guard in self.routes[source][trigger]:
            if guard is None or guard(ctx):
                return dest
        return None

    def new_machine(self, model: Any, guard: Callable[[Expression, Any], bool]) -> Any:
        """A fresh machine bound to `model`; `guard(expression, event)` decides a `when`."""
        from transitions import Machine

        machine = Machine(
            model=model,
            states=list(self.config.states),
            initial=self.config.initial,
            auto_transitions=False,
            send_event=True,
            model_attribute="state",
        )
        for trigger, source, dest, _when in self.config.transitions:
            compiled = _guard_for(self.states, source, dest, trigger, _when)
            conditions: list[Any] = [] if compiled is None else [_bind_guard(guard, compiled)]
            machine.add_transition(trigger, source, dest, conditions=conditions)
        return machine


def _guard_for(states: Mapping[str, CompiledState], source: str, dest: str, trigger: str,
               when: str | None) -> Expression | None:
    """The compiled `when` of an edge (the state's own, so it is compiled once)."""
    if trigger != ROUTE or when is None:
        return None
    for d, expr in states[source].guards:
        if d == dest and expr is not None and expr.source == when:
            return expr
    return compile_expression(when)


def _routes(config: MachineConfig, states: Mapping[str, CompiledState]) -> Routes:
    routes: dict[str, dict[str, list[tuple[str, Expression | None]]]] = {}
    for trigger, source, dest, when in config.transitions:
        edge = (dest, _guard_for(states, source, dest, trigger, when))
        routes.setdefault(source, {}).setdefault(trigger, []).append(edge)
    return {source: {trigger: tuple(edges) for trigger, edges in by_trigger.items()}
            for source, by_trigger in routes.items()}


def _bind_guard(guard: Callable[[Expression, Any], bool], expr: Expression) -> Callable[[Any], bool]:
    def condition(event: Any) -> bool:
        return guard(expr, event)

    return condition


_SINGLE_PLACEHOLDER = re.compile(r"^\s*\{\{(?P<expr>(?:(?!\}\}|\{\{|\{%).)*)\}\}\s*$", re.DOTALL)


def _template_or_literal(value: Any) -> Template | Expression | Any:
    """A value given to a sub-loop or an output: a string that is one `{{ expr }}` keeps the
    expression's own type (a number stays a number); other strings are text templates."""
    if not isinstance(value, str):
        return value
    single = _SINGLE_PLACEHOLDER.match(value)
    if single is not None:
        return compile_expression(single.group("expr").strip())
    return compile_template(value)


def input_facts(loop: Loop) -> InputFacts:
    """Inputs validated as integers or as one of an `enum`'s strings: the only values that may
    stand where bash evaluates a value (shell_template.py)."""
    integers = frozenset(name for name, spec in loop.inputs.items() if spec.type == "integer")
    choices = tuple(
        (name, tuple(str(v) for v in spec.enum)) for name, spec in loop.inputs.items()
        if spec.enum is not None and all(isinstance(v, str) for v in spec.enum)
    )
    return InputFacts(integers, choices)


def _compile_shell(spec: ShellSpec, facts: InputFacts) -> CompiledShell:
    if spec.argv is not None:
        check_argv(spec.argv)
    check_env(spec.env)
    return CompiledShell(
        spec=spec,
        command=compile_shell(spec.cmd, facts.with_env(spec.env)) if spec.cmd is not None else None,
        argv=tuple(compile_template(a) for a in spec.argv) if spec.argv is not None else None,
        cwd=compile_template(spec.cwd) if spec.cwd else None,
        env={k: compile_template(v) for k, v in spec.env.items()},
    )


def compile_state(state: State, facts: InputFacts = NO_FACTS) -> CompiledState:
    action = state.action
    parts: dict[str, Any] = {}
    if isinstance(action, ShellSpec):
        parts["shell"] = _compile_shell(action, facts)
    elif isinstance(action, (LlmAction, EvaluateAction)) or state.kind == "agent":
        parts["prompt"] = compile_template(action.prompt)  # type: ignore[union-attr]
        if action.system:  # type: ignore[union-attr]
            parts["system"] = compile_template(action.system)  # type: ignore[union-attr]
    elif isinstance(action, SetAction):
        parts["set_values"] = {
            k: compile_expression(v) if isinstance(v, str) else v for k, v in action.values.items()
        }
    elif isinstance(action, LoopAction):
        parts["for_each"] = compile_expression(action.for_each) if action.for_each else None
        parts["with_values"] = {k: _template_or_literal(v) for k, v in action.with_.items()}
    elif state.kind == "checkpoint" and action is not None:
        parts["message"] = compile_template(action.message)  # type: ignore[union-attr]
    if state.is_end:
        parts["output"] = {k: _template_or_literal(v) for k, v in state.output.items()}
    guards = tuple(
        (t.to, compile_expression(t.when) if t.when is not None else None) for t in state.transitions
    )
    return CompiledState(state=state, guards=guards, **parts)


def machine_config(loop: Loop) -> MachineConfig:
    transitions = tuple((e.trigger, e.source, e.dest, e.when) for e in loop.graph.edges)
    return MachineConfig(
        states=tuple(loop.states),
        initial=loop.start,
        final=tuple(s.name for s in loop.states.values() if s.is_end),
        transitions=transitions,
    )


def compile_loop(loop: Loop) -> CompiledLoop:
    """Loop -> CompiledLoop. Raises templates.TemplateError on a template lint would reject."""
    facts = input_facts(loop)
    config = machine_config(loop)
    states = {name: compile_state(state, facts) for name, state in loop.states.items()}
    return CompiledLoop(
        loop=loop,
        config=config,
        states=states,
        outputs={k: _template_or_literal(v) for k, v in loop.outputs.items()},
        routes=_routes(config, states),
    )
