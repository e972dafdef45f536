"""The LLM port: real calls over HTTP to the loopback stub, and the scripted provider (no LiteLLM)."""
from __future__ import annotations

import asyncio
import email.utils
import gc
import json
import math
import os
import random
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from stub_server import StubReply, StubServer

from loopdsl.runtime.budget import cost_for
from loopdsl.language.prices import model_price
from loopdsl.adapters import litellm_loading
from loopdsl.adapters.litellm import LiteLLMProvider, ScriptedProvider, ensure_litellm, map_litellm_error
from loopdsl.runtime.model_port import LlmRequest, ProviderError
from loopdsl.runtime.errors import ScriptError, ScriptExhausted

pytestmark = pytest.mark.xdist_group("litellm")  # LiteLLM imported in-process: once a run, on one worker

MESSAGES = ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello."})


@pytest.fixture(scope="module")
def litellm() -> Any:
    # One import per test process: it costs seconds.
    return ensure_litellm()


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def stub_request(stub: StubServer, model: str = "openai/gpt-4o-mini", **kw: Any) -> LlmRequest:
    return LlmRequest(model=model, messages=MESSAGES, max_tokens=50, api_base=stub.api_base, **kw)


def expect_error(stub: StubServer, request: LlmRequest) -> ProviderError:
    with pytest.raises(ProviderError) as info:
        run(LiteLLMProvider().complete(request, state="draft"))
    # A call that timed out may return before the stub's thread has read the request (seen on a
    # loaded machine with a 0.4 s timeout): give it a moment to be recorded.
    deadline = time.monotonic() + 5
    while not stub.requests and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(stub.requests) == 1, "one complete() must be exactly one HTTP request (no hidden retries)"
    return info.value


# -- LiteLLMProvider over HTTP ----------------------------------------------------------------
def test_text_usage_and_cost_come_from_the_response(litellm: Any, stub_server: StubServer) -> None:
    stub_server.reply_text("Hello!", prompt_tokens=1234, completion_tokens=56)
    response = run(LiteLLMProvider().complete(stub_request(stub_server, temperature=0.2), state="draft"))
    assert response.text == "Hello!"
    assert (response.prompt_tokens, response.completion_tokens) == (1234, 56)
    price = model_price("openai/gpt-4o-mini")
    assert price is not None
    assert response.cost_usd == pytest.approx(cost_for(price, 1234, 56))
    [sent] = stub_server.requests
    assert sent.path == "/v1/chat/completions"
    assert sent.body["model"] == "gpt-4o-mini"
    assert sent.body["messages"] == [dict(m) for m in MESSAGES]
    assert sent.body["max_tokens"] == 50 and sent.body["temperature"] == 0.2
    # LiteLLM insists on a key even for a local server: a placeholder is sent.
    assert sent.headers["authorization"] == "Bearer sk-local"


def test_explicit_key_is_sent_but_never_in_the_canonical_request(litellm: Any, stub_server: StubServer) -> None:
    stub_server.reply_text("ok")
    request = stub_request(stub_server, api_key="sk-test-abcdef123456", params={"seed": 7})
    run(LiteLLMProvider().complete(request, state="draft"))
    assert stub_server.requests[0].headers["authorization"] == "Bearer sk-test-abcdef123456"
    assert stub_server.requests[0].body["seed"] == 7
    assert "sk-test-abcdef123456" not in json.dumps(request.canonical())
    assert "sk-test-abcdef123456" not in repr(request)


def test_unknown_model_cost_is_none_not_zero(litellm: Any, stub_server: StubServer) -> None:
    stub_server.reply_text("local answer", prompt_tokens=20, completion_tokens=4)
    response = run(LiteLLMProvider().complete(stub_request(stub_server, model="openai/my-local-llm"), state="s"))
    assert response.cost_usd is None
    assert (response.prompt_tokens, response.completion_tokens) == (20, 4)


def test_a_priced_call_skips_litellms_cost_lookup(litellm: Any, stub_server: StubServer,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # The engine charges a priced model at its own price, so LiteLLM's lookup (slow for a
    # model it does not know: ~0.6 ms a reply, most of a fan-out child's overhead) is not run.
    looked_up: list[Any] = []
    real = litellm.completion_cost
    monkeypatch.setattr(litellm, "completion_cost", lambda **kw: looked_up.append(kw) or real(**kw))
    stub_server.reply_text("priced", prompt_tokens=20, completion_tokens=4)
    request = stub_request(stub_server, model="openai/my-local-llm", priced=True)
    response = run(LiteLLMProvider().complete(request, state="s"))
    assert (response.prompt_tokens, response.completion_tokens, response.cost_usd) == (20, 4, None)
    assert looked_up == []
    stub_server.reply_text("unpriced", prompt_tokens=20, completion_tokens=4)
    run(LiteLLMProvider().complete(stub_request(stub_server, model="openai/my-local-llm"), state="s"))
    assert len(looked_up) == 1  # without a price of our own, LiteLLM is still asked

@pytest.mark.parametrize("header, expected", [("7", 7.0), ("0.5", 0.5)])
def test_429_is_rate_limit_with_retry_after(litellm: Any, stub_server: StubServer, header: str, expected: float) -> None:
    stub_server.reply_rate_limit(header)
    error = expect_error(stub_server, stub_request(stub_server))
    assert error.kind == "rate_limit"
    assert error.retry_after == pytest.approx(expected)


def test_retry_after_as_http_date(litellm: Any, stub_server: StubServer) -> None:
    when = email.utils.formatdate(time.time() + 30, usegmt=True)
    stub_server.enqueue(StubReply(status=429, headers={"Retry-After": when}))
    error = expect_error(stub_server, stub_request(stub_server))
    assert error.kind == "rate_limit" and 20 < (error.retry_after or 0) <= 31


@pytest.mark.parametrize("header", ["garbage", "inf", "nan", "1e400", "Fri, 31 Dec 99999 23:59:59 GMT"])
def test_a_retry_after_that_is_no_time_is_ignored(litellm: Any, stub_server: StubServer, header: str) -> None:
    """`garbage` escaped as a ValueError from the date parser (an internal error that ended the
    run); `inf` made the engine sleep for good."""
    stub_server.enqueue(StubReply(status=429, headers={"Retry-After": header}))
    error = expect_error(stub_server, stub_request(stub_server))
    assert error.kind == "rate_limit" and error.retry_after is None


def test_a_providers_wait_is_believed_up_to_an_hour() -> None:
    from loopdsl.language.model import RetryPolicy
    from loopdsl.runtime.retry import MAX_PROVIDER_WAIT_S, backoff_delay

    year_9999 = 250_000_000_000.0
    assert backoff_delay(RetryPolicy(), 1, year_9999, random) == MAX_PROVIDER_WAIT_S == 3600.0
    assert backoff_delay(RetryPolicy(), 1, 90.0, random) == 90.0


def test_429_without_retry_after(litellm: Any, stub_server: StubServer) -> None:
    stub_server.reply_rate_limit(None)
    error = expect_error(stub_server, stub_request(stub_server))
    assert error.kind == "rate_limit" and error.retry_after is None


@pytest.mark.parametrize("status", [500, 502, 503])
def test_5xx_is_server_error_with_one_request(litellm: Any, stub_server: StubServer, status: int) -> None:
    stub_server.reply_status(status, "upstream exploded")
    stub_server.reply_text("a retry would have got this")
    error = expect_error(stub_server, stub_request(stub_server))
    assert error.kind == "server_error"
    assert "upstream exploded" in error.message and "openai/gpt-4o-mini" in error.message
    assert stub_server.pending == 1


def test_params_cannot_turn_litellm_retries_back_on(litellm: Any, stub_server: StubServer) -> None:
    stub_server.reply_status(500)
    stub_server.reply_status(500)
    error = expect_error(stub_server, stub_request(stub_server, params={"num_retries": 3, "max_retries": 3}))
    assert error.kind == "server_error"


def test_malformed_body_is_server_error(litellm: Any, stub_server: StubServer) -> None:
    stub_server.reply_malformed()
    error = expect_error(stub_server, stub_request(stub_server))
    assert error.kind == "server_error" and "malformed" in error.message


def test_slow_reply_times_out(litellm: Any, stub_server: StubServer) -> None:
    stub_server.reply_slow(5.0)
    start = time.monotonic()
    error = expect_error(stub_server, stub_request(stub_server, timeout=0.4))
    assert error.kind == "timeout"
    assert time.monotonic() - start < 3.0


def test_refused_connection_is_connection(litellm: Any) -> None:
    with StubServer() as closed:
        base = closed.api_base
    request = LlmRequest(model="openai/gpt-4o-mini", messages=MESSAGES, max_tokens=5, api_base=base)
    with pytest.raises(ProviderError) as info:
        run(LiteLLMProvider().complete(request, state="draft"))
    assert info.value.kind == "connection"


@pytest.mark.parametrize("status", [401, 403])
def test_auth_errors_never_show_the_key(litellm: Any, stub_server: StubServer, status: int) -> None:
    key = "sk-leaky-0123456789"
    stub_server.reply_status(status, f"Incorrect API key provided: {key}")
    error = expect_error(stub_server, stub_request(stub_server, api_key=key))
    assert error.kind == "auth"
    assert key not in error.message and key not in str(error)


@pytest.mark.parametrize("model, variable", [("openai/gpt-4o-mini", "OPENAI_API_KEY"),
                                             ("anthropic/claude-haiku-4-5", "ANTHROPIC_API_KEY"),
                                             ("gemini/gemini-2.0-flash", "GEMINI_API_KEY")])
def test_a_missing_key_is_auth_not_a_server_error(litellm: Any, monkeypatch: pytest.MonkeyPatch, model: str,
                                                  variable: str) -> None:
    # The clients refuse before sending anything (OpenAI's as a synthetic HTTP 500, Gemini's
    # as a connection error): `auth`, which the engine does not retry.
    for name in list(os.environ):
        if any(word in name for word in ("API_KEY", "AUTH_TOKEN", "OPENAI", "ANTHROPIC", "GEMINI", "GOOGLE")):
            monkeypatch.delenv(name)
    request = LlmRequest(model=model, messages=MESSAGES, max_tokens=5, timeout=20)
    with pytest.raises(ProviderError) as info:
        run(LiteLLMProvider().complete(request, state="draft"))
    assert info.value.kind == "auth", info.value.message
    assert variable in info.value.message


def test_context_window_from_a_400(litellm: Any, stub_server: StubServer) -> None:
    stub_server.reply_status(
        400, "This model's maximum context length is 128000 tokens. However, your messages resulted in 200000 tokens."
    )
    error = expect_error(stub_server, stub_request(stub_server))
    assert error.kind == "context_window"


def test_other_400_is_server_error(litellm: Any, stub_server: StubServer) -> None:
    stub_server.reply_status(400, "Unsupported parameter: 'frobnicate'")
    error = expect_error(stub_server, stub_request(stub_server))
    assert error.kind == "server_error"


def test_count_tokens_exact_for_openai_and_padded_elsewhere(litellm: Any) -> None:
    provider = LiteLLMProvider()
    messages = [{"role": "user", "content": "Prioritise these commits by risk, highest first. " * 20}]
    openai_estimate = litellm.token_counter(model="openai/gpt-4o-mini", messages=messages)
    claude_estimate = litellm.token_counter(model="anthropic/claude-haiku-4-5", messages=messages)
    assert provider.count_tokens("openai/gpt-4o-mini", messages) == openai_estimate
    assert provider.count_tokens("anthropic/claude-haiku-4-5", messages) == math.ceil(1.25 * claude_estimate)
    assert provider.count_tokens("openai/my-local-llm", messages) > openai_estimate  # unknown: not exact


def test_map_litellm_error_redacts_and_classifies(litellm: Any) -> None:
    exc = litellm.APIConnectionError(message="failed with key sk-abc12345", llm_provider="openai", model="m")
    error = map_litellm_error(exc, model="m", secrets=["sk-abc12345"])
    assert error.kind == "connection" and "sk-abc12345" not in error.message


# -- canonical request ---------------------------------------------------------------------------
def test_canonical_request_has_no_credentials() -> None:
    request = LlmRequest(
        model="openai/gpt-4o-mini",
        messages=[{"role": "user", "content": "hi"}],  # type: ignore[arg-type]
        max_tokens=10,
        api_base="https://user:hunter2@llm.example/v1",
        api_key="sk-secret",
        timeout=30,
        params={"seed": 1, "aws_secret_access_key": "x", "extra_headers": {"Authorization": "Bearer y", "X-Trace": "t"}},
    )
    canonical = request.canonical()
    text = json.dumps(canonical)
    for secret in ("sk-secret", "hunter2", "Bearer y", "aws_secret_access_key"):
        assert secret not in text
    assert canonical["api_base"] == "https://llm.example/v1"
    assert canonical["params"] == {"extra_headers": {"X-Trace": "t"}, "seed": 1}
    assert canonical["max_tokens"] == 10 and isinstance(request.messages, tuple)
    same = LlmRequest(model="openai/gpt-4o-mini", messages=({"role": "user", "content": "hi"},), max_tokens=10,
                      api_base="https://user:hunter2@llm.example/v1", api_key="other", timeout=5,
                      params={"seed": 1, "aws_secret_access_key": "z", "extra_headers": {"X-Trace": "t"}})
    assert json.dumps(same.canonical(), sort_keys=True) == json.dumps(canonical, sort_keys=True)


# -- ensure_litellm in a fresh process -------------------------------------------------------------
@pytest.mark.slow
def test_ensure_litellm_sets_safe_defaults_without_overriding_the_user(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("LOOPDSL_TEST_FROM_DOTENV=loaded\n")
    code = textwrap.dedent(
        """
        import gc, json, os, sys
        import loopdsl.adapters.litellm as providers
        before = "litellm" in sys.modules
        collections = []
        gc.callbacks.append(lambda phase, info: collections.append(info) if phase == "start" else None)
        litellm = providers.ensure_litellm()
        gc.callbacks.clear()
        print(json.dumps({
            "imported_by_module": before,
            "collections_while_importing": len(collections),
            "collecting": gc.isenabled(),  # paused for the import only
            "frozen": gc.get_freeze_count(),  # a host's process: nothing frozen
            "cost_map": os.environ.get("LITELLM_LOCAL_MODEL_COST_MAP"),
            "mode": os.environ.get("LITELLM_MODE"),
            "dotenv": os.environ.get("LOOPDSL_TEST_FROM_DOTENV"),
            "quiet": litellm.suppress_debug_info,
            "retries": litellm.num_retries,
        }))
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("LITELLM_")}
    env["LITELLM_LOCAL_MODEL_COST_MAP"] = "true"  # the user's own spelling must be kept
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    # The collector paused for the import: the one it owes runs once it is back (~900 without the pause).
    assert result.pop("collections_while_importing") < 5
    assert result == {"imported_by_module": False, "collecting": True, "frozen": 0, "cost_map": "true",
                      "mode": "PRODUCTION", "dotenv": None, "quiet": True, "retries": 0}


@pytest.mark.slow
def test_a_process_loopdsl_owns_makes_the_first_calls_imports_before_the_first_call(tmp_path: Path) -> None:
    """The CLI's (and a worker's) LiteLLM import ends with an offline mock call, so the first
    real call does not stop for LiteLLM's lazy imports (~70 modules); the mock sends nothing."""
    code = textwrap.dedent(
        """
        import asyncio, json, sys
        from stub_server import StubServer
        from loopdsl.adapters import litellm_loading
        litellm_loading.claim_process()
        litellm = litellm_loading.ensure_litellm()
        with StubServer() as stub:
            stub.reply_text("hi", prompt_tokens=3, completion_tokens=1)
            before = set(sys.modules)
            asyncio.run(litellm.acompletion(model="openai/gpt-4o-mini", api_base=stub.api_base, api_key="sk-stub",
                                            messages=[{"role": "user", "content": "hello"}], max_tokens=5))
            print(json.dumps({"imported_by_the_call": sorted(set(sys.modules) - before),
                              "requests": len(stub.requests)}))
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LITELLM_", "OPENAI"))}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["requests"] == 1, result  # the warm-up never reached the network
    # Without the warm-up this call imported 66 modules (LiteLLM 1.x); a few stay lazy either way.
    assert len(result["imported_by_the_call"]) <= 10, result


def test_the_import_leaves_a_collector_turned_off_off() -> None:
    gc.disable()
    try:
        litellm_loading._import_without_collecting()
        assert not gc.isenabled()
    finally:
        gc.enable()


# -- ScriptedProvider ------------------------------------------------------------------------------
def scripted_request(model: str = "anthropic/claude-haiku-4-5", max_tokens: int = 100) -> LlmRequest:
    return LlmRequest(model=model, messages=MESSAGES, max_tokens=max_tokens)


def test_scripted_text_usage_is_counted_as_reserved_and_priced() -> None:
    provider = ScriptedProvider.from_data({"draft": ["Here is the triage list."]})
    model = "anthropic/claude-haiku-4-5"
    reserved = provider.prompt_tokens_to_reserve(model, list(MESSAGES), "draft")
    response = run(provider.complete(scripted_request(), state="draft"))
    assert response.text == "Here is the triage list."
    # 3 bytes a token, rounded up, plus 4 framing tokens a message: "Be brief." (9 bytes)
    # 3 + 4, "Say hello." (10 bytes) 4 + 4; the reply (24 bytes) 8.
    assert (response.prompt_tokens, response.completion_tokens) == (15, 8)
    assert reserved == response.prompt_tokens  # the usage never exceeds the reservation
    price = model_price(model)
    assert price is not None
    assert response.cost_usd == pytest.approx(cost_for(price, 15, 8))


def test_scripted_usage_is_kept_and_priced() -> None:
    script = {"draft": [{"text": "[]", "usage": {"prompt_tokens": 1000, "completion_tokens": 80}}]}
    provider = ScriptedProvider.from_data(script)
    # The reservation covers the scripted prompt size, so scripted usage cannot overspend.
    assert provider.prompt_tokens_to_reserve("anthropic/claude-haiku-4-5", [{"role": "user", "content": "hi"}], "draft") == 1000
    response = run(provider.complete(scripted_request(), state="draft"))
    assert (response.prompt_tokens, response.completion_tokens) == (1000, 80)
    price = model_price("anthropic/claude-haiku-4-5")
    assert price is not None
    assert response.cost_usd == pytest.approx(cost_for(price, 1000, 80))


def test_scripted_replies_do_not_import_litellm() -> None:
    code = textwrap.dedent(
        """
        import asyncio, sys
        from loopdsl.adapters.litellm import LlmRequest, ProviderError, ScriptedProvider
        provider = ScriptedProvider.from_data({"draft": ["hello", {"error": "rate_limit", "retry_after": 1}]})
        request = LlmRequest(model="openai/gpt-4o-mini", messages=({"role": "user", "content": "hi"},), max_tokens=9)
        asyncio.run(provider.complete(request, state="draft"))
        try:
            asyncio.run(provider.complete(request, state="draft"))
        except ProviderError:
            pass
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("litellm", "openai", "tiktoken")))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"


def test_scripted_completion_stops_at_max_tokens() -> None:
    provider = ScriptedProvider.from_data({"draft": ["word " * 200]})
    response = run(provider.complete(scripted_request(max_tokens=10), state="draft"))
    assert response.completion_tokens == 10


def test_scripted_text_that_looks_like_a_litellm_magic_string_stays_text() -> None:
    provider = ScriptedProvider.from_data({"draft": ["litellm.RateLimitError"]})
    assert run(provider.complete(scripted_request(), state="draft")).text == "litellm.RateLimitError"


def test_scripted_unknown_model_cost_is_none() -> None:
    provider = ScriptedProvider.from_data({"draft": ["x"]})
    assert run(provider.complete(scripted_request(model="openai/my-local-llm"), state="draft")).cost_usd is None


@pytest.mark.parametrize("kind", ["rate_limit", "timeout", "server_error", "context_window", "connection", "auth"])
def test_scripted_errors_map_to_their_kinds(kind: str) -> None:
    provider = ScriptedProvider.from_data({"draft": [{"error": kind, "message": f"scripted {kind} here"}, "fine"]})
    with pytest.raises(ProviderError) as info:
        run(provider.complete(scripted_request(), state="draft"))
    assert info.value.kind == kind and f"scripted {kind} here" in info.value.message
    assert run(provider.complete(scripted_request(), state="draft")).text == "fine"


def test_scripted_rate_limit_carries_retry_after() -> None:
    provider = ScriptedProvider.from_data({"draft": [{"error": "rate_limit", "retry_after": 2.5}]})
    with pytest.raises(ProviderError) as info:
        run(provider.complete(scripted_request(), state="draft"))
    assert info.value.retry_after == 2.5


def test_running_out_of_replies_is_a_clear_error() -> None:
    provider = ScriptedProvider.from_data({"draft": ["one", "two"]}, source="triage.script.yaml")
    run(provider.complete(scripted_request(), state="draft"))
    run(provider.complete(scripted_request(), state="draft"))
    with pytest.raises(ScriptExhausted) as info:
        run(provider.complete(scripted_request(), state="draft"))
    message = str(info.value)
    assert "'draft'" in message and "only 2" in message and "triage.script.yaml" in message
    with pytest.raises(ScriptExhausted, match="no scripted reply for state 'review'.*draft"):
        run(provider.complete(scripted_request(), state="review"))


def test_decisions_and_unused_entries() -> None:
    provider = ScriptedProvider.from_data(
        {
            "approve": [{"decision": "approve", "comment": "ship it"}, {"decision": "reject"}],
            "drfat": ["typo'd state name"],
        }
    )
    assert provider.decision("approve") == {"decision": "approve", "comment": "ship it"}
    assert provider.unused() == {"approve": 1, "drfat": 1}
    assert provider.decision("approve") == {"decision": "reject", "comment": ""}
    assert provider.decision("approve") is None  # nothing scripted: the run waits for a person
    assert provider.decision("elsewhere") is None
    assert provider.unused() == {"drfat": 1}
    assert provider.unknown_states(["approve", "draft"]) == ["drfat"]


def test_a_decision_where_a_reply_is_expected_is_reported() -> None:
    provider = ScriptedProvider.from_data({"draft": [{"decision": "approve"}]})
    with pytest.raises(ScriptError, match=r"draft\[0\] is a checkpoint decision"):
        run(provider.complete(scripted_request(), state="draft"))


def test_from_file_yaml_and_json(tmp_path: Path) -> None:
    yaml_file = tmp_path / "script.yaml"
    yaml_file.write_text(
        "draft:\n"
        "  - {error: rate_limit, retry_after: 1}\n"
        "  - text: '[\"a\"]'\n"
        "    usage: {prompt_tokens: 3, completion_tokens: 4}\n"
        "approve:\n"
        "  - {decision: approve, comment: ok}\n"
    )
    provider = ScriptedProvider.from_file(yaml_file)
    with pytest.raises(ProviderError):
        run(provider.complete(scripted_request(), state="draft"))
    response = run(provider.complete(scripted_request(), state="draft"))
    assert (response.text, response.prompt_tokens, response.completion_tokens) == ('["a"]', 3, 4)
    json_file = tmp_path / "script.json"
    json_file.write_text(json.dumps({"draft": "only one"}))
    assert run(ScriptedProvider.from_file(json_file).complete(scripted_request(), state="draft")).text == "only one"


@pytest.mark.parametrize(
    "data, match",
    [
        (["not", "a", "mapping"], "reply script must be a mapping.*each state name maps to its replies"),
        ({"draft": [{"error": "explode"}]}, r"`draft\[0\]\.error` must be one of rate_limit, .*not \"explode\""),
        ({"draft": [{"text": "x", "error": "timeout"}]}, "exactly one of"),
        ({"draft": [{"text": "x", "usage": {"prompt_tokens": -1, "completion_tokens": 2}}]}, "must be at least 0"),
        ({"draft": [{"text": "x", "colour": "red"}]}, "unknown key `colour`.*keys allowed here: text and usage"),
        ({"draft": [42]}, r"`draft\[0\]` must be a string or a mapping, not 42"),
        ({"draft": [{"error": "rate_limit", "retry_after": "soon"}]}, "retry_after"),
    ],
)
def test_bad_scripts_are_explained(data: Any, match: str) -> None:
    with pytest.raises(ScriptError, match=match):
        ScriptedProvider.from_data(data)


def test_unreadable_script_files(tmp_path: Path) -> None:
    with pytest.raises(ScriptError, match="cannot read"):
        ScriptedProvider.from_file(tmp_path / "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("draft: [unclosed\n")
    with pytest.raises(ScriptError, match=r"broken.yaml:2:1: expected ',' or ']'"):
        ScriptedProvider.from_file(broken)


# -- what a failed call may have cost (ProviderError.billed) ------------------------------------
BILLING_CASES = {
    # the provider answered with an HTTP error status: it did no paid work
    "500": (lambda s: s.reply_status(500), "server_error", False),
    "400": (lambda s: s.reply_status(400, "Unsupported parameter"), "server_error", False),
    "429": (lambda s: s.reply_rate_limit("1"), "rate_limit", False),
    "401": (lambda s: s.reply_status(401, "bad key"), "auth", False),
    "context": (lambda s: s.reply_status(400, "maximum context length is 10 tokens"), "context_window", False),
    # the request went out and no readable answer came back: it may have been paid
    "malformed 200": (lambda s: s.reply_malformed(), "server_error", True),
    "200 not an object": (lambda s: s.enqueue(StubReply(raw_body=b"[1, 2]")), "server_error", True),
    "200 without choices": (lambda s: s.enqueue(StubReply(raw_body=b'{"object": "chat.completion", "choices": []}')),
                            "server_error", True),
    "dropped after the request": (lambda s: s.reply_drop(), "connection", True),
}


@pytest.mark.parametrize("case", sorted(BILLING_CASES))
def test_which_failures_may_have_been_billed(litellm: Any, stub_server: StubServer, case: str) -> None:
    script, kind, billed = BILLING_CASES[case]
    script(stub_server)
    error = expect_error(stub_server, stub_request(stub_server))
    assert (error.kind, error.billed) == (kind, billed)


def test_timeout_may_have_been_billed_and_refused_connection_was_not(litellm: Any, stub_server: StubServer) -> None:
    stub_server.reply_slow(5.0)
    assert expect_error(stub_server, stub_request(stub_server, timeout=0.4)).billed
    with StubServer() as closed:
        base = closed.api_base
    request = LlmRequest(model="openai/gpt-4o-mini", messages=MESSAGES, max_tokens=5, api_base=base)
    with pytest.raises(ProviderError) as info:
        run(LiteLLMProvider().complete(request, state="draft"))
    assert (info.value.kind, info.value.billed) == ("connection", False)


@pytest.mark.parametrize("usage", [None, (-5, -7), (0, 0), (10**30, 3)])
def test_missing_or_garbage_usage_is_reported_unknown(litellm: Any, stub_server: StubServer, usage: Any) -> None:
    if usage is None:
        stub_server.reply_without_usage("hi")
    else:
        stub_server.enqueue(StubReply(text="hi", prompt_tokens=usage[0], completion_tokens=usage[1]))
    response = run(LiteLLMProvider().complete(stub_request(stub_server), state="draft"))
    assert response.text == "hi" and response.usage_known is False and response.cost_usd is None


def test_params_never_override_the_reserved_max_tokens(litellm: Any, stub_server: StubServer) -> None:
    stub_server.reply_text("one completion")
    params = {"max_tokens": 64000, "max_completion_tokens": 64000, "n": 20, "seed": 3, "model": "openai/o1-pro",
              "messages": [{"role": "user", "content": "x" * 10_000}], "extra_body": {"n": 5, "best_of": 5, "top_k": 4}}
    run(LiteLLMProvider().complete(stub_request(stub_server, params=params), state="draft"))
    body = stub_server.requests[0].body
    assert body["max_tokens"] == 50 and body["seed"] == 3 and body["top_k"] == 4
    assert body["model"] == "gpt-4o-mini" and body["messages"] == list(MESSAGES)
    for key in ("n", "best_of", "max_completion_tokens"):
        assert key not in body


def test_reply_file_problems_are_positioned_by_the_published_schema(tmp_path: Path) -> None:
    script = tmp_path / "greet.replies.yaml"
    script.write_text("draft:\n  - hello\n  - {error: rate_limt}\nreview:\n  - {decision: approve, coment: ok}\n")
    with pytest.raises(ScriptError) as caught:
        ScriptedProvider.from_file(script)
    lines = str(caught.value).splitlines()
    assert lines[0].startswith(f"{script}:3:13: `draft[1].error` must be one of rate_limit,")
    assert "did you mean `rate_limit`?" in lines[0]
    assert lines[1].startswith(f"{script}:5:25: unknown key `coment` in `review[0]`; did you mean `comment`?")


def test_provider_errors_use_the_run_redactor_for_every_form_of_a_key() -> None:
    """A provider echoing the key URL-encoded, or cut short, still hides it (the error
    redactor is the run's; the old one replaced the literal value only)."""
    from loopdsl.adapters.litellm import provider_error

    key = "sk-test/abcdef+0123456789"
    detail = "bad key sk-test%2Fabcdef%2B0123456789 (prefix sk-test/abcdef+01...) short ab"
    error = provider_error("auth", "openai/x", detail, status=401, secrets=[key, "ab", None])
    assert "abcdef" not in str(error) and "%2F" not in str(error)
    assert "short ab" in str(error)  # values under 4 characters are not hidden


def test_a_key_set_to_nothing_is_a_missing_key(litellm: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """LiteLLM's check counts OPENAI_API_KEY="" as set: the run started, was recorded, and
    failed on its first call (auth) instead of stopping before it with the variable to set."""
    from loopdsl.api.credentials import missing_credentials, model_calls
    from loopdsl.lint.pipeline import load_loop

    loop_file = tmp_path / "ask.yaml"
    loop_file.write_text("loopdsl: 1\nname: ask\nmodels:\n  m: {model: openai/gpt-4o-mini, max_tokens: 10}\n"
                         "start: a\nstates:\n  a: {llm: {model: m, prompt: hi}, next: done}\n  done: {end: completed}\n")
    calls = model_calls(load_loop(loop_file))
    monkeypatch.setenv("OPENAI_API_KEY", "")
    (missing,) = missing_credentials(calls, litellm)
    assert missing.variables == ("OPENAI_API_KEY",) and os.environ["OPENAI_API_KEY"] == ""  # and left as it was
    monkeypatch.setenv("OPENAI_API_KEY", "sk-set")
    assert missing_credentials(calls, litellm) == []
