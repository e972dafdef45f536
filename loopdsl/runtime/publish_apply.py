"""`publish:` applied: the planned writes made one by one, each recorded before and after.

The plan (runtime/publish.py) is kept in the run as `meta.publish` = {status, items,
results, intents}. Before a write its index joins `intents` and the run is committed;
after it, its result is stored and committed. A process killed in between leaves an
intent without a result: the resumed run passes `resumed=True` for that write, and the
publisher looks for it (the open pull request of the branch, a comment or issue carrying
the write's marker) before writing, so each write happens once. A failure is recorded
(`publish_failed`) and raised as a PublishError; `loopdsl resume RUN` continues from the
first write without a result.
"""
from __future__ import annotations

from typing import Any, Callable, Generator

from ..language.errors import LoopdslError
from .ports import Publisher
from .publish import PublishError
from .run_state import RunState

PLANNED, DONE, FAILED = "planned", "done", "failed"


def publish_pending(state: RunState) -> bool:
    """Whether a completed run still has writes to make (a plan not applied to its end)."""
    record = state.meta.get("publish")
    return isinstance(record, dict) and record.get("status") != DONE


def record_plan(state: RunState, items: list[dict[str, Any]]) -> None:
    state.meta["publish"] = {"status": PLANNED, "items": items, "results": [None] * len(items), "intents": []}


def record_failure(state: RunState, message: str, emit: Callable[..., None], kind: str = "") -> None:
    record = state.meta.setdefault("publish", {"items": [], "results": [], "intents": []})
    record.update(status=FAILED, error=message)
    emit("publish_failed", kind=kind, message=message)


def _target(item: dict[str, Any], opened: dict[str, int]) -> int | None:
    if item["kind"] in ("pull_request", "issue"):
        return None
    return item.get("number") or opened.get(item.get("on", "pull_request"))


def apply_plan(state: RunState, publisher: Publisher, emit: Callable[..., None],
               commit: Callable[[], None]) -> None:
    """Make every write of the run's plan that has no result yet; commit around each."""
    steps = plan_writes(state, emit, commit)
    try:
        request = next(steps)
        while True:
            try:
                answer = publisher.write(*request)
            except Exception as exc:  # the steps record it and raise a PublishError
                request = steps.throw(exc)
            else:
                request = steps.send(answer)
    except StopIteration:
        return


def plan_writes(state: RunState, emit: Callable[..., None],
                commit: Callable[[], None]) -> Generator[tuple[dict[str, Any], int | None, bool], Any, None]:
    """The bookkeeping of `apply_plan`, apart from how a write is made (here in a thread of
    calls, on Temporal through an activity): yields (item, number, resumed) for each write
    to make and is sent its result, or thrown the exception the write raised."""
    record = state.meta["publish"]
    items, results, intents = record["items"], record["results"], record["intents"]
    opened: dict[str, int] = {}
    for index, item in enumerate(items):
        kind = item["kind"]
        if results[index] is None:
            number = _target(item, opened)
            if kind not in ("pull_request", "issue") and number is None:
                _fail(state, kind, f"publish {kind}: no {item.get('on')} to write to (this publish opened none)",
                      emit, commit)
            resumed = index in intents
            if not resumed:
                intents.append(index)
                emit("publish_intent", kind=kind, number=number)
                commit()
            try:
                results[index] = yield item, number, resumed
            except LoopdslError as exc:
                _fail(state, kind, f"publish {kind}: {exc.message}", emit, commit, exc.hint)
            except Exception as exc:  # a bug or an unexpected answer: recorded, the run stands
                _fail(state, kind, f"publish {kind}: {type(exc).__name__}: {str(exc)[:300]}", emit, commit)
            emit("published", kind=kind, **results[index])
            commit()
        if kind in ("pull_request", "issue"):
            opened[kind] = int(results[index]["number"])
    record["status"] = DONE
    record.pop("error", None)
    commit()


def _fail(state: RunState, kind: str, message: str, emit: Callable[..., None], commit: Callable[[], None],
          hint: str = "") -> None:
    record_failure(state, message, emit, kind)
    commit()
    raise PublishError(message, (f"{hint}; then " if hint else "") +
                       f"`loopdsl resume {state.run_id}` makes the writes not made yet")
