"""The price checks a model alias gets wherever it is declared (a loop or an imported
library): lint reports them as rules, the import resolver while it merges libraries."""
from __future__ import annotations

from collections.abc import Callable

from .diagnostics import Diagnostic, Severity
from .model import ModelAlias, YamlPath
from .prices import PriceTableUnavailable, cost_changing_params, model_price


def price_diagnostic(path: str, position: tuple[int, int], alias: str, model: str) -> Diagnostic | None:
    """unknown-price for `model` of alias `alias`, or None when LiteLLM's table prices it."""
    try:
        if model_price(model) is not None:
            return None
        reason = ""
    except PriceTableUnavailable as exc:
        reason = f" ({exc})"
    return Diagnostic(
        path, position[0], position[1], Severity.ERROR, "unknown-price",
        f'model "{model}" (alias "{alias}") has no price in LiteLLM\'s table{reason}',
        "check the spelling (provider/model) or give the alias "
        "`price: {input_per_mtok: N, output_per_mtok: N}` (USD per million tokens) "
        "so the budget can be enforced",
    )


def params_cost_diagnostics(path: str, locate: Callable[[YamlPath], tuple[int, int]], alias: ModelAlias) -> list[Diagnostic]:
    """params-cost for each key of `models.X.params` (at any depth) that changes what a
    call costs: the budget reserves one completion of at most `max_tokens` tokens."""
    out = []
    for inner in cost_changing_params(alias.params):
        shown = ".".join(str(k) for k in inner)
        line, col = locate(("models", alias.name, "params", *inner))
        out.append(Diagnostic(
            path, line, col, Severity.ERROR, "params-cost",
            f'model alias "{alias.name}" sets params.{shown}, which changes what a call costs '
            "beyond what the budget reserves",
            "remove it: the budget reserves one completion of the alias's `model` (or a `fallbacks` entry) "
            "for the state's prompt, of at most `max_tokens` tokens (set on the alias or the call), at the "
            "standard tier; bound spending with `budget:` (tokens, cost_usd)",
        ))
    return out
