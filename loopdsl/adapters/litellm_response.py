"""A LiteLLM response object -> our `LlmResponse`: text, tool calls, finish reason, usage, cost.

Every field is hostile: tool calls without an id or a name, or with arguments that are not
a string, fail `parse` (the model's malformed answer; the reply arrived, so it counts as
billed); a missing or implausible usage is reported unknown (charged the whole
reservation), and a cost LiteLLM cannot give is unknown, never $0.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..runtime.budget import plausible_usage
from ..runtime.model_port import LlmRequest, LlmResponse, ProviderError, ToolCall


def _tool_calls(raw: Any, model: str) -> tuple[ToolCall, ...]:
    """The reply's tool calls, each with a non-empty id and name and string arguments
    (kept raw: the caller checks them against the tool's params); else `parse`."""
    if raw is None:
        return ()
    if not isinstance(raw, (list, tuple)):
        raise ProviderError("parse", f"{model}: the reply's tool_calls is not a list", billed=True)
    calls = []
    for index, call in enumerate(raw):
        function = getattr(call, "function", None)
        call_id, name = getattr(call, "id", None), getattr(function, "name", None)
        arguments = getattr(function, "arguments", None)
        if not (isinstance(call_id, str) and call_id and isinstance(name, str) and name and isinstance(arguments, str)):
            raise ProviderError("parse", f"{model}: tool call {index + 1} of the reply has no id, no name or "
                                "arguments that are not a string", billed=True)
        calls.append(ToolCall(id=call_id, name=name, arguments=arguments))
    return tuple(calls)


def _cost(litellm: Any, response: Any, request: LlmRequest) -> float | None:
    hidden = getattr(response, "_hidden_params", None) or {}
    cost = hidden.get("response_cost") if isinstance(hidden, Mapping) else None
    if cost is None and not request.priced:
        try:
            cost = litellm.completion_cost(completion_response=response)
        except Exception:  # noqa: BLE001 - LiteLLM raises for a model it cannot price: unknown, not free
            cost = None
    if isinstance(cost, bool) or not isinstance(cost, (int, float)) or not math.isfinite(cost) or cost < 0:
        return None  # unknown, never free (nor negative)
    return float(cost)


def response_to_llm(litellm: Any, response: Any, request: LlmRequest) -> LlmResponse:
    choices = getattr(response, "choices", None) or []
    if not choices:  # a 200 that says nothing: the work may still have been billed
        raise ProviderError("server_error", f"{request.model}: the provider returned no choices", billed=True)
    message = getattr(choices[0], "message", None)
    text = getattr(message, "content", None) or ""
    text = text if isinstance(text, str) else str(text)
    tool_calls = _tool_calls(getattr(message, "tool_calls", None), request.model)
    finish = getattr(choices[0], "finish_reason", None)
    finish_reason = finish if isinstance(finish, str) and finish else None
    model = str(getattr(response, "model", None) or request.model)
    usage = getattr(response, "usage", None)
    prompt_tokens = getattr(usage, "prompt_tokens", None)
    completion_tokens = getattr(usage, "completion_tokens", None)
    if not plausible_usage(prompt_tokens, completion_tokens):
        # LiteLLM turns a missing `usage` into zeros: never take that as a free call.
        return LlmResponse(text=text, prompt_tokens=0, completion_tokens=0, cost_usd=None, model=model,
                           usage_known=False, tool_calls=tool_calls, finish_reason=finish_reason)
    return LlmResponse(text=text, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                       cost_usd=_cost(litellm, response, request), model=model, tool_calls=tool_calls,
                       finish_reason=finish_reason)
