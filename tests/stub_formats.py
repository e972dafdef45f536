"""Reply bodies of the loopback model stub (`stub_server`), in each provider's wire format.

A `StubReply` is provider-neutral (text, OpenAI-shaped tool calls, usage, finish
reason); these functions write it as OpenAI chat completions or Anthropic Messages
would. Tool calls that are not well formed are passed through as they are, so tests
can send garbage to the client.
"""
from __future__ import annotations

import json
import time
from typing import Any

# OpenAI finish reasons and their Anthropic stop reasons.
_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def _finish_reason(reply: Any) -> Any:
    if reply.finish_reason is not None:
        return reply.finish_reason
    return "tool_calls" if reply.tool_calls else "stop"


def openai_body(reply: Any, model: str) -> bytes:
    message: dict[str, Any] = {"role": "assistant", "content": reply.text}
    if reply.tool_calls is not None:
        message["tool_calls"] = reply.tool_calls
    payload: dict[str, Any] = {
        "id": f"chatcmpl-stub-{time.monotonic_ns()}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": _finish_reason(reply)}],
    }
    if not reply.omit_usage:
        payload["usage"] = {
            "prompt_tokens": reply.prompt_tokens,
            "completion_tokens": reply.completion_tokens,
            "total_tokens": reply.prompt_tokens + reply.completion_tokens,
        }
    return json.dumps(payload).encode()


def _tool_use_block(call: Any) -> Any:
    """An OpenAI tool call as Anthropic's `tool_use` block; anything malformed stays as it is."""
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        return call
    arguments = function.get("arguments")
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        parsed = arguments  # Anthropic sends objects; a test of garbage gets its string through
    return {"type": "tool_use", "id": call.get("id"), "name": function.get("name"), "input": parsed}


def anthropic_body(reply: Any, model: str) -> bytes:
    content: list[Any] = []
    if reply.text:
        content.append({"type": "text", "text": reply.text})
    if isinstance(reply.tool_calls, list):
        content.extend(_tool_use_block(call) for call in reply.tool_calls)
    elif reply.tool_calls is not None:
        content = reply.tool_calls  # garbage in place of the content list
    finish = _finish_reason(reply)
    payload: dict[str, Any] = {
        "id": f"msg_stub_{time.monotonic_ns()}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": _STOP_REASONS.get(finish, finish),
        "stop_sequence": None,
    }
    if not reply.omit_usage:
        payload["usage"] = {"input_tokens": reply.prompt_tokens, "output_tokens": reply.completion_tokens}
    return json.dumps(payload).encode()


def openai_error_body(reply: Any) -> bytes:
    kind = "rate_limit_exceeded" if reply.status == 429 else "server_error"
    return json.dumps({"error": {"message": reply.error_message, "type": kind, "code": reply.status}}).encode()


def anthropic_error_body(reply: Any) -> bytes:
    kind = {429: "rate_limit_error", 401: "authentication_error", 400: "invalid_request_error"}.get(reply.status, "api_error")
    return json.dumps({"type": "error", "error": {"type": kind, "message": reply.error_message}}).encode()
