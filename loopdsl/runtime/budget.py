"""The budget ledger: what makes `budget:` a hard cap rather than a report.

Before an LLM call the engine reserves the call's worst case (`reservation_for`);
`Ledger.reserve` refuses it unless spent + outstanding reservations + the new one
fit under every cap, in this ledger and in every ancestor (a sub-loop or fan-out
child shares its parent's budget). After the call the provider's reported usage
replaces the reservation (`settle`); a call that may have been paid without a usable
report (timed out, dropped, unreadable reply or usage, cancelled or killed) is charged the
whole reservation (`charge_reservation`); docs/dsl.md has the table. Because reservations are
held while calls are in flight, concurrent fan-out children cannot together
overrun a cap.

`reserve` and `settle` never await, so under asyncio each is atomic.

Money is kept as an integer count of pico-dollars (1e-12 USD) so that sums are
exact: reserving $0.10 and then $0.20 against a $0.30 cap fits, as it should,
where float addition (0.1 + 0.2 > 0.3) would refuse it.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..language.model import Budget, Price

_PICO_PER_USD = 10**12
BUDGET_KINDS = ("tokens", "cost_usd", "steps", "wall_time")


class BudgetExceeded(Exception):
    """A cap would be crossed; `which` names the cap ("tokens", "cost_usd", "steps", "wall_time")."""

    def __init__(self, which: str, message: str) -> None:
        super().__init__(message)
        self.which = which
        self.message = message

    def __str__(self) -> str:
        return self.message


@dataclass(eq=False)
class Reservation:
    """An amount held against the caps while one call is in flight.

    Compared by identity: two reservations of the same size are different holds.
    """

    tokens: int
    cost_usd: float
    label: str = ""
    _pico: int = field(default=0, repr=False)


def _to_pico(cost_usd: float, what: str) -> int:
    if isinstance(cost_usd, bool) or not isinstance(cost_usd, (int, float)) or not math.isfinite(cost_usd):
        raise ValueError(f"{what} must be a finite number of US dollars, got {cost_usd!r}")
    if cost_usd < 0:
        raise ValueError(f"{what} must not be negative, got {cost_usd!r}")
    return round(cost_usd * _PICO_PER_USD)


def _check_tokens(tokens: int, what: str) -> int:
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise ValueError(f"{what} must be a non-negative integer, got {tokens!r}")
    return tokens


def _usd(pico: int) -> float:
    return pico / _PICO_PER_USD


class Ledger:
    def __init__(
        self,
        caps: Budget,
        spent: Mapping[str, Any] | None = None,
        parent: Ledger | None = None,
        *,
        name: str = "run",
    ) -> None:
        self.caps = caps
        self.parent = parent
        self.name = name
        spent = spent or {}
        self.tokens_spent: int = _check_tokens(int(spent.get("tokens", 0) or 0), "spent tokens")
        self._cost_spent_pico: int = (
            int(spent["cost_picousd"])
            if "cost_picousd" in spent
            else _to_pico(float(spent.get("cost_usd", 0.0) or 0.0), "spent cost_usd")
        )
        self.steps: int = _check_tokens(int(spent.get("steps", 0) or 0), "spent steps")
        self.tokens_reserved: int = 0
        self._cost_reserved_pico: int = 0
        # Keyed by id(): the dict holds the object, so the id cannot be reused while open.
        self._open: dict[int, Reservation] = {}

    # -- amounts -----------------------------------------------------------
    @property
    def cost_spent(self) -> float:
        return _usd(self._cost_spent_pico)

    @property
    def cost_reserved(self) -> float:
        return _usd(self._cost_reserved_pico)

    @property
    def outstanding(self) -> list[Reservation]:
        return list(self._open.values())

    def _chain(self) -> list[Ledger]:
        chain: list[Ledger] = []
        ledger: Ledger | None = self
        while ledger is not None:
            chain.append(ledger)
            ledger = ledger.parent
        return chain

    def _whose(self, asking: Ledger | None = None) -> str:
        """Which budget refused: the one asked, or an enclosing one it shares."""
        if asking is not None and asking is not self:
            return f" (the enclosing {self.name}'s budget, shared with {asking.name})"
        return "" if self.parent is None else f" ({self.name}'s own budget)"

    # -- steps and time ----------------------------------------------------
    def take_step(self) -> None:
        chain = self._chain()
        for ledger in chain:
            cap = ledger.caps.steps
            if cap is not None and ledger.steps >= cap:
                raise BudgetExceeded(
                    "steps", f"budget exhausted: steps: all {cap} steps are used{ledger._whose(self)}"
                )
        for ledger in chain:
            ledger.steps += 1

    async def hold(self, calls_model: bool = False) -> None:
        """Confirms with a ledger kept elsewhere what was taken since the last call (a
        Temporal child asks its root run: adapters/temporal/budget_tree.py); here, nothing.
        `calls_model`: a model call's reservation follows, which may carry the step."""

    def check_wall_time(self, elapsed_s: float) -> None:
        cap = self.caps.wall_time
        if cap is not None and elapsed_s >= cap:
            raise BudgetExceeded(
                "wall_time",
                f"budget exhausted: wall_time: the run has taken {elapsed_s:.1f}s of its {cap:g}s{self._whose()}",
            )

    def past_cap(self) -> BudgetExceeded | None:
        """What a provider's reported usage pushed past a cap (more than was reserved: the one
        way spending passes one), to end the run on; None while every cap holds."""
        for ledger in self._chain():
            if ledger.caps.tokens is not None and ledger.tokens_spent > ledger.caps.tokens:
                return BudgetExceeded("tokens", f"budget exhausted: tokens: the provider reported usage that brought "
                                      f"spent to {ledger.tokens_spent:,}, past the cap of {ledger.caps.tokens:,}"
                                      f"{ledger._whose(self)} (more than the call reserved)")
            if ledger.caps.cost_usd is not None and ledger._cost_spent_pico > _to_pico(ledger.caps.cost_usd, "cost_usd cap"):
                return BudgetExceeded("cost_usd", f"budget exhausted: cost_usd: the provider reported usage that brought "
                                      f"spent to ${ledger.cost_spent:.6f}, past the cap of ${ledger.caps.cost_usd:.6f}"
                                      f"{ledger._whose(self)} (more than the call reserved)")
        return None

    # -- reservations ------------------------------------------------------
    def reserve(self, tokens: int, cost_usd: float, label: str = "") -> Reservation:
        tokens = _check_tokens(tokens, "reserved tokens")
        pico = _to_pico(cost_usd, "reserved cost_usd")
        what = f" for {label}" if label else ""
        chain = self._chain()
        # Check every ledger before holding anything, so a refusal changes nothing.
        for ledger in chain:
            cap_tokens = ledger.caps.tokens
            if cap_tokens is not None:
                total = ledger.tokens_spent + ledger.tokens_reserved + tokens
                if total > cap_tokens:
                    raise BudgetExceeded(
                        "tokens",
                        f"budget exhausted: tokens: reserving {tokens:,}{what} would bring spent "
                        f"{ledger.tokens_spent:,} + in flight {ledger.tokens_reserved:,} to {total:,}, "
                        f"over the cap of {cap_tokens:,}{ledger._whose(self)}",
                    )
            if ledger.caps.cost_usd is not None:
                cap_pico = _to_pico(ledger.caps.cost_usd, "cost_usd cap")
                total_pico = ledger._cost_spent_pico + ledger._cost_reserved_pico + pico
                if total_pico > cap_pico:
                    raise BudgetExceeded(
                        "cost_usd",
                        f"budget exhausted: cost_usd: reserving ${_usd(pico):.6f}{what} would bring spent "
                        f"${ledger.cost_spent:.6f} + in flight ${ledger.cost_reserved:.6f} to "
                        f"${_usd(total_pico):.6f}, over the cap of ${ledger.caps.cost_usd:.6f}{ledger._whose(self)}",
                    )
        reservation = Reservation(tokens=tokens, cost_usd=_usd(pico), label=label, _pico=pico)
        for ledger in chain:
            ledger.tokens_reserved += tokens
            ledger._cost_reserved_pico += pico
            ledger._open[id(reservation)] = reservation
        return reservation

    def settle(self, r: Reservation, tokens: int, cost_usd: float | None) -> None:
        """Replace a reservation with what the provider reported.

        A cost of None (the provider could not price the call) is charged at the
        reserved cost: unknown is never recorded as free. Actual usage above the
        reservation is recorded as it is (it was spent); later reservations then see it.
        """
        tokens = _check_tokens(tokens, "settled tokens")
        pico = r._pico if cost_usd is None else _to_pico(cost_usd, "settled cost_usd")
        chain = self._chain()
        if id(r) not in self._open:
            raise ValueError(
                f"reservation {r.label or '(unlabelled)'} is not open in this ledger: "
                "it was already settled or belongs to another ledger"
            )
        for ledger in chain:
            if ledger._open.pop(id(r), None) is None:
                continue
            ledger.tokens_reserved -= r.tokens
            ledger._cost_reserved_pico -= r._pico
            ledger.tokens_spent += tokens
            ledger._cost_spent_pico += pico

    def charge_reservation(self, r: Reservation) -> None:
        """A call that timed out, was cancelled or killed may have been paid: charge it all."""
        self.settle(r, r.tokens, _usd(r._pico))

    def release(self, r: Reservation) -> None:
        """A call that certainly never reached the provider (e.g. refused before sending)."""
        self.settle(r, 0, 0.0)

    def correct_charged(self, charged_tokens: int, charged_cost_usd: float, tokens: int, cost_usd: float) -> None:
        """Replace a full charge made for a call in flight at a crash (see `from_json`) by
        what the call really cost, once its stored response shows it completed. Ancestors
        were rebuilt from records that held the same reservation, so they are corrected too."""
        token_delta = _check_tokens(tokens, "tokens") - _check_tokens(charged_tokens, "charged tokens")
        pico_delta = _to_pico(cost_usd, "cost_usd") - _to_pico(charged_cost_usd, "charged cost_usd")
        for ledger in self._chain():
            ledger.tokens_spent += token_delta
            ledger._cost_spent_pico += pico_delta

    # -- views ---------------------------------------------------------------
    def spent(self) -> dict[str, Any]:
        return {"tokens": self.tokens_spent, "cost_usd": self.cost_spent, "steps": self.steps}

    def reserved(self) -> dict[str, Any]:
        return {"tokens": self.tokens_reserved, "cost_usd": self.cost_reserved}

    def remaining(self, elapsed_s: float | None = None) -> dict[str, Any]:
        """What is left under each cap (None when uncapped), after in-flight reservations.

        For a child ledger each figure is the smaller of its own and its ancestors'.
        `wall_time` is the cap minus `elapsed_s` (the ledger does not keep a clock).
        """
        tokens: int | None = None
        cost_pico: int | None = None
        steps: int | None = None
        for ledger in self._chain():
            caps = ledger.caps
            if caps.tokens is not None:
                left = max(0, caps.tokens - ledger.tokens_spent - ledger.tokens_reserved)
                tokens = left if tokens is None else min(tokens, left)
            if caps.cost_usd is not None:
                left_pico = max(
                    0, _to_pico(caps.cost_usd, "cost_usd cap") - ledger._cost_spent_pico - ledger._cost_reserved_pico
                )
                cost_pico = left_pico if cost_pico is None else min(cost_pico, left_pico)
            if caps.steps is not None:
                left_steps = max(0, caps.steps - ledger.steps)
                steps = left_steps if steps is None else min(steps, left_steps)
        wall: float | None = None
        if self.caps.wall_time is not None:
            wall = max(0.0, self.caps.wall_time - (elapsed_s or 0.0))
        return {
            "tokens": tokens,
            "cost_usd": None if cost_pico is None else _usd(cost_pico),
            "steps": steps,
            "wall_time": wall,
        }

    # -- persistence -------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens_spent,
            "cost_usd": self.cost_spent,
            "cost_picousd": self._cost_spent_pico,
            "steps": self.steps,
            "outstanding": [
                {"tokens": r.tokens, "cost_usd": r.cost_usd, "cost_picousd": r._pico, "label": r.label}
                for r in self._open.values()
            ],
        }

    @classmethod
    def from_json(
        cls, caps: Budget, data: Mapping[str, Any], parent: Ledger | None = None, *, name: str = "run"
    ) -> Ledger:
        """Rebuild a ledger from `to_json`; reservations still open then are charged in full.

        An open reservation in a saved ledger is a call that was in flight when the
        process stopped: it may have been paid, so it counts as spent. Nothing is
        added to `parent`, whose own saved figures already include this ledger's.
        """
        ledger = cls(caps, spent=data, parent=None, name=name)
        for item in data.get("outstanding", ()) or ():
            ledger.tokens_spent += _check_tokens(int(item.get("tokens", 0)), "outstanding tokens")
            ledger._cost_spent_pico += (
                int(item["cost_picousd"])
                if "cost_picousd" in item
                else _to_pico(float(item.get("cost_usd", 0.0)), "outstanding cost_usd")
            )
        ledger.parent = parent
        return ledger

    def child(self, caps: Budget, *, name: str = "child") -> Ledger:
        """A ledger for a sub-loop or fan-out child: its own caps, and every ancestor's too."""
        return Ledger(caps, parent=self, name=name)


def rates_for(price: Price, prompt_tokens: int) -> tuple[float, float]:
    """(input, output) USD per million tokens for a call with this many prompt tokens.

    A tiered price bills every token of a call at the rate of the highest tier whose
    threshold the prompt exceeds (as LiteLLM and the providers do), not just the excess.
    """
    rates = (price.input_per_mtok, price.output_per_mtok)
    for above, input_per_mtok, output_per_mtok in sorted(price.tiers):
        if prompt_tokens > above:
            rates = (input_per_mtok, output_per_mtok)
    return rates


def cost_for(price: Price, prompt_tokens: int, completion_tokens: int) -> float:
    """USD for a call at `price` (per million tokens), at the tier the prompt falls in."""
    input_per_mtok, output_per_mtok = rates_for(price, prompt_tokens)
    return (prompt_tokens * input_per_mtok + completion_tokens * output_per_mtok) / 1_000_000


def reservation_for(
    models: Sequence[tuple[str, Price | None]], prompt_tokens: int, max_tokens: int
) -> tuple[int, float]:
    """The worst case of one call over a fallback chain: (tokens, cost_usd).

    Tokens are prompt + max_tokens; the cost is that many tokens priced at the
    dearest model of the chain, so whichever model answers, the hold covers it.
    """
    if not models:
        raise ValueError("reservation_for needs at least one model")
    _check_tokens(prompt_tokens, "prompt_tokens")
    _check_tokens(max_tokens, "max_tokens")
    worst = 0.0
    for name, price in models:
        if price is None:
            raise ValueError(
                f"no price known for model {name!r}: LiteLLM's price table does not list it; "
                "give its model alias a `price: {input_per_mtok: ..., output_per_mtok: ...}`"
            )
        worst = max(worst, cost_for(price, prompt_tokens, max_tokens))
    return prompt_tokens + max_tokens, worst


# No single call reads or writes a billion tokens: a larger count is garbage, not usage.
_MAX_PLAUSIBLE_TOKENS = 10**9


def plausible_usage(prompt_tokens: Any, completion_tokens: Any) -> bool:
    """Whether a reply's reported usage can be charged as it is. Missing, negative,
    non-integer or absurd counts cannot (nor a prompt of 0 tokens: every call sends one);
    such a call is charged its whole reservation instead."""
    for count in (prompt_tokens, completion_tokens):
        if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= _MAX_PLAUSIBLE_TOKENS:
            return False
    return prompt_tokens > 0


def conservative_tokens(text: str) -> int:
    """An upper estimate of a text's tokens without a tokenizer: one token per 3 UTF-8 bytes.

    Real BPE tokenizers average about 4 bytes per token on English and code; 3 keeps
    the estimate above the true count for the texts dry runs and `cost` price.
    """
    return math.ceil(len(text.encode("utf-8", errors="surrogatepass")) / 3)
