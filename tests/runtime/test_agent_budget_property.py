"""Budgets are hard caps for agents too: a property test over >= 1,000 generated agent
conversations (turns that call tools, invalid and unknown calls, final answers, provider
errors, fallback chains, retries) under random token, cost and step caps.

Whatever happens: spent never passes a cap, no reservation is left open, every request
was reserved with its tool definitions counted, and the ledger's tokens are exactly the
reported usage of answered turns plus the whole reservation of turns that timed out.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import loopdsl
from loopdsl.language.model import build_loop
from loopdsl.runtime.model_port import LlmRequest, LlmResponse, ProviderError, ToolCall

EXAMPLES = 1000
ERRORS = ("rate_limit", "server_error", "timeout", "connection", "context_window")
TERMINAL = {"completed", "failed", "escalated", "budget_exhausted"}


@dataclass
class Turn:
    error: str | None = None
    calls: tuple[str, ...] = ()  # tool names; "" sends malformed JSON arguments
    prompt_percent: int = 100
    completion_percent: int = 100


@dataclass
class PlannedAgentProvider:
    plan: Sequence[Turn]
    calls: int = 0
    log: list[dict[str, Any]] = field(default_factory=list)

    def count_tokens(self, model: str, messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] = ()) -> int:
        return 10 + len(json.dumps(list(messages))) // 8 + len(json.dumps(list(tools))) // 8

    async def complete(self, request: LlmRequest, *, state: str, attempt: int | None = None) -> LlmResponse:
        turn = self.plan[self.calls % len(self.plan)]
        self.calls += 1
        counted = self.count_tokens(request.model, request.messages, request.tools)
        entry = {"counted": counted, "max_tokens": request.max_tokens, "error": turn.error, "tools": len(request.tools)}
        self.log.append(entry)
        if turn.error is not None:
            raise ProviderError(turn.error, f"planned {turn.error}", retry_after=0.0 if turn.error == "rate_limit" else None)
        entry["usage"] = turn.prompt_percent * counted // 100 + turn.completion_percent * request.max_tokens // 100
        usage = {"prompt_tokens": turn.prompt_percent * counted // 100,
                 "completion_tokens": turn.completion_percent * request.max_tokens // 100}
        if not turn.calls:
            return LlmResponse(text='{"done": true}', cost_usd=None, model=request.model, finish_reason="stop", **usage)
        calls = tuple(ToolCall(f"c{self.calls}_{i}", name or "probe", "{oops" if not name else '{"n": 1}')
                      for i, name in enumerate(turn.calls))
        return LlmResponse(text="", cost_usd=None, model=request.model, tool_calls=calls, finish_reason="tool_calls",
                           **usage)


prices = st.builds(lambda i, o: {"input_per_mtok": i, "output_per_mtok": o},
                   st.sampled_from([0, 0.15, 1, 5, 60]), st.sampled_from([0, 0.6, 4, 30, 120]))


# Built once, not in every example: hypothesis spends more time making and checking
# strategies drawn inside a composite than drawing from ready ones.
MAX_TOKENS = st.integers(1, 300)
BOOLS = st.booleans()
FALLBACKS = st.lists(st.sampled_from(["openai/gpt-4o-mini", "openai/gpt-4o"]), min_size=1, max_size=2, unique=True)
MAX_TURNS = st.integers(1, 8)
CALLS_PER_TURN = st.integers(1, 3)
ATTEMPTS = st.integers(2, 3)
TOKEN_CAP = st.integers(0, 4000)
COST_CAP = st.sampled_from([0, 1e-6, 1e-5, 1e-4, 1e-3, 0.01])
STEP_CAP = st.integers(1, 4)


@st.composite
def agent_loops(draw: st.DrawFn) -> dict[str, Any]:
    alias: dict[str, Any] = {"model": "openai/planned", "price": draw(prices), "max_tokens": draw(MAX_TOKENS)}
    if draw(BOOLS):
        alias["fallbacks"] = draw(FALLBACKS)
    agent: dict[str, Any] = {"model": "m", "prompt": "work {{ run.attempt }}", "tools": ["probe"],
                             "max_turns": draw(MAX_TURNS),
                             "max_tool_calls_per_turn": draw(CALLS_PER_TURN)}
    state: dict[str, Any] = {"agent": agent, "next": "done", "on_failure": "out"}
    if draw(BOOLS):
        state["retry"] = {"max_attempts": draw(ATTEMPTS), "backoff": {"initial": 0, "jitter": False}}
    data: dict[str, Any] = {
        "loopdsl": 1, "name": "generated-agent", "models": {"m": alias},
        "tools": {"probe": {"description": "Probe.", "params": {"n": {"type": "integer"}}, "shell": "true"}},
        "start": "work", "states": {"work": state, "done": {"end": "completed"}, "out": {"end": "escalated"}},
    }
    budget: dict[str, Any] = {}
    if draw(BOOLS):
        budget["tokens"] = draw(TOKEN_CAP)
    if draw(BOOLS):
        budget["cost_usd"] = draw(COST_CAP)
    if draw(BOOLS):
        budget["steps"] = draw(STEP_CAP)
    if budget:
        data["budget"] = budget
    return data


turns = st.builds(
    Turn,
    # None four times in five, else one of the errors (one draw, not a one_of's two)
    error=st.sampled_from([None] * 4 * len(ERRORS) + list(ERRORS)),
    calls=st.lists(st.sampled_from(["probe", "probe", "nope", ""]), max_size=3).map(tuple),
    prompt_percent=st.integers(0, 100),
    completion_percent=st.integers(0, 100),
)


def check(data: dict[str, Any], plan: list[Turn], work: Path) -> None:
    provider = PlannedAgentProvider(plan)
    result = loopdsl.run(build_loop(data), provider=provider, workdir=work)
    assert result.status in TERMINAL, result.status
    caps, spent = data.get("budget", {}), result.state.ledger
    if "tokens" in caps:
        assert spent["tokens"] <= caps["tokens"], (spent, caps)
    if "cost_usd" in caps:
        assert spent["cost_picousd"] <= round(caps["cost_usd"] * 1e12), (spent, caps)
    if "steps" in caps:
        assert spent["steps"] <= caps["steps"]
    assert not spent.get("outstanding")
    assert all(entry["tools"] == 1 for entry in provider.log)  # the definitions went with every turn
    expected = sum(e["usage"] for e in provider.log if e["error"] is None) + sum(
        e["counted"] + e["max_tokens"] for e in provider.log if e["error"] == "timeout")
    assert spent["tokens"] == expected, (spent, provider.log)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=agent_loops(), plan=st.lists(turns, min_size=1, max_size=8))
def test_agent_conversations_never_pass_a_cap(data: dict[str, Any], plan: list[Turn], tmp_path_factory: Any) -> None:
    check(data, plan, tmp_path_factory.getbasetemp())
