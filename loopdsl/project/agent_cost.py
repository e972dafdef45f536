"""The worst case of an `agent` state for dry runs and `loopdsl cost`, without LiteLLM
and without starting any MCP server (DSL.md, v1.1 precise rules, "Dry run and cost").

One attempt is at most `max_turns` turns; turn t sends the first request (P0: the prompt
as `llm` counts it, plus the tool definitions) and, at worst, everything the t-1 turns
before it added: each turn's `max_tokens` of reply and `max_tool_calls_per_turn` results
of `tool_output_limit` bytes each. Each turn is priced at the dearest model of the
fallback chain. A coding-agent CLI's worst case is its `max_cost_usd`.
"""
from __future__ import annotations

import json
from typing import Any

from ..language.agent_model import BUILTIN_TOOLS, AgentAction, resolve_tool
from ..language.model import Loop
from ..runtime.budget import conservative_tokens
from .prompt_size import prompt_size

# A built-in tool's definition when the workspace tools' own specs cannot be read.
BUILTIN_DEFINITION_TOKENS = 200


def definition_tokens(loop: Loop, action: AgentAction) -> int:
    """Tokens of the tool definitions sent with every turn. An MCP server's definitions are
    only known once it runs, so they count as its declared `schema_tokens`, once per server
    entry however many of its tools the agent lists."""
    total = 0
    servers: set[str] = set()
    for use in action.tools:
        tool = resolve_tool(loop.tools, use.name)
        if tool is None:
            continue
        if tool.kind == "mcp":
            if tool.mcp is not None and tool.name not in servers:
                servers.add(tool.name)
                total += tool.mcp.schema_tokens
            continue
        if tool.kind == "builtin":
            total += _builtin_tokens(use.name)
            continue
        definition = {"type": "function", "function": {"name": tool.name, "description": tool.description,
                                                       "parameters": tool.parameters_schema()}}
        total += conservative_tokens(json.dumps(definition))
    return total


def _builtin_tokens(name: str) -> int:
    try:
        from ..runtime.tools.workspace import SPECS  # the built-ins' own definitions, when installed
    except ImportError:
        return BUILTIN_DEFINITION_TOKENS
    spec = SPECS.get(name) if name in BUILTIN_TOOLS else None
    return conservative_tokens(json.dumps(spec.definition())) if spec is not None else BUILTIN_DEFINITION_TOKENS


def turn_prompts(p0: int, action: AgentAction, max_tokens: int) -> list[int]:
    """The worst prompt of each turn t = 1..max_turns."""
    per_turn = max_tokens + action.max_tool_calls_per_turn * conservative_tokens("x" * action.tool_output_limit)
    return [p0 + (t - 1) * per_turn for t in range(1, (action.max_turns or 1) + 1)]


def agent_worst(loop: Loop, action: AgentAction, skill_text: str, price_cost: Any,
                prices: list[Any], max_input: list[int | None]) -> dict[str, Any]:
    """prompt tokens (first turn), tokens and cost (None: a price is unknown) of one attempt.
    `price_cost(price, prompt, completion)` prices one call."""
    if action.cli is not None:
        return {"prompt": 0, "tokens": 0, "cost": action.max_cost_usd}
    alias = loop.models[action.model]
    max_tokens = int(action.max_tokens or alias.max_tokens or 0)
    size = prompt_size(loop, action, skill_text)  # type: ignore[arg-type]  (an agent's prompt is built like `llm`'s)
    p0 = max(size.worst_tokens(m) for m in max_input) + definition_tokens(loop, action)
    prompts = turn_prompts(p0, action, max_tokens)
    tokens = sum(p + max_tokens for p in prompts)
    if any(p is None for p in prices):
        return {"prompt": p0, "tokens": tokens, "cost": None}
    cost = sum(max(price_cost(price, p, max_tokens) for price in prices) for p in prompts)
    return {"prompt": p0, "tokens": tokens, "cost": cost}
