"""The `WorkspaceGit` port in the workflow: each call an activity on a worker's copy of
the run's worktree (activities.py, `git`), so an agent's result carries `changed_files`
and `diff_stat` and its attempt is guarded as on the local backend (git_workspace.py).

The guard's snapshot of the repository's git setup travels in the workflow's state
between the call that takes it and the one that compares, so the check may run on
another worker (with the same repository) after a worker was lost.
"""
from __future__ import annotations

from typing import Any, Awaitable, Callable

from temporalio import workflow

from ...language.errors import LoopdslError
from .wf_ports import activity_options
from .wire import GIT

# Git plumbing over a checkout: seconds, even on a large repository.
GIT_TIMEOUT_S = 300


class WorkflowGit:
    def __init__(self, worktree: dict[str, Any], heartbeat_s: float) -> None:
        self.where = {"path": worktree["path"], "branch": worktree["branch"]}
        self.heartbeat_s = heartbeat_s

    async def _call(self, op: str, **args: Any) -> dict[str, Any]:
        out = await workflow.execute_activity(GIT, {**self.where, "op": op, **args},
                                              **activity_options(self.heartbeat_s, GIT_TIMEOUT_S))
        if "error" in out:
            raise LoopdslError(out["error"], out.get("hint") or "")
        return dict(out)

    async def visit_start(self) -> str:
        return str((await self._call("visit_start"))["sha"])

    async def changes(self, since: str) -> tuple[list[str], str]:
        out = await self._call("changes", since=since)
        return list(out["files"]), str(out["stat"])

    async def reset(self, since: str) -> None:
        await self._call("reset", since=since)

    async def guard(self) -> Callable[[], Awaitable[str | None]]:
        taken = (await self._call("guard"))["taken"]

        async def check() -> str | None:
            return (await self._call("check", taken=taken)).get("problem")

        return check

    async def item_worktrees(self, label: str, count: int) -> list[Any]:
        raise LoopdslError(f"on the Temporal backend the concurrent items of '{label}' cannot each get a worktree "
                           "of their own yet", "give the for_each `concurrency: 1`, or run the loop locally")


__all__ = ["WorkflowGit"]
