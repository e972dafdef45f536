"""Where a loop's templates stand: every string the engine renders or evaluates is a *site*.

A site is where the string is (YAML path), how it is read (template, expression, shell
command), and when it runs relative to its state (before the action, after it, or at an
end). The template rules check each site; other rules look at some of them (a literal `cwd`).
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ..language.model import RESERVED_NAMES, Gate, ShellSpec, State, YamlPath

if TYPE_CHECKING:
    from .registry import LintContext

Mode = Literal["template", "expr", "shell"]
# pre: before the state's action (its own result is not there on the first visit);
# post: after it (after-gates, transition guards); outputs: top-level outputs;
# definition: a named gate, whose context is the state that refers to it; publish: `publish:`
# texts, rendered at the completed ends `publish.ends` names (or every one).
Phase = Literal["pre", "post", "outputs", "definition", "publish"]
# env: a command's `env:` value; with: a sub-loop's `with:` value (secret rules differ there).
Where = Literal["prompt", "command", "env", "with", "other"]

TEMPLATE_ROOTS = frozenset(RESERVED_NAMES)


@dataclass(frozen=True)
class Site:
    path: YamlPath
    source: str
    mode: Mode
    where: Where
    phase: Phase
    state: str | None
    # For a shell command: its `env:` (values that are templates carry values into bash).
    env: tuple[tuple[str, str], ...] = ()


def raw_at(ctx: LintContext, path: YamlPath) -> Any:
    """The raw data at `path` in the linted file (None when it is not there)."""
    node: Any = ctx.doc.data
    for key in path:
        try:
            node = node[key]
        except (KeyError, IndexError, TypeError):
            return None
    return node


def _shell_sites(ctx: LintContext, spec: ShellSpec, phase: Phase, state: str | None) -> Iterator[Site]:
    path = spec.path
    env = tuple(sorted((k, str(v)) for k, v in spec.env.items()))
    if isinstance(raw_at(ctx, path), str):
        if spec.cmd is not None:
            yield Site(path, spec.cmd, "shell", "command", phase, state, env)
        return
    if spec.cmd is not None:
        yield Site(path + ("cmd",), spec.cmd, "shell", "command", phase, state, env)
    for i, arg in enumerate(spec.argv or ()):
        yield Site(path + ("argv", i), arg, "template", "command", phase, state)
    if spec.cwd is not None:
        yield Site(path + ("cwd",), str(spec.cwd), "template", "command", phase, state)
    # env values reach the process as environment variables, the safe way to pass a secret.
    for key, value in spec.env.items():
        yield Site(path + ("env", key), value, "template", "env", phase, state, ((key, value),))


def _gate_sites(ctx: LintContext, gate: Gate, phase: Phase, state: str | None) -> Iterator[Site]:
    if gate.kind == "shell" and gate.shell is not None:
        yield from _shell_sites(ctx, gate.shell, phase, state)
    elif gate.kind == "expr" and gate.expr is not None:
        yield Site(gate.path + ("expr",), gate.expr, "expr", "other", phase, state)
    elif gate.kind == "builtin" and isinstance(gate.value, str):
        yield Site(gate.path + ("value",), gate.value, "template", "other", phase, state)


def _state_sites(ctx: LintContext, state: State) -> Iterator[Site]:
    p, name, a = state.path, state.name, state.action
    if state.kind == "shell" and isinstance(a, ShellSpec):
        yield from _shell_sites(ctx, a, "pre", name)
    elif state.kind in ("llm", "evaluate"):
        body = raw_at(ctx, p + (state.kind,)) or {}
        for key in ("prompt", "system"):
            if isinstance(body.get(key), str):
                yield Site(p + (state.kind, key), body[key], "template", "prompt", "pre", name)
        criteria = body.get("criteria")
        for i, item in enumerate(criteria if isinstance(criteria, list) else ()):
            if isinstance(item, str):
                yield Site(p + (state.kind, "criteria", i), item, "template", "prompt", "pre", name)
    elif state.kind == "checkpoint":
        body = raw_at(ctx, p + ("checkpoint",))
        if isinstance(body, dict) and isinstance(body.get("message"), str):
            yield Site(p + ("checkpoint", "message"), body["message"], "template", "other", "pre", name)
    elif state.kind == "set":
        body = raw_at(ctx, p + ("set",))
        for key, value in (body.items() if isinstance(body, dict) else ()):
            if isinstance(value, str):
                yield Site(p + ("set", key), value, "expr", "other", "pre", name)
    elif state.kind == "loop":
        raw_state = raw_at(ctx, p) or {}
        if isinstance(raw_state.get("for_each"), str):
            yield Site(p + ("for_each",), raw_state["for_each"], "expr", "other", "pre", name)
        with_ = raw_state.get("with")
        for key, value in (with_.items() if isinstance(with_, dict) else ()):
            if isinstance(value, str):
                yield Site(p + ("with", key), value, "template", "with", "pre", name)
    for key, value in state.output.items():
        if isinstance(value, str):
            yield Site(p + ("output", key), value, "template", "other", "pre", name)
    for gate in state.gates_before:
        yield from _gate_sites(ctx, gate, "pre", name)
    for gate in state.gates_after:
        yield from _gate_sites(ctx, gate, "post", name)
    for t in state.transitions:
        if isinstance(t.when, str):
            yield Site(t.path + ("when",), t.when, "expr", "other", "post", name)


def _publish_sites(ctx: LintContext) -> Iterator[Site]:
    """`publish:` texts, rendered at a `completed` end like the top-level outputs."""
    publish = raw_at(ctx, ("publish",))
    for part, body in (publish.items() if isinstance(publish, dict) else ()):
        for key, value in (body.items() if isinstance(body, dict) else ()):
            if key in ("title", "body", "number") and isinstance(value, str):
                yield Site(("publish", part, key), value, "template", "other", "publish", None)
            elif key in ("add", "remove", "labels") and isinstance(value, list):
                for i, item in enumerate(value):
                    if isinstance(item, str):
                        yield Site(("publish", part, key, i), item, "template", "other", "publish", None)


def sites(ctx: LintContext) -> list[Site]:
    """Every site of the loop (the context keeps them: `ctx.template_sites`)."""
    out: list[Site] = []
    for state in ctx.states.values():
        out.extend(_state_sites(ctx, state))
    for name in ctx.local_gates:
        gate = ctx.loop.gates.get(name)
        if gate is not None:
            out.extend(_gate_sites(ctx, gate, "definition", None))
    for key, value in ctx.loop.outputs.items():
        if isinstance(value, str):
            out.append(Site(("outputs", key), value, "template", "other", "outputs", None))
    out.extend(_publish_sites(ctx))
    return out
