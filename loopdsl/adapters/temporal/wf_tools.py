"""An agent's tools on Temporal: the workflow offers them to the model, an activity runs each call.

A tool call reads and writes the worker's checkout (built-in tools) or starts a command
(shell tools): an effect, so never workflow code, where a replay would run it again on a
tree it already changed. The workflow side only knows the tools' specs (static data); the
`loopdsl.tool` activity opens the state's tools on the serving worker, from the run's loop
(cached by the hashes recorded at its start), runs the one call and returns its outcome,
which the history keeps: a replay reads it from there.

Only the runtime's own kinds run here; others (MCP servers, sub-loops as tools) need a
process or a run of their own that outlives one call and say so when an agent lists them.
"""
from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from temporalio import workflow
from temporalio.exceptions import ActivityError

from ...language.agent_model import ToolDef, ToolUse
from ...runtime.tools.base import ToolOutcome, ToolSpec, check_names
from . import loops
from .wf_ports import stop_if_cancelled, under
from .wire import TOOL

if TYPE_CHECKING:
    from ...runtime.tools.registry import ToolEnv

# The kinds an activity can open on any worker, per call.
REMOTE_KINDS = ("builtin", "shell")


def _specs(kind: str, tools: Sequence[tuple[ToolDef, ToolUse]]) -> list[ToolSpec]:
    if kind == "builtin":
        from ...runtime.tools.workspace import SPECS

        return [SPECS[tool.name] for tool, _use in tools]
    return [ToolSpec(tool.name, tool.description, tool.parameters_schema(), idempotent=tool.idempotent)
            for tool, _use in tools]


class RemoteToolBox:
    """The ToolBox protocol with every call an activity; nothing stays open between calls."""

    def __init__(self, specs: Sequence[ToolSpec], base_arg: dict[str, Any], options: Callable[[float], dict[str, Any]]):
        self._specs = check_names(specs)
        self._base_arg, self._options = base_arg, options

    def specs(self) -> Sequence[ToolSpec]:
        return list(self._specs.values())

    async def call(self, name: str, args: Mapping[str, Any], *, call_id: str, timeout: float) -> ToolOutcome:
        arg = {**self._base_arg, "name": name, "args": dict(args), "call_id": call_id, "timeout": timeout}
        try:
            out = await workflow.execute_activity(TOOL, arg, **self._options(timeout))
        except ActivityError as exc:  # the worker running it was lost: the model is told, as for a failure
            stop_if_cancelled(exc)
            return ToolOutcome.failure(f"{name}: the worker running the call was lost ({exc.cause})")
        return ToolOutcome(**out)

    async def aclose(self) -> None:
        return None


def _loop_file(source: Any, loop_path: str) -> str:
    """The file of the loop whose agent calls: relative to the worker's root when inside it
    (a bundled loop's parts are not: then as the loading worker named it)."""
    if not source:
        return loop_path
    try:
        return under(source, loops.root())
    except ValueError:
        return str(source)


def remote_kinds(run_arg: Mapping[str, Any], options: Callable[[float], dict[str, Any]]) -> dict[str, Any]:
    """`Ports.tool_kinds` for the workflow: each runtime kind served by the tool activity.
    `run_arg` says where the worker finds the run's loop (path, script, file hashes, workdir)."""

    def factory(kind: str) -> Any:
        async def open_remote(tools: Sequence[tuple[ToolDef, ToolUse]], env: "ToolEnv") -> RemoteToolBox:
            source = getattr(env.engine, "loop", None) and env.engine.loop.source
            base = {**run_arg, "loop_file": _loop_file(source, run_arg["loop_path"]),
                    "kind": kind, "state": env.ids["state"], "tools": [use.name for _tool, use in tools],
                    "inputs": dict(env.inputs), "run": dict(env.run)}
            return RemoteToolBox(_specs(kind, tools), base, options)

        return open_remote

    return {kind: factory(kind) for kind in REMOTE_KINDS}


def outcome_json(outcome: ToolOutcome) -> dict[str, Any]:
    return asdict(outcome)
