"""The names a loop's templates and guards read (`inputs`, `secrets`, each state's
result, `history`, `feedback`, `error`, `run`, `budget`, `item`), built once per engine
and kept current by it as the run goes."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Mapping

from ..language.templates import install_globals
from .budget import Ledger

if TYPE_CHECKING:
    from .engine import Engine

MISSING = object()


def build_context(engine: "Engine") -> None:
    run = engine.run
    ctx = engine.context
    ctx.clear()
    ctx.update(run.results)
    ctx["inputs"] = run.inputs
    # A declared secret that is not set passes an empty value (`env: {GH_TOKEN: ...}` for
    # an optional token: the tool then uses its own login).
    ctx["secrets"] = {**{name: "" for name in engine.loop.secrets}, **engine.ports.secret_values}
    for name in engine.loop.states:  # `history.X` of a state that has not run yet is []
        run.history.setdefault(name, [])
    ctx["history"] = run.history
    ctx["feedback"] = run.feedback
    ctx["error"] = run.error
    ctx["run"] = {"id": run.run_id, "date": run.date, "attempt": 1, "visits": 0}
    ctx["budget"] = BudgetView(engine.ledger, engine._active_seconds)
    install_globals(ctx)
    item = run.meta.get("item", MISSING)
    if item is not MISSING:
        ctx["item"] = item
        ctx["index"] = run.meta.get("index")


class BudgetView(Mapping[str, Any]):
    """`budget.spent` / `budget.remaining` for templates, computed only when a template reads them."""

    _KEYS = ("spent", "remaining")

    def __init__(self, ledger: Ledger, elapsed: Callable[[], float]):
        self._ledger = ledger
        self._elapsed = elapsed

    def __getitem__(self, key: str) -> Any:
        if key == "spent":
            return self._ledger.spent()
        if key == "remaining":
            return self._ledger.remaining(self._elapsed())
        raise KeyError(key)

    def __iter__(self) -> Any:
        return iter(self._KEYS)

    def __len__(self) -> int:
        return len(self._KEYS)
