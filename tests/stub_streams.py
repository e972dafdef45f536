"""Streamed (server-sent events) reply bodies of the loopback model stub (`stub_server`).

The coding-agent CLIs only ever stream: Claude Code sends Anthropic Messages requests with
`stream: true`, and Codex speaks only the OpenAI Responses API (`POST /v1/responses`,
always streamed; `wire_api = "chat"` is refused by codex 0.171). These functions write a
provider-neutral `StubReply` (text, OpenAI-shaped tool calls, usage) as each one's event
stream, so the real binaries can run against the stub. The whole stream is written at once:
the clients parse it incrementally either way.
"""
from __future__ import annotations

import json
import time
from typing import Any

from stub_formats import _STOP_REASONS, _finish_reason, _tool_use_block


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


def anthropic_stream(reply: Any, model: str) -> bytes:
    """An Anthropic Messages stream: message_start (input usage), one content block per
    text and tool_use, message_delta (stop reason, output usage), message_stop."""
    usage = {} if reply.omit_usage else {"input_tokens": reply.prompt_tokens, "output_tokens": 0,
                                         "cache_read_input_tokens": reply.cache_read_tokens,
                                         "cache_creation_input_tokens": reply.cache_write_tokens}
    message = {"id": f"msg_stub_{time.monotonic_ns()}", "type": "message", "role": "assistant", "model": model,
               "content": [], "stop_reason": None, "stop_sequence": None, "usage": usage}
    out = [_sse("message_start", {"type": "message_start", "message": message})]
    blocks: list[Any] = [{"type": "text", "text": reply.text}] if reply.text else []
    blocks += [_tool_use_block(call) for call in reply.tool_calls or ()]
    for index, block in enumerate(blocks):
        if block.get("type") == "text":
            start, delta = {"type": "text", "text": ""}, {"type": "text_delta", "text": block["text"]}
        else:
            start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        out.append(_sse("content_block_start",
                        {"type": "content_block_start", "index": index, "content_block": start}))
        out.append(_sse("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}))
        out.append(_sse("content_block_stop", {"type": "content_block_stop", "index": index}))
    finish = _finish_reason(reply)
    end: dict[str, Any] = {"type": "message_delta",
                           "delta": {"stop_reason": _STOP_REASONS.get(finish, finish), "stop_sequence": None}}
    if not reply.omit_usage:
        end["usage"] = {"output_tokens": reply.completion_tokens}
    out.append(_sse("message_delta", end))
    out.append(_sse("message_stop", {"type": "message_stop"}))
    return b"".join(out)


def _response_items(reply: Any) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    if reply.text:
        text = {"type": "output_text", "text": reply.text, "annotations": []}
        items.append({"type": "message", "id": f"msg_stub_{time.monotonic_ns()}", "role": "assistant",
                      "status": "completed", "content": [text]})
    for call in reply.tool_calls or ():
        function = call.get("function") or {}
        items.append({"type": "function_call", "id": f"fc_{call.get('id')}", "call_id": call.get("id"),
                      "name": function.get("name"), "arguments": function.get("arguments"), "status": "completed"})
    return items


def responses_body(reply: Any, model: str) -> dict[str, Any]:
    """The `response` object of the OpenAI Responses API (as `response.completed` carries it)."""
    response: dict[str, Any] = {"id": f"resp_stub_{time.monotonic_ns()}", "object": "response",
                                "created_at": int(time.time()), "status": "completed", "model": model,
                                "output": _response_items(reply)}
    if not reply.omit_usage:
        # OpenAI counts cached (read and written) tokens inside input_tokens.
        given = reply.prompt_tokens + reply.cache_read_tokens + reply.cache_write_tokens
        response["usage"] = {"input_tokens": given,
                             "input_tokens_details": {"cached_tokens": reply.cache_read_tokens,
                                                      "cache_write_tokens": reply.cache_write_tokens},
                             "output_tokens": reply.completion_tokens,
                             "output_tokens_details": {"reasoning_tokens": 0},
                             "total_tokens": given + reply.completion_tokens}
    return response


def responses_stream(reply: Any, model: str) -> bytes:
    """A Responses API stream: created, each output item added and done (text deltas for
    messages), then `response.completed` with the usage."""
    response = responses_body(reply, model)
    started = {**response, "status": "in_progress", "output": []}
    started.pop("usage", None)
    out = [_sse("response.created", {"type": "response.created", "response": started})]
    for index, item in enumerate(response["output"]):
        pending = {**item, "status": "in_progress", "content": []} if item["type"] == "message" else item
        out.append(_sse("response.output_item.added", {"type": "response.output_item.added", "output_index": index,
                                                       "item": pending}))
        if item["type"] == "message":
            out.append(_sse("response.output_text.delta", {
                "type": "response.output_text.delta", "item_id": item["id"], "output_index": index,
                "content_index": 0, "delta": item["content"][0]["text"]}))
        out.append(_sse("response.output_item.done", {"type": "response.output_item.done", "output_index": index,
                                                      "item": item}))
    out.append(_sse("response.completed", {"type": "response.completed", "response": response}))
    return b"".join(out)
