"""Lint rules about sub-loops (`loop:` states): the child file exists and lints, `with:` gives
its inputs with values of the right types, and the child's secrets are the parent's too."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ...language.diagnostics import Diagnostic, Severity, format_plain
from ...language.files import is_file, leads_to_yaml
from ...language.model import Loop, LoopAction, State
from ..registry import LintContext, did_you_mean, quoted_list, rule
from .calls import loop_folder


_TYPE_CHECKS = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
}


def _type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    for name in ("integer", "number", "string", "array", "object"):
        if _TYPE_CHECKS[name](value):
            return name
    return "null" if value is None else type(value).__name__


def _is_template(value: Any) -> bool:
    return isinstance(value, str) and ("{{" in value or "{%" in value)


@rule
def sub_loops(ctx: LintContext) -> Iterator[Diagnostic]:
    for state in ctx.states.values():
        action = state.action
        if not isinstance(action, LoopAction):
            continue
        yield from _check_sub_loop(ctx, state, action)


def _check_sub_loop(ctx: LintContext, state: State, action: LoopAction) -> Iterator[Diagnostic]:
    found: list[Diagnostic] = []
    child = _lint_child(ctx, state, action, found)
    yield from found
    if child is None or child.loop is None:
        return
    yield from _with_values(ctx, state, action, child.loop)
    parent_secrets = set(ctx.loop.secrets)
    for secret in child.loop.secrets:
        if secret not in parent_secrets:
            yield ctx.diag(
                "child-secret",
                f'sub-loop "{action.path}" declares secret {secret}, which this loop does not declare',
                state.path + ("loop",),
                value=True,
                hint=f"add {secret} to this loop's `secrets:`: a child only gets secrets its parent has",
            )


def _child_file(ctx: LintContext, state: State, action: LoopAction,
                found: list[Diagnostic]) -> tuple[Path, str] | None:
    """The sub-loop's file and how it is shown; None (with a finding) when there is none."""
    loop_path = state.path + ("loop",)
    if action.path.startswith("pkg:"):
        from ...language.packaged_loops import PackageError, resolve_loop_ref

        try:
            file = resolve_loop_ref(action.path)
        except PackageError as exc:
            found.append(ctx.diag("missing-file", exc.message, loop_path, value=True, hint=exc.hint))
            return None
        shown = action.path
    else:
        file = ctx.source.parent / action.path
        shown = ctx.child_display(action.path)
    if not is_file(file):
        found.append(ctx.diag(
            "missing-file",
            f'sub-loop file "{action.path}" does not exist',
            loop_path,
            value=True,
            hint=f"the path is relative to the loop file's folder ({loop_folder(ctx)})",
        ))
        return None
    elsewhere = leads_to_yaml(file)
    if elsewhere is not None:
        found.append(ctx.diag("missing-file", f'sub-loop file "{action.path}" is not a YAML file (it is {elsewhere[-80:]!r})',
                              loop_path, value=True, hint="a `loop:` state runs a .yaml or .yml loop file"))
        return None
    return file, shown


def _lint_child(ctx: LintContext, state: State, action: LoopAction, found: list[Diagnostic]) -> Any:
    """The sub-loop's lint analysis, or None; what is wrong with it goes to `found`."""
    located = _child_file(ctx, state, action, found)
    if located is None or ctx.analyze_child is None:
        return None
    file, shown = located
    loop_path = state.path + ("loop",)
    child = ctx.analyze_child(file, shown)
    if child is None:  # the child is already being linted higher up: a recursive sub-loop
        budget = ctx.loop.budget
        # Judged for a loop that runs itself; through other loops, the one whose budget is
        # shared (the first of the chain) is not this one, and its own lint says so.
        bounded = budget.steps is not None or budget.wall_time is not None or not _same_file(file, ctx.source)
        # Unbounded, each level starts the next at once: the run never ends and its store
        # grows by gigabytes a minute (every level's record nests under its parent's).
        found.append(ctx.diag(
            "loop-recursion",
            f'sub-loop "{action.path}" runs a loop that is already running it (recursion)'
            + ("" if bounded else ", and no `budget.steps` or `budget.wall_time` stops it"),
            loop_path,
            value=True,
            severity=Severity.WARNING if bounded else Severity.ERROR,
            hint="recursive sub-loops only stop when the shared budget runs out; make sure that is intended"
            if bounded else "set `budget: {steps: N}` (or `wall_time`) on this loop, or break the recursion",
        ))
        return None
    errors = [d for d in child.diagnostics if d.is_error]
    if errors:
        related = tuple((d.path, d.line, d.col, _short(f"{d.message} [{d.rule}]")) for d in errors[:3])
        found.append(ctx.diag(
            "child-invalid",
            f'sub-loop "{action.path}" does not lint: {len(errors)} error{"s" if len(errors) != 1 else ""} '
            f"(first: {_short(_cause(errors[0]))})",
            loop_path,
            value=True,
            hint=f"run `loopdsl lint {shown}` and fix it",
            related=related,
        ))
    return child


def _with_values(ctx: LintContext, state: State, action: LoopAction, child: Loop) -> Iterator[Diagnostic]:
    """`with:` names the child's inputs, with values of their types, and gives every required one."""
    inputs = child.inputs
    for key, value in action.with_.items():
        if key not in inputs:
            yield ctx.diag(
                "with-unknown-input",
                f'sub-loop "{action.path}" has no input "{key}"{did_you_mean(key, inputs)}',
                state.path + ("with", key),
                hint=f"its inputs are: {quoted_list(inputs)}",
            )
            continue
        spec = inputs[key]
        if _is_template(value) or spec.type not in _TYPE_CHECKS:
            continue
        if not _TYPE_CHECKS[spec.type](value):  # a null too: the child refuses it as it starts
            yield ctx.diag(
                "with-type",
                f'input "{key}" of sub-loop "{action.path}" is {spec.type}, got {_type_name(value)}'
                + ("" if value is None else f" {value!r}"),
                state.path + ("with", key),
                value=True,
                hint=f"pass a {spec.type}" + (" (unquoted)" if spec.type in ("integer", "number", "boolean") else ""),
            )
    missing = [n for n, s in inputs.items() if s.required and not s.has_default and n not in action.with_]
    if missing:
        given_with = "with" in (ctx.doc.data["states"][state.name] or {})
        where = state.path + ("with",) if given_with else state.path + ("loop",)
        yield ctx.diag(
            "with-missing-input",
            f'sub-loop "{action.path}" needs input{"s" if len(missing) > 1 else ""} '
            f"{', '.join(missing)}, not given in `with:`",
            where,
            hint="add " + ", ".join(f"`{n}: ...`" for n in missing) + " under `with:`",
        )


def _short(text: str) -> str:
    """A child's finding quoted in its parent's, cut: a hostile file's may be long."""
    return text if len(text) <= 300 else text[:297] + "..."


def _cause(first: Diagnostic) -> str:
    """A child's first error, as its parent quotes it: when that is itself a sub-loop's
    `child-invalid`, the finding deepest in the chain (each level quoted the next whole, and a
    long chain of sub-loops buried the cause in kilobytes of nesting)."""
    text = format_plain(first)
    if first.rule != "child-invalid" or "(first: " not in text:
        return text
    inner = text.rsplit("(first: ", 1)[1]
    while inner.endswith(") [child-invalid]"):
        inner = inner[:-len(") [child-invalid]")]
    return _DEEPER + inner.removeprefix(_DEEPER)


_DEEPER = "in its own sub-loops: "


def _same_file(one: Path, other: Path) -> bool:
    try:
        return one.resolve() == other.resolve()
    except (OSError, ValueError):
        return False
