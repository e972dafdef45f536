from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from loopdsl.language import prices

pytestmark = pytest.mark.xdist_group("litellm")  # LiteLLM imported in-process: once a run, on one worker


def _table_entry(key: str) -> dict:
    return prices.price_table()[key]


@pytest.mark.parametrize(
    "model, key",
    [
        ("openai/gpt-4o-mini", "gpt-4o-mini"),  # the DSL example's writer
        ("anthropic/claude-haiku-4-5", "claude-haiku-4-5"),  # the DSL example's critic
        ("gpt-4o-mini", "gpt-4o-mini"),
        ("OpenAI/GPT-4o-Mini", "gpt-4o-mini"),  # LiteLLM matches keys case-insensitively
    ],
)
def test_model_price_resolves_like_litellm(model: str, key: str) -> None:
    entry = _table_entry(key)
    price = prices.model_price(model)
    assert price is not None
    assert price.input_per_mtok == pytest.approx(entry["input_cost_per_token"] * 1e6)
    assert price.output_per_mtok == pytest.approx(entry["output_cost_per_token"] * 1e6)
    assert prices.max_input_tokens(model) == entry["max_input_tokens"]


def test_provider_prefixed_keys_are_used_as_they_are() -> None:
    table = prices.price_table()
    key = next(k for k, v in table.items() if k.startswith("gemini/") and "input_cost_per_token" in v)
    assert prices.model_price(key) is not None
    assert prices.model_price(key).input_per_mtok == pytest.approx(table[key]["input_cost_per_token"] * 1e6)  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "model",
    [
        "openai/not-a-real-model-xyz",
        "no-such-model",
        "groq/gpt-4o-mini",  # the bare name exists, but under another provider
        "",
        "sample_spec",  # the table's format description is not a model
    ],
)
def test_unknown_models_have_no_price(model: str) -> None:
    assert prices.model_price(model) is None
    assert prices.max_input_tokens(model) is None


def test_prices_read_cleanly_per_million_tokens() -> None:
    # 1.5e-07 USD/token * 1e6 is 0.15000000000000002 in floats; reports should say 0.15.
    for model in ("openai/gpt-4o-mini", "anthropic/claude-haiku-4-5"):
        price = prices.model_price(model)
        assert price is not None
        for value in (price.input_per_mtok, price.output_per_mtok):
            assert len(repr(value).split(".")[-1]) <= 10, value


def test_missing_litellm_gives_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    prices.price_table.cache_clear()
    prices._lowercase_index.cache_clear()
    prices._table_text.cache_clear()
    prices._folded_text.cache_clear()
    prices.model_info.cache_clear()
    monkeypatch.setattr(prices.importlib.util, "find_spec", lambda name: None)
    try:
        with pytest.raises(prices.PriceTableUnavailable, match="litellm.*price"):
            prices.model_price("openai/gpt-4o-mini")
    finally:
        monkeypatch.undo()
        prices.price_table.cache_clear()
        prices._lowercase_index.cache_clear()
        prices._table_text.cache_clear()
        prices._folded_text.cache_clear()
        prices.model_info.cache_clear()
    prices._folded_text.cache_clear()
    prices.model_info.cache_clear()
    assert prices.model_price("openai/gpt-4o-mini") is not None


def test_pricing_never_imports_litellm() -> None:
    code = textwrap.dedent(
        """
        import json, sys, time
        start = time.perf_counter()
        from loopdsl.language import prices
        price = prices.model_price("openai/gpt-4o-mini")
        window = prices.max_input_tokens("anthropic/claude-haiku-4-5")
        elapsed = time.perf_counter() - start
        print(json.dumps({
            "litellm_loaded": any(m == "litellm" or m.startswith("litellm.") for m in sys.modules),
            "price": [price.input_per_mtok, price.output_per_mtok],
            "window": window,
            "elapsed": elapsed,
        }))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    result = json.loads(out.stdout)
    assert result["litellm_loaded"] is False
    assert result["price"] == [prices.model_price("openai/gpt-4o-mini").input_per_mtok,  # type: ignore[union-attr]
                               prices.model_price("openai/gpt-4o-mini").output_per_mtok]  # type: ignore[union-attr]
    assert result["window"] == prices.max_input_tokens("anthropic/claude-haiku-4-5")
    assert result["elapsed"] < 2.0  # reading the table, not importing LiteLLM (4-7 s)


def test_prices_agree_with_litellm_itself() -> None:
    from loopdsl.adapters.litellm import ensure_litellm

    litellm = ensure_litellm()
    for model in ("openai/gpt-4o-mini", "anthropic/claude-haiku-4-5", "gpt-4o-mini"):
        info = litellm.get_model_info(model)
        price = prices.model_price(model)
        assert price is not None
        assert price.input_per_mtok == pytest.approx(info["input_cost_per_token"] * 1e6)
        assert price.output_per_mtok == pytest.approx(info["output_cost_per_token"] * 1e6)
        assert prices.max_input_tokens(model) == info["max_input_tokens"]
    with pytest.raises(Exception, match="not mapped|isn't mapped"):
        litellm.get_model_info("openai/not-a-real-model-xyz")


def _completion_cost(litellm: object, model: str, prompt_tokens: int, completion_tokens: int) -> float:
    """LiteLLM's own price of a reply with this usage (what the provider bills)."""
    response = litellm.ModelResponse(  # type: ignore[attr-defined]
        model=model, usage={"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                            "total_tokens": prompt_tokens + completion_tokens})
    return float(litellm.completion_cost(completion_response=response, model=model))  # type: ignore[attr-defined]


@pytest.mark.parametrize("prompt_tokens", [1_000, 200_000, 200_001, 250_000, 900_000])
def test_tiered_price_matches_litellms_completion_cost(prompt_tokens: int) -> None:
    # gemini-2.5-pro bills the whole call at $2.50/$15 per Mtok once the prompt passes 200k.
    from loopdsl.runtime.budget import cost_for
    from loopdsl.adapters.litellm import ensure_litellm

    litellm = ensure_litellm()
    price = prices.model_price("gemini/gemini-2.5-pro")
    assert price is not None and price.tiers
    ours = cost_for(price, prompt_tokens, 4_000)
    assert ours == pytest.approx(_completion_cost(litellm, "gemini/gemini-2.5-pro", prompt_tokens, 4_000), rel=1e-9)


def test_every_tiered_chat_model_is_priced_like_litellm() -> None:
    """Both spellings of tiers in the table (`*_above_<N>k_tokens` keys and `tiered_pricing`
    ranges), inclusive thresholds (xAI) included, against LiteLLM's cost_per_token."""
    from loopdsl.runtime.budget import cost_for
    from loopdsl.adapters.litellm import ensure_litellm

    litellm = ensure_litellm()
    table = prices.price_table()
    tiered = [key for key, entry in table.items() if isinstance(entry, dict) and entry.get("mode") == "chat"
              and "copilot" not in key  # its provider logs in over the network to price
              and ("tiered_pricing" in entry or any(k.startswith("input_cost_per_token_above_") for k in entry))]
    compared = 0
    for model in tiered:
        price = prices.model_price(model)
        if price is None:
            continue
        for prompt_tokens in (1_000, 128_000, 128_001, 200_000, 200_001, 256_001, 272_000, 272_001, 1_500_000):
            try:
                prompt_cost, completion_cost = litellm.cost_per_token(model=model, prompt_tokens=prompt_tokens,
                                                                      completion_tokens=1_234)
            except litellm.BadRequestError:  # a key LiteLLM cannot route without a provider prefix
                break
            assert cost_for(price, prompt_tokens, 1_234) == pytest.approx(prompt_cost + completion_cost, rel=1e-9), \
                (model, prompt_tokens)
            compared += 1
    assert len(tiered) > 100 and compared > 1_000


def test_reservation_is_made_at_the_tier_the_prompt_falls_in() -> None:
    from loopdsl.runtime.budget import reservation_for

    price = prices.model_price("gemini/gemini-2.5-pro")
    _tokens, small = reservation_for([("gemini/gemini-2.5-pro", price)], 100_000, 1_000)
    _tokens, large = reservation_for([("gemini/gemini-2.5-pro", price)], 300_000, 1_000)
    assert small == pytest.approx((100_000 * 1.25 + 1_000 * 10) / 1e6)
    assert large == pytest.approx((300_000 * 2.5 + 1_000 * 15) / 1e6)
