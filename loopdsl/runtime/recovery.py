"""What a resumed run corrects in its spending before it goes on: a model call that
completed just before a kill, and spending no state was charged with."""
from __future__ import annotations

from typing import TYPE_CHECKING

from .run_state import checked_response

if TYPE_CHECKING:
    from .engine import Engine


def settle_completed_call(engine: "Engine") -> None:
    """A run killed between an LLM call's stored response and the next commit was
    charged that call's whole reservation on reload; charge what it really cost."""
    pending = engine.run.pending
    if not pending or pending.get("kind") != "llm" or "reserved" not in pending or pending.get("settled"):
        return
    stored = checked_response(engine.ports.responses.get_response(pending["key"]), "model_reply", engine.run.run_id)
    if stored is None or stored.get("cached"):
        return
    usage = stored.get("usage") or {}
    reserved = pending["reserved"]
    engine.ledger.correct_charged(int(reserved["tokens"]), float(reserved["cost_usd"]),
                                int(usage.get("prompt_tokens", 0)) + int(usage.get("completion_tokens", 0)),
                                float(stored.get("cost_usd") or 0.0))
    pending["settled"] = True


def account_for_crash(engine: "Engine") -> None:
    """Spending committed by a process killed mid-attempt (a charged reservation, a call
    completed just before the kill) never reached the per-state totals: give it to the
    state that was running, so that the per-state table adds up to `spent`."""
    usage = engine.run.usage
    tokens = engine.ledger.tokens_spent - sum(int(u.get("tokens", 0)) for u in usage.values())
    cost = engine.ledger.cost_spent - sum(float(u.get("cost_usd", 0.0)) for u in usage.values())
    if tokens <= 0 and cost <= 1e-12:
        return
    name = (engine.run.pending or {}).get("state") or engine.run.current
    totals = usage.setdefault(name, {"tokens": 0, "cost_usd": 0.0, "seconds": 0.0, "attempts": 0})
    totals["tokens"] += max(tokens, 0)
    totals["cost_usd"] = round(totals["cost_usd"] + max(cost, 0.0), 12)
