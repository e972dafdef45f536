"""The repository guard around an agent attempt, with real repositories and a real `sh`
doing what a hostile agent's shell tool would do."""
from __future__ import annotations

from pathlib import Path

import pytest
from git_repos import IDENTITY, agent, git, isolate_git, make_repo

from loopdsl.adapters.git_guard import describe_changes, guard_repository
from loopdsl.adapters.git_snapshot import reset_workspace, visit_start, workspace_changes
from loopdsl.adapters.git_worktree import Worktree, create_worktree

COMMON = '"$(git rev-parse --git-common-dir)"'


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    isolate_git(tmp_path, monkeypatch)


@pytest.fixture
def run(tmp_path: Path) -> Worktree:
    repo = make_repo(tmp_path / "repo", {"a.py": "x = 1\n", "README.md": "hi\n"})
    git(repo, "branch", "other")
    git(repo, "tag", "v1")
    return create_worktree(repo, tmp_path / "store" / "worktrees", "run00001")


# (what the agent runs in its worktree, a fragment of the change line the guard reports)
HOSTILE = {
    "hook": (f"printf '#!/bin/sh\\ntouch /tmp/x\\n' > {COMMON}/hooks/pre-commit; chmod +x {COMMON}/hooks/pre-commit",
             "git file hooks/pre-commit was created"),
    "hook edited": (f"echo 'exit 0' >> {COMMON}/hooks/pre-push.sample", "git file hooks/pre-push.sample was changed"),
    "config": ("git config core.fsmonitor 'touch /tmp/x'", "git file config was changed"),
    "info attributes": (f"echo '* filter=evil' > {COMMON}/info/attributes", "git file info/attributes was created"),
    "alternates": (f"echo /tmp/elsewhere > {COMMON}/objects/info/alternates",
                   "git file objects/info/alternates was created"),
    "other branch": (f"git {' '.join(IDENTITY)} commit -q --allow-empty -m x && git branch -f other HEAD",
                     "ref refs/heads/other moved"),
    "main": ("git update-ref -d refs/heads/main", "ref refs/heads/main was deleted"),
    "new branch": ("git branch sneaky", "ref refs/heads/sneaky was created"),
    "tag": ("git tag v2", "ref refs/tags/v2 was created"),
    "main checkout": ("git -C ../../../repo symbolic-ref HEAD refs/heads/other", "ref HEAD moved"),
    "worktree git file": ("echo 'gitdir: /tmp/elsewhere' > .git", "git file <run worktree>/.git was changed"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_each_change_to_the_git_setup_is_reported(run: Worktree, case: str) -> None:
    script, expected = HOSTILE[case]
    guard = guard_repository(run.repo, run.branch)
    assert guard.changes() == []
    agent(run.path, script)
    changes = guard.changes()
    assert any(expected in line for line in changes), changes
    message = describe_changes(changes)
    assert expected in message and "run failed" in message


def test_a_packed_ref_rewritten_in_place_is_reported(run: Worktree) -> None:
    git(run.repo, "pack-refs", "--all")
    assert not (run.repo / ".git" / "refs" / "heads" / "other").exists()
    guard = guard_repository(run.repo, run.branch)
    packed = run.repo / ".git" / "packed-refs"
    head = git(run.repo, "rev-parse", "HEAD")
    fake = git(run.repo, *IDENTITY, "commit-tree", "-m", "forged", "HEAD^{tree}")
    packed.write_text(packed.read_text().replace(f"{head} refs/heads/other", f"{fake} refs/heads/other"))
    assert guard.changes() == ["ref refs/heads/other moved"]


def test_a_hooks_path_inside_the_repository_is_watched(run: Worktree) -> None:
    (run.repo / ".githooks").mkdir()
    git(run.repo, "config", "core.hooksPath", ".githooks")
    guard = guard_repository(run.repo, run.branch)
    agent(run.path, "printf '#!/bin/sh\\n' > ../../../repo/.githooks/post-commit")
    assert any(".githooks/post-commit was created" in line for line in guard.changes())


def test_the_runs_own_branch_and_loopdsls_own_steps_are_not_changes(run: Worktree) -> None:
    guard = guard_repository(run.repo, run.branch)
    start = visit_start(run.path)
    agent(run.path, f"echo 'x = 2' > a.py && echo new > b.txt && git {' '.join(IDENTITY)} commit -qam edit "
                    f"&& echo more > c.txt && git {' '.join(IDENTITY)} commit -q --allow-empty -m again")
    assert git(run.repo, "rev-parse", run.branch) != run.base_commit  # the own branch did move
    files, _stat = workspace_changes(run.path, start)
    assert files == ["a.py", "b.txt", "c.txt"]
    reset_workspace(run.path, start)
    assert git(run.repo, "rev-parse", run.branch) == run.base_commit
    assert guard.changes() == []


def test_many_changes_are_summarised(run: Worktree) -> None:
    guard = guard_repository(run.repo, run.branch)
    agent(run.path, "for i in 1 2 3 4 5 6 7 8 9 10 11 12; do git branch b$i; done")
    changes = guard.changes()
    assert len(changes) == 12
    assert "and 2 more" in describe_changes(changes)
