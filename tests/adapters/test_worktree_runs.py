"""`workspace: {worktree: true}` in a real git repository with a dirty working tree.

Whatever happens to the run (completed, failed, SIGKILLed and resumed, cleaned up),
the user's working tree, branch, HEAD and index stay byte-identical, and the run's
work ends up on branch `loopdsl/<run-id>` (or in a kept worktree).
"""
from __future__ import annotations

import hashlib
import sys
from pathlib import Path
from typing import Any

import pytest
from cli_in_process import cli_in_process
from git_repos import git_output as _git, owned_repo

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import crash_torture as ct

import loopdsl
from loopdsl.adapters.store.run_store import RunStore

LOOP = Path(__file__).parents[1] / "data" / "durable" / "worktree.yaml"


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A repository with one commit, then an unstaged change, a staged change and an untracked file."""
    monkeypatch.delenv("LOOPDSL_STORE", raising=False)
    root = owned_repo(tmp_path / "repo", {name: f"{name} as committed\n" for name in ("a.txt", "b.txt", "c.txt")},
                      owner="Repo Owner")
    (root / "a.txt").write_text("a.txt edited, not staged\n")
    (root / "b.txt").write_text("b.txt edited and staged\n")
    _git(root, "add", "b.txt")
    (root / "untracked.txt").write_text("nobody added me\n")
    return root


def _snapshot(repo: Path) -> dict[str, Any]:
    index = hashlib.sha256((repo / ".git" / "index").read_bytes()).hexdigest()
    files = {str(p.relative_to(repo)): p.read_bytes() for p in sorted(repo.rglob("*"))
             if p.is_file() and ".git" not in p.relative_to(repo).parts[:1] and ".loopdsl" not in p.relative_to(repo).parts[:1]}
    return {
        "status": _git(repo, "status", "--porcelain=v2", "--branch", "--untracked-files=all"),
        "head": _git(repo, "rev-parse", "HEAD"),
        "branch": _git(repo, "symbolic-ref", "HEAD"),
        "index": index,
        "files": files,
    }


def _branch_file(repo: Path, run_id: str, name: str) -> str:
    return _git(repo, "show", f"loopdsl/{run_id}:{name}")


def _registered(repo: Path) -> str:
    return _git(repo, "worktree", "list", "--porcelain")


def test_a_completed_run_commits_to_its_branch_and_removes_the_worktree(repo: Path) -> None:
    before = _snapshot(repo)
    result = loopdsl.run(LOOP, workdir=repo)  # the default store: .loopdsl/ at the repository root
    assert result.status == "completed", result.state.error
    run_id, store = result.run_id, repo / ".loopdsl"
    wt = store / "worktrees" / run_id
    assert result.outputs == {"where": str(wt)}  # commands ran in the worktree, not the checkout
    assert not wt.exists() and str(wt) not in _registered(repo)
    # The worktree started from HEAD (not the dirty files); the agent's edits are committed on its branch.
    assert _branch_file(repo, run_id, "a.txt") == "a.txt as committed\nagent line\n"
    assert _branch_file(repo, run_id, "agent.txt") == "made by agent\n"
    assert _branch_file(repo, run_id, "b.txt") == "b.txt as committed\n"
    assert _git(repo, "rev-parse", f"loopdsl/{run_id}~1") == before["head"]
    info = RunStore(store).load(run_id)["meta"]["worktree"]
    assert info["kept"] is False and _git(repo, "rev-parse", f"loopdsl/{run_id}").strip() == info["commit"]
    assert _snapshot(repo) == before
    assert (store / ".gitignore").read_text() == "*\n"
    assert ".loopdsl" not in _git(repo, "status", "--porcelain", "--untracked-files=all", "--ignored=no")


def test_a_failed_run_keeps_its_worktree_until_clean(repo: Path) -> None:
    before = _snapshot(repo)
    result = loopdsl.run(LOOP, inputs={"fail": 3}, workdir=repo)
    assert result.status == "failed" and result.state.error["kind"] == "shell_exit"
    run_id, store = result.run_id, repo / ".loopdsl"
    wt = store / "worktrees" / run_id
    assert (wt / "agent.txt").read_text() == "made by agent\n" and str(wt) in _registered(repo)
    assert _snapshot(repo) == before

    shown = cli_in_process(["show", run_id], repo)
    assert shown.returncode == 0
    assert f"worktree kept for inspection: {wt} (branch loopdsl/{run_id})" in shown.stdout

    cleaned = cli_in_process(["clean"], repo)
    assert cleaned.returncode == 0, cleaned.stderr
    assert f"removed 1 worktree(s): {run_id}" in cleaned.stdout
    assert not wt.exists() and str(wt) not in _registered(repo)
    assert f"loopdsl/{run_id}" in _git(repo, "branch", "--list", "loopdsl/*")  # the branch stays
    assert _snapshot(repo) == before


def test_a_killed_run_keeps_its_worktree_and_resumes_inside_it(repo: Path, tmp_path: Path) -> None:
    before = _snapshot(repo)
    marks = tmp_path / "marks"
    marks.mkdir()
    proc = ct.launch(["run", str(LOOP), "--input", f"marks={marks}", "--quiet"], repo)
    ct.wait_until(lambda: ct.markers(marks, "slow") == 1, proc, what="the slow step started")
    assert ct.kill(proc)
    store = repo / ".loopdsl"
    run_id = RunStore(store).list_runs()[0]["run_id"]
    wt = store / "worktrees" / run_id
    assert (wt / "agent.txt").exists() and str(wt) in _registered(repo)
    assert _snapshot(repo) == before

    (marks / "go").touch()
    ct.wait_lock_free(store, run_id)
    result = loopdsl.resume(run_id, store=store)
    assert result.status == "completed", result.state.error
    assert result.outputs == {"where": str(wt)}  # the resumed step ran in the same worktree
    assert ct.markers(marks, "slow") == 2
    assert not wt.exists() and _branch_file(repo, run_id, "agent.txt") == "made by agent\n"
    assert _branch_file(repo, run_id, "a.txt") == "a.txt as committed\nagent line\n"  # edited once, not twice
    assert _snapshot(repo) == before
