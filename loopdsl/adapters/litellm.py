"""The LLM port: one completion per call, through LiteLLM, with errors as kinds.

Two providers implement it. `LiteLLMProvider` makes real calls; `ScriptedProvider`
(in `scripted`, re-exported here) answers from a script for offline runs and tests,
without LiteLLM: it builds the same `LlmResponse`, and its errors are `ProviderError`s
worded as `map_litellm_error` words the real ones (`provider_error`).

Retries belong to the engine alone: every call passes `num_retries=0` (LiteLLM's
wrapper) and `max_retries=0` (the OpenAI client's own, which otherwise makes
3 requests for one 5xx), and no Router is used. One `complete()` is at most one
paid request.

A malformed (unparseable) response body from the provider is reported as
`server_error`, not `parse`: `parse` is reserved for *our* parsing of the model's
answer (its message becomes `feedback` for the model), and a garbled body is the
provider's fault, worth retrying like any other 5xx. The exception: on a request that
offers tools, a reply LiteLLM cannot convert (tool calls without a name, garbage in
place of the calls) is the model's malformed answer, so `parse`, as are tool calls
that arrive without an id, a name or string arguments. A missing API key is `auth`
whatever status LiteLLM gives it (the OpenAI client's is a synthetic 500): waiting
does not make a key appear.
"""
from __future__ import annotations

import asyncio
import email.utils
import json
import math
import re
import time
import traceback
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..language.prices import without_cost_params
from .litellm_loading import ensure_litellm, is_loaded, wait_until_loaded
from ..runtime.redaction import Redactor
from ..runtime.model_port import LlmRequest, LlmResponse, PROVIDER_ERROR_KINDS, Provider, ProviderError, json_copy
from .litellm_response import response_to_llm
from .litellm_tokens import (ESTIMATE_MARGIN, EXACT_TOKENIZER_PROVIDERS, TokenTally, count_prompt_tokens,
                             tokenizer_is_exact)

if TYPE_CHECKING:
    # Re-exported lazily (see `__getattr__` at the bottom): `scripted` imports this module.
    from .scripted import SCRIPTED_ERROR_KINDS, ScriptedProvider
    from ..runtime.errors import ScriptError, ScriptExhausted

# LiteLLM needs some key even for a local OpenAI-compatible server that checks none.
LOCAL_PLACEHOLDER_KEY = "sk-local"
# Grace beyond the request's own timeout before we stop waiting on LiteLLM ourselves.
_TIMEOUT_GRACE_S = 5.0
# Providers word an over-long prompt differently; LiteLLM recognises only some phrasings.
_CONTEXT_WINDOW_TEXT = re.compile(
    r"context[ _-]?(length|window)|maximum context|prompt is too long|too many (input )?tokens", re.IGNORECASE
)
# Down an exception chain: the connection was never made, so nothing was sent or billed.
_NOT_CONNECTED = frozenset({"ConnectError", "ConnectTimeout", "ClientConnectorError", "ConnectionRefusedError", "gaierror"})
# Down an exception chain: the provider answered with an HTTP error status (not billed).
_HTTP_STATUS_ERRORS = frozenset({"APIStatusError", "HTTPStatusError"})
# How providers' clients say that no key was given (LiteLLM maps some of these to a 500).
_MISSING_KEY_TEXT = re.compile(
    r"missing credentials|missing [\w ]{0,40}api[ _-]?key|api_key client option must be set|no api[ _-]?key", re.IGNORECASE
)
# A reply that arrived but that LiteLLM could not turn into its response object.
_UNREADABLE = frozenset({"ValidationError", "TypeError", "AttributeError", "KeyError", "IndexError"})
# Characters of a provider's error message kept in ours.
_DETAIL_LIMIT = 500
# Down an exception chain: the network failed (the reply did not arrive whole).
_NETWORK = frozenset({"TransportError", "ClientError", "OSError", "APIConnectionError"})


# -- exception mapping ----------------------------------------------------------------
def _exception_chain(exc: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in chain and len(chain) < 20:
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain


def _class_names(exc: BaseException) -> set[str]:
    return {cls.__name__ for cls in type(exc).__mro__}


def _status_code(exc: BaseException) -> int | None:
    status = getattr(exc, "status_code", None)
    return status if isinstance(status, int) else None


def _retry_after(exc: BaseException) -> float | None:
    """Seconds from Retry-After / retry-after-ms, wherever this LiteLLM keeps the headers.

    A vendor 429 carries them in `litellm_response_headers` (and `response.headers`);
    an error built by LiteLLM or by our script carries them in `headers`.
    """
    sources = [
        getattr(exc, "headers", None),
        getattr(exc, "litellm_response_headers", None),
        getattr(getattr(exc, "response", None), "headers", None),
    ]
    for headers in sources:
        if not headers:
            continue
        try:
            lowered = {str(k).lower(): str(v) for k, v in headers.items()}
        except AttributeError:
            continue
        if "retry-after-ms" in lowered:
            seconds = _seconds(lowered["retry-after-ms"], scale=1000.0)
            if seconds is not None:
                return seconds
        value = lowered.get("retry-after")
        if value is None:
            continue
        seconds = _seconds(value)
        if seconds is not None:
            return seconds
        try:  # an HTTP date; garbage raises (Python 3.10 and later) rather than returning None
            parsed = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError, OverflowError):
            continue
        return max(0.0, parsed.timestamp() - time.time())
    return None


def _seconds(text: str, scale: float = 1.0) -> float | None:
    """A header's number of seconds (>= 0), or None when it is not a finite number."""
    try:
        value = float(text) / scale
    except ValueError:
        return None
    return max(0.0, value) if math.isfinite(value) else None


def _redact(text: str, secrets: Iterable[str | None]) -> str:
    # Values under 4 characters are not hidden: they would blank ordinary words of the message.
    return Redactor(s for s in secrets if s and len(s) >= 4).error(text)


# How each kind reads after "<model>: ", before the provider's own detail.
_KIND_WORDING = {
    "context_window": "the prompt does not fit the model's context window: ",
    "rate_limit": "rate limited: ",
    "timeout": "timed out: ",
    "auth": "not authorised (check the API key and its permissions): ",
    "connection": "could not reach the provider: ",
    "server_error": "",
    "parse": "",
}


def provider_error(kind: str, model: str, detail: str, *, status: int | None = None,
                   retry_after: float | None = None, secrets: Iterable[str | None] = (),
                   billed: bool | None = None) -> ProviderError:
    """A ProviderError worded the one way real and scripted errors are shown."""
    shown = f"HTTP {status}: " if status and status >= 400 else ""
    return ProviderError(kind, _redact(f"{model}: {shown}{_KIND_WORDING[kind]}{detail}", secrets), retry_after,
                         billed=billed)


def map_litellm_error(exc: BaseException, *, model: str, secrets: Iterable[str | None] = (),
                      tools_offered: bool = False) -> ProviderError:
    """One LiteLLM/OpenAI exception -> a ProviderError with one of our kinds.

    `tools_offered`: the request offered tools, so a reply LiteLLM could not read is
    the model's malformed tool call (`parse`) rather than the provider's (`server_error`)."""
    chain = _exception_chain(exc)
    names = _class_names(exc)
    status = _status_code(exc)
    detail = _short(re.sub(r"^litellm\.\w+: ", "", str(exc) or type(exc).__name__))

    def error(kind: str, retry_after: float | None = None, http: bool = True,
              billed: bool | None = None) -> ProviderError:
        # No status for timeouts and connection failures: LiteLLM fills in a
        # synthetic 408/500 there although no response ever arrived.
        return provider_error(kind, model, detail, status=status if http else None,
                              retry_after=retry_after, secrets=secrets, billed=billed)

    if "ContextWindowExceededError" in names or (
        status in (400, 413) and _CONTEXT_WINDOW_TEXT.search(detail)
    ):
        return error("context_window")
    if "RateLimitError" in names or status == 429:
        return error("rate_limit", _retry_after(exc))
    below = [_class_names(e) for e in chain[1:]]  # what LiteLLM's exception wraps
    never_sent = any(_NOT_CONNECTED & names_ for names_ in below)
    if any({"Timeout", "APITimeoutError", "TimeoutError", "TimeoutException"} & _class_names(e) for e in chain):
        return error("timeout", http=False, billed=not never_sent)
    if {"AuthenticationError", "PermissionDeniedError"} & names or status in (401, 403):
        return error("auth")
    if any(_MISSING_KEY_TEXT.search(str(e)) for e in chain):
        return error("auth", http=False)  # raised by the client before any request: no status
    unreadable = _unreadable_reply(chain[1:])
    if unreadable == "shape" and tools_offered:
        return provider_error("parse", model, f"the model's reply could not be read (malformed tool calls?): "
                              f"{detail}", secrets=secrets, billed=True)
    if unreadable:
        return provider_error("server_error", model, f"the provider sent a malformed response body: {detail}",
                              secrets=secrets, billed=True)
    # A refused or dropped connection reaches us as LiteLLM's InternalServerError
    # wrapping openai.APIConnectionError / httpx.ConnectError: look down the chain.
    connection_names = {"APIConnectionError", "ConnectError", "ClientConnectorError", "ConnectionError"}
    if any(connection_names & _class_names(e) for e in chain):
        # Refused (nothing was sent) costs nothing; dropped after sending may have been paid.
        return error("connection", http=False, billed=not never_sent)
    # A reply that arrived but could not be read (a 200 with a malformed body) may have been
    # paid; an HTTP error status (a real 4xx/5xx: a status error down the chain) was not.
    arrived = bool(below) and not any(_HTTP_STATUS_ERRORS & names_ for names_ in below)
    return error("server_error", billed=arrived)


def _short(detail: str) -> str:
    """A provider's message without the traceback and request dump LiteLLM appends to some
    (file paths, the whole reply), capped: it is shown to people and fed back to the model."""
    for marker in ("Traceback (most recent call last)", "received_args="):
        detail = detail.split(marker, 1)[0]
    detail = detail.strip()
    return detail if len(detail) <= _DETAIL_LIMIT else detail[:_DETAIL_LIMIT] + " [...]"


def _unreadable_reply(below: list[BaseException]) -> str | None:
    """What LiteLLM's exception wraps says of a reply that arrived but could not be read:
    "body" (not JSON), "shape" (a shape error raised while converting the response, not
    while building the request), or None (not that; or a network or HTTP-status error)."""
    if any((_NETWORK | _HTTP_STATUS_ERRORS | _NOT_CONNECTED) & _class_names(e) for e in below):
        return None
    if any(isinstance(e, json.JSONDecodeError) for e in below):
        return "body"
    return "shape" if any(_UNREADABLE & _class_names(e) and _raised_reading(e) for e in below) else None


def _raised_reading(exc: BaseException) -> bool:
    # LiteLLM's converters are all named for the response (transform_response,
    # convert_to_model_response_object); a request-side bug raises elsewhere.
    return any("response" in frame.name for frame in traceback.extract_tb(exc.__traceback__))


_FORCED = {"num_retries": 0, "max_retries": 0}


async def _acompletion(litellm: Any, kwargs: dict[str, Any], request: LlmRequest, secrets: Sequence[str | None]) -> Any:
    try:
        call = litellm.acompletion(**kwargs)
        if request.timeout is not None:
            # LiteLLM enforces `timeout` itself; this only bounds a client that hangs anyway.
            return await asyncio.wait_for(call, request.timeout + _TIMEOUT_GRACE_S)
        return await call
    except asyncio.TimeoutError:
        raise ProviderError("timeout", f"{request.model}: no answer within {request.timeout:g}s") from None
    except ProviderError:
        raise
    except Exception as exc:
        raise map_litellm_error(exc, model=request.model, secrets=secrets, tools_offered=bool(request.tools)) from exc


def _response_format(litellm: Any, request: LlmRequest) -> dict[str, Any] | None:
    """The structured-output `response_format` for a request with a schema, where LiteLLM says
    the model supports one; never with tools (some providers make it a forced tool call)."""
    if request.response_schema is None or request.tools:
        return None
    try:
        supported = bool(litellm.supports_response_schema(model=request.model))
    except Exception:  # noqa: BLE001 - a model LiteLLM does not know: send no response_format
        supported = False
    if not supported:
        return None
    # Not `strict`: OpenAI's strict mode refuses ordinary schemas (optional keys, no
    # additionalProperties: false); the answer is checked against the schema afterwards anyway.
    return {"type": "json_schema",
            "json_schema": {"name": "answer", "schema": json_copy(request.response_schema), "strict": False}}


def _tool_kwargs(request: LlmRequest) -> dict[str, Any]:
    kwargs: dict[str, Any] = {}
    if request.tools:
        kwargs["tools"] = json_copy(request.tools)
    if request.tool_choice is not None:
        kwargs["tool_choice"] = json_copy(request.tool_choice)
    if request.parallel_tool_calls is not None:
        kwargs["parallel_tool_calls"] = request.parallel_tool_calls
    return kwargs


class LiteLLMProvider:
    """Real calls through `litellm.acompletion`, one HTTP request per `complete()`."""

    def __init__(self) -> None:
        self._tally = TokenTally()  # an agent's growing conversation is counted once per message

    def loaded(self) -> bool:
        """Whether LiteLLM is imported; until then a call first waits for it (see the engine)."""
        return is_loaded()

    async def wait_until_loaded(self) -> None:
        await wait_until_loaded()

    async def complete(self, request: LlmRequest, *, state: str, attempt: int | None = None) -> LlmResponse:
        litellm = await wait_until_loaded()
        api_key = request.api_key or (LOCAL_PLACEHOLDER_KEY if request.api_base else None)
        # Copies: LiteLLM's provider translations may edit what they are given, and the request
        # (its canonical form, the conversation it belongs to) must stay as it was.
        kwargs: dict[str, Any] = {"model": request.model, "messages": json_copy(request.messages)}
        kwargs["max_tokens"] = request.max_tokens
        for name, value in (
            ("temperature", request.temperature),
            ("api_base", request.api_base),
            ("api_key", api_key),
            ("timeout", request.timeout),
        ):
            if value is not None:
                kwargs[name] = value
        kwargs.update(without_cost_params(request.params))  # never more output or completions than reserved
        kwargs.update(_tool_kwargs(request))  # the request's own tools win over an alias's `params`
        response_format = _response_format(litellm, request)
        if response_format is not None and "response_format" not in kwargs and "tools" not in kwargs:
            kwargs["response_format"] = response_format
        kwargs.update(_FORCED)  # a model alias cannot switch LiteLLM's retries back on
        kwargs["max_tokens"] = request.max_tokens
        response = await _acompletion(litellm, kwargs, request, (api_key, request.api_key))
        return response_to_llm(litellm, response, request)

    def count_tokens(self, model: str, messages: Sequence[Mapping[str, Any]],
                     tools: Sequence[Mapping[str, Any]] = ()) -> int:
        return self._tally.count(model, messages, tools)


# -- re-exports from `scripted` ---------------------------------------------------------
_SCRIPTED_NAMES = frozenset({"ScriptedProvider", "ScriptError", "ScriptExhausted", "SCRIPTED_ERROR_KINDS"})


def __getattr__(name: str) -> Any:
    # Lazy, so `import loopdsl.adapters.scripted` first and `import loopdsl.adapters.litellm` first both work.
    if name in _SCRIPTED_NAMES:
        from . import scripted

        return getattr(scripted, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ESTIMATE_MARGIN", "EXACT_TOKENIZER_PROVIDERS", "LOCAL_PLACEHOLDER_KEY", "PROVIDER_ERROR_KINDS",
    "SCRIPTED_ERROR_KINDS", "LiteLLMProvider", "LlmRequest", "LlmResponse", "Provider", "ProviderError",
    "ScriptError", "ScriptExhausted", "ScriptedProvider", "count_prompt_tokens", "ensure_litellm",
    "map_litellm_error", "tokenizer_is_exact",
]
