"""The model port: one completion per call, with errors as kinds. `adapters.litellm` and `adapters.scripted` implement it."""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


PROVIDER_ERROR_KINDS = ("rate_limit", "server_error", "timeout", "connection", "auth", "context_window", "parse")


_CREDENTIAL_KEY = re.compile(r"(^|_)(api_?key|key|secret|password|passwd|token|authorization|credentials?|auth)($|_)")


# -- request / response / errors ------------------------------------------------
@dataclass(frozen=True)
class LlmRequest:
    model: str
    messages: tuple[dict[str, str], ...]
    max_tokens: int
    temperature: float | None = None
    api_base: str | None = None
    api_key: str | None = field(default=None, repr=False, compare=False)  # never persisted
    timeout: float | None = None
    params: Mapping[str, Any] = field(default_factory=dict)
    # The caller charges this call at its own price (a loop's `price:` or the price table),
    # so LiteLLM's cost lookup (~0.6 ms a reply for a model it does not know) is skipped.
    priced: bool = field(default=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "messages", tuple(dict(m) for m in self.messages))
        object.__setattr__(self, "params", dict(self.params))

    def canonical(self) -> dict[str, Any]:
        """What determines the answer, as JSON-able data, without any credential.

        Used for response-cache keys and the run store. `timeout` is left out: it
        changes when we give up, not what the model says.
        """
        return {
            "model": self.model,
            "messages": [dict(m) for m in self.messages],
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "api_base": _strip_userinfo(self.api_base),
            "params": _without_credentials(self.params),
        }


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
    async def complete(self, request: LlmRequest, *, state: str) -> LlmResponse: ...

    def count_tokens(self, model: str, messages: Sequence[Mapping[str, str]]) -> int: ...


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
