"""Model prices and context windows, read as data from LiteLLM's price table.

`lint`, `cost` and dry runs need prices but must not pay LiteLLM's multi-second
import, so this module never imports litellm: it locates the installed package with
`importlib.util.find_spec` (which does not execute the package) and reads the JSON
table shipped inside it. The table is the same one LiteLLM itself uses when
`LITELLM_LOCAL_MODEL_COST_MAP=True`, which is how `providers.ensure_litellm` runs it,
so the prices reserved here are the prices LiteLLM later reports.
"""
from __future__ import annotations

import importlib.util
import json
import re
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from .model import Price

PRICE_TABLE_FILE = "model_prices_and_context_window_backup.json"
_TOKENS_PER_MTOK = 1_000_000


class PriceTableUnavailable(RuntimeError):
    """LiteLLM (and so its price table) is not installed or the table is unreadable."""


def price_table_path() -> Path:
    spec = importlib.util.find_spec("litellm")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        candidate = Path(location) / PRICE_TABLE_FILE
        if candidate.is_file():
            return candidate
    raise PriceTableUnavailable(
        f"cannot find LiteLLM's price table ({PRICE_TABLE_FILE}): is litellm installed? "
        "Install it (pip install litellm) or give each model alias a `price:`."
    )


@lru_cache(maxsize=1)
def price_table() -> dict:
    path = price_table_path()
    try:
        table = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise PriceTableUnavailable(f"cannot read LiteLLM's price table {path}: {exc}") from exc
    if not isinstance(table, dict):
        raise PriceTableUnavailable(f"LiteLLM's price table {path} is not a JSON object")
    # The first entry documents the format; it is not a model.
    table.pop("sample_spec", None)
    return table


@lru_cache(maxsize=1)
def _lowercase_index() -> dict[str, str]:
    # LiteLLM matches table keys case-insensitively; keep the first spelling seen.
    index: dict[str, str] = {}
    for key in price_table():
        index.setdefault(key.lower(), key)
    return index


def _provider_matches(prefix: str, litellm_provider: Any) -> bool:
    """Whether a "prefix/" in a model string names the provider of a table entry.

    The table spells some providers with a qualifier ("vertex_ai-language-models",
    "text-completion-openai"); the prefix a user writes is the bare provider.
    """
    if not isinstance(litellm_provider, str):
        return False
    provider = litellm_provider.lower()
    prefix = prefix.lower()
    return provider == prefix or provider.startswith(prefix + "-") or provider.endswith("-" + prefix)


@lru_cache(maxsize=1)
def _table_text() -> str:
    try:
        return price_table_path().read_text(encoding="utf-8")
    except OSError as exc:
        raise PriceTableUnavailable(f"cannot read LiteLLM's price table: {exc}") from exc


@lru_cache(maxsize=1)
def _folded_text() -> str:
    folded = _table_text().lower()
    if len(folded) != len(_table_text()):  # lower() changed a length: offsets would not match
        raise ValueError("the price table has characters whose lower case differs in length")
    return folded


def _quick_entry(key: str) -> Mapping[str, Any] | None:
    """One top-level entry decoded straight from the table's text.

    Parsing the whole 3.5 MB table costs ~100 ms, most of a one-file lint; the table
    is one key per line at four spaces, so an exact key is found by a string search
    and only its object is decoded.
    """
    if key == "sample_spec":  # the table's format documentation, not a model
        return None
    text = _table_text()
    needle = "\n    " + json.dumps(key) + ": {"
    at = text.find(needle)
    if at < 0:
        # LiteLLM matches keys case-insensitively: the first spelling in the file wins.
        at = _folded_text().find(needle.lower())
        if at < 0:
            return None
    try:
        entry, _end = json.JSONDecoder().raw_decode(text, at + len(needle) - 1)
    except ValueError:
        return None
    return entry if isinstance(entry, Mapping) else None


def _lookup(key: str) -> Mapping[str, Any] | None:
    try:
        return _quick_entry(key)
    except PriceTableUnavailable:
        raise
    except Exception:  # an unexpected layout of a future table: decode it whole instead
        pass
    table = price_table()
    entry = table.get(key)
    if entry is None:
        real_key = _lowercase_index().get(key.lower())
        entry = table.get(real_key) if real_key is not None else None
    return entry if isinstance(entry, Mapping) else None


@lru_cache(maxsize=1024)
def model_info(model: str) -> Mapping[str, Any] | None:
    """The price-table entry for a LiteLLM model string, resolved as LiteLLM does.

    First the exact key ("gemini/gemini-2.5-flash", "gpt-4o-mini"), then, for
    "provider/name", the bare name when that entry belongs to the same provider
    ("openai/gpt-4o-mini" -> "gpt-4o-mini", "anthropic/claude-haiku-4-5" ->
    "claude-haiku-4-5"). A bare name under a different provider is not a match:
    "groq/gpt-4o-mini" is not OpenAI's price.
    """
    model = model.strip()
    if not model:
        return None
    entry = _lookup(model)
    if entry is not None:
        return entry
    prefix, sep, rest = model.partition("/")
    if sep and rest:
        entry = _lookup(rest)
        if entry is not None and _provider_matches(prefix, entry.get("litellm_provider")):
            return entry
    return None


def model_provider(model: str) -> str | None:
    """LiteLLM's provider name for a model known to the table ("openai", "anthropic" ...)."""
    entry = model_info(model)
    provider = entry.get("litellm_provider") if entry is not None else None
    return provider if isinstance(provider, str) else None


def _per_mtok(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    # Rounded so that 1.5e-07/token reads as 0.15, not 0.15000000000000002.
    return round(float(value) * _TOKENS_PER_MTOK, 10)


# `input_cost_per_token_above_200k_tokens`; suffixed variants (`..._priority`, `_batches`)
# price other service tiers, which loopdsl never requests (lint refuses `service_tier`).
_ABOVE_KEY = re.compile(r"input_cost_per_token_above_(\d+(?:\.\d+)?)(k?)_tokens")
# Providers that bill the higher tier once the prompt *reaches* the threshold (LiteLLM's list).
_INCLUSIVE_THRESHOLD_PROVIDERS = frozenset({"xai"})


def price_tiers(entry: Mapping[str, Any], base_output: float) -> tuple[tuple[int, float, float], ...]:
    """The entry's prompt-size tiers as (prompt tokens above which, input, output per Mtok).

    Two spellings exist in LiteLLM's table: `*_cost_per_token_above_<N>[k]_tokens` keys,
    and a `tiered_pricing` list of `{range: [start, end], ...}` (a tier applies above
    `start`; past the last `end` the last tier still applies). A tier without its own
    output rate keeps the base output rate, as LiteLLM does.
    """
    tiers: list[tuple[int, float, float]] = []
    inclusive = entry.get("litellm_provider") in _INCLUSIVE_THRESHOLD_PROVIDERS
    for key, value in entry.items():
        found = _ABOVE_KEY.fullmatch(str(key))
        per_input = _per_mtok(value)
        if found is None or per_input is None:
            continue
        threshold = int(float(found.group(1)) * (1000 if found.group(2) else 1))
        per_output = _per_mtok(entry.get(key.replace("input_cost", "output_cost", 1)))
        tiers.append((threshold - 1 if inclusive else threshold, per_input,
                      base_output if per_output is None else per_output))
    ranged = entry.get("tiered_pricing")
    for tier in ranged if isinstance(ranged, list) else ():
        bounds = tier.get("range") if isinstance(tier, Mapping) else None
        per_input = _per_mtok(tier.get("input_cost_per_token")) if isinstance(tier, Mapping) else None
        if not isinstance(bounds, list) or not bounds or per_input is None or _per_mtok(bounds[0]) is None:
            continue
        per_output = _per_mtok(tier.get("output_cost_per_token"))
        tiers.append((int(bounds[0]), per_input, base_output if per_output is None else per_output))
    return tuple(sorted(tiers))


def model_price(model: str) -> Price | None:
    """USD per million tokens (input, output, and any prompt-size tiers), or None when
    the table has no price."""
    entry = model_info(model)
    if entry is None:
        return None
    per_input = _per_mtok(entry.get("input_cost_per_token"))
    per_output = _per_mtok(entry.get("output_cost_per_token"))
    if per_input is None or per_output is None:
        return None
    return Price(input_per_mtok=per_input, output_per_mtok=per_output, tiers=price_tiers(entry, per_output))


def max_input_tokens(model: str) -> int | None:
    return _table_size(model, "max_input_tokens")


def max_output_tokens(model: str) -> int | None:
    """How many tokens `model` writes at most in one call, per the table."""
    return _table_size(model, "max_output_tokens")


def _table_size(model: str, key: str) -> int | None:
    entry = model_info(model)
    value = entry.get(key) if entry is not None else None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return int(value)


# Request parameters that change what one call may cost, compared without case, `_` or `-`:
# several completions per request, an output cap other than the reserved `max_tokens`
# (each provider's spelling), a thinking budget, a dearer service tier, or another model,
# prompt or fallback chain than the one reserved for.
_COST_PARAMS = frozenset({
    "n", "bestof", "candidatecount", "numgenerations",
    "maxtokens", "maxcompletiontokens", "maxoutputtokens", "maxnewtokens", "maxtokenstosample", "numpredict",
    "thinking", "thinkingbudget", "thinkingconfig", "budgettokens",
    "servicetier",
    "model", "messages", "fallbacks", "contextwindowfallbackdict",
})


def _is_cost_param(key: Any) -> bool:
    return str(key).lower().replace("_", "").replace("-", "") in _COST_PARAMS


def cost_changing_params(params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
    """Paths (within `params`) of keys that would change what a call costs, at any depth:
    `extra_body: {n: 20}` reaches the provider as surely as `n: 20`."""
    found: list[tuple[Any, ...]] = []
    stack: list[tuple[tuple[Any, ...], Any]] = [((), params)]
    while stack:  # iterative: a deeply nested value must not exhaust the recursion limit
        path, value = stack.pop()
        if isinstance(value, Mapping):
            for key, item in value.items():
                if _is_cost_param(key):
                    found.append(path + (key,))
                else:
                    stack.append((path + (key,), item))
        elif isinstance(value, (list, tuple)):
            stack.extend((path + (i,), item) for i, item in enumerate(value))
    return sorted(found, key=lambda p: [str(k) for k in p])


def without_cost_params(value: Any) -> Any:
    """A copy of `value` without any cost-changing key (the call-time defence behind lint)."""
    if isinstance(value, Mapping):
        return {k: without_cost_params(v) for k, v in value.items() if not _is_cost_param(k)}
    if isinstance(value, (list, tuple)):
        return [without_cost_params(v) for v in value]
    return value
