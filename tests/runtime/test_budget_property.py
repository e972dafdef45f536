"""Budgets are hard caps: a property test over >= 1,000 generated loops and reply sequences.

Each example is a random chain of llm / set / shell states (retries, back edges bounded
by `max_visits`, `on_failure` and `on_exhausted` routes, fallback chains), random caps on
tokens, cost and steps, and a provider that answers with random usage (prompt tokens up
to the counted prompt, completion tokens up to `max_tokens`, as a real provider does) or
random errors. Whatever happens, spent tokens, cost and steps never pass their caps,
the ledger equals exactly what the provider reported (plus full reservations for calls
that timed out), and a run stopped by a cap ends `budget_exhausted` keeping its results.

The provider is an in-process object (no LiteLLM) so 1,000 runs stay fast.
"""
from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import loopdsl
from loopdsl.language.model import build_loop
from loopdsl.language.prices import model_price
from loopdsl.runtime.model_port import LlmRequest, LlmResponse, ProviderError

EXAMPLES = 1000
FALLBACK_MODELS = ("openai/gpt-4o-mini", "openai/gpt-4o")
ERROR_KINDS = ("rate_limit", "server_error", "timeout", "context_window", "auth", "connection")
TERMINAL = {"completed", "failed", "escalated", "budget_exhausted"}


# ---------------------------------------------------------------- the provider


@dataclass
class Reply:
    error: str | None = None
    prompt_percent: int = 100  # of the counted prompt
    completion_percent: int = 100  # of max_tokens


@dataclass
class PlannedProvider:
    """Answers calls from a fixed plan (cycled), and logs what each call may cost."""

    plan: Sequence[Reply]
    base_prompt: int
    calls: int = 0
    log: list[dict[str, Any]] = field(default_factory=list)

    def count_tokens(self, model: str, messages: Sequence[Mapping[str, str]]) -> int:
        return self.base_prompt + sum(len(m["content"]) for m in messages) // 8

    async def complete(self, request: LlmRequest, *, state: str) -> LlmResponse:
        reply = self.plan[self.calls % len(self.plan)] if self.plan else Reply()
        self.calls += 1
        counted = self.count_tokens(request.model, request.messages)
        entry = {"state": state, "model": request.model, "counted": counted, "max_tokens": request.max_tokens, "error": reply.error}
        self.log.append(entry)
        if reply.error is not None:
            raise ProviderError(reply.error, f"planned {reply.error}", retry_after=0.0 if reply.error == "rate_limit" else None)
        entry["prompt"] = reply.prompt_percent * counted // 100
        entry["completion"] = reply.completion_percent * request.max_tokens // 100
        return LlmResponse(text="reply", prompt_tokens=entry["prompt"], completion_tokens=entry["completion"],
                           cost_usd=None, model=request.model)


# ---------------------------------------------------------------- generated loops


prices = st.builds(lambda i, o: {"input_per_mtok": i, "output_per_mtok": o},
                   st.sampled_from([0, 0.1, 0.15, 1, 2.5, 5, 15, 60]), st.sampled_from([0, 0.4, 0.6, 4, 10, 30, 120]))


# Built once, not in every example: hypothesis spends more time making and checking
# strategies drawn inside a composite than the runs themselves take.
MAX_TOKENS = st.integers(1, 400)
FALLBACKS = st.lists(st.sampled_from(FALLBACK_MODELS), max_size=2, unique=True)
STATE_COUNT = st.integers(1, 6)
KINDS = st.sampled_from(["llm", "llm", "llm", "set", "shell"])
ALIASES = st.sampled_from(["a", "b"])
BOOLS = st.booleans()
DIGITS = st.integers(0, 9)
COMMANDS = st.sampled_from(["true", "true", "false"])
ATTEMPTS = st.integers(1, 3)
MAX_VISITS = st.integers(1, 4)
BACK_LIMIT = st.integers(2, 5)
TOKEN_CAP = st.integers(0, 3000)
COST_CAP = st.sampled_from([0, 1e-6, 1e-5, 1e-4, 5e-4, 2e-3, 0.01])
STEP_CAP = st.integers(1, 25)
ROUTE = st.sampled_from(["out", ""])  # "": the state's following one
BACK_TARGETS = [st.sampled_from([f"s{j}" for j in range(i + 1)]) for i in range(6)]  # s0..s<i>


@st.composite
def loops(draw: st.DrawFn) -> dict[str, Any]:
    models = {}
    for name in ("a", "b"):
        alias: dict[str, Any] = {"model": f"openai/planned-{name}", "price": draw(prices),
                                 "max_tokens": draw(MAX_TOKENS)}
        fallbacks = draw(FALLBACKS)
        if fallbacks:
            alias["fallbacks"] = fallbacks
        models[name] = alias
    count = draw(STATE_COUNT)
    names = [f"s{i}" for i in range(count)]
    states: dict[str, Any] = {}
    for i, name in enumerate(names):
        following = names[i + 1] if i + 1 < count else "done"
        kind = draw(KINDS)
        state: dict[str, Any]
        if kind == "llm":
            llm: dict[str, Any] = {"model": draw(ALIASES),
                                   "prompt": "step {{ run.visits }}.{{ run.attempt }} {{ feedback }}"}
            if draw(BOOLS):
                llm["max_tokens"] = draw(MAX_TOKENS)
            state = {"llm": llm}
        elif kind == "set":
            state = {"set": {"v": "run.visits", "k": draw(DIGITS)}}
        else:
            state = {"shell": draw(COMMANDS)}
        attempts = draw(ATTEMPTS)
        if attempts > 1:
            state["retry"] = {"max_attempts": attempts, "backoff": {"initial": 0}}
        state["max_visits"] = draw(MAX_VISITS)
        if draw(BOOLS):
            state["on_exhausted"] = draw(ROUTE) or following
        if draw(BOOLS):
            state["on_failure"] = draw(ROUTE) or following
        if draw(BOOLS):  # a back edge: a cycle bounded by max_visits
            back = draw(BACK_TARGETS[i])
            state["transitions"] = [{"to": back, "when": f"run.visits < {draw(BACK_LIMIT)}"}, {"to": following}]
        else:
            state["next"] = following
        states[name] = state
    states["done"] = {"end": "completed"}
    states["out"] = {"end": "escalated"}
    budget = {}
    if draw(BOOLS):
        budget["tokens"] = draw(TOKEN_CAP)
    if draw(BOOLS):
        budget["cost_usd"] = draw(COST_CAP)
    if draw(BOOLS):
        budget["steps"] = draw(STEP_CAP)
    data = {"loopdsl": 1, "name": "generated", "models": models, "start": names[0], "states": states}
    if budget:
        data["budget"] = budget
    return data


replies = st.builds(
    Reply,
    # None three times in four, else one of the kinds (one draw, not a one_of's two)
    error=st.sampled_from([None] * 3 * len(ERROR_KINDS) + list(ERROR_KINDS)),
    prompt_percent=st.integers(0, 100),
    completion_percent=st.integers(0, 100),
)


# ---------------------------------------------------------------- the property


def price_of(model: str, aliases: Mapping[str, Any]) -> Mapping[str, float]:
    for alias in aliases.values():
        if alias["model"] == model:
            return alias["price"]
    price = model_price(model)
    assert price is not None, model
    return {"input_per_mtok": price.input_per_mtok, "output_per_mtok": price.output_per_mtok}


def expected_spend(log: Sequence[Mapping[str, Any]], data: Mapping[str, Any]) -> tuple[int, float]:
    """What the ledger must hold: reported usage of answered calls, full reservations of timeouts."""
    aliases = data["models"]
    tokens, cost = 0, 0.0
    for call in log:
        alias = aliases[data["states"][call["state"]]["llm"]["model"]]
        chain = [alias["model"], *alias.get("fallbacks", [])]
        assert call["model"] in chain
        if call["error"] is None:
            price = price_of(call["model"], aliases)
            tokens += call["prompt"] + call["completion"]
            cost += (call["prompt"] * price["input_per_mtok"] + call["completion"] * price["output_per_mtok"]) / 1e6
        elif call["error"] == "timeout":
            worst = max(
                (call["counted"] * p["input_per_mtok"] + call["max_tokens"] * p["output_per_mtok"]) / 1e6
                for p in (price_of(m, aliases) for m in chain)
            )
            tokens += call["counted"] + call["max_tokens"]
            cost += worst
    return tokens, cost


def check_run(data: dict[str, Any], plan: list[Reply], base_prompt: int, work: Path) -> str:
    loop = build_loop(data)
    provider = PlannedProvider(plan, base_prompt)
    result = loopdsl.run(loop, provider=provider, workdir=work)
    caps = data.get("budget", {})
    spent = result.state.ledger
    assert result.status in TERMINAL, result.status

    # hard caps
    if "tokens" in caps:
        assert result.tokens <= caps["tokens"], (result.tokens, caps)
    if "cost_usd" in caps:
        assert spent["cost_picousd"] <= round(caps["cost_usd"] * 1e12), (spent, caps)
        assert result.cost_usd <= caps["cost_usd"] + 1e-15
    if "steps" in caps:
        assert result.steps <= caps["steps"]

    # the ledger is exactly what the provider reported (timeouts: the whole reservation)
    tokens, cost = expected_spend(provider.log, data)
    assert result.tokens == tokens, (result.tokens, tokens, provider.log)
    assert math.isclose(result.cost_usd, cost, rel_tol=1e-9, abs_tol=1e-11), (result.cost_usd, cost)
    attempts = [e for e in result.events if e["type"] == "attempt"]
    assert result.steps == len(attempts)
    assert not result.state.ledger.get("outstanding")  # no reservation left open

    # a run stopped by a cap keeps everything done so far
    succeeded = {e["state"] for e in result.events if e["type"] == "ok"}
    assert succeeded <= set(result.state.results)
    if result.status == "budget_exhausted":
        assert result.state.error["kind"] == "budget"
        assert result.exit_code == 1
        if succeeded:
            assert result.state.results
    return result.status


@pytest.mark.slow
def test_budgets_are_hard_caps_over_generated_loops() -> None:
    seen: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)

        @settings(max_examples=EXAMPLES, deadline=None, database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
        @given(loops(), st.lists(replies, max_size=12), st.integers(0, 300))
        def property_holds(data: dict[str, Any], plan: list[Reply], base_prompt: int) -> None:
            status = check_run(data, plan, base_prompt, work)
            seen[status] = seen.get(status, 0) + 1

        property_holds()
    assert sum(seen.values()) >= EXAMPLES
    # the generator reaches every kind of end, the budget one included
    assert seen.get("budget_exhausted", 0) >= 50, seen
    assert seen.get("completed", 0) >= 50, seen
