"""Names and defaults shared by the workflow, the worker and the client."""
from __future__ import annotations

from datetime import timedelta

WORKFLOW = "loopdsl.run"
PREPARE, LLM, SHELL, FINISH = "loopdsl.prepare", "loopdsl.llm", "loopdsl.shell", "loopdsl.finish"
TOOL = "loopdsl.tool"
PUBLISH = "loopdsl.publish"
GIT = "loopdsl.git"
PROGRESS_QUERY = "progress"
DECIDE_UPDATE = "decide"
# `loopdsl abort --reason`: sent just before the cancellation, so the run records why it ended.
ABORT_SIGNAL = "loopdsl.abort"
DEFAULT_TASK_QUEUE = "loopdsl"
DEFAULT_NAMESPACE = "default"
# The failure type of an activity cut off because its worker was asked to stop (worker.serve).
WORKER_STOPPED = "loopdsl.WorkerStopped"
# How long an activity may go without a heartbeat before its worker counts as dead.
DEFAULT_HEARTBEAT_S = 30.0
# The heartbeats a run accepts: the client refuses others, the workflow clamps what it is given.
MIN_HEARTBEAT_S, MAX_HEARTBEAT_S = 1.0, 3600.0
# A command or call without its own timeout still ends some time: a day.
NO_TIMEOUT = timedelta(hours=24)
# Carried events a `progress` query returns at most per call.
EVENTS_PER_QUERY = 500
# Exact budgets across child workflows (budget_tree.py): a child asks the root, the root answers.
RESERVE_SIGNAL, ANSWER_SIGNAL = "loopdsl.reserve", "loopdsl.answer"
# Temporal allows 2,000 pending children per run: a wider `concurrency` is held to this.
MAX_PENDING_CHILDREN = 2_000
