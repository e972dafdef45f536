"""What the crash drivers share (agent_crash_driver.py, agent_edit_crash_driver.py,
fan_out_crash_driver.py): each runs (`run STORE WORKDIR`) or resumes (`resume STORE RUN_ID`)
a loop in a process of its own with a provider port of its own, so its test can SIGKILL the
process mid-run and resume what the store kept."""
from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import loopdsl.adapters.store.run_store as store
from loopdsl.api.durable import resume_durable
from loopdsl.api.runs import RunResult, arun


def shorten_lock_ttl() -> None:
    """A SIGKILLed holder cannot release its run lock: the next process takes it after 0.5 s
    instead of the default TTL (as bench/crash_torture.py's launcher does)."""
    store.RunStore.lock.__wrapped__.__kwdefaults__["ttl"] = 0.5  # type: ignore[attr-defined]


async def run_or_resume(provider: Any, report: Callable[[RunResult], dict[str, Any]] = lambda result: {}) -> None:
    """Run WORKDIR/loop.yaml or resume RUN_ID as sys.argv says; print the run id, the status
    and what `report` adds, as one JSON line."""
    command, store_dir = sys.argv[1], Path(sys.argv[2])
    if command == "run":
        workdir = Path(sys.argv[3])
        result = await arun(workdir / "loop.yaml", workdir=workdir, provider=provider, store=store_dir)
    else:
        result = await resume_durable(sys.argv[3], store=store_dir, provider=provider)
    print(json.dumps({"run_id": result.run_id, "status": result.status, **report(result)}))
