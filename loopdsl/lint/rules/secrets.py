"""Lint rules for which commands get secrets (docs/dsl.md, secrets).

A command's environment holds only the secrets its `env:` passes whole
(`env: {X: "{{ secrets.X }}"}`). These rules catch a command that still reads a
declared secret it is not given, and a command that gets secrets while it runs what
a model wrote. Where templates may read secrets at all is checked in rules/template_names.py.
"""
from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from ...language.diagnostics import Diagnostic, Severity
from ...language.model import Gate, ShellSpec, State, YamlPath
from ..registry import LintContext, rule
from .templates import names_read


@dataclass(frozen=True)
class _Command:
    spec: ShellSpec
    label: str  # e.g. `state "test"` or `gate "authed"`
    state: str | None  # the state it runs in (None for a named gate's definition)


def _gate_commands(gates: tuple[Gate, ...], state: str) -> Iterator[_Command]:
    for gate in gates:
        if gate.kind == "shell" and gate.shell is not None:
            yield _Command(gate.shell, f'a gate of state "{state}"', state)


def _commands(ctx: LintContext) -> list[_Command]:
    out: list[_Command] = []
    for name, state in ctx.states.items():
        if state.kind == "shell" and isinstance(state.action, ShellSpec):
            out.append(_Command(state.action, f'state "{name}"', name))
        out.extend(_gate_commands(state.gates_before + state.gates_after, name))
    for name in ctx.local_gates:
        gate = ctx.loop.gates.get(name)
        if gate is not None and gate.kind == "shell" and gate.shell is not None:
            out.append(_Command(gate.shell, f'gate "{name}"', None))
    return out


def _reads(spec: ShellSpec, env: bool = True) -> set[str]:
    """Root names and `history.X` states read by the templates of a command (its `cmd`,
    `argv` and `cwd`; and its `env` values unless `env` is False)."""
    sources = [spec.cmd or "", *(spec.argv or ()), spec.cwd or ""]
    if env:
        sources += [v for v in spec.env.values() if isinstance(v, str)]
    names: set[str] = set()
    for source in sources:
        if "{{" in source or "{%" in source:
            names |= names_read(source)
            names |= set(re.findall(r"history\s*(?:\.\s*|\[\s*['\"])([a-z][a-z0-9_]*)", source))
    return names


# `> file`, `>> file`, `tee file`: where a command writes. A report or data file (.json,
# .md, ...) is read, not run, so writing a model's words there is not counted.
_WRITE_TARGET = re.compile(r"(?:>>?|\btee\s+(?:-a\s+)?)\s*[\"']?([^\s\"'|;&<>]+)")
_DATA_FILE = re.compile(r"\.(?:json|jsonl|md|txt|csv|tsv|ya?ml|log|html)[\"']?\Z|\A/dev/(?:null|stdout|stderr)\Z|\A&\d\Z")


def _writes_runnable_file(spec: ShellSpec) -> bool:
    if spec.cmd is None:
        return False
    text = re.sub(r"\{\{.*?\}\}", "X", spec.cmd, flags=re.S)  # a placeholder in a path is one word
    targets = [t for t in _WRITE_TARGET.findall(text) if not t.isdigit()]
    return any(not _DATA_FILE.search(t) for t in targets)


def _after_writers(ctx: LintContext, writers: list[_Command]) -> dict[str, _Command]:
    """Each state that can run after a writer (or is one), with the nearest such writer:
    one breadth-first walk from all writers at once, so lint stays linear in states."""
    roots: dict[str, _Command] = {}
    for writer in writers:
        assert writer.state is not None
        roots.setdefault(writer.state, writer)
    first: dict[str, _Command] = {}
    # Breadth-first order lists each parent before its children.
    for name, parent in ctx.graph.breadth_first(list(roots)).items():
        first[name] = roots[name] if parent is None else first[parent]
    return first


def _model_states(ctx: LintContext) -> set[str]:
    """States whose results hold a model's words: llm and evaluate states, and `set`
    states computed from them (to a fixed point)."""
    tainted = {n for n, s in ctx.states.items() if s.kind in ("llm", "evaluate")}
    readers: dict[str, list[str]] = {}  # state -> the set states that read it
    for name, state in ctx.states.items():
        if state.kind == "set":
            for read in _set_reads(ctx, state):
                readers.setdefault(read, []).append(name)
    work = list(tainted)
    while work:
        for reader in readers.get(work.pop(), ()):
            if reader not in tainted:
                tainted.add(reader)
                work.append(reader)
    return tainted


def _set_reads(ctx: LintContext, state: State) -> set[str]:
    raw = ctx.doc.data.get("states", {}).get(state.name, {}) if isinstance(ctx.doc.data, dict) else {}
    body = raw.get("set") if isinstance(raw, dict) else None
    names: set[str] = set()
    for value in (body.values() if isinstance(body, dict) else ()):
        if isinstance(value, str):
            names |= names_read(value, expression=True)
    return names


def _path(spec: ShellSpec, *tail: str | int) -> YamlPath:
    return spec.path + tail


@rule
def secret_not_passed(ctx: LintContext) -> Iterator[Diagnostic]:
    declared = set(ctx.loop.secrets)
    if not declared:
        return
    for command in _commands(ctx):
        spec = command.spec
        if spec.cmd is None:
            continue
        for name in sorted(declared - set(spec.env)):
            found = re.search(rf"\$(?:{name}(?![A-Za-z0-9_])|\{{{name}[}}:#%/^,@-])", spec.cmd)
            if found is None:
                continue
            where = spec.path if isinstance(_raw_at(ctx, spec.path), str) else _path(spec, "cmd")
            yield ctx.diag(
                "secret-not-passed",
                f'{command.label} reads ${name}, a declared secret, but its `env:` does not pass it, so it is empty there',
                position=ctx.at_offset(where, spec.cmd, found.start()),
                hint=f'give the command `env: {{{name}: "{{{{ secrets.{name} }}}}"}}` '
                f"(shell: {{cmd: ..., env: ...}}); commands get only the secrets their env names",
            )


def _raw_at(ctx: LintContext, path: YamlPath) -> object:
    node: object = ctx.doc.data
    for key in path:
        try:
            node = node[key]  # type: ignore[index]
        except (KeyError, IndexError, TypeError):
            return None
    return node


@rule
def secret_with_model_output(ctx: LintContext) -> Iterator[Diagnostic]:
    if not ctx.loop.secrets:
        return
    model_states = _model_states(ctx)
    if not model_states:
        return
    commands = _commands(ctx)
    # Commands that write a model's reply into a file that may be run (a script, a test):
    # every command after them may run it.
    writers = [c for c in commands if c.state is not None and _reads(c.spec) & model_states
               and _writes_runnable_file(c.spec)]
    after = _after_writers(ctx, writers)
    for command in commands:
        passed = sorted(set(command.spec.secrets_passed.values()))
        if not passed:
            continue
        own = sorted(_reads(command.spec, env=False) & model_states)
        # A named gate may run in any state: any writer counts.
        writer = (writers[0] if writers else None) if command.state is None else after.get(command.state)
        if own:
            why = f'runs the reply of "{own[0]}" (a model wrote it)'
        elif writer is not None:
            why = f"may run the file {writer.label} writes from a model's reply"
        else:
            continue
        yield ctx.diag(
            "secret-with-model-output",
            f"{command.label} gets secret {', '.join(passed)} and {why}",
            _path(command.spec, "env"),
            severity=Severity.WARNING,
            hint="model-written code can read and send anything in its environment: run it in a state "
            "that gets no secrets, apart from the one that needs them",
        )
