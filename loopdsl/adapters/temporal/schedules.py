"""`loopdsl schedule LOOP --export temporal`: a Temporal Schedule from the loop's `schedule:`.

Its id is `loopdsl/<repo>/<loop>`; exporting again updates it in place, and another loop file
with the same `name:` is refused rather than taking the schedule over. The action starts
the loop workflow with no retry policy (the engine owns retries), and `concurrency` maps
to the overlap policy (Temporal's default, SKIP, is not loopdsl's default).
"""
from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
    ScheduleUpdate,
    ScheduleUpdateInput,
)

from ...language.errors import LoopdslError
from ...language.model import Loop
from ...language.schedules import UTC_NAMES
from .wire import WORKFLOW

# How late a missed run may still start (Temporal's default is a year): one hour.
CATCHUP_WINDOW = timedelta(hours=1)
OVERLAP = {None: ScheduleOverlapPolicy.ALLOW_ALL, "skip": ScheduleOverlapPolicy.SKIP,
           "wait": ScheduleOverlapPolicy.BUFFER_ALL,
           # No "fail" in Temporal: a run that would overlap is skipped (documented deviation).
           "fail": ScheduleOverlapPolicy.SKIP}


SCHEDULED_START = "TemporalScheduledStartTime"


def scheduled_start() -> str | None:
    """In workflow code: when the schedule meant this run to start (ISO, UTC), or None for a
    run not started by a schedule. `run.date` is that instant's date in the schedule's time
    zone, so a buffered or late run keeps the date it was scheduled for."""
    from temporalio import workflow
    from temporalio.common import SearchAttributeKey

    when = workflow.info().typed_search_attributes.get(SearchAttributeKey.for_datetime(SCHEDULED_START))
    return when.isoformat() if when is not None else None


def schedule_id(repo: str, loop: Loop) -> str:
    return f"loopdsl/{repo}/{loop.name}"


def build(loop: Loop, request: dict[str, Any], task_queue: str, repo: str) -> Schedule:
    assert loop.schedule is not None
    conflict = loop.concurrency.on_conflict if loop.concurrency else None
    action = ScheduleActionStartWorkflow(WORKFLOW, request, id=f"{loop.name}-scheduled", task_queue=task_queue,
                                         memo={"loop": loop.name, "loop_path": request["loop_path"], "repo": repo})
    return Schedule(action=action,
                    spec=ScheduleSpec(cron_expressions=[loop.schedule.cron], time_zone_name=_zone_name(loop.schedule.timezone)),
                    policy=SchedulePolicy(overlap=OVERLAP[conflict], catchup_window=CATCHUP_WINDOW))


async def export(client: Client, loop: Loop, request: dict[str, Any], task_queue: str, repo: str) -> tuple[str, bool]:
    """Creates the schedule, or updates it when it exists and starts the same loop file; (id, created)."""
    sid = schedule_id(repo, loop)
    schedule = build(loop, request, task_queue, repo)
    try:
        await client.create_schedule(sid, schedule)
        return sid, True
    except ScheduleAlreadyRunningError:
        def replace(current: ScheduleUpdateInput) -> ScheduleUpdate:
            # The id comes from `name:`: a second loop file of the repository with the same
            # name would silently take over the first one's schedule.
            other = _loop_path(client, current.description.schedule.action)
            if other is not None and other != request["loop_path"]:
                raise LoopdslError(
                    f"Temporal schedule {sid} already starts {other}, another loop file with `name: {loop.name}`",
                    f"give one of the two loops another `name:`, or delete the schedule first if {other} is gone "
                    f"(`temporal schedule delete --schedule-id {sid}`)")
            return ScheduleUpdate(schedule=schedule)

        await client.get_schedule_handle(sid).update(replace)
        return sid, False


def _loop_path(client: Client, action: object) -> str | None:
    """The loop file an existing schedule starts (from its memo), or None when it does not say."""
    memo = getattr(action, "memo", None) or {}
    payload = memo.get("loop_path")
    if payload is None:
        return None
    try:
        value = payload if isinstance(payload, str) else client.data_converter.payload_converter.from_payload(payload)
    except Exception:  # a memo someone else wrote: not ours to judge
        return None
    return value if isinstance(value, str) else None


def _zone_name(name: str) -> str:
    """The zone as the server knows it: lint takes `Z` and `utc` for UTC, Temporal only "UTC"."""
    return "UTC" if name in UTC_NAMES else name
