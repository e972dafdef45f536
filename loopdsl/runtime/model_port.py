"""The model port: one completion per call, with errors as kinds. `adapters.litellm` and `adapters.scripted` implement it."""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..language.bounded_json import without_lone_surrogates


PROVIDER_ERROR_KINDS = ("rate_limit", "server_error", "timeout", "connection", "auth", "context_window", "parse")


_CREDENTIAL_KEY = re.compile(r"(^|_)(api_?key|key|secret|password|passwd|token|authorization|credentials?|auth)($|_)")


# -- request / response / errors ------------------------------------------------
@dataclass(frozen=True)
class LlmRequest:
    """One completion to ask for.

    `messages` are OpenAI-format dicts, tool turns included: an assistant message with
    `tool_calls: [{"id", "type": "function", "function": {"name", "arguments"}}]` and
    `{"role": "tool", "tool_call_id", "content"}` answers. `tools` are OpenAI function
    tools (`ToolSpec.definition()`); `tool_choice` and `parallel_tool_calls` are sent only
    when set. `response_schema`: the JSON Schema the answer must match, sent as the
    provider's structured-output `response_format` where the model supports it and no
    tools are offered (the caller checks the answer itself either way).
    """

    model: str
    messages: tuple[dict[str, Any], ...]
    max_tokens: int
    temperature: float | None = None
    api_base: str | None = None
    api_key: str | None = field(default=None, repr=False, compare=False)  # never persisted
    timeout: float | None = None
    params: Mapping[str, Any] = field(default_factory=dict)
    # The caller charges this call at its own price (a loop's `price:` or the price table),
    # so LiteLLM's cost lookup (~0.6 ms a reply for a model it does not know) is skipped.
    priced: bool = field(default=False, compare=False)
    tools: tuple[dict[str, Any], ...] = ()
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_schema: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        # Deep copies: a caller that appends to its conversation must not change a sent request.
        object.__setattr__(self, "messages", tuple(json_copy(dict(m)) for m in self.messages))
        object.__setattr__(self, "params", dict(self.params))
        object.__setattr__(self, "tools", tuple(json_copy(dict(t)) for t in self.tools))
        object.__setattr__(self, "tool_choice", json_copy(self.tool_choice))

    def canonical(self) -> dict[str, Any]:
        """What determines the answer, as JSON-able data, without any credential.

        Used for response-cache keys and the run store. `timeout` is left out: it
        changes when we give up, not what the model says. The tool fields appear only
        when set, so the keys of tool-less requests stay what they were. `response_schema`
        is left out: the schema is already in the messages' instructions, and whether it
        is also sent follows from the model, which is in.
        """
        data: dict[str, Any] = {
            "model": self.model,
            "messages": [json_copy(m) for m in self.messages],
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "api_base": _strip_userinfo(self.api_base),
            "params": _without_credentials(self.params),
        }
        if self.tools:
            data["tools"] = [json_copy(t) for t in self.tools]
        if self.tool_choice is not None:
            data["tool_choice"] = json_copy(self.tool_choice)
        if self.parallel_tool_calls is not None:
            data["parallel_tool_calls"] = self.parallel_tool_calls
        return data


@dataclass(frozen=True)
class ToolCall:
    """One tool call of a reply. `arguments` is the raw string the model sent (it may not
    be JSON at all: checking it is the caller's job, and its error goes back to the model)."""

    id: str
    name: str
    arguments: str

    def to_data(self) -> dict[str, str]:
        return {"id": self.id, "name": self.name, "arguments": self.arguments}

    def to_message(self) -> dict[str, Any]:
        """The call as it goes back in the assistant message of the next request."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> ToolCall:
        return cls(id=str(data["id"]), name=str(data["name"]), arguments=str(data["arguments"]))


@dataclass
class LlmResponse:
    text: str
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float | None  # None: the provider's price is unknown (never read as $0)
    model: str
    # False: the reply's usage was missing or garbage, so the counts above mean nothing
    # and the call is charged its whole reservation (never 0).
    usage_known: bool = True
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: str | None = None  # "stop" | "length" | "tool_calls" | another provider word; None: not said

    def __post_init__(self) -> None:
        # The reply is the model's, and hostile: a lone surrogate in it (`"\ud800"` in the
        # provider's JSON) is no text a file, a command or a terminal can take.
        if isinstance(self.text, str):
            self.text = without_lone_surrogates(self.text)

    def tool_fields(self) -> dict[str, Any]:
        """What a stored response keeps besides text and usage, so a replayed turn is whole."""
        return {"tool_calls": [call.to_data() for call in self.tool_calls], "finish_reason": self.finish_reason}

    def assistant_message(self) -> dict[str, Any]:
        """This reply as the assistant message of the conversation's next request."""
        message: dict[str, Any] = {"role": "assistant", "content": self.text or None}
        if self.tool_calls:
            message["tool_calls"] = [call.to_message() for call in self.tool_calls]
        return message


def stored_tool_calls(stored: Mapping[str, Any]) -> tuple[ToolCall, ...]:
    """The tool calls of a response read back from the store (none in one stored before v1.1)."""
    return tuple(ToolCall.from_data(call) for call in stored.get("tool_calls") or ())


class ProviderError(Exception):
    """A failed call. `billed`: the request may have reached the provider and been paid for
    (it is then charged its whole reservation); by default only a timeout is."""

    def __init__(self, kind: str, message: str, retry_after: float | None = None, *, billed: bool | None = None) -> None:
        if kind not in PROVIDER_ERROR_KINDS:
            raise ValueError(f"unknown provider error kind {kind!r}")
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.retry_after = retry_after
        self.billed = kind == "timeout" if billed is None else billed

    def __str__(self) -> str:
        return self.message


class Provider(Protocol):
    # `attempt` only makes a scripted provider's "ran out of replies" more precise.
    async def complete(self, request: LlmRequest, *, state: str, attempt: int | None = None) -> LlmResponse: ...

    def count_tokens(self, model: str, messages: Sequence[Mapping[str, Any]],
                     tools: Sequence[Mapping[str, Any]] = ()) -> int: ...


def json_copy(value: Any) -> Any:
    """A copy of JSON-like data (dicts and lists copied, leaves shared): ~10x faster than
    `copy.deepcopy`, which matters on every turn of a long agent conversation."""
    kind = type(value)
    if kind is str or kind is int or kind is float or kind is bool or value is None:
        return value  # the leaves, by far the most values: checked first, without isinstance's ABC lookup
    if isinstance(value, Mapping):
        return {k: json_copy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_copy(v) for v in value]
    return value


def _strip_userinfo(url: str | None) -> str | None:
    if not url:
        return url
    return re.sub(r"^([a-zA-Z][a-zA-Z0-9+.-]*://)[^/@]*@", r"\1", url)


def _without_credentials(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {
            str(k): _without_credentials(v)
            for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))
            if not _CREDENTIAL_KEY.search(str(k).lower().replace("-", "_"))
        }
    if isinstance(value, (list, tuple)):
        return [_without_credentials(v) for v in value]
    return value
