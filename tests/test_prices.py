from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from loopdsl import prices


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
        from loopdsl import prices
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
    from loopdsl.providers import ensure_litellm

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
