"""`publish:` orchestrated: planned at a `completed` end, applied through the GitHub adapter.

Called where the API finishes a run (after its branch is committed, before `notify:`) and
by `resume` for a completed run whose writes are not all made. Planning always happens
(the rendered, checked texts are stored in the run); applying can be left for later
(`publish=False`: `loopdsl run --no-publish`, loop tests), and `loopdsl resume RUN` then
applies the stored plan, e.g. in a later job that alone holds a write token.
"""
from __future__ import annotations

from pathlib import Path

from ..adapters.git_worktree import find_repo_root
from ..adapters.github.publisher import GitHubPublisher, check_ready
from ..language.errors import LoopdslError
from ..language.model import Loop
from ..runtime.engine import Engine
from ..runtime.publish import PublishError, plan_for
from ..runtime.publish_apply import DONE, apply_plan, record_failure, record_plan
from ..runtime.run_state import COMPLETED


def check_publish_ready(loop: Loop, publish: bool) -> None:
    """Before a run starts: a run that will publish has the library, the repository and the
    token it needs (a run must not spend its budget and then fail to deliver)."""
    if loop.publish is not None and publish:
        try:
            check_ready(loop.publish.token)
        except LoopdslError as exc:
            exc.hint = f"{exc.hint}; or `loopdsl run --no-publish` keeps the run's result local"
            raise


def _repository(worktree: dict) -> Path | None:
    """The repository to push from: the run's own, or (a resume in another checkout of it,
    e.g. a later CI job) the one this process runs in."""
    recorded = Path(worktree["repo"]) if worktree.get("repo") else None
    if recorded is not None and recorded.is_dir():
        return recorded
    return find_repo_root(Path.cwd()) if recorded is not None else None


def publish_engine(engine: Engine, publish: bool = True) -> None:
    """Plan the run's `publish:` (once) and, when `publish`, make its writes."""
    loop, state = engine.loop, engine.run
    if loop.publish is None or state.status != COMPLETED:
        return
    record = state.meta.get("publish")
    if loop.publish.ends and state.current not in loop.publish.ends:
        if not isinstance(record, dict) or record.get("status") != DONE:  # e.g. "nothing to fix"
            state.meta["publish"] = {"status": DONE, "items": [], "skipped": f"ended at {state.current}"}
            engine.commit()
        return
    if not isinstance(record, dict) or not record.get("items"):
        try:
            items = plan_for(engine)
        except PublishError as exc:
            record_failure(state, exc.message, engine.emit)
            engine.commit()
            raise
        record_plan(state, items)
        engine.emit("publish_planned", writes=[item["kind"] for item in items])
        engine.commit()
    elif record.get("status") == DONE:
        return
    if not publish:
        return
    try:
        publisher = GitHubPublisher(loop.publish.token, _repository(state.meta.get("worktree") or {}))
    except LoopdslError as exc:
        record_failure(state, f"publish: {exc.message}", engine.emit)
        engine.commit()
        raise PublishError(f"publish: nothing was written to GitHub: {exc.message}",
                           f"{exc.hint}; then `loopdsl resume {state.run_id}` publishes the completed run") from None
    apply_plan(state, publisher, engine.emit, engine.commit)
