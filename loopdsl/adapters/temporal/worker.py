"""A worker: polls one task queue, runs loop workflows and their activities in the
repository it was started in."""
from __future__ import annotations

import asyncio
import concurrent.futures
import signal
from datetime import timedelta
from pathlib import Path
from typing import Callable, Mapping

from temporalio.client import Client
from temporalio.worker import Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from . import loops
from .activities import LoopActivities
from .workflow import LoopWorkflow

# The sandbox is on; these modules are passed through it (imported once, not per workflow):
# Jinja needs its threading.Lock, which the sandbox refuses, and re-importing the engine and
# its parsers for every workflow would cost each activation seconds. Passed-through code is
# not checked, so what it may do is bounded by the ports (every clock reading, random draw
# and wait goes through WorkflowClock, every effect is an activity) and checked by the
# strict runner below.
LIBRARIES = ("jinja2", "markupsafe", "transitions", "yaml", "ruamel", "jsonschema", "jsonschema_specifications",
             "referencing", "rpds", "attrs", "regex", "croniter", "dateutil", "tree_sitter", "tree_sitter_bash",
             "diskcache", "litellm")
# Strict: only loading and compiling loop files is passed through (the per-worker cache of
# compiled loops, whose cache miss reads the run's files and checks their recorded hashes);
# the engine, the actions and the workflow run sandboxed, so a stray clock reading, random
# draw or file access in them fails the workflow task. The Replayer tests run with it.
LOADING = ("loopdsl.language", "loopdsl.lint", "loopdsl.adapters.temporal.loops")


def sandbox_runner(strict: bool = False) -> SandboxedWorkflowRunner:
    modules = (*LIBRARIES, *LOADING) if strict else ("loopdsl", *LIBRARIES)
    return SandboxedWorkflowRunner(restrictions=SandboxRestrictions.default.with_passthrough_modules(*modules))


def build_worker(client: Client, task_queue: str, root: Path, base_env: Callable[[], Mapping[str, str]], *,
                 identity: str | None = None, sticky_timeout_s: float = 10.0, models: bool = True,
                 grace_s: float = 0.0) -> Worker:
    loops.set_root(root)
    activities = LoopActivities(base_env, models=models)
    return Worker(client, task_queue=task_queue, workflows=[LoopWorkflow], activities=activities.all(),
                  workflow_runner=sandbox_runner(), identity=identity,
                  sticky_queue_schedule_to_start_timeout=timedelta(seconds=sticky_timeout_s),
                  activity_executor=concurrent.futures.ThreadPoolExecutor(4),
                  max_heartbeat_throttle_interval=timedelta(seconds=1),
                  default_heartbeat_throttle_interval=timedelta(seconds=1),
                  graceful_shutdown_timeout=timedelta(seconds=grace_s))


def warm_imports() -> None:
    """Imports what workflow code imports at function level (loading, lint, the state kinds
    most runs never reach), so no activation pays for them."""
    import importlib

    for name in ("lint.pipeline", "lint.lockfile", "language.checked_files", "language.skills", "adapters.scripted",
                 "runtime.actions.agent", "runtime.actions.subloop", "runtime.tools.workspace",
                 "runtime.tools.shell_tools", "runtime.run_keys"):
        importlib.import_module(f"loopdsl.{name}")


async def serve(client: Client, task_queue: str, root: Path, base_env: Callable[[], Mapping[str, str]],
                *, identity: str | None = None, sticky_timeout_s: float = 10.0,
                ready: Callable[[], None] | None = None, stopping: Callable[[str], None] | None = None,
                models: bool = True, grace_s: float = 0.0) -> None:
    """Serve until Ctrl-C or SIGTERM, then stop as Temporal's worker shutdown does: no more
    polling, running activities get `grace_s` seconds to finish before they are cancelled
    (their commands stopped, their states recorded as cut off), and the server learns at once,
    so another worker takes the runs over without waiting for a heartbeat to time out.
    `models=False` (`--no-models`): scripted runs and loops without models only; the worker
    never imports LiteLLM (most of its start-up) and refuses a real model call."""
    from ..litellm_loading import wait_until_loaded

    # Before polling, not beside it: importing LiteLLM takes seconds of CPU, and a workflow
    # activation sharing the interpreter with it then passed the SDK's 2 s deadlock detector
    # (measured: the first replay on a fresh worker). Workflow code's own lazy imports too.
    if models:
        await wait_until_loaded()
    warm_imports()
    worker = build_worker(client, task_queue, root, base_env, identity=identity, sticky_timeout_s=sticky_timeout_s,
                          models=models, grace_s=grace_s)
    terminated = asyncio.Event()
    # SIGTERM is how service managers and orchestrators (systemd, docker stop, Kubernetes) ask a
    # process to stop; by default it would end the worker on the spot, mid-activity.
    _on_sigterm(terminated.set)
    try:
        async with worker:
            if ready is not None:
                ready()
            try:
                await terminated.wait()
            except asyncio.CancelledError:  # Ctrl-C: asyncio cancels this task
                if stopping is not None:
                    stopping("Ctrl-C")
                raise
            if stopping is not None:
                stopping("SIGTERM")
    finally:
        _on_sigterm(None)


def _on_sigterm(callback: Callable[[], object] | None) -> None:
    """Call `callback` on SIGTERM (None: the default again), where the loop can (Unix, main thread)."""
    loop = asyncio.get_running_loop()
    try:
        if callback is None:
            loop.remove_signal_handler(signal.SIGTERM)
        else:
            loop.add_signal_handler(signal.SIGTERM, callback)
    except (NotImplementedError, RuntimeError, ValueError):  # Windows, or not the main thread
        pass
