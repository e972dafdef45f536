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
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Mapping, Sequence

from temporalio import workflow
from temporalio.exceptions import ActivityError

from ...language.agent_model import ToolDef, ToolUse
from ...runtime.errors import StepFailure
from ...runtime.tools.base import ToolOutcome, ToolSpec, check_names
from . import loops
from .wf_ports import stop_if_cancelled, under, worker_lost
from .wire import TOOL

if TYPE_CHECKING:
    from ...runtime.tools.registry import ToolEnv

# The kinds an activity can open on any worker, per call.
REMOTE_KINDS = ("builtin", "shell")
# The version of this workflow code that asks a person about a cut-off call (histories made
# before it told the model the call failed, and replay that way).
TOOL_CUT_OFF = "tool-cut-off-asks"
# (tool name, call id) -> "rerun", "skip" or "fail", as a person chose.
AskAfterLoss = Callable[[str, str], Awaitable[str]]


def _specs(kind: str, tools: Sequence[tuple[ToolDef, ToolUse]]) -> list[ToolSpec]:
    if kind == "builtin":
        from ...runtime.tools.workspace import SPECS

        return [SPECS[tool.name] for tool, _use in tools]
    return [ToolSpec(tool.name, tool.description, tool.parameters_schema(), idempotent=tool.idempotent)
            for tool, _use in tools]


class RemoteToolBox:
    """The ToolBox protocol with every call an activity; nothing stays open between calls."""

    def __init__(self, specs: Sequence[ToolSpec], base_arg: dict[str, Any], options: Callable[[float], dict[str, Any]],
                 ask: AskAfterLoss | None = None):
        self._specs = check_names(specs)
        self._base_arg, self._options = base_arg, options
        self._ask = ask  # what a person chooses for a cut-off call of a tool that is not idempotent

    def specs(self) -> Sequence[ToolSpec]:
        return list(self._specs.values())

    async def call(self, name: str, args: Mapping[str, Any], *, call_id: str, timeout: float) -> ToolOutcome:
        arg = {**self._base_arg, "name": name, "args": dict(args), "call_id": call_id, "timeout": timeout}
        while True:
            try:
                out = await workflow.execute_activity(TOOL, arg, **self._options(timeout))
                return ToolOutcome(**out)
            except ActivityError as exc:
                stop_if_cancelled(exc)
                if not worker_lost(exc) or self._ask is None or not workflow.patched(TOOL_CUT_OFF):
                    return ToolOutcome.failure(f"{name}: the worker running the call was lost ({exc.cause})")
            # Cut off mid-way, as after a crash on the local backend: an idempotent tool runs
            # again; for any other, the call may have done part of its work, so a person decides.
            choice = "rerun" if self._specs[name].idempotent else await self._ask(name, call_id)
            if choice == "skip":
                return ToolOutcome.failure(f"{name}: the call was cut off when its worker was lost, and a person "
                                           "chose to skip it (it may have done part of its work)")
            if choice == "fail":
                raise StepFailure("interrupted", f"a person chose to fail after tool call {call_id} ({name}) was "
                                                 "cut off when its worker was lost")

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


def remote_kinds(run_arg: Mapping[str, Any], options: Callable[[float], dict[str, Any]],
                 ask: AskAfterLoss | None = None) -> dict[str, Any]:
    """`Ports.tool_kinds` for the workflow: each runtime kind served by the tool activity.
    `run_arg` says where the worker finds the run's loop (path, script, file hashes, workdir)."""

    def factory(kind: str) -> Any:
        async def open_remote(tools: Sequence[tuple[ToolDef, ToolUse]], env: "ToolEnv") -> RemoteToolBox:
            source = getattr(env.engine, "loop", None) and env.engine.loop.source
            base = {**run_arg, "loop_file": _loop_file(source, run_arg["loop_path"]),
                    "kind": kind, "state": env.ids["state"], "tools": [use.name for _tool, use in tools],
                    "inputs": dict(env.inputs), "run": dict(env.run)}
            return RemoteToolBox(_specs(kind, tools), base, options, ask)

        return open_remote

    return {kind: factory(kind) for kind in REMOTE_KINDS}


def outcome_json(outcome: ToolOutcome) -> dict[str, Any]:
    return asdict(outcome)
