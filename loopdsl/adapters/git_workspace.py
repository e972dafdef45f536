"""The runtime's `WorkspaceGit` port over a run's git worktree: the visit-start commit,
the changes since it, the reset to it, and the guard of the repository's git setup
around an agent attempt (git_snapshot.py and git_guard.py do the work)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .git_guard import describe_changes, guard_repository
from .git_snapshot import reset_workspace, visit_start, workspace_changes


@dataclass(frozen=True)
class GitWorkspace:
    repo: Path  # the repository the worktree belongs to
    path: Path  # the run's worktree
    branch: str  # the run's own branch (loopdsl/<run-id>): it may move, other refs may not

    def visit_start(self) -> str:
        return visit_start(self.path)

    def changes(self, since: str) -> tuple[list[str], str]:
        return workspace_changes(self.path, since)

    def reset(self, since: str) -> None:
        reset_workspace(self.path, since)

    def guard(self) -> Callable[[], str | None]:
        taken = guard_repository(self.repo, self.branch)

        def check() -> str | None:
            changes = taken.changes()
            return describe_changes(changes) if changes else None

        return check
