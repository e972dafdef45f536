"""`loopdsl schedule LOOP --export temporal`: a Temporal Schedule from `schedule:`, updated
in place when exported again, whose runs are ordinary loop workflows."""
from __future__ import annotations

import asyncio
import time
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo
from pathlib import Path

import pytest

from .conftest import Workers, loopdsl

pytestmark = pytest.mark.slow

LOOP = """\
loopdsl: 1
name: nightly
schedule: {cron: "30 2 * * *", timezone: Europe/Paris}
concurrency: {group: nightly, on_conflict: CONFLICT}
start: note
states:
  note:
    shell: "echo ran >> ran.txt"
    next: done
  done: {end: completed}
"""


async def _describe(address: str, sid: str) -> object:
    from temporalio.client import Client

    client = await Client.connect(address)
    return await client.get_schedule_handle(sid).describe()


async def _trigger_and_wait(address: str, sid: str) -> tuple[str, str, datetime]:
    from temporalio.client import Client

    client = await Client.connect(address)
    handle = client.get_schedule_handle(sid)
    await handle.trigger()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        desc = await handle.describe()
        for action in desc.info.recent_actions:
            run_id = action.action.workflow_id
            result = await asyncio.wait_for(client.get_workflow_handle(run_id).result(), 60)
            return str(result["status"]), str(result["date"]), action.scheduled_at
        await asyncio.sleep(0.3)
    raise AssertionError("the schedule never started a run")


def test_a_schedule_is_created_updated_and_starts_runs(tmp_path: Path, workers: Workers) -> None:
    from temporalio.client import ScheduleOverlapPolicy

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "loop.yaml").write_text(LOOP.replace("CONFLICT", "skip"))
    out = loopdsl("schedule", "loop.yaml", "--export", "temporal", "--temporal", workers.address,
                  "--task-queue", workers.queue, cwd=repo)
    assert out.returncode == 0, out.stderr
    sid = "loopdsl/repo/nightly"
    assert f"created Temporal schedule {sid}" in out.stdout
    desc = asyncio.run(_describe(workers.address, sid))
    spec, policy = desc.schedule.spec, desc.schedule.policy  # type: ignore[attr-defined]
    assert spec.time_zone_name == "Europe/Paris"
    assert policy.overlap == ScheduleOverlapPolicy.SKIP
    assert desc.schedule.action.retry_policy is None  # type: ignore[attr-defined]
    assert policy.catchup_window == timedelta(hours=1)  # set, not Temporal's year

    (repo / "loop.yaml").write_text(LOOP.replace("CONFLICT", "wait"))
    again = loopdsl("schedule", "loop.yaml", "--export", "temporal", "--temporal", workers.address,
                    "--task-queue", workers.queue, cwd=repo)
    assert again.returncode == 0 and "updated Temporal schedule" in again.stdout, again.stderr
    desc = asyncio.run(_describe(workers.address, sid))
    assert desc.schedule.policy.overlap == ScheduleOverlapPolicy.BUFFER_ALL  # type: ignore[attr-defined]

    # `fail` has no Temporal twin: an overlapping run is skipped; no `concurrency`: all run.
    for conflict, overlap in (("fail", ScheduleOverlapPolicy.SKIP), (None, ScheduleOverlapPolicy.ALLOW_ALL)):
        text = LOOP.replace("CONFLICT", str(conflict))
        (repo / "loop.yaml").write_text(text if conflict else text.replace("concurrency: {group: nightly, on_conflict: None}\n", ""))
        assert loopdsl("schedule", "loop.yaml", "--export", "temporal", "--temporal", workers.address,
                       "--task-queue", workers.queue, cwd=repo).returncode == 0
        desc = asyncio.run(_describe(workers.address, sid))
        assert desc.schedule.policy.overlap == overlap, conflict  # type: ignore[attr-defined]

    # Lint takes `Z` for UTC; the server knows only "UTC" (it was an internal error).
    (repo / "loop.yaml").write_text(LOOP.replace("CONFLICT", "skip").replace("Europe/Paris", "Z"))
    zulu = loopdsl("schedule", "loop.yaml", "--export", "temporal", "--temporal", workers.address,
                   "--task-queue", workers.queue, cwd=repo)
    assert zulu.returncode == 0, zulu.stderr
    assert asyncio.run(_describe(workers.address, sid)).schedule.spec.time_zone_name == "UTC"  # type: ignore[attr-defined]
    (repo / "loop.yaml").write_text(LOOP.replace("CONFLICT", "skip"))
    assert loopdsl("schedule", "loop.yaml", "--export", "temporal", "--temporal", workers.address,
                   "--task-queue", workers.queue, cwd=repo).returncode == 0

    workers.start(repo, models=False)
    status, date, scheduled = asyncio.run(_trigger_and_wait(workers.address, sid))
    assert status == "completed"
    # run.date: the date the schedule meant the run for, in the schedule's time zone.
    assert date == scheduled.astimezone(ZoneInfo("Europe/Paris")).date().isoformat()
    assert (repo / "ran.txt").read_text() == "ran\n"


def test_export_temporal_needs_an_address(tmp_path: Path) -> None:
    (tmp_path / "loop.yaml").write_text(LOOP.replace("CONFLICT", "skip"))
    out = loopdsl("schedule", "loop.yaml", "--export", "temporal", cwd=tmp_path)
    assert out.returncode == 2 and "needs --temporal" in out.stderr


def test_a_second_loop_file_with_the_same_name_does_not_take_the_schedule_over(tmp_path: Path,
                                                                                temporal_server: str) -> None:
    repo = tmp_path / "names"  # its own schedule id on the shared server
    (repo / "loops").mkdir(parents=True)
    (repo / "loops" / "nightly.yaml").write_text(LOOP.replace("CONFLICT", "skip"))
    (repo / "loops" / "copy.yaml").write_text(LOOP.replace("CONFLICT", "wait").replace("echo ran", "echo copy"))
    args = ("--export", "temporal", "--temporal", temporal_server, "--task-queue", "q-names")
    assert loopdsl("schedule", "loops/nightly.yaml", *args, cwd=repo).returncode == 0
    taken = loopdsl("schedule", "loops/copy.yaml", *args, cwd=repo)
    assert taken.returncode == 2, (taken.stdout, taken.stderr)
    sid = "loopdsl/names/nightly"
    assert f"Temporal schedule {sid} already starts loops/nightly.yaml, another loop file with `name: nightly`" \
        in taken.stderr, taken.stderr
    assert f"temporal schedule delete --schedule-id {sid}" in taken.stderr
    desc = asyncio.run(_describe(temporal_server, sid))
    started = str(desc.schedule.action.args)  # type: ignore[attr-defined]  # still the first loop's request
    assert "loops/nightly.yaml" in started and "copy.yaml" not in started
    from temporalio.client import ScheduleOverlapPolicy

    assert desc.schedule.policy.overlap == ScheduleOverlapPolicy.SKIP  # type: ignore[attr-defined]
    # The same file again still updates its own schedule.
    again = loopdsl("schedule", "loops/nightly.yaml", *args, cwd=repo)
    assert again.returncode == 0 and "updated Temporal schedule" in again.stdout, again.stderr
