"""Stubbed tool results, so that a loop test runs side-effecting and MCP tools offline.

A loop test may say what a tool answers (`tools: {issues__get_issue: {result: {...}}}`):
every call of that tool gets that result, or that error, instead of running. The stub is a
ToolBox wrapped around the real one of the tool's kind, so the model is offered what it
would be offered in a real run (the same names, descriptions and parameters), its
arguments are still checked against the tool's parameters, and each call is still a
durable, budgeted turn of the agent: only what the tool does is replaced. An MCP server
whose offered tools are all stubbed is never started; its tools are offered with the
description the stub gives (or a plain one) and any object as arguments.
"""
from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...language.agent_model import ToolDef, ToolUse
from .base import ToolBox, ToolOutcome, ToolSpec
from ..errors import StepFailure
from .registry import RUNTIME_KINDS, ToolBoxFactory, ToolEnv, factory_for

ANY_ARGUMENTS: Mapping[str, Any] = {"type": "object"}


@dataclass(frozen=True)
class ToolStub:
    """What every call of one tool answers: `result` (ok), or `error` (a failed call)."""

    result: Any = None
    error: str | None = None
    description: str | None = None  # offered when the real description is unknown (MCP)

    @classmethod
    def from_mapping(cls, name: str, raw: Any) -> ToolStub:
        """`{result}` or `{error}` (and maybe `description`), as a loop test writes it;
        ValueError saying what is wrong otherwise."""
        keys = set(raw) if isinstance(raw, Mapping) else set()
        if not isinstance(raw, Mapping) or not keys <= {"result", "error", "description"} \
                or len(keys & {"result", "error"}) != 1:
            raise ValueError(f"the stub of tool {name!r} must be a mapping with exactly one of `result` or "
                             f"`error` (and maybe `description`), not {raw!r:.200}")
        if "error" in raw and not (isinstance(raw["error"], str) and raw["error"]):
            raise ValueError(f"the stub of tool {name!r}: `error` must be a non-empty string")
        return cls(result=raw.get("result"), error=raw.get("error"), description=raw.get("description"))

    def outcome(self) -> ToolOutcome:
        if self.error is not None:
            return ToolOutcome(ok=False, error=self.error, extra={"stubbed": True})
        return ToolOutcome(ok=True, result=self.result, extra={"stubbed": True})


class StubbedToolBox:
    """A ToolBox answering the stubbed names itself and passing the others to `inner`."""

    def __init__(self, inner: ToolBox | None, stubs: Mapping[str, ToolStub], extra: Sequence[ToolSpec] = ()) -> None:
        self.inner = inner
        self.stubs = dict(stubs)
        self._specs = [*(inner.specs() if inner is not None else ()), *extra]
        self._by_name = {spec.name: spec for spec in self._specs}

    def specs(self) -> Sequence[ToolSpec]:
        return list(self._specs)

    async def call(self, name: str, args: Mapping[str, Any], *, call_id: str, timeout: float) -> ToolOutcome:
        stub = self.stubs.get(name)
        if stub is None:
            if self.inner is None:  # the agent only routes offered names here
                return ToolOutcome.failure(f"unknown tool {name!r}")
            return await self.inner.call(name, args, call_id=call_id, timeout=timeout)
        started = time.monotonic()
        problem = _argument_problem(self._by_name.get(name), args)
        if problem is not None:
            return ToolOutcome.failure(problem, duration_s=time.monotonic() - started)
        outcome = stub.outcome()
        outcome.duration_s = time.monotonic() - started
        return outcome

    async def aclose(self) -> None:
        if self.inner is not None:
            await self.inner.aclose()


def _argument_problem(spec: ToolSpec | None, args: Any) -> str | None:
    """The check a real call makes before it runs: the arguments fit the offered schema."""
    from ...language.user_schema import InvalidSchema, SchemaTimeout, schema_errors

    if not isinstance(args, Mapping):
        return "arguments must be a JSON object"
    if spec is None:
        return None
    try:
        problems = schema_errors(dict(spec.parameters), dict(args))
    except (InvalidSchema, SchemaTimeout) as exc:
        return f"cannot check the arguments: {exc}"
    return "invalid arguments: " + "; ".join(problems[:5]) if problems else None


def offered_names(tool: ToolDef) -> list[str]:
    """The names the model calls one `tools:` entry by (an MCP entry offers several)."""
    if tool.kind == "mcp":
        return [allowed.as_ or f"{tool.name}__{allowed.name}" for allowed in tool.allow]
    return [tool.name]


def _stub_spec(tool: ToolDef, name: str, stub: ToolStub) -> ToolSpec:
    if tool.kind == "mcp":
        description = stub.description or f"{name} (from the MCP server '{tool.name}')"
        return ToolSpec(name, description, ANY_ARGUMENTS, idempotent=tool.idempotent)
    return ToolSpec(name, stub.description or tool.description, tool.parameters_schema(), idempotent=tool.idempotent)


def _stubbing(kind: str, real: ToolBoxFactory | None, stubs: Mapping[str, ToolStub]) -> ToolBoxFactory:
    async def open_tools(tools: Sequence[tuple[ToolDef, ToolUse]], env: ToolEnv) -> ToolBox:
        mine = {name: stubs[name] for tool, _use in tools for name in offered_names(tool) if name in stubs}
        # A tool whose every offered name is stubbed needs nothing real: an MCP server is
        # not started, a sub-loop tool not prepared. Built-in and shell tools are opened
        # anyway (cheap, nothing runs), so the model is offered exactly their definitions.
        fully = [(t, u) for t, u in tools if kind not in ("builtin", "shell")
                 and all(n in stubs for n in offered_names(t))]
        rest = [(t, u) for t, u in tools if (t, u) not in fully]
        inner = None
        if rest:
            if real is None:
                names = ", ".join(t.name for t, _ in rest)
                raise StepFailure("parse", f"tools of kind '{kind}' cannot run here ({names})")
            inner = await real(rest, env)
        extra = [_stub_spec(t, n, stubs[n]) for t, _u in fully for n in offered_names(t)]
        return StubbedToolBox(inner, mine, extra)

    return open_tools


def stubbed_kinds(kinds: Mapping[str, ToolBoxFactory], stubs: Mapping[str, ToolStub]) -> dict[str, ToolBoxFactory]:
    """Every tool kind (the runtime's own and `kinds`, the adapters'), each wrapped so that
    the stubbed names answer from `stubs`: what `Ports.tool_kinds` gets in a loop test."""
    if not stubs:
        return dict(kinds)
    every = {*RUNTIME_KINDS, *kinds, "loop", "mcp"}
    return {kind: _stubbing(kind, factory_for(kind, kinds), stubs) for kind in every}


__all__ = ["StubbedToolBox", "ToolStub", "offered_names", "stubbed_kinds"]
