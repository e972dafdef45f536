"""A repository whose config and attributes name commands (an fsmonitor, clean/smudge and
process filters, textconv and external diff drivers, every hook) runs none of them while
loopdsl creates, snapshots, diffs, resets, commits and cleans a run worktree."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from git_repos import IDENTITY, agent, git, isolate_git, make_repo

from loopdsl.adapters.git_guard import guard_repository
from loopdsl.adapters.git_snapshot import reset_workspace, visit_start, workspace_changes
from loopdsl.adapters.git_worktree import (
    SecretInCommit,
    clean_worktrees,
    create_worktree,
    finish_worktree,
    open_worktree,
)

HOOKS = ("pre-commit", "prepare-commit-msg", "commit-msg", "post-commit", "post-checkout", "post-merge",
         "reference-transaction", "post-index-change", "pre-auto-gc", "post-rewrite", "fsmonitor-watchman")


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    isolate_git(tmp_path, monkeypatch)


def _marker_script(path: Path, marks: Path, name: str, tail: str = "") -> str:
    path.write_text(f"#!/bin/sh\ntouch '{marks}/{name}'\n{tail}")
    path.chmod(0o755)
    return str(path)


def hostile_repo(tmp_path: Path) -> tuple[Path, Path]:
    """A committed repository, then config and hooks that leave a marker file when they run."""
    repo = make_repo(tmp_path / "repo", {
        "a.txt": "alpha\n", "data.dat": "raw\n", "notes.md": "notes\n",
        # A driver named `odd=name` cannot be blanked with `git -c` (it splits at the first "=").
        ".gitattributes": "*.txt filter=evil diff=evil\n*.dat filter=proc diff=ext\n*.md filter=odd=name\n",
    })
    marks, bin_dir = tmp_path / "marks", tmp_path / "bin"
    marks.mkdir()
    bin_dir.mkdir()
    settings = {
        "core.fsmonitor": _marker_script(bin_dir / "fsmonitor", marks, "fsmonitor"),
        "filter.evil.clean": _marker_script(bin_dir / "clean", marks, "clean", "cat\n"),
        "filter.evil.smudge": _marker_script(bin_dir / "smudge", marks, "smudge", "cat\n"),
        "filter.evil.required": "true",
        "filter.odd=name.clean": _marker_script(bin_dir / "clean-odd", marks, "clean-odd", "cat\n"),
        "filter.odd=name.smudge": _marker_script(bin_dir / "smudge-odd", marks, "smudge-odd", "cat\n"),
        "filter.proc.process": _marker_script(bin_dir / "process", marks, "process", "exit 1\n"),
        "diff.evil.textconv": _marker_script(bin_dir / "textconv", marks, "textconv", 'cat "$1"\n'),
        "diff.ext.command": _marker_script(bin_dir / "extdiff", marks, "extdiff"),
    }
    for key, value in settings.items():
        git(repo, "config", key, value)
    for hook in HOOKS:
        _marker_script(repo / ".git" / "hooks" / hook, marks, f"hook-{hook}")
    return repo, marks


def test_no_command_of_the_repository_runs_during_a_whole_run(tmp_path: Path) -> None:
    repo, marks = hostile_repo(tmp_path)
    worktrees = tmp_path / "store" / "worktrees"
    wt = create_worktree(repo, worktrees, "run00001")
    guard = guard_repository(repo, wt.branch)
    assert (wt.path / "a.txt").read_text() == "alpha\n"
    (wt.path / "a.txt").write_text("alpha edited\n")
    (wt.path / "b.txt").write_text("new text\n")
    (wt.path / "data.dat").write_text("raw edited\n")
    (wt.path / "notes.md").write_text("notes edited\n")
    start = visit_start(wt.path)
    (wt.path / "a.txt").write_text("attempt 1\n")
    assert workspace_changes(wt.path, start)[0] == ["a.txt"]
    reset_workspace(wt.path, start)
    assert (wt.path / "a.txt").read_text() == "alpha edited\n"
    files, stat = workspace_changes(wt.path, wt.base_commit)
    assert files == ["a.txt", "b.txt", "data.dat", "notes.md"] and "4 files changed" in stat
    assert guard.changes() == []
    assert open_worktree(repo, worktrees, "run00001") == wt
    sha = finish_worktree(wt, "loopdsl: run")
    assert sha and git(repo, "show", f"{sha}:a.txt") == "alpha edited"
    assert git(repo, "show", f"{sha}:data.dat") == "raw edited"

    # A second run whose commit is refused (the branch moved back, changes staged), then cleaned.
    wt2 = create_worktree(repo, worktrees, "run00002")
    tame = ("GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0='filter.odd=name.clean' GIT_CONFIG_VALUE_0= "
            f"git {' '.join(IDENTITY)} -c core.hooksPath=/dev/null -c core.fsmonitor=false "
            "-c filter.evil.clean= -c filter.evil.required=false -c filter.proc.process=")
    agent(wt2.path, f"echo 'token s3cr3t-value' > c.txt && {tame} add c.txt && {tame} commit -qm leak")
    assert list(marks.iterdir()) == []
    with pytest.raises(SecretInCommit):
        finish_worktree(wt2, "m", ["s3cr3t-value"])
    assert git(repo, "rev-parse", wt2.branch) == wt2.base_commit
    assert clean_worktrees(repo, worktrees) == ["run00002"]

    assert sorted(p.name for p in marks.iterdir()) == []

    # The control: plain git in the same repository does run them, so the assertion above can fail.
    (repo / "a.txt").write_text("user edit\n")
    (repo / "notes.md").write_text("user edit\n")
    for args in (["add", "a.txt", "notes.md"], [*IDENTITY, "commit", "-qm", "user commit"], ["diff", "HEAD~1", "--", "a.txt"]):
        # The process filter (which fails on purpose) is the only one tamed here: it already ran.
        subprocess.run(["git", "-c", "filter.proc.process=", *args], cwd=repo, capture_output=True, check=False)
    (repo / "data.dat").write_text("user edit\n")
    subprocess.run(["git", "add", "data.dat"], cwd=repo, capture_output=True, check=False)  # fails: exit 1
    ran = {p.name for p in marks.iterdir()}
    assert {"clean", "clean-odd", "process", "fsmonitor", "hook-pre-commit", "hook-post-commit", "hook-reference-transaction",
            "textconv"} <= ran, ran
