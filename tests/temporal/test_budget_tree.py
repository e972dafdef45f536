"""The root's ledger tree on its own (budget_tree.BudgetTree): what its signal handler
decides for each request, with the answers collected instead of signalled. The same
object runs in the root workflow; test_shared_budget.py runs it across workers."""
from __future__ import annotations

from typing import Any

import pytest

from loopdsl.language.model import Budget
from loopdsl.runtime.budget import Ledger

pytest.importorskip("temporalio", reason="the temporal extra (pip install 'loopdsl[temporal]')")

from loopdsl.adapters.temporal.budget_tree import MAX_RESERVE_SIGNALS, BudgetTree  # noqa: E402

CHILD = {"id": "root/each/0", "caps": {"tokens": None, "cost_usd": None, "steps": None, "wall_time": None}}


def _tree(caps: Budget) -> tuple[BudgetTree, Ledger, list[tuple[str, dict[str, Any]]]]:
    root = Ledger(caps)
    sent: list[tuple[str, dict[str, Any]]] = []
    return BudgetTree(lambda: root, lambda to, _name, answer: sent.append((to, answer))), root, sent


def _ask(tree: BudgetTree, key: str, tokens: int, *, child: dict[str, Any] = CHILD, steps: int = 0,
         settle: list[dict[str, Any]] | None = None) -> None:
    tree.on_reserve({"key": key, "from": child["id"], "path": [child], "steps": steps, "settle": settle or [],
                     "reservations": [{"key": f"{key}.r", "tokens": tokens, "cost_usd": 0.0, "label": key}]})


def test_a_repeated_request_gets_the_same_answer_and_holds_once() -> None:
    tree, root, sent = _tree(Budget(tokens=100))
    _ask(tree, "c#1", 60)
    _ask(tree, "c#1", 60)  # signals come at least once
    assert [a["ok"] for _, a in sent] == [True, True] and root.tokens_reserved == 60
    _ask(tree, "c#2", 60)
    assert sent[-1][1]["ok"] is False and "over the cap of 100" in sent[-1][1]["message"]
    assert root.tokens_reserved == 60 and tree.signals == 2


def test_a_refused_request_changes_nothing_and_settlements_ride_along() -> None:
    tree, root, sent = _tree(Budget(tokens=100, steps=3))
    _ask(tree, "c#1", 60, steps=2)
    _ask(tree, "c#2", 50, steps=1)  # the step fits, the tokens do not: neither is taken
    assert sent[-1][1]["which"] == "tokens" and root.steps == 2 and root.tokens_reserved == 60
    _ask(tree, "c#3", 50, steps=1, settle=[{"key": "c#1.r", "tokens": 40, "cost_usd": 0.0}])
    assert sent[-1][1]["ok"] is True and root.tokens_spent == 40 and root.tokens_reserved == 50 and root.steps == 3


def test_a_closed_child_is_charged_what_it_held_and_refused_after() -> None:
    tree, root, sent = _tree(Budget(tokens=1000))
    grandchild = {"id": "root/each/0/sub", "caps": CHILD["caps"]}
    tree.on_reserve({"key": "g#1", "from": grandchild["id"], "path": [CHILD, grandchild], "steps": 0, "settle": [],
                     "reservations": [{"key": "g#1.r", "tokens": 70, "cost_usd": 0.0, "label": "g"}]})
    _ask(tree, "c#1", 30)
    tree.on_closed("root/each/0", [{"key": "c#1.r", "tokens": 10, "cost_usd": 0.0}])
    # Its own call settled at 10; its grandchild's open hold (maybe paid) charged in full.
    assert root.tokens_spent == 80 and root.tokens_reserved == 0 and tree.mirrors == {}
    _ask(tree, "c#late", 5)
    assert sent[-1][1]["ok"] is False and "already ended" in sent[-1][1]["message"]


def test_past_the_signal_budget_requests_are_refused() -> None:
    tree, _root, sent = _tree(Budget())
    for i in range(MAX_RESERVE_SIGNALS + 1):
        _ask(tree, f"c#{i}", 0)
    assert sent[-2][1]["ok"] is True and sent[-1][1]["ok"] is False
    assert "split the fan-out" in sent[-1][1]["message"]
