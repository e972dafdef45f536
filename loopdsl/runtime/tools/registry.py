"""Which ToolBox serves each kind of tool, and what every kind is given to run in.

The agent action never knows a tool kind: it groups the tools an agent lists by
`ToolDef.kind` and asks the factory registered for that kind for a ToolBox. Kinds that
live in the runtime (shell tools, the built-in workspace tools) are registered here; kinds
that reach outside (MCP servers, in adapters/) are added by the API through `Ports.tool_kinds`.
"""
from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ...language.agent_model import AgentAction, ToolDef, ToolUse
from ...language.shell_places import NO_FACTS, InputFacts
from ..shell import run_command
from .base import ToolBox

# What every tool process gets of the environment, besides the secrets it lists.
BASE_ENV_KEYS = ("PATH", "HOME", "LANG", "TERM", "TMPDIR")


@dataclass
class ToolEnv:
    """Everything a ToolBox may use, for one attempt of one agent state."""

    workdir: Path
    env: Mapping[str, str]  # the run's environment; a kind keeps only BASE_ENV_KEYS of it
    secret_values: Mapping[str, str]  # declared secret -> value
    redact: Callable[[str], str]  # hides every secret of the run
    output_limit: int
    action: AgentAction
    worktree: bool
    inputs: Mapping[str, Any] = field(default_factory=dict)
    run: Mapping[str, Any] = field(default_factory=dict)  # {"id", "date"}
    shell: Callable[..., Any] = run_command  # the one shell runner (Ports.shell)
    facts: InputFacts = NO_FACTS  # what the loop's inputs prove to the shell rules (compile.input_facts)
    # Called with (call id, process description) once a tool's process runs: the agent
    # commits it, so that a resumed run can kill a call cut off by a crash.
    on_process: Callable[[str, dict[str, Any]], None] = lambda call_id, ref: None
    redactor: Any = None  # the engine's Redactor, for kinds that redact error text themselves
    # A resumed attempt's stored tool definitions (function dicts): kinds that list their
    # tools (MCP) offer these instead of listing again. None: a fresh attempt.
    stored_definitions: Sequence[Mapping[str, Any]] | None = None
    engine: Any = None  # the caller's engine, for sub-loop tools (child runs share its budget and store)
    ids: Mapping[str, Any] = field(default_factory=dict)  # run, state, visit, attempt of the agent
    # The run's RunCommands (runtime/commands.py): a kind that starts a process of its own
    # (an MCP server) enters it there, so that `resume` stops it after a crash.
    commands: Any = None

    def command_started(self, ref: Any, what: str) -> None:
        if self.commands is not None:
            self.commands.started(ref, what)

    def command_ended(self, ref: Any) -> None:
        if self.commands is not None:
            self.commands.ended(ref)

    def base_env(self) -> dict[str, str]:
        return {k: self.env[k] for k in BASE_ENV_KEYS if k in self.env}


class ToolBoxFactory(Protocol):
    """Opens the tools of one kind for one attempt (an MCP server starts here)."""

    def __call__(self, tools: Sequence[tuple[ToolDef, ToolUse]], env: ToolEnv) -> Awaitable[ToolBox]: ...


async def open_workspace_tools(tools: Sequence[tuple[ToolDef, ToolUse]], env: ToolEnv) -> ToolBox:
    """The built-in tools an agent lists; the writing ones only in a worktree."""
    from .workspace import WorkspaceTools  # its own module: confinement code most runs never load

    # `paths:` narrows the one listing it is written on: tools listed with the same globs
    # (or none) share a box, so `{name: read_file, paths: [src/**]}` leaves list_files whole.
    groups: dict[tuple[str, ...], list[str]] = {}
    for tool, use in tools:
        groups.setdefault(tuple(use.paths), []).append(tool.name)
    boxes = [WorkspaceTools(env.workdir, writable=env.worktree, writable_globs=env.action.writable,
                            read_ignored=env.action.read_ignored, paths=paths, output_limit=env.output_limit,
                            redactor=env.redact, tools=names)
             for paths, names in groups.items()]
    return boxes[0] if len(boxes) == 1 else ToolBoxes(boxes)


# kind -> "module:attribute" of its factory, imported when an agent first uses that kind.
RUNTIME_KINDS: dict[str, str] = {
    "shell": "loopdsl.runtime.tools.shell_tools:open_shell_tools",
    "builtin": "loopdsl.runtime.tools.registry:open_workspace_tools",
    "loop": "loopdsl.runtime.tools.subloop_tools:open_subloop_tools",
}


def factory_for(kind: str, extra: Mapping[str, ToolBoxFactory]) -> ToolBoxFactory | None:
    if kind in extra:
        return extra[kind]
    target = RUNTIME_KINDS.get(kind)
    if target is None:
        return None
    module, _, name = target.partition(":")
    try:
        return getattr(importlib.import_module(module), name)  # type: ignore[no-any-return]
    except (ImportError, AttributeError):
        return None


def group_by_kind(tools: Sequence[tuple[ToolDef, ToolUse]]) -> dict[str, list[tuple[ToolDef, ToolUse]]]:
    groups: dict[str, list[tuple[ToolDef, ToolUse]]] = {}
    for tool, use in tools:
        groups.setdefault(tool.kind, []).append((tool, use))
    return groups


class ToolBoxes:
    """Several ToolBoxes of one kind (one per MCP server) seen as one."""

    def __init__(self, boxes: Sequence[ToolBox], on_close: Callable[[], None] = lambda: None) -> None:
        self.boxes = list(boxes)
        self._on_close = on_close  # once every box is closed (their processes are gone)
        self._by_name = {spec.name: box for box in self.boxes for spec in box.specs()}

    def specs(self) -> Sequence[Any]:
        return [spec for box in self.boxes for spec in box.specs()]

    async def call(self, name: str, args: Mapping[str, Any], *, call_id: str, timeout: float) -> Any:
        return await self._by_name[name].call(name, args, call_id=call_id, timeout=timeout)

    async def ready(self) -> None:
        for box in self.boxes:
            ready = getattr(box, "ready", None)  # only some kinds take something at the start
            if ready is not None:
                await ready()

    async def aclose(self) -> None:
        for box in self.boxes:
            await box.aclose()
        self._on_close()
