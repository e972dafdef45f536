"""Lint rules for `on:` GitHub event triggers (docs/dsl.md, on).

An event run has no person to type `--input`: every input comes from the payload mapping
or from its default. So a mapping that names an unknown input, reads a field the event does
not have, or leaves a required input unset would only fail when the event arrives, on a
CI machine; lint says so at the desk instead.
"""
from __future__ import annotations

from collections.abc import Iterator

from ...language.diagnostics import Diagnostic
from ...language.github_events import COMPATIBLE, field_type, path_parts
from ..registry import LintContext, did_you_mean, quoted_list, rule


@rule
def on_input_unknown(ctx: LintContext) -> Iterator[Diagnostic]:
    for trigger in ctx.loop.on:
        for name in trigger.inputs:
            if name not in ctx.loop.inputs:
                yield ctx.diag("on-input-unknown",
                               f"on.{trigger.event} maps the event into input '{name}', which the loop does not "
                               f"declare{did_you_mean(name, ctx.loop.inputs)}",
                               (*trigger.yaml_path, "inputs", name),
                               hint=f"declare it under `inputs:` or remove it (declared: {quoted_list(ctx.loop.inputs)})")


@rule
def on_event_path(ctx: LintContext) -> Iterator[Diagnostic]:
    for trigger in ctx.loop.on:
        for name, path in trigger.inputs.items():
            where = (*trigger.yaml_path, "inputs", name)
            parts = path_parts(path)
            if parts is None:
                yield ctx.diag("on-event-path", f"'{path}' is not a path into the event",
                               where, value=True,
                               hint="write `event.` then field names, e.g. event.pull_request.number "
                                    "(a path, not a {{ template }}: the value is read as data)")
                continue
            kind, known = field_type(trigger.event, parts)
            if kind is None:
                done = ".".join(["event", *parts[:_depth(trigger.event, parts)]])
                missing = parts[_depth(trigger.event, parts)]
                yield ctx.diag("on-event-path",
                               f"a {trigger.event} event has no '{path}'{did_you_mean(missing, known)}",
                               where, value=True, hint=f"fields of {done}: {quoted_list(known, 12)}")


def _depth(event: str, parts: list[str]) -> int:
    """How many leading parts of the path the payload table knows."""
    for i in range(len(parts), 0, -1):
        if field_type(event, parts[:i])[0] is not None:
            return i
    return 0


@rule
def on_input_type(ctx: LintContext) -> Iterator[Diagnostic]:
    for trigger in ctx.loop.on:
        for name, path in trigger.inputs.items():
            spec = ctx.loop.inputs.get(name)
            parts = path_parts(path)
            if spec is None or parts is None:
                continue
            kind, _ = field_type(trigger.event, parts)
            if kind is not None and kind not in COMPATIBLE.get(spec.type, {spec.type}):
                yield ctx.diag("on-input-type",
                               f"input '{name}' is {spec.type} but {path} is {_a(kind)} {kind}",
                               (*trigger.yaml_path, "inputs", name), value=True,
                               hint=f"map a field of type {spec.type}, or change the input's `type`")


def _a(kind: str) -> str:
    return "an" if kind[0] in "aeiou" else "a"


@rule
def on_input_missing(ctx: LintContext) -> Iterator[Diagnostic]:
    for trigger in ctx.loop.on:
        unset = [name for name, spec in ctx.loop.inputs.items()
                 if spec.required and not spec.has_default and name not in trigger.inputs]
        if unset:
            yield ctx.diag("on-input-missing",
                           f"a run started by on.{trigger.event} has no value for required input(s) "
                           f"{', '.join(unset)}",
                           trigger.yaml_path,
                           hint=f"map them from the event (`inputs: {{{unset[0]}: event.<field>}}`) or give them a `default`")
