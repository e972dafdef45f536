"""Tool kinds served by adapters, plugged into the engine's tool registry (Ports.tool_kinds).

The runtime may not import adapters (the layers), so the API hands the engine a factory
for each kind that lives there: today the stdio MCP servers of adapters/mcp_tools.py.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..language.agent_model import ToolDef, ToolUse
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
    try:
        for tool, _use in tools:
            assert tool.mcp is not None
            allow = [a.name if a.as_ is None else {"name": a.name, "as": a.as_} for a in tool.allow]
            entry = McpEntry.build(tool.name, tool.mcp.command, mcp_env(tool.mcp.env, env.secret_values), allow,
                                   tool.mcp.startup_timeout, tool.idempotent)
            offered = {a.offered for a in entry.allow}
            stored = None if env.stored_definitions is None else [
                d for d in env.stored_definitions if (d.get("function") or {}).get("name") in offered]
            boxes.append(await McpToolBox.open(entry, redactor=env.redactor, output_limit=env.output_limit,
                                               definitions=stored, cwd=env.workdir, environ=env.env))
    except BaseException:
        for box in boxes:  # the servers already started must not outlive a failed start
            await box.aclose()
        raise
    return ToolBoxes(boxes)


def adapter_tool_kinds() -> dict[str, ToolBoxFactory]:
    return {"mcp": open_mcp_tools}


__all__ = ["adapter_tool_kinds", "mcp_env", "open_mcp_tools"]
