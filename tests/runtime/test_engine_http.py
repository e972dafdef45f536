"""Provider behaviour through real HTTP: loopdsl -> LiteLLM -> the loopback stub server.

Each test points a model alias at the stub (`openai/<name>` + `api_base`), scripts what
the "provider" answers, runs the loop with `loopdsl.run`, and checks what the run
recorded against what the stub saw (request count, bodies, timing).
"""
from __future__ import annotations

import textwrap
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

import loopdsl
from loopdsl.adapters.litellm import count_prompt_tokens
from stub_server import StubReply, StubServer

pytestmark = pytest.mark.xdist_group("litellm")  # LiteLLM imported in-process: once a run, on one worker

PRICE = {"input_per_mtok": 1.5, "output_per_mtok": 4.0}


def loop_file(tmp_path: Path, stub: StubServer, *, alias_extra: str = "", state_extra: str = "",
              top_extra: str = "", max_tokens: int = 200) -> Path:
    text = textwrap.dedent(f"""\
        loopdsl: 1
        name: http-test
        models:
          stub:
            model: openai/stubby
            api_base: {stub.api_base}
            price: {{input_per_mtok: {PRICE['input_per_mtok']}, output_per_mtok: {PRICE['output_per_mtok']}}}
            max_tokens: {max_tokens}
            temperature: 0.3
        {textwrap.indent(alias_extra, '    ')}
        {top_extra}
        start: ask
        states:
          ask:
            llm: {{model: stub, prompt: "Say something about {{{{ inputs.topic }}}}"}}
        {textwrap.indent(state_extra, '    ')}
            next: done
          done: {{end: completed, output: {{said: "{{{{ ask.text }}}}"}}}}
        inputs:
          topic: {{type: string, default: owls}}
        """)
    path = tmp_path / "loop.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def run(path: Path, tmp_path: Path, **kwargs: Any) -> loopdsl.RunResult:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    return loopdsl.run(path, workdir=work, **kwargs)


def events(result: loopdsl.RunResult, type_: str) -> list[dict[str, Any]]:
    return [e for e in result.events if e["type"] == type_]


RETRY2 = "retry: {max_attempts: 2, backoff: {initial: 0s}}"


def test_usage_and_cost_from_the_alias_price(stub_server: StubServer, tmp_path: Path) -> None:
    stub_server.reply_text("Owls are quiet.", prompt_tokens=1000, completion_tokens=500)
    result = run(loop_file(tmp_path, stub_server), tmp_path)
    assert result.status == "completed", result.state.error
    assert result.outputs == {"said": "Owls are quiet."}
    ask = result.state.results["ask"]
    assert ask["usage"] == {"prompt_tokens": 1000, "completion_tokens": 500}
    # (1000 x $1.5 + 500 x $4) per million tokens
    assert ask["cost_usd"] == 0.0035
    assert result.cost_usd == 0.0035
    assert result.tokens == 1500
    assert result.usage["ask"]["tokens"] == 1500
    # what went over the wire
    assert len(stub_server.requests) == 1 and stub_server.unscripted == 0
    body = stub_server.requests[0].body
    assert body["model"] == "stubby"
    assert body["max_tokens"] == 200 and body["temperature"] == 0.3
    assert body["messages"] == [{"role": "user", "content": "Say something about owls"}]


def test_rate_limit_retry_after_is_honoured(stub_server: StubServer, tmp_path: Path) -> None:
    stub_server.reply_rate_limit("1")
    stub_server.reply_text("after the wait")
    started = time.monotonic()
    result = run(loop_file(tmp_path, stub_server, state_extra=RETRY2), tmp_path)
    assert result.status == "completed", result.state.error
    assert time.monotonic() - started >= 1.0
    retries = events(result, "retry")
    assert [e["kind"] for e in retries] == ["rate_limit"]
    assert retries[0]["delay_s"] >= 1.0
    attempts = events(result, "attempt")
    gap = datetime.fromisoformat(attempts[1]["t"]) - datetime.fromisoformat(attempts[0]["t"])
    assert gap.total_seconds() >= 1.0
    assert len(stub_server.requests) == 2 and stub_server.unscripted == 0
    # the refused call was charged nothing
    assert result.tokens == 11 + 7


def test_server_error_is_retried(stub_server: StubServer, tmp_path: Path) -> None:
    stub_server.reply_status(500, "the stub fell over")
    stub_server.reply_text("second time lucky")
    result = run(loop_file(tmp_path, stub_server, state_extra=RETRY2), tmp_path)
    assert result.status == "completed", result.state.error
    retry = events(result, "retry")
    assert [e["kind"] for e in retry] == ["server_error"]
    assert "the stub fell over" in retry[0]["message"]
    assert result.outputs == {"said": "second time lucky"}
    assert len(stub_server.requests) == 2


def test_slow_response_past_alias_timeout_is_kind_timeout_and_charged(stub_server: StubServer, tmp_path: Path) -> None:
    stub_server.reply_slow(4.0)
    started = time.monotonic()
    result = run(loop_file(tmp_path, stub_server, alias_extra="timeout: 0.5s"), tmp_path)
    assert time.monotonic() - started < 3.5
    assert result.status == "failed"
    assert result.state.error["kind"] == "timeout"
    assert len(stub_server.requests) == 1
    # the timed-out call is charged its whole reservation: exact prompt count + max_tokens
    prompt = count_prompt_tokens("openai/stubby", [{"role": "user", "content": "Say something about owls"}])
    assert result.tokens == prompt + 200
    assert result.cost_usd == pytest.approx((prompt * 1.5 + 200 * 4.0) / 1e6, rel=1e-9)


def test_malformed_body_is_server_error(stub_server: StubServer, tmp_path: Path) -> None:
    stub_server.reply_malformed()
    stub_server.reply_text("proper answer")
    result = run(loop_file(tmp_path, stub_server, state_extra=RETRY2), tmp_path)
    assert result.status == "completed", result.state.error
    assert [e["kind"] for e in events(result, "retry")] == ["server_error"]
    assert len(stub_server.requests) == 2


def test_one_http_request_per_attempt_even_when_params_ask_for_retries(stub_server: StubServer, tmp_path: Path) -> None:
    for _ in range(3):
        stub_server.reply_status(503, "busy")
    stub_server.reply_text("never requested")
    path = loop_file(tmp_path, stub_server, alias_extra="params: {num_retries: 4, max_retries: 4}",
                     state_extra="retry: {max_attempts: 3, backoff: {initial: 0s}}")
    result = run(path, tmp_path)
    assert result.status == "failed"
    assert result.state.error["kind"] == "server_error"
    assert len(events(result, "attempt")) == 3
    assert len(stub_server.requests) == 3  # no hidden LiteLLM / OpenAI-client retries
    assert stub_server.pending == 1 and stub_server.unscripted == 0


def test_fallbacks_tried_in_order_within_one_attempt(stub_server: StubServer, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # A fallback is a plain LiteLLM model string: it uses the provider's default base URL,
    # which LiteLLM takes from OPENAI_API_BASE; point that at the stub too.
    monkeypatch.setenv("OPENAI_API_BASE", stub_server.api_base)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-real")
    stub_server.reply_status(500, "primary down")
    stub_server.reply_status(500, "first fallback down")
    stub_server.reply_text("from the second fallback", prompt_tokens=100, completion_tokens=50)
    path = loop_file(tmp_path, stub_server, alias_extra="fallbacks: [openai/gpt-4o-mini, openai/gpt-4o]",
                     state_extra=RETRY2)
    result = run(path, tmp_path)
    assert result.status == "completed", result.state.error
    assert [r.body["model"] for r in stub_server.requests] == ["stubby", "gpt-4o-mini", "gpt-4o"]
    assert len(events(result, "attempt")) == 1 and not events(result, "retry")
    ask = result.state.results["ask"]
    assert ask["model"].endswith("gpt-4o") and ask["text"] == "from the second fallback"
    # priced by LiteLLM's table for gpt-4o ($2.50 / $10 per million)
    assert ask["cost_usd"] == pytest.approx((100 * 2.5 + 50 * 10.0) / 1e6, rel=1e-6)
    assert result.tokens == 150


def test_reservation_is_priced_at_the_dearest_model_of_the_chain(stub_server: StubServer, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_BASE", stub_server.api_base)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-real")
    stub_server.reply_text("never requested")
    # The primary costs $1.5/$4; the fallback gpt-4o $2.5/$10. 1000 max tokens at $10/M is
    # $0.01 at least: over a $0.006 cap, although the primary alone ($0.004 + prompt) fits.
    path = loop_file(tmp_path, stub_server, alias_extra="fallbacks: [openai/gpt-4o]",
                     top_extra="budget: {cost_usd: 0.006}", max_tokens=1000)
    result = run(path, tmp_path)
    assert result.status == "budget_exhausted"
    assert result.state.error["kind"] == "budget"
    assert stub_server.requests == []
    assert (result.tokens, result.cost_usd) == (0, 0.0)


def test_connection_refused_is_a_connection_or_server_error(tmp_path: Path) -> None:
    stub = StubServer().start()
    dead = loop_file(tmp_path, stub)
    stub.stop()  # nothing listens on that port any more
    result = run(dead, tmp_path)
    assert result.status == "failed"
    assert result.state.error["kind"] in ("connection", "server_error")
    assert result.tokens == 0


# ----------------------------------------------------------------- what each failure is charged

PROMPT = [{"role": "user", "content": "Say something about owls"}]


def reservation(max_tokens: int = 200) -> tuple[int, float]:
    """(tokens, cost_usd) one call of `loop_file`'s prompt reserves."""
    prompt = count_prompt_tokens("openai/stubby", PROMPT)
    return prompt + max_tokens, (prompt * PRICE["input_per_mtok"] + max_tokens * PRICE["output_per_mtok"]) / 1e6


def cycle_file(tmp_path: Path, stub: StubServer, budget: str, state_extra: str = "") -> Path:
    """`ask` calls the stub again and again, bounded only by `budget` (tokens / cost)."""
    text = textwrap.dedent(f"""\
        loopdsl: 1
        name: charged-cycle
        models:
          stub:
            model: openai/stubby
            api_base: {stub.api_base}
            price: {{input_per_mtok: {PRICE['input_per_mtok']}, output_per_mtok: {PRICE['output_per_mtok']}}}
            max_tokens: 200
        budget: {budget}
        start: ask
        states:
          ask:
            llm: {{model: stub, prompt: "Say something about owls"}}
        {textwrap.indent(state_extra, '    ')}
            on_failure: ask
            transitions:
              - {{to: done, when: "ask.text == 'stop'"}}
              - {{to: ask}}
          done: {{end: completed}}
        """)
    path = tmp_path / "cycle.yaml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("garbage", ["missing", "negative", "absurd", "zero"])
def test_reply_without_believable_usage_is_charged_its_reservation(stub_server: StubServer, tmp_path: Path,
                                                                   garbage: str) -> None:
    # A cycle bounded only by a 2,000-token cap: charged 0 per reply, it would never stop
    # (the wall_time is there so that a regression fails instead of hanging).
    for _ in range(60):
        if garbage == "missing":
            stub_server.reply_without_usage("no usage")
        else:
            counts = {"negative": (-5, -7), "absurd": (10**30, 3), "zero": (0, 0)}[garbage]
            stub_server.enqueue(StubReply(text="odd usage", prompt_tokens=counts[0], completion_tokens=counts[1]))
    result = run(cycle_file(tmp_path, stub_server, "{tokens: 2000, wall_time: 20s}"), tmp_path)
    assert result.status == "budget_exhausted", result.state.error
    assert result.state.error["which"] == "tokens"
    tokens, cost = reservation()
    paid = len(stub_server.requests)
    assert paid == 2000 // tokens  # each reply charged its whole reservation, then the next did not fit
    assert result.tokens == paid * tokens <= 2000
    assert result.cost_usd == pytest.approx(paid * cost, rel=1e-9)
    llm = events(result, "llm")[0]
    assert llm["usage"]["completion_tokens"] == 200


@pytest.mark.parametrize("failure", ["drop", "malformed", "no_choices"])
def test_dropped_or_unreadable_reply_is_charged_its_reservation(stub_server: StubServer, tmp_path: Path,
                                                                failure: str) -> None:
    for _ in range(30):
        if failure == "drop":
            stub_server.reply_drop()
        elif failure == "malformed":
            stub_server.reply_malformed()
        else:
            stub_server.enqueue(StubReply(raw_body=b'{"id": "x", "object": "chat.completion", "choices": []}'))
    result = run(cycle_file(tmp_path, stub_server, "{tokens: 2000, wall_time: 20s}"), tmp_path)
    assert result.status == "budget_exhausted", result.state.error
    tokens, cost = reservation()
    paid = len(stub_server.requests)
    assert paid == 2000 // tokens
    assert result.tokens == paid * tokens
    assert result.cost_usd == pytest.approx(paid * cost, rel=1e-9)
    expected = "connection" if failure == "drop" else "server_error"
    assert {e["kind"] for e in events(result, "failed")} == {expected}


def test_http_error_statuses_are_charged_nothing(stub_server: StubServer, tmp_path: Path) -> None:
    stub_server.reply_status(500, "busy")
    stub_server.reply_status(400, "bad request")
    stub_server.reply_rate_limit("0")
    stub_server.reply_text("fine", prompt_tokens=100, completion_tokens=50)
    path = loop_file(tmp_path, stub_server, state_extra="retry: {max_attempts: 4, backoff: {initial: 0s}, on: [server_error, rate_limit]}")
    result = run(path, tmp_path)
    assert result.status == "completed", result.state.error
    assert len(stub_server.requests) == 4
    assert result.tokens == 150
    assert result.cost_usd == pytest.approx((100 * 1.5 + 50 * 4.0) / 1e6)


def test_params_that_change_the_cost_are_refused_at_call_time(stub_server: StubServer, tmp_path: Path) -> None:
    # Lint refuses these (params-cost); a Loop built in code reaches the engine unlinted.
    from dataclasses import replace

    loop = loopdsl.load(loop_file(tmp_path, stub_server))
    loop.models["stub"] = replace(loop.models["stub"], params={"extra_body": {"n": 20}, "seed": 1})
    stub_server.reply_text("never requested")
    result = run(loop, tmp_path)  # type: ignore[arg-type]
    assert result.status == "failed"
    assert result.state.error["kind"] == "budget" and "extra_body.n" in result.state.error["message"]
    assert stub_server.requests == []
    assert result.tokens == 0


def test_a_prompt_past_a_price_tier_is_charged_at_that_tier(stub_server: StubServer, tmp_path: Path) -> None:
    # gpt-5.4 bills a call whose prompt passes 272k tokens at $5 / $22.50 per Mtok instead of
    # $2.50 / $15 (LiteLLM's table); the run must report what LiteLLM itself says it cost.
    from loopdsl.adapters.litellm import ensure_litellm

    stub_server.reply_text("long read", prompt_tokens=300_000, completion_tokens=1_000)
    path = tmp_path / "tier.yaml"
    path.write_text(textwrap.dedent(f"""\
        loopdsl: 1
        name: tier
        models:
          big: {{model: openai/gpt-5.4, api_base: {stub_server.api_base}, max_tokens: 1000}}
        budget: {{cost_usd: 5.0}}
        start: ask
        states:
          ask:
            llm: {{model: big, prompt: "Summarise the attached corpus"}}
            next: done
          done: {{end: completed}}
        """), encoding="utf-8")
    result = run(path, tmp_path)
    assert result.status == "completed", result.state.error
    litellm = ensure_litellm()
    reply = litellm.ModelResponse(model="gpt-5.4", usage={"prompt_tokens": 300_000, "completion_tokens": 1_000,
                                                          "total_tokens": 301_000})
    expected = litellm.completion_cost(completion_response=reply, model="openai/gpt-5.4")
    assert expected == pytest.approx((300_000 * 5.0 + 1_000 * 22.5) / 1e6)
    assert result.cost_usd == pytest.approx(expected, rel=1e-9)
