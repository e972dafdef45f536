"""post-merge-cleanup end to end: merged branches and stale worktrees found by git, deleted after approval."""
from __future__ import annotations

import shutil
from pathlib import Path

import loopdsl
from loopdsl.api.durable import decide

from .conftest import (
    LOOPS_DIR,
    branches,
    checkout_snapshot,
    commit_file,
    git,
    init_repo,
    run_loop,
)

SCRIPT = LOOPS_DIR / "scripts" / "post-merge-cleanup.replies.yaml"


def _dated(when: str) -> dict[str, str]:
    return {"GIT_AUTHOR_DATE": when, "GIT_COMMITTER_DATE": when}


def build_cleanup_repo(base: Path) -> Path:
    """The user sits on `wip` (unmerged, forked before the merges) with uncommitted and untracked work.

    Merged into main: feat-a, feat-b (no own commits), feat-old (its worktree deleted from disk:
    prunable), feat-live (checked out in a live worktree) and release/1.0 (protected).
    Not merged: feat-x and wip.
    """
    repo = init_repo(base / "repo")
    commit_file(repo, "app.py", "x = 1\n", "base work", date="2024-02-01T10:00:00+00:00")
    git(repo, "branch", "feat-b")
    git(repo, "branch", "wip")
    for name, day in (("feat-a", "02"), ("feat-old", "03"), ("feat-live", "04"), ("release/1.0", "05")):
        git(repo, "checkout", "-q", "-b", name, "main")
        commit_file(repo, f"{name.replace('/', '-')}.txt", name + "\n", f"work on {name}", date=f"2024-02-{day}T10:00:00+00:00")
        git(repo, "checkout", "-q", "main")
        git(repo, "merge", "-q", "--no-ff", "-m", f"Merge {name}", name, env=_dated(f"2024-02-{day}T11:00:00+00:00"))
    git(repo, "checkout", "-q", "-b", "feat-x", "main")
    commit_file(repo, "x.txt", "x\n", "unmerged work", date="2024-02-06T10:00:00+00:00")
    git(repo, "checkout", "-q", "wip")
    commit_file(repo, "wip.txt", "wip\n", "my wip", date="2024-02-07T10:00:00+00:00")
    git(repo, "worktree", "add", "-q", str(base / "wt-old"), "feat-old")
    git(repo, "worktree", "add", "-q", str(base / "wt-live"), "feat-live")
    shutil.rmtree(base / "wt-old")
    (repo / "app.py").write_text("x = 2  # uncommitted\n")
    (repo / "notes.txt").write_text("untracked\n")
    return repo


def _worktree_paths(repo: Path) -> list[str]:
    return [line.split(" ", 1)[1] for line in git(repo, "worktree", "list", "--porcelain").splitlines()
            if line.startswith("worktree ")]


def test_cleanup_deletes_only_merged_branches_and_stale_worktrees(tmp_path: Path) -> None:
    repo = build_cleanup_repo(tmp_path)
    unmerged_tips = {name: git(repo, "rev-parse", name).strip() for name in ("feat-x", "wip")}
    before = checkout_snapshot(repo)

    result = run_loop("post-merge-cleanup", repo, tmp_path / "store")

    assert result.status == "completed", result.events[-3:]
    assert result.path == ["head", "merged", "unmerged", "stale", "details", "summarise", "approve", "delete", "done"]
    scan = next(e["result"]["stdout"] for e in result.events if e["type"] == "ok" and e["state"] == "merged")
    # The list came from git: merged, not busy in a live worktree, not protected, not the base.
    assert sorted(scan.split()) == ["feat-a", "feat-b", "feat-old"]
    assert sorted(result.outputs["deleted"].split()) == ["feat-a", "feat-b", "feat-old"]
    assert branches(repo) == {"main", "wip", "feat-x", "feat-live", "release/1.0"}
    for name, tip in unmerged_tips.items():
        assert git(repo, "rev-parse", name).strip() == tip
    paths = _worktree_paths(repo)
    assert str(tmp_path / "wt-old") not in paths and str(tmp_path / "wt-live") in paths
    assert len(paths) == 2  # the scratch worktree `git branch -d` ran from is gone too
    gates = {e["gate"]: e["passed"] for e in result.events if e["type"] == "gate"}
    assert gates == {"still-merged-into-base": True, "unmerged-branches-kept": True, "head-unchanged": True}
    assert checkout_snapshot(repo) == before


def test_cleanup_refuses_when_a_branch_gained_commits_after_the_scan(tmp_path: Path) -> None:
    repo = build_cleanup_repo(tmp_path)
    store = tmp_path / "store"
    script = tmp_path / "no-decision.yaml"
    script.write_text(SCRIPT.read_text().split("\napprove:")[0] + "\n")  # the summary, but no decision
    before = checkout_snapshot(repo)

    waiting = loopdsl.run(LOOPS_DIR / "post-merge-cleanup.yaml", {}, script=script, store=store, workdir=repo)
    assert waiting.status == "waiting" and waiting.path[-1] == "approve"
    # While the person deliberates, someone commits to feat-b (without touching the checkout).
    tree = git(repo, "rev-parse", "feat-b^{tree}").strip()
    late = git(repo, "commit-tree", tree, "-p", "feat-b", "-m", "late work").strip()
    git(repo, "update-ref", "refs/heads/feat-b", late)
    decide(waiting.run_id, "approve", store=store)
    result = loopdsl.resume(waiting.run_id, store=store)

    assert result.status == "escalated"
    failed = [e for e in result.events if e["type"] == "gate" and not e["passed"]]
    assert [e["gate"] for e in failed] == ["still-merged-into-base"]
    assert "feat-b has commits not in main" in failed[0]["message"]
    # The before-gate stopped the action: nothing was deleted, no worktree removed.
    assert {"feat-a", "feat-b", "feat-old"} <= branches(repo)
    assert git(repo, "rev-parse", "feat-b").strip() == late
    assert str(tmp_path / "wt-old") in _worktree_paths(repo)
    assert checkout_snapshot(repo) == before
