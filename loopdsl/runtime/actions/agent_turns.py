"""One turn of an agent's conversation: a model call with its fallbacks, retried in place.

Every turn goes through `LlmCaller._paid_call`, so it is reserved, committed, charged and
stored exactly as an `llm` call is (actions/llm.py). What differs: the key a turn is
stored under holds its turn number, the tool definitions are counted in the
reservation, fallbacks stick (once entry k answered, later turns start at k and reserve
at the dearest of k..n), and a transient error is retried on the same turn, so a 429 on
turn 15 does not throw away 14 paid turns: as the state's `retry` allows (its `on`, and its
`max_attempts` in all, the attempts after the turn's included).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...language.agent_model import AgentAction
from ...language.model import ModelAlias
from ..errors import StepFailure
from ..run_state import checked_response
from ..model_port import LlmRequest, ProviderError
from ..retry import backoff_delay
from ..run_keys import agent_key  # its home is with the other store keys; agent.py imports it from here
from .llm import CallContext

if TYPE_CHECKING:
    from ..engine import Engine

# Errors of one turn that are retried in place (each retry reserved anew).
TURN_RETRIED = frozenset({"rate_limit", "server_error", "timeout", "connection"})


class TurnCaller:
    """Calls the model for each turn of one attempt of one agent state."""

    def __init__(self, engine: "Engine", action: AgentAction, ids: dict[str, Any]) -> None:
        self.engine = engine
        self.action = action
        self.alias: ModelAlias = engine.loop.models[action.model]
        self.ids = ids  # run, state, visit, attempt
        self.chain = [self.alias.model, *self.alias.fallbacks]
        self.priced = [(m, engine.llm._price(self.alias, m)) for m in self.chain]
        self.start = 0  # the fallback entry that answered last: later turns start there
        max_tokens = action.max_tokens or self.alias.max_tokens
        if not max_tokens:
            raise StepFailure("budget", f"model '{self.alias.name}' has no max_tokens; set it on the agent or the alias")
        self.max_tokens = int(max_tokens)

    def key(self, turn: int, index: int) -> str:
        return agent_key("turn", **self.ids, turn=turn, fallback=index, model=self.chain[index])

    async def turn(self, turn: int, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
        """The reply of turn `turn` (stored, or paid now), retried in place on transient errors."""
        failures = 0
        retry = self.engine.loop.states[self.ids["state"]].retry
        while True:
            try:
                return await self._once(turn, messages, tools)
            except StepFailure as failure:
                failures += 1
                # Only what the state's `retry.on` lists, and within its `max_attempts` in all:
                # the attempt retried after these does not start them over.
                if failure.kind not in TURN_RETRIED or failure.kind not in retry.on or failures >= retry.max_attempts:
                    failure.in_place = failures - 1
                    raise
                delay = backoff_delay(retry, failures, failure.retry_after, self.engine.ports.clock)
                self.engine.emit("turn_retry", state=self.ids["state"], attempt=self.ids["attempt"], turn=turn,
                                 kind=failure.kind, message=failure.message, delay_s=round(delay, 3))
                await self.engine._sleep(delay)

    async def _once(self, turn: int, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
        store = self.engine.ports.responses
        # A resumed run first looks for a reply paid before the crash, at any entry it may
        # have fallen back to: an entry that failed then must not be asked (and paid) again.
        for index in range(self.start, len(self.chain)):
            stored = checked_response(store.get_response(self.key(turn, index)), "model_reply", self.ids["run"])
            if stored is not None:
                self.start = index
                return dict(stored, replayed=True, fallback=index)
        last: ProviderError | None = None
        for index in range(self.start, len(self.chain)):
            request = self._request(turn, index, messages, tools)
            cc = CallContext(self.ids["run"], self.ids["state"], self.ids["visit"], self.ids["attempt"], "",
                             pending_extra={"turn": turn})
            try:
                reply = await self.engine.llm._paid_call(request, self.priced, self.key(turn, index),
                                                         None, cc, reserve_from=index,
                                                         keep_messages=False)
            except ProviderError as exc:
                last = exc
                continue
            self.start = index
            return dict(reply, fallback=index)
        assert last is not None
        raise StepFailure(last.kind, last.message, retry_after=last.retry_after)

    def _request(self, turn: int, index: int, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> LlmRequest:
        alias, action = self.alias, self.action
        first = index == 0  # provider-specific settings belong to the alias's own model only
        temperature = action.temperature if action.temperature is not None else alias.temperature
        return LlmRequest(
            model=self.chain[index], messages=tuple(messages), max_tokens=self.max_tokens, temperature=temperature,
            api_base=alias.api_base if first else None, api_key=self.engine.llm._api_key(alias) if first else None,
            timeout=alias.timeout, params=dict(alias.params) if first else {},
            priced=first and self.priced[0][1] is not None,
            tools=tuple(tools), tool_choice=self._tool_choice() if turn == 1 and tools else None,
            parallel_tool_calls=action.parallel_tool_calls if tools else None,
        )

    def _tool_choice(self) -> str | dict[str, Any] | None:
        choice = self.action.tool_choice
        if choice == "auto":
            return None  # the providers' default: not sent, so the request stays minimal
        if choice in ("required", "none"):
            return choice
        return {"type": "function", "function": {"name": choice}}
