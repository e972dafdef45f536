"""Run worktrees in real git repositories: the user's checkout must never change."""
from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from loopdsl.adapters.store.run_store import RunStore
from loopdsl.adapters.git_worktree import (
    FALLBACK_EMAIL,
    WorkspaceError,
    clean_worktrees,
    create_worktree,
    find_repo_root,
    finish_worktree,
    keep_worktree,
    open_worktree,
)

SETUP_IDENTITY = ["-c", "user.name=Setup", "-c", "user.email=setup@example.com"]


@pytest.fixture(autouse=True)
def isolated_git(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No global/system git config from the machine: no identity unless a test sets one."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    for name in ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME",
                 "GIT_COMMITTER_EMAIL", "EMAIL", "LOOPDSL_STORE"):
        monkeypatch.delenv(name, raising=False)


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "user-repo"
    root.mkdir()
    git(root, "init", "-q", "-b", "main")
    (root / "README.md").write_text("hello\n")
    (root / "src.py").write_text("print(1)\n")
    git(root, "add", "-A")
    git(root, *SETUP_IDENTITY, "commit", "-q", "-m", "first")
    (root / "src.py").write_text("print(2)\n")
    git(root, "add", "-A")
    git(root, *SETUP_IDENTITY, "commit", "-q", "-m", "second")
    return root


@pytest.fixture
def worktrees_dir(repo: Path):
    with RunStore(repo / ".loopdsl") as store:
        yield store.worktrees_dir


def user_state(root: Path) -> dict[str, object]:
    """Everything of the user's checkout a run must leave alone."""
    index_sha = hashlib.sha256((root / ".git" / "index").read_bytes()).hexdigest()
    files = {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".git" not in p.relative_to(root).parts[:1]
        and ".loopdsl" not in p.relative_to(root).parts[:1]
    }
    return {
        "index": index_sha,
        "status": git(root, "--no-optional-locks", "status", "--porcelain=v2", "--branch"),
        "head": git(root, "rev-parse", "HEAD"),
        "symbolic": git(root, "symbolic-ref", "HEAD"),
        "files": files,
    }


def test_find_repo_root(repo: Path, tmp_path: Path) -> None:
    (repo / "pkg" / "sub").mkdir(parents=True)
    assert find_repo_root(repo / "pkg" / "sub") == repo.resolve()
    assert find_repo_root(repo / "README.md") == repo.resolve()
    plain = tmp_path / "plain"
    plain.mkdir()
    assert find_repo_root(plain) is None
    assert find_repo_root(tmp_path / "missing") is None


def test_create_and_finish_commits_on_the_run_branch(repo: Path, worktrees_dir: Path) -> None:
    before = user_state(repo)
    wt = create_worktree(repo, worktrees_dir, "run00001")
    assert wt.branch == "loopdsl/run00001"
    assert wt.path == worktrees_dir / "run00001" and wt.path.is_dir()
    assert wt.base_commit == before["head"]
    assert (wt.path / "src.py").read_text() == "print(2)\n"
    # The agent edits, adds and deletes files.
    (wt.path / "src.py").write_text("print(3)\n")
    (wt.path / "new.txt").write_text("made by the run\n")
    (wt.path / "README.md").unlink()
    assert user_state(repo) == before  # mid-run, the user's checkout is untouched

    sha = finish_worktree(wt, "loopdsl run run00001: completed")

    assert sha and git(repo, "rev-parse", "loopdsl/run00001") == sha
    assert git(repo, "rev-parse", f"{sha}^") == before["head"]
    assert git(repo, "show", f"{sha}:src.py") == "print(3)"
    assert git(repo, "show", f"{sha}:new.txt") == "made by the run"
    assert "README.md" not in git(repo, "ls-tree", "--name-only", sha).split()
    assert git(repo, "log", "-1", "--format=%s", sha) == "loopdsl run run00001: completed"
    assert not wt.path.exists()
    assert str(wt.path) not in git(repo, "worktree", "list", "--porcelain")
    assert user_state(repo) == before


def test_finish_without_identity_uses_the_loopdsl_author(repo: Path, worktrees_dir: Path) -> None:
    wt = create_worktree(repo, worktrees_dir, "anon0001")
    (wt.path / "x.txt").write_text("x\n")
    sha = finish_worktree(wt, "m")
    assert git(repo, "log", "-1", "--format=%ae|%ce", sha) == f"{FALLBACK_EMAIL}|{FALLBACK_EMAIL}"
    # The fallback identity was passed per command, never written to the user's config.
    config = git(repo, "config", "--list")
    assert "user.email" not in config


def test_finish_with_user_identity_keeps_it(repo: Path, worktrees_dir: Path) -> None:
    git(repo, "config", "user.name", "Ada")
    git(repo, "config", "user.email", "ada@example.com")
    wt = create_worktree(repo, worktrees_dir, "ada00001")
    (wt.path / "x.txt").write_text("x\n")
    sha = finish_worktree(wt, "m")
    assert git(repo, "log", "-1", "--format=%an <%ae>", sha) == "Ada <ada@example.com>"


def test_finish_skips_user_hooks(repo: Path, worktrees_dir: Path) -> None:
    hook = repo / ".git" / "hooks" / "pre-commit"
    hook.write_text("#!/bin/sh\necho refused >&2\nexit 1\n")
    hook.chmod(0o755)
    wt = create_worktree(repo, worktrees_dir, "hook0001")
    (wt.path / "x.txt").write_text("x\n")
    assert finish_worktree(wt, "m") is not None


def test_finish_with_nothing_to_commit(repo: Path, worktrees_dir: Path) -> None:
    before = user_state(repo)
    wt = create_worktree(repo, worktrees_dir, "idle0001")
    assert finish_worktree(wt, "nothing") is None
    assert not wt.path.exists()
    assert git(repo, "rev-parse", "loopdsl/idle0001") == before["head"]
    assert user_state(repo) == before


def test_dirty_user_checkout_stays_exactly_as_it_was(repo: Path, worktrees_dir: Path) -> None:
    (repo / "src.py").write_text("print('unstaged edit')\n")
    (repo / "staged.txt").write_text("staged\n")
    git(repo, "add", "staged.txt")
    (repo / "README.md").write_text("staged then edited again\n")
    git(repo, "add", "README.md")
    (repo / "README.md").write_text("edited after staging\n")
    (repo / "untracked.txt").write_text("untracked\n")
    before = user_state(repo)
    assert before["status"].count("\n") >= 4  # the checkout really is dirty

    wt = create_worktree(repo, worktrees_dir, "dirt0001")
    # The run starts from the commit, not from the user's uncommitted edits.
    assert (wt.path / "src.py").read_text() == "print(2)\n"
    assert not (wt.path / "staged.txt").exists() and not (wt.path / "untracked.txt").exists()
    (wt.path / "src.py").write_text("print('run')\n")
    finish_worktree(wt, "m")
    assert user_state(repo) == before


def test_base_ref(repo: Path, worktrees_dir: Path) -> None:
    first = git(repo, "rev-parse", "HEAD~1")
    git(repo, "tag", "v1", first)
    wt = create_worktree(repo, worktrees_dir, "base0001", base="v1")
    assert wt.base_commit == first
    assert (wt.path / "src.py").read_text() == "print(1)\n"
    (wt.path / "src.py").write_text("print('from v1')\n")
    sha = finish_worktree(wt, "m")
    assert git(repo, "rev-parse", f"{sha}^") == first


def test_unknown_base_is_a_clear_error(repo: Path, worktrees_dir: Path) -> None:
    with pytest.raises(WorkspaceError) as info:
        create_worktree(repo, worktrees_dir, "bad00001", base="no-such-branch")
    assert "'no-such-branch' is not a commit" in info.value.message
    assert "git log" in info.value.hint
    assert subprocess.run(
        ["git", "rev-parse", "--verify", "--quiet", "loopdsl/bad00001"], cwd=repo, check=False
    ).returncode != 0


def test_repo_without_commits_is_a_clear_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty-repo"
    empty.mkdir()
    git(empty, "init", "-q")
    with pytest.raises(WorkspaceError) as info:
        create_worktree(empty, tmp_path / "wts", "r1")
    assert "no commits yet" in info.value.hint


def test_non_git_directory_is_a_clear_error(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(WorkspaceError) as info:
        create_worktree(plain, tmp_path / "wts", "r1")
    assert "not inside a git repository" in info.value.message
    assert "git init" in info.value.hint
    assert not (tmp_path / "wts").exists()


def test_existing_branch_is_refused(repo: Path, worktrees_dir: Path) -> None:
    git(repo, "branch", "loopdsl/dup00001")
    with pytest.raises(WorkspaceError, match="already exists"):
        create_worktree(repo, worktrees_dir, "dup00001")


def test_failed_run_keeps_worktree_and_resume_reopens_it(repo: Path, worktrees_dir: Path) -> None:
    wt = create_worktree(repo, worktrees_dir, "fail0001")
    (wt.path / "half-done.txt").write_text("partial\n")
    keep_worktree(wt)
    assert (wt.path / "half-done.txt").read_text() == "partial\n"
    reopened = open_worktree(repo, worktrees_dir, "fail0001")
    assert reopened == wt
    assert open_worktree(repo, worktrees_dir, "never000") is None
    sha = finish_worktree(reopened, "resumed and completed")
    assert git(repo, "show", f"{sha}:half-done.txt") == "partial"


def test_clean_removes_leftovers_but_not_branches_or_kept(repo: Path, worktrees_dir: Path) -> None:
    before = user_state(repo)
    left = create_worktree(repo, worktrees_dir, "left0001")
    (left.path / "wip.txt").write_text("uncommitted\n")
    kept = create_worktree(repo, worktrees_dir, "keep0001")
    gone = create_worktree(repo, worktrees_dir, "gone0001")
    subprocess.run(["rm", "-rf", str(gone.path)], check=True)  # deleted by hand
    user_own = repo.parent / "users-own-worktree"
    git(repo, "worktree", "add", "-q", "-b", "mine", str(user_own))

    removed = clean_worktrees(repo, worktrees_dir, keep=["keep0001"])

    assert removed == ["gone0001", "left0001"]
    assert not left.path.exists() and kept.path.is_dir() and user_own.is_dir()
    listing = git(repo, "worktree", "list", "--porcelain")
    assert str(kept.path) in listing and str(user_own) in listing
    assert "left0001" not in listing and "gone0001" not in listing
    for run_id in ("left0001", "keep0001", "gone0001"):
        git(repo, "rev-parse", "--verify", f"loopdsl/{run_id}")  # branches remain
    assert user_state(repo)["index"] == before["index"]
    assert user_state(repo)["head"] == before["head"]


def test_store_inside_repo_keeps_git_status_clean(repo: Path, worktrees_dir: Path) -> None:
    wt = create_worktree(repo, worktrees_dir, "stat0001")
    (wt.path / "x").write_text("x\n")
    assert git(repo, "status", "--porcelain", "--untracked-files=all") == ""
    keep_worktree(wt)


def test_git_environment_of_a_hook_does_not_leak(repo: Path, worktrees_dir: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    other = tmp_path / "other"
    other.mkdir()
    git(other, "init", "-q")
    # As when loopdsl runs from inside a git hook of another repository.
    monkeypatch.setenv("GIT_DIR", str(other / ".git"))
    monkeypatch.setenv("GIT_INDEX_FILE", str(other / ".git" / "index"))
    wt = create_worktree(repo, worktrees_dir, "envx0001")
    assert wt.repo == repo.resolve()
    (wt.path / "x").write_text("x\n")
    assert finish_worktree(wt, "m") is not None
    monkeypatch.delenv("GIT_DIR")
    monkeypatch.delenv("GIT_INDEX_FILE")
    git(repo, "rev-parse", "--verify", "loopdsl/envx0001")
    assert not (other / ".git" / "index").exists()
