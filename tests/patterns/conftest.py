"""Shared helpers for the bundled pattern loops' end-to-end tests.

Every test builds a real scratch git repository, runs a bundled loop in-process with its
scripted replies, then inspects the branches, commits and files the run left behind.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
LOOPS_DIR = ROOT / "loops"
SCRIPTS_DIR = LOOPS_DIR / "scripts"

TEST_NAME = "Loop Tester"
TEST_EMAIL = "loop-tester@example.invalid"
# Directories that are not part of "the user's checkout": git's own data and the run store.
_NOT_CHECKOUT = {".git", ".loopdsl"}


def _clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """An environment where the developer's git configuration cannot leak into the test."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("GIT_")}
    env.update(
        {
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": os.devnull,
            "GIT_TERMINAL_PROMPT": "0",
            "GIT_AUTHOR_NAME": TEST_NAME,
            "GIT_AUTHOR_EMAIL": TEST_EMAIL,
            "GIT_COMMITTER_NAME": TEST_NAME,
            "GIT_COMMITTER_EMAIL": TEST_EMAIL,
        }
    )
    if extra:
        env.update(extra)
    return env


def git(repo: Path, *args: str, env: Mapping[str, str] | None = None) -> str:
    """Run git in `repo` with a fixed identity; return stdout, raise with stderr on failure."""
    command = ["git", "-c", f"user.name={TEST_NAME}", "-c", f"user.email={TEST_EMAIL}",
               "-c", "init.defaultBranch=main", "-c", "commit.gpgsign=false", "-c", "tag.gpgsign=false",
               *args]
    completed = subprocess.run(command, check=False, cwd=repo, env=_clean_env(env), capture_output=True, text=True)
    if completed.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed ({completed.returncode}) in {repo}:\n{completed.stderr}")
    return completed.stdout


def init_repo(path: Path) -> Path:
    """A git repository on branch `main` with one initial commit (README.md)."""
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q", "-b", "main")
    commit_file(path, "README.md", "# scratch\n", "initial commit", date="2024-01-01T09:00:00+00:00")
    return path


@pytest.fixture
def scratch_repo(tmp_path: Path) -> Path:
    return init_repo(tmp_path / "repo")


def commit_file(repo: Path, path: str, text: str, message: str, date: str | None = None) -> str:
    """Write `path` (relative to repo), commit it, return the new commit sha."""
    target = repo / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text, encoding="utf-8")
    git(repo, "add", "--", path)
    dates = {"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date} if date else None
    git(repo, "commit", "-q", "-m", message, env=dates)
    return git(repo, "rev-parse", "HEAD").strip()


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def checkout_snapshot(repo: Path) -> dict[str, Any]:
    """Everything that makes up the user's checkout, for before == after assertions."""
    files: dict[str, str] = {}
    for path in sorted(repo.rglob("*")):
        relative = path.relative_to(repo)
        if relative.parts[0] in _NOT_CHECKOUT or not path.is_file() or path.is_symlink():
            continue
        files[relative.as_posix()] = _sha256(path)
    index = repo / ".git" / "index"
    return {
        "head": git(repo, "rev-parse", "HEAD").strip(),
        "symbolic_ref": git(repo, "symbolic-ref", "HEAD").strip(),
        "index": _sha256(index) if index.exists() else None,
        "status": git(repo, "status", "--porcelain=v2", "--untracked-files=all"),
        "files": files,
    }


def branches(repo: Path) -> set[str]:
    return set(git(repo, "for-each-ref", "--format=%(refname:short)", "refs/heads").split())


def run_loop(name: str, repo: Path, store: Path, inputs: Mapping[str, Any] | None = None) -> Any:
    """Run loops/<name>.yaml offline with loops/scripts/<name>.replies.yaml; return the RunResult."""
    import loopdsl

    return loopdsl.run(
        LOOPS_DIR / f"{name}.yaml",
        dict(inputs or {}),
        script=SCRIPTS_DIR / f"{name}.replies.yaml",
        store=store,
        workdir=repo,
        publish=False,  # the branch stays local: tests/cli/test_publish_cli.py publishes to a fake GitHub
    )
