"""Replaying a run's recorded history against the current workflow code (temporalio's
Replayer): a workflow that decides anything differently on replay fails here."""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any


async def _replay(address: str, run_id: str, root: Path, strict: bool) -> Any:
    from temporalio.client import Client
    from temporalio.worker import Replayer

    from loopdsl.adapters.temporal import loops
    from loopdsl.adapters.temporal.worker import sandbox_runner
    from loopdsl.adapters.temporal.workflow import LoopWorkflow

    client = await Client.connect(address)
    history = await client.get_workflow_handle(run_id).fetch_history()
    loops.set_root(root)  # the replaying "worker" serves the run's repository
    # debug_mode: no 2 s deadlock timer. The replay checks what the workflow decides; on a test
    # machine busier than it has cores, its first activation (compiling the loop's templates
    # in the sandbox) once took longer than that, and failed a run that replayed identically.
    replayer = Replayer(workflows=[LoopWorkflow], workflow_runner=sandbox_runner(strict=strict), debug_mode=True)
    await replayer.replay_workflow(history)  # raises on any nondeterminism
    return history


def replay(address: str, run_id: str, root: Path, *, strict: bool = True) -> Any:
    """The run's history, once it replayed without a difference (strict: engine sandboxed)."""
    return asyncio.run(_replay(address, run_id, root, strict))
