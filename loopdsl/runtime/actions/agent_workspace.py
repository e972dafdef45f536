"""The git side of an agent attempt in a worktree (the engine's `WorkspaceGit` port).

- The visit-start commit is taken once per visit, before its first attempt, and stored,
  so a resumed run and every later attempt compare with (and reset to) the same commit.
- With `retry.reset_workspace: true` a new attempt first restores that commit; the reset
  is recorded, so a resumed attempt does not throw away what it already did.
- The repository's git setup (shared config, hooks, other refs) is taken when the attempt
  starts and compared when it ends, after its tools are closed and their processes killed:
  any change ends the run `failed` (it is not retried: the next attempt could not undo it).
- `changed_files` and `diff_stat` come from the port (git plumbing, no hook or filter runs)
  against the visit-start commit, redacted before anything stores them.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Awaitable, Callable

from ..errors import StepFailure
from ..run_state import checked_response
from ..ports import call_port
from .agent_turns import agent_key

if TYPE_CHECKING:
    from ..engine import Engine


class AttemptWorkspace:
    def __init__(self, engine: "Engine", ids: dict[str, Any], reset: bool) -> None:
        self.engine, self.ids, self.reset = engine, ids, reset
        self.git = engine.ports.git
        self.since = ""
        self.check: Callable[[], str | None] | None = None

    async def begin(self) -> None:
        git, engine = self.git, self.engine
        if git is None:
            return
        store = engine.ports.responses
        start_key = agent_key("visit_start", run=self.ids["run"], state=self.ids["state"], visit=self.ids["visit"])
        stored = checked_response(store.get_response(start_key), "workspace_mark", self.ids["run"])
        if stored is None:
            self.since = await call_port(git.visit_start)
            store.put_response(start_key, {"sha": self.since})
            engine.commit()
        else:
            self.since = str(stored["sha"])
        reset_key = agent_key("reset", **self.ids)
        if self.reset and self.ids["attempt"] > 1 and store.get_response(reset_key) is None:
            await call_port(git.reset, self.since)
            store.put_response(reset_key, {"sha": self.since})
            engine.emit("workspace_reset", state=self.ids["state"], attempt=self.ids["attempt"], commit=self.since)
            engine.commit()
        self.check = await call_port(git.guard)

    async def around(self, body: Awaitable[dict[str, Any]]) -> dict[str, Any]:
        """Runs the attempt; adds the workspace's changes to its result, failed or not, and
        ends the run if the attempt changed the repository's git setup."""
        try:
            result = await body
        except StepFailure as failure:
            await self._changes(failure.result)
            await self._guarded(failure.result)
            raise
        await self._changes(result)
        await self._guarded(result)
        return result

    async def _changes(self, result: dict[str, Any] | None) -> None:
        if self.git is None or result is None or not self.since:
            return
        files, stat = await call_port(self.git.changes, self.since)
        found = {"changed_files": files, "diff_stat": stat}
        redact = self.engine.redact
        result.update(redact.redact_obj(found) if redact else found)

    async def _guarded(self, result: dict[str, Any] | None) -> None:
        if self.check is None:
            return
        problem = await call_port(self.check)
        if problem is not None:
            self.engine.emit("git_setup_changed", state=self.ids["state"], attempt=self.ids["attempt"], message=problem)
            raise StepFailure("workspace", problem, result=result, fatal=True)
