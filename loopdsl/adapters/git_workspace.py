"""The runtime's `WorkspaceGit` port over a run's git worktree: the visit-start commit,
the changes since it, the reset to it, and the guard of the repository's git setup
around an agent attempt (git_snapshot.py and git_guard.py do the work); and the
worktrees of a fan-out's items.

Items of a `for_each` with `concurrency > 1` whose agents hold writing tools or a
coding-agent CLI would edit one worktree at once; instead each item gets a worktree of
its own, on branch `loopdsl/<run-id>--<state>--<index>` (`<state>@<visit>` past the first
visit), checked out from the caller's worktree as it is when the fan-out starts
(uncommitted files included). All of them are made before any item starts and finished
after every item ended, so no item's agent sees another's worktree appear or vanish in the
middle of its attempt (each item's git guard leaves the fan-out's branches to the items).
Each ends like a run's worktree: a completed item's changes are committed on its branch
and the worktree is removed; any other end keeps it for inspection. Nothing is merged into
the caller's branch (items may conflict): the fan-out's result names each item's branch
and commit, for a later state to merge or review. On resume, an item worktree that still
exists is reopened; a branch without a worktree was finished before the crash.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .git_guard import describe_changes, guard_repository
from .git_snapshot import reset_workspace, resolve, visit_start, workspace_changes
from .git_worktree import ITEM_SEPARATOR, SecretInCommit, Worktree, create_worktree, finish_worktree, open_worktree


@dataclass(frozen=True)
class GitWorkspace:
    repo: Path  # the repository the worktree belongs to
    path: Path  # the run's worktree
    branch: str  # the run's own branch (loopdsl/<run-id>): it may move, other refs may not
    # A fan-out item's: the prefix of its siblings' branches, which may move too (their work).
    shared_branches: str = ""

    def visit_start(self) -> str:
        return visit_start(self.path)

    def changes(self, since: str) -> tuple[list[str], str]:
        return workspace_changes(self.path, since)

    def reset(self, since: str) -> None:
        reset_workspace(self.path, since)

    def guard(self) -> Callable[[], str | None]:
        taken = guard_repository(self.repo, self.branch, self.shared_branches)

        def check() -> str | None:
            changes = taken.changes()
            return describe_changes(changes) if changes else None

        return check

    def item_worktrees(self, label: str, count: int) -> list["GitItem"]:
        return item_worktrees(self, label, count)



@dataclass
class GitItem:
    """One item's worktree (`path`, `git`), or None for both when it was finished earlier."""

    repo: Path
    branch: str
    path: Path | None
    git: GitWorkspace | None
    base_commit: str = ""

    def finish(self, completed: bool, message: str, secrets: Iterable[str]) -> dict[str, Any]:
        """Commit and remove a completed item's worktree, keep another's; what the result says
        of it: its branch, and its commit (completed) or kept worktree (not)."""
        info: dict[str, Any] = {"branch": self.branch}
        if self.path is None or not completed:
            if self.path is not None:
                info["worktree"] = str(self.path)
            else:
                info["commit"] = resolve(self.repo, f"refs/heads/{self.branch}")
            return info
        wt = Worktree(repo=self.repo, path=self.path, branch=self.branch, base_commit=self.base_commit)
        try:
            finish_worktree(wt, message, secrets)
        except SecretInCommit as exc:
            return {**info, "worktree": str(self.path), "error": f"{exc.message}; {exc.hint}"}
        info["commit"] = resolve(self.repo, f"refs/heads/{self.branch}")
        return info


def item_worktrees(parent: GitWorkspace, label: str, count: int) -> list[GitItem]:
    """The worktrees of items 0..count-1 of fan-out `label`: reopened, or made now from the
    caller's worktree as it is (blocking: git processes)."""
    worktrees_dir, run_name = parent.path.parent, parent.path.name
    shared = f"{parent.branch}{ITEM_SEPARATOR}{label}{ITEM_SEPARATOR}"
    base = ""
    items: list[GitItem] = []
    for index in range(count):
        name = f"{run_name}{ITEM_SEPARATOR}{label}{ITEM_SEPARATOR}{index}"
        wt = open_worktree(parent.repo, worktrees_dir, name)
        branch = f"{shared}{index}"
        if wt is None and resolve(parent.repo, f"refs/heads/{branch}"):
            items.append(GitItem(parent.repo, branch, None, None))  # finished before a crash
            continue
        if wt is None:
            base = base or visit_start(parent.path)
            wt = create_worktree(parent.repo, worktrees_dir, name, base)
        items.append(GitItem(parent.repo, wt.branch, wt.path,
                             GitWorkspace(parent.repo, wt.path, wt.branch, shared_branches=shared), wt.base_commit))
    return items
