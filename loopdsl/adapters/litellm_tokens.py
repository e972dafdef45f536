"""Prompt tokens to reserve for, counted with LiteLLM's `token_counter`, once per message.

An agent's conversation grows by a few messages a turn and every turn is reserved for the
whole of it; counting all of it each turn is quadratic in the conversation (the tokenizer
was the largest cost of loopdsl's own per turn). LiteLLM's count of a message list is a sum:
a constant (the reply primer, the tool definitions, less a discount when a system message is
present) plus one term per message that depends on that message alone (its
`messages_reach_token_count` relies on the same sum). So a request that extends one counted
before is counted as the earlier total plus the new messages' own terms; anything else (a
different model or tools, a changed prefix, a new system message) is counted whole. The
equality with a whole count is a property test (tests/adapters/test_token_tally.py), so a
reservation never counts fewer tokens than the whole count would.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..language.prices import model_provider
from .litellm_loading import ensure_litellm

# Providers whose prompts LiteLLM counts with the provider's real tokenizer (tiktoken).
EXACT_TOKENIZER_PROVIDERS = frozenset({"openai", "azure", "text-completion-openai", "azure_text"})
ESTIMATE_MARGIN = 1.25
# Conversations remembered at once: one per agent attempt in flight (fan-outs run several).
_REMEMBERED = 16


def tokenizer_is_exact(model: str) -> bool:
    """Whether LiteLLM's `token_counter` uses the provider's real tokenizer for `model`."""
    return model_provider(model) in EXACT_TOKENIZER_PROVIDERS


def _raw_count(model: str, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]]) -> int:
    litellm = ensure_litellm()
    return int(litellm.token_counter(model=model, messages=[dict(m) for m in messages],
                                     tools=[dict(t) for t in tools] or None))


def _with_margin(model: str, counted: int) -> int:
    return counted if tokenizer_is_exact(model) else math.ceil(ESTIMATE_MARGIN * counted)


def count_prompt_tokens(model: str, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] = ()) -> int:
    """Prompt tokens to reserve, tool definitions included: exact for OpenAI models, else
    ceil(1.25 x LiteLLM's estimate). Counts everything, every call."""
    return _with_margin(model, _raw_count(model, messages, tools))


@dataclass
class _Counted:
    model: str
    tools: tuple[Mapping[str, Any], ...]
    messages: tuple[Mapping[str, Any], ...]
    raw: int  # LiteLLM's count of exactly these messages and tools, before any margin


class TokenTally:
    """Counts requests like `count_prompt_tokens`, reusing the count of a conversation's
    earlier request when the new one extends it (the same model, tools and messages, plus
    messages appended that are not system messages)."""

    def __init__(self) -> None:
        self._seen: list[_Counted] = []  # most recently used last
        self._empty: dict[str, int] = {}  # model -> the count of no message (the reply primer)

    def count(self, model: str, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] = ()) -> int:
        messages, tools = tuple(messages), tuple(tools)
        earlier = self._extended(model, messages, tools)
        if earlier is None:
            raw = _raw_count(model, messages, tools)
        else:
            # The new messages without tools count their own terms plus the constant of no
            # message (the reply primer), which the earlier total already holds.
            raw = earlier.raw + _raw_count(model, messages[len(earlier.messages):], ()) - self._empty_count(model)
            self._seen.remove(earlier)
        self._seen.append(_Counted(model, tools, messages, raw))
        del self._seen[:-_REMEMBERED]
        return _with_margin(model, raw)

    def _extended(self, model: str, messages: tuple[Mapping[str, Any], ...],
                  tools: tuple[Mapping[str, Any], ...]) -> _Counted | None:
        for earlier in reversed(self._seen):
            n = len(earlier.messages)
            if earlier.model != model or n == 0 or n > len(messages) or earlier.tools != tools:
                continue
            # Equal dicts; their strings are usually the same objects, so this is cheap.
            if earlier.messages != messages[:n]:
                continue
            if any(m.get("role") == "system" for m in messages[n:]):
                return None  # a system message changes the tool definitions' count
            return earlier
        return None

    def _empty_count(self, model: str) -> int:
        if model not in self._empty:
            self._empty[model] = _raw_count(model, (), ())
        return self._empty[model]
