from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loopdsl.runtime.budget import (
    BudgetExceeded,
    Ledger,
    Reservation,
    conservative_tokens,
    cost_for,
    plausible_usage,
    reservation_for,
)
from loopdsl.language.prices import cost_changing_params, without_cost_params
from loopdsl.language.model import Budget, Price


# -- reserve at the boundary ---------------------------------------------------------
def test_tokens_reservation_fits_exactly_at_the_cap_and_not_one_more() -> None:
    ledger = Ledger(Budget(tokens=1000))
    ledger.reserve(600, 0.0, "a")
    ledger.reserve(400, 0.0, "b")  # 1000 == cap: allowed
    with pytest.raises(BudgetExceeded) as info:
        ledger.reserve(1, 0.0, "draft")
    assert info.value.which == "tokens"
    assert "draft" in info.value.message and "1,000" in info.value.message
    assert ledger.tokens_reserved == 1000


def test_cost_reservation_boundary_is_exact_despite_float_sums() -> None:
    # 0.1 + 0.2 > 0.3 in floats; the ledger must still let these fit exactly.
    ledger = Ledger(Budget(cost_usd=0.3))
    ledger.reserve(0, 0.1)
    ledger.reserve(0, 0.2)
    with pytest.raises(BudgetExceeded) as info:
        ledger.reserve(0, 1e-9, "review")
    assert info.value.which == "cost_usd"
    assert "review" in str(info.value)


def test_refused_reservation_changes_nothing() -> None:
    ledger = Ledger(Budget(tokens=100, cost_usd=1.0))
    ledger.reserve(50, 0.5)
    before = (ledger.tokens_reserved, ledger.cost_reserved, ledger.spent())
    with pytest.raises(BudgetExceeded):
        ledger.reserve(10, 0.6)  # tokens fit, cost does not
    assert (ledger.tokens_reserved, ledger.cost_reserved, ledger.spent()) == before


def test_uncapped_ledger_accepts_anything() -> None:
    ledger = Ledger(Budget())
    r = ledger.reserve(10**9, 10**6)
    ledger.settle(r, 10**9, 10**6)
    assert ledger.remaining() == {"tokens": None, "cost_usd": None, "steps": None, "wall_time": None}


@pytest.mark.parametrize("tokens, cost", [(-1, 0.0), (1, -0.01), (1, float("nan")), (1.5, 0.0)])
def test_bad_amounts_are_rejected(tokens: object, cost: float) -> None:
    with pytest.raises(ValueError):
        Ledger(Budget()).reserve(tokens, cost)  # type: ignore[arg-type]


# -- settle / charge -----------------------------------------------------------------
def test_settle_replaces_the_reservation_with_reported_usage() -> None:
    ledger = Ledger(Budget(tokens=1000, cost_usd=1.0))
    r = ledger.reserve(900, 0.9, "draft")
    with pytest.raises(BudgetExceeded):
        ledger.reserve(200, 0.0)
    ledger.settle(r, 120, 0.01)
    assert ledger.spent() == {"tokens": 120, "cost_usd": pytest.approx(0.01), "steps": 0}
    assert ledger.tokens_reserved == 0 and ledger.cost_reserved == 0
    assert ledger.remaining()["tokens"] == 880
    ledger.reserve(200, 0.0)  # the freed hold is usable again


def test_settle_with_unknown_cost_charges_the_reserved_cost_not_zero() -> None:
    ledger = Ledger(Budget(cost_usd=1.0))
    r = ledger.reserve(10, 0.25)
    ledger.settle(r, 5, None)
    assert ledger.cost_spent == pytest.approx(0.25)


def test_charge_reservation_charges_the_full_hold() -> None:
    ledger = Ledger(Budget(tokens=500, cost_usd=0.5))
    r = ledger.reserve(300, 0.2, "timed out")
    ledger.charge_reservation(r)
    assert ledger.tokens_spent == 300 and ledger.cost_spent == pytest.approx(0.2)
    assert ledger.outstanding == []


def test_release_frees_a_hold_without_charge() -> None:
    ledger = Ledger(Budget(tokens=10))
    ledger.release(ledger.reserve(10, 0.0))
    assert ledger.spent()["tokens"] == 0
    ledger.reserve(10, 0.0)


def test_a_reservation_settles_once_and_only_in_its_ledger() -> None:
    ledger, other = Ledger(Budget()), Ledger(Budget())
    r = ledger.reserve(1, 0.0, "x")
    with pytest.raises(ValueError, match="not open"):
        other.settle(r, 1, 0.0)
    ledger.settle(r, 1, 0.0)
    with pytest.raises(ValueError, match="already settled"):
        ledger.settle(r, 1, 0.0)
    with pytest.raises(ValueError):
        ledger.settle(Reservation(1, 0.0, "forged"), 1, 0.0)


# -- steps and wall time ------------------------------------------------------------------
def test_steps_cap_checked_before_counting() -> None:
    ledger = Ledger(Budget(steps=2))
    ledger.take_step()
    ledger.take_step()
    with pytest.raises(BudgetExceeded) as info:
        ledger.take_step()
    assert info.value.which == "steps" and ledger.steps == 2


def test_wall_time() -> None:
    ledger = Ledger(Budget(wall_time=60))
    ledger.check_wall_time(59.9)
    with pytest.raises(BudgetExceeded) as info:
        ledger.check_wall_time(60.0)
    assert info.value.which == "wall_time"
    assert ledger.remaining(elapsed_s=45)["wall_time"] == pytest.approx(15)


# -- parent / child ---------------------------------------------------------------------
def test_child_is_bound_by_the_parents_remaining_budget() -> None:
    parent = Ledger(Budget(tokens=1000, cost_usd=1.0, steps=10))
    parent.settle(parent.reserve(700, 0.0), 700, 0.0)
    child = parent.child(Budget(tokens=500))
    assert child.remaining()["tokens"] == 300  # smaller of 500 own and 300 parent's
    with pytest.raises(BudgetExceeded) as info:
        child.reserve(301, 0.0, "fan-out item")
    assert info.value.which == "tokens" and "enclosing run" in info.value.message
    r = child.reserve(300, 0.4)
    assert parent.tokens_reserved == 300 and parent.cost_reserved == pytest.approx(0.4)
    child.settle(r, 100, 0.1)
    assert parent.spent() == {"tokens": 800, "cost_usd": pytest.approx(0.1), "steps": 0}
    assert child.spent()["tokens"] == 100


def test_siblings_in_flight_share_the_parent_cap() -> None:
    parent = Ledger(Budget(cost_usd=1.0))
    a, b = parent.child(Budget()), parent.child(Budget())
    a.reserve(0, 0.6)
    with pytest.raises(BudgetExceeded):
        b.reserve(0, 0.5)
    b.reserve(0, 0.4)


def test_child_own_cap_is_smaller_than_parent() -> None:
    parent = Ledger(Budget(tokens=10_000))
    child = parent.child(Budget(tokens=100))
    with pytest.raises(BudgetExceeded, match="child's own budget"):
        child.reserve(101, 0.0)
    assert parent.tokens_reserved == 0


def test_child_steps_count_against_the_parent() -> None:
    parent = Ledger(Budget(steps=3))
    parent.take_step()
    child = parent.child(Budget(steps=5))
    child.take_step()
    child.take_step()
    with pytest.raises(BudgetExceeded):
        child.take_step()
    assert (parent.steps, child.steps) == (3, 2)


# -- persistence -----------------------------------------------------------------------------
def test_json_round_trip_and_inflight_calls_are_charged_on_reload() -> None:
    caps = Budget(tokens=10_000, cost_usd=2.0, steps=9)
    ledger = Ledger(caps)
    ledger.take_step()
    ledger.settle(ledger.reserve(1000, 0.1), 800, 0.07)
    ledger.reserve(500, 0.3, "in flight when killed")
    data = json.loads(json.dumps(ledger.to_json()))
    again = Ledger.from_json(caps, data)
    assert again.spent() == {"tokens": 1300, "cost_usd": pytest.approx(0.37), "steps": 1}
    assert again.outstanding == []
    # A ledger with nothing in flight round-trips exactly.
    settled = Ledger.from_json(caps, again.to_json())
    assert settled.to_json() == again.to_json()
    assert settled.remaining() == again.remaining()


def test_initial_spent_counts_against_caps() -> None:
    ledger = Ledger(Budget(tokens=100), spent={"tokens": 90, "cost_usd": 0.0, "steps": 0})
    with pytest.raises(BudgetExceeded):
        ledger.reserve(11, 0.0)


# -- pricing helpers ---------------------------------------------------------------------------
def test_reservation_for_uses_the_dearest_model_of_the_chain() -> None:
    cheap, dear = Price(0.15, 0.6), Price(1.0, 5.0)
    tokens, cost = reservation_for([("a", cheap), ("b", dear)], prompt_tokens=1000, max_tokens=500)
    assert tokens == 1500
    assert cost == pytest.approx(cost_for(dear, 1000, 500)) == pytest.approx((1000 * 1.0 + 500 * 5.0) / 1e6)
    assert cost > cost_for(cheap, 1000, 500)


def test_reservation_for_names_an_unpriced_model() -> None:
    with pytest.raises(ValueError, match="'openai/mystery'.*price"):
        reservation_for([("a", Price(1, 1)), ("openai/mystery", None)], 10, 10)


@pytest.mark.parametrize("text, expected", [("", 0), ("abc", 1), ("abcd", 2), ("é" * 3, 2), ("日本語", 3)])
def test_conservative_tokens(text: str, expected: int) -> None:
    assert conservative_tokens(text) == expected == math.ceil(len(text.encode()) / 3)


# -- property: spent never exceeds any cap ---------------------------------------------------------
_ops = st.lists(
    st.tuples(
        st.sampled_from(["reserve", "settle", "charge", "step", "child"]),
        st.integers(0, 40),
        st.integers(0, 40),  # micro-dollars: small numbers so sums land on the caps exactly
        st.floats(0, 1),
    ),
    max_size=40,
)


@pytest.mark.slow
@settings(max_examples=1000, deadline=None)
@given(
    caps=st.tuples(st.integers(0, 120), st.integers(0, 120), st.integers(0, 15)),
    child_caps=st.tuples(st.integers(0, 120), st.integers(0, 120)),
    ops=_ops,
)
def test_spent_never_exceeds_any_cap(
    caps: tuple[int, int, int], child_caps: tuple[int, int], ops: list[tuple[str, int, int, float]]
) -> None:
    root = Ledger(Budget(tokens=caps[0], cost_usd=caps[1] / 1e6, steps=caps[2]))
    ledgers = [root]
    open_holds: list[tuple[Ledger, Reservation]] = []
    for op, tokens, micro_usd, fraction in ops:
        ledger = ledgers[tokens % len(ledgers)]
        try:
            if op == "reserve":
                open_holds.append((ledger, ledger.reserve(tokens, micro_usd / 1e6)))
            elif op == "step":
                ledger.take_step()
            elif op == "child":
                ledgers.append(ledger.child(Budget(tokens=child_caps[0], cost_usd=child_caps[1] / 1e6)))
            elif open_holds:
                owner, r = open_holds.pop(tokens % len(open_holds))
                if op == "charge":
                    owner.charge_reservation(r)
                else:  # a provider reports at most what was reserved (the worst case)
                    owner.settle(r, int(r.tokens * fraction), r.cost_usd * fraction)
        except BudgetExceeded:
            pass
        for each in ledgers:
            for cap, used in (
                (each.caps.tokens, each.tokens_spent + each.tokens_reserved),
                (each.caps.cost_usd, each.cost_spent + each.cost_reserved),
                (each.caps.steps, each.steps),
            ):
                assert cap is None or used <= cap + 1e-12
            # What a ledger holds is exactly its open reservations (its own and its children's).
            assert each.tokens_reserved == sum(r.tokens for r in each.outstanding)
    for owner, r in open_holds:
        owner.charge_reservation(r)
    assert root.tokens_reserved == 0 and root.tokens_spent <= caps[0]
    assert root.cost_spent <= caps[1] / 1e6 + 1e-12


# -- what may change a call's cost ---------------------------------------------------------
def test_cost_changing_params_are_found_at_any_depth_and_spelling() -> None:
    params = {"seed": 1, "N": 3, "Max-Tokens": 9, "extra_body": {"generationConfig": {"maxOutputTokens": 9,
              "candidateCount": 2}, "stop": ["x"]}, "list": [{"thinking": {"budget_tokens": 1}}],
              "serviceTier": "priority", "reasoning_effort": "low"}
    assert cost_changing_params(params) == [
        ("Max-Tokens",), ("N",), ("extra_body", "generationConfig", "candidateCount"),
        ("extra_body", "generationConfig", "maxOutputTokens"), ("list", 0, "thinking"), ("serviceTier",)]
    assert without_cost_params(params) == {"seed": 1, "extra_body": {"generationConfig": {}, "stop": ["x"]},
                                           "list": [{}], "reasoning_effort": "low"}
    deep: dict = {}
    node = deep
    for _ in range(5_000):  # deeper than the recursion limit: found without recursing
        node["x"] = {}
        node = node["x"]
    node["n"] = 2
    assert len(cost_changing_params(deep)[0]) == 5_001


@pytest.mark.parametrize("usage, ok", [
    ((10, 0), True), ((10, 5), True), ((0, 0), False), ((0, 5), False), ((-1, 5), False), ((5, -1), False),
    ((None, 5), False), ((5, None), False), ((True, 5), False), ((5.0, 5), False), ((10**10, 5), False),
])
def test_plausible_usage(usage: tuple, ok: bool) -> None:
    assert plausible_usage(*usage) is ok


def test_tiered_price_bills_the_whole_call_at_the_tier_passed() -> None:
    price = Price(1.0, 2.0, tiers=((1000, 3.0, 4.0), (100, 1.5, 2.5)))
    assert cost_for(price, 100, 10) == pytest.approx((100 * 1.0 + 10 * 2.0) / 1e6)
    assert cost_for(price, 101, 10) == pytest.approx((101 * 1.5 + 10 * 2.5) / 1e6)
    assert cost_for(price, 1001, 10) == pytest.approx((1001 * 3.0 + 10 * 4.0) / 1e6)
