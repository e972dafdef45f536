"""`publish:` on Temporal: planned in the workflow, each write made once by an activity.

As on the local backend (api/publishing.py), a root run's `publish:` is planned at its
`completed` end, after its branch is committed: rendered, capped and validated in the
workflow, and scanned for the declared secrets' placeholders (sealed.py) and credential
shapes; the plan is kept in the run (`meta.publish`, so in the workflow's state and
result). The writes go through `plan_writes`, the same bookkeeping as locally: the
intent of each write is recorded before its activity is scheduled, its result after.
The history is the durable record: a replayed workflow gets each finished write's result
from it and makes no write again. A write whose worker was lost mid-way is made again
on another worker with `resumed`, so the publisher looks for it first (the open pull
request of the branch, the marker of a comment or issue) and never writes it twice.
A failed publish leaves the run `completed`, its `meta.publish` `failed` with the reason.
"""
from __future__ import annotations

from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError

from ...language.errors import LoopdslError
from ...runtime.engine import Engine
from ...runtime.publish import PublishError, plan_for
from ...runtime.publish_apply import DONE, plan_writes, record_failure, record_plan
from ...runtime.run_state import COMPLETED
from .wf_ports import activity_options, stop_if_cancelled, worker_lost
from .wire import PUBLISH

# Tries of one write when its worker is lost (each later one looks for the write first).
WRITE_TRIES = 3
# A write pushes a branch and makes a few API calls; its own retries on rate limits included.
WRITE_TIMEOUT_S = 600


async def publish_run(engine: Engine, heartbeat_s: float, apply: bool) -> None:
    """Plan the run's `publish:` and, when `apply`, make its writes (failures are recorded)."""
    loop, run = engine.loop, engine.run
    if loop.publish is None or run.status != COMPLETED:
        return
    if loop.publish.ends and run.current not in loop.publish.ends:
        run.meta["publish"] = {"status": DONE, "items": [], "skipped": f"ended at {run.current}"}
        return
    try:
        items = plan_for(engine)
    except PublishError as exc:
        record_failure(run, exc.message, engine.emit)
        return
    record_plan(run, items)
    engine.emit("publish_planned", writes=[item["kind"] for item in items])
    if not apply:
        return
    steps = plan_writes(run, engine.emit, engine.commit)
    try:
        request = next(steps)
        while True:
            try:
                answer = await _write(engine, *request, heartbeat_s=heartbeat_s)
            except Exception as exc:  # noqa: BLE001 - the steps record it and raise a PublishError
                request = steps.throw(exc)
            else:
                request = steps.send(answer)
    except StopIteration:
        return
    except PublishError:
        return  # recorded in `meta.publish` and as a `publish_failed` event


async def _write(engine: Engine, item: dict[str, Any], number: int | None, resumed: bool, *,
                 heartbeat_s: float) -> dict[str, Any]:
    loop = engine.loop
    assert loop.publish is not None
    req = {"item": item, "number": number, "token": loop.publish.token, "secrets": sorted(loop.secrets)}
    for tries in range(1, WRITE_TRIES + 1):
        try:
            out = await workflow.execute_activity(PUBLISH, {**req, "resumed": resumed or tries > 1},
                                                  **activity_options(heartbeat_s, WRITE_TIMEOUT_S))
        except ActivityError as exc:
            stop_if_cancelled(exc)
            if worker_lost(exc) and tries < WRITE_TRIES:
                continue
            raise
        if "error" in out:
            raise LoopdslError(out["error"], out.get("hint") or "")
        return dict(out["result"])
    raise AssertionError("unreachable")  # the last try returns or raises


__all__ = ["publish_run"]
