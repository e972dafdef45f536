"""Real git repositories in tmp dirs for the worktree, snapshot and guard tests."""
from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

import pytest

IDENTITY = ["-c", "user.name=Setup", "-c", "user.email=setup@example.com"]


def isolate_git(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No global/system git config from the machine."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    for name in ("XDG_CONFIG_HOME", "GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME",
                 "GIT_COMMITTER_EMAIL", "EMAIL", "LOOPDSL_STORE", "GIT_DIR", "GIT_INDEX_FILE"):
        monkeypatch.delenv(name, raising=False)


def git_output(cwd: Path, *args: str) -> str:
    """What `git ARGS` prints, exactly. GIT_OPTIONAL_LOCKS=0: a test's own `git status` must
    not refresh (rewrite) the index a test compares before and after a run."""
    env = dict(os.environ, GIT_OPTIONAL_LOCKS="0")
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


def git(cwd: Path, *args: str) -> str:
    return git_output(cwd, *args).strip()


def make_repo(root: Path, files: dict[str, str]) -> Path:
    """A repository on `main` with one commit holding `files`."""
    root.mkdir(parents=True)
    git(root, "init", "-q", "-b", "main")
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    git(root, "add", "-A")
    git(root, *IDENTITY, "commit", "-q", "-m", "first")
    return root


def owned_repo(root: Path, files: Mapping[str, str], owner: str = "Owner") -> Path:
    """A repository on `main` whose own config names `owner` (the identity the run's commits
    take), with one commit "initial" holding `files`."""
    root.mkdir(parents=True)
    git(root, "init", "-q", "-b", "main")
    git(root, "config", "user.name", owner)
    git(root, "config", "user.email", "owner@example.com")
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "initial")
    return root


def agent(cwd: Path, script: str) -> None:
    """What an agent's shell tool would do: a real `sh -c` in the run's worktree."""
    proc = subprocess.run(["sh", "-c", script], cwd=cwd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
