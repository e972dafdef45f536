"""Tool kinds served by adapters, plugged into the engine's tool registry (Ports.tool_kinds).

The runtime may not import adapters (the layers), so the API hands the engine a factory
for each kind that lives there: today the stdio MCP servers of adapters/mcp_tools.py.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pathlib import Path

from ..language.agent_model import AgentAction, ToolDef, ToolUse
from ..language.model import ModelAlias
from ..runtime.errors import StepFailure
from ..runtime.tools.base import ToolBox
from ..runtime.tools.registry import ToolBoxes, ToolBoxFactory, ToolEnv


def mcp_env(values: Mapping[str, str], secrets: Mapping[str, str]) -> dict[str, str]:
    """An `mcp.env` value is a literal, or exactly "$X" naming a declared secret."""
    out = {}
    for key, value in values.items():
        name = value[1:] if value.startswith("$") else None
        out[key] = secrets.get(name, "") if name is not None and name in secrets else value
    return out


async def open_mcp_tools(tools: Sequence[tuple[ToolDef, ToolUse]], env: ToolEnv) -> ToolBox:
    from ..adapters.mcp_tools import McpEntry, McpToolBox  # the mcp SDK loads only for loops with MCP tools

    boxes: list[ToolBox] = []
    servers: list[Any] = []  # their CommandRefs, entered in the run's record as they start (runtime/commands.py)

    def started(ref: Any, name: str) -> None:
        servers.append(ref)
        env.command_started(ref, f"mcp {name}")

    def forget_servers() -> None:  # stopped: out of the run's record
        for ref in servers:
            env.command_ended(ref)

    try:
        for tool, _use in tools:
            assert tool.mcp is not None
            entry = McpEntry.build(tool.name, tool.mcp.command, mcp_env(tool.mcp.env, env.secret_values), tool.allow,
                                   tool.mcp.startup_timeout, tool.idempotent)
            offered = {a.offered for a in entry.allow}
            stored = None if env.stored_definitions is None else [
                d for d in env.stored_definitions if (d.get("function") or {}).get("name") in offered]
            boxes.append(await McpToolBox.open(
                entry, redactor=env.redactor, output_limit=env.output_limit, definitions=stored, cwd=env.workdir,
                environ=env.env, on_start=lambda ref, name=tool.name: started(ref, name)))
    except BaseException:
        for box in boxes:  # the servers already started must not outlive a failed start
            await box.aclose()
        forget_servers()
        raise
    return ToolBoxes(boxes, on_close=forget_servers)


async def run_cli(*, action: AgentAction, alias: ModelAlias | None, prompt: str, workspace: Path, redactor: Any,
                  env: Mapping[str, str], timeout: float | None, charge: Any, on_start: Any,
                  on_event: Any = None) -> dict[str, Any]:
    """The `coding_cli` port: one CLI attempt, binary and extra flags from the model alias
    (`cli_path`, `cli_args` beside `model`), priced from the alias or the price table."""
    from ..adapters.coding_cli import CliSpec, prices_for, run_coding_cli, worst_call_usd  # only for CLI states

    model = alias.model.split("/", 1)[-1] if alias is not None else None
    spec = CliSpec(kind=str(action.cli), binary=(alias.cli_path if alias else None) or DEFAULT_BINARY[str(action.cli)],
                   extra_args=alias.cli_args if alias is not None else (), model=model,
                   max_turns=action.max_turns, permissions=action.permissions,
                   api_key_env=alias.api_key_env if alias is not None else None,
                   api_base=alias.api_base if alias is not None else None)
    prices = prices_for(alias.model if alias is not None else None, alias.price if alias is not None else None)
    worst = worst_call_usd(prices, alias.model if alias is not None else None) if prices is not None else None
    if prices is None or worst is None:
        raise StepFailure("budget", f"cannot price the {action.cli} CLI's spend: give the agent a `model` alias "
                          "with a `price:` and a model the price table knows the context window of")
    result = await run_coding_cli(spec, prompt=prompt, workspace=workspace, reservation_usd=float(action.max_cost_usd or 0),
                                  worst_call_usd=worst, prices=prices, redactor=redactor, base_env=env,
                                  api_key=env.get(spec.key_env()), timeout=timeout, charge=charge, on_start=on_start,
                                  on_event=on_event)
    return {**result.as_result(), "model": model}


DEFAULT_BINARY = {"claude-code": "claude", "codex": "codex"}


def adapter_tool_kinds() -> dict[str, ToolBoxFactory]:
    return {"mcp": open_mcp_tools}


__all__ = ["adapter_tool_kinds", "mcp_env", "open_mcp_tools", "run_cli"]
