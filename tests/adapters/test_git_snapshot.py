"""visit_start / workspace_changes / reset_workspace on real run worktrees."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from git_repos import IDENTITY, agent, git, isolate_git, make_repo

from loopdsl.adapters.git_snapshot import reset_workspace, visit_start, workspace_changes
from loopdsl.adapters.git_worktree import Worktree, create_worktree, finish_worktree


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    isolate_git(tmp_path, monkeypatch)


@pytest.fixture
def run(tmp_path: Path) -> Worktree:
    repo = make_repo(tmp_path / "repo", {
        "a.py": "x = 1\n", "README.md": "hi\n", "pkg/b.py": "y = 2\n", ".gitignore": "build/\n*.log\n",
        "win.bat": "echo one\necho two\n", ".gitattributes": "*.bat text eol=crlf\n",
    })
    return create_worktree(repo, tmp_path / "store" / "worktrees", "run00001")


def test_a_clean_worktree_starts_at_head_and_reports_nothing(run: Worktree) -> None:
    # win.bat is CRLF on disk and LF in the commit: built-in eol conversion reads it back unchanged.
    assert (run.path / "win.bat").read_bytes() == b"echo one\r\necho two\r\n"
    assert visit_start(run.path) == run.base_commit
    assert workspace_changes(run.path, run.base_commit) == ([], "")


def test_changes_include_untracked_files_but_not_ignored_ones(run: Worktree) -> None:
    start = visit_start(run.path)
    (run.path / "a.py").write_text("x = 10\n")
    (run.path / "pkg" / "b.py").unlink()
    (run.path / "pkg" / "new.py").write_text("z = 3\n")
    (run.path / "build").mkdir()
    (run.path / "build" / "out.bin").write_text("ignored\n")
    (run.path / "debug.log").write_text("ignored\n")
    files, stat = workspace_changes(run.path, start)
    assert files == ["a.py", "pkg/b.py", "pkg/new.py"]
    assert stat.splitlines()[-1].strip() == "3 files changed, 2 insertions(+), 2 deletions(-)"
    assert " a.py " in stat and "pkg/new.py" in stat
    assert git(run.path, "diff", "--cached", "--name-only") == ""  # the worktree's own index is not used


def test_visit_start_of_a_dirty_worktree_is_a_commit_of_its_files_on_no_branch(run: Worktree) -> None:
    (run.path / "a.py").write_text("x = 'earlier state'\n")
    (run.path / "notes.txt").write_text("untracked work\n")
    start = visit_start(run.path)
    assert start != run.base_commit
    assert git(run.path, "rev-parse", f"{start}^") == run.base_commit
    assert git(run.path, "show", f"{start}:notes.txt") == "untracked work"
    assert git(run.path, "rev-parse", "HEAD") == run.base_commit  # the branch did not move
    assert git(run.path, "branch", "--contains", start) == ""
    assert workspace_changes(run.path, start) == ([], "")


def test_names_that_look_like_index_entries_or_revisions_are_plain_files(run: Worktree) -> None:
    """One `ls-files` lists tracked and untracked files: an untracked name shaped like a staged
    entry is still an untracked file with its own content, and a file named HEAD does not make
    the visit's HEAD ambiguous."""
    sha = git(run.path, "rev-parse", "HEAD:a.py")
    spoof = f"100644 {sha} 0\ta.py"
    (run.path / spoof).write_text("not a.py\n")
    (run.path / "HEAD").write_text("a file\n")
    start = visit_start(run.path)
    assert git(run.path, "rev-parse", f"{start}^") == run.base_commit
    assert git(run.path, "show", f"{start}:{spoof}") == "not a.py"
    assert git(run.path, "show", f"{start}:HEAD") == "a file"
    assert git(run.path, "show", f"{start}:a.py") == "x = 1"
    assert workspace_changes(run.path, run.base_commit)[0] == sorted(["HEAD", spoof])


def test_reset_restores_the_visit_start_exactly(run: Worktree) -> None:
    (run.path / "a.py").write_text("x = 'earlier state'\n")
    (run.path / "notes.txt").write_text("untracked work\n")
    start = visit_start(run.path)
    # The attempt edits, deletes, adds, commits, leaves a nested repository and ignored files.
    agent(run.path, f"echo bad > a.py && rm notes.txt README.md && mkdir -p deep/er && echo n > deep/er/new.py "
                    f"&& chmod +x pkg/b.py && git add -A && git {' '.join(IDENTITY)} commit -qm attempt "
                    "&& echo after > later.txt && git init -q nested && echo l > debug.log")
    os.symlink("a.py", run.path / "link")
    assert workspace_changes(run.path, start)[0]
    reset_workspace(run.path, start)
    assert workspace_changes(run.path, start) == ([], "")
    assert (run.path / "a.py").read_text() == "x = 'earlier state'\n"
    assert (run.path / "notes.txt").read_text() == "untracked work\n"
    assert (run.path / "README.md").read_text() == "hi\n"
    for gone in ("deep", "later.txt", "nested", "link"):
        assert not os.path.lexists(run.path / gone), gone
    assert not os.access(run.path / "pkg" / "b.py", os.X_OK)
    assert (run.path / "debug.log").exists()  # ignored files are kept
    assert git(run.path, "rev-parse", "HEAD") == run.base_commit  # the snapshot commit is on no branch
    assert git(run.path, "diff", "--cached", "--name-only") == ""


def test_finish_keeps_modes_symlinks_and_names_git_cannot_pass_on_a_line(run: Worktree) -> None:
    (run.path / "run.sh").write_text("#!/bin/sh\n")
    (run.path / "run.sh").chmod(0o755)
    os.symlink("a.py", run.path / "alias.py")
    (run.path / "odd\nname.txt").write_text("newline in the name\n")
    sha = finish_worktree(run, "m")
    assert sha
    listing = git(run.repo, "ls-tree", "-r", sha)
    assert "100755 blob" in next(line for line in listing.splitlines() if line.endswith("run.sh"))
    assert git(run.repo, "cat-file", "-p", f"{sha}:alias.py") == "a.py"
    assert "120000" in next(line for line in listing.splitlines() if line.endswith("alias.py"))
    assert '"odd\\nname.txt"' in listing
    assert git(run.repo, "show", f"{sha}:win.bat") == "echo one\necho two"  # LF in the repository, as before


def test_reset_does_not_follow_a_directory_swapped_for_a_symlink(run: Worktree, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "b.py").write_text("not the run's\n")
    start = visit_start(run.path)
    agent(run.path, f"rm -r pkg && ln -s '{outside}' pkg")
    assert workspace_changes(run.path, start)[0] == ["pkg", "pkg/b.py"]
    reset_workspace(run.path, start)
    assert (outside / "b.py").read_text() == "not the run's\n" and sorted(p.name for p in outside.iterdir()) == ["b.py"]
    assert not (run.path / "pkg").is_symlink() and (run.path / "pkg" / "b.py").read_text() == "y = 2\n"


def test_reset_to_a_commit_that_is_gone_is_a_clear_error(run: Worktree) -> None:
    from loopdsl.adapters.git_worktree import WorkspaceError
    with pytest.raises(WorkspaceError) as info:
        reset_workspace(run.path, "1" * 40)
    assert "is not a commit" in info.value.message and "start a new run" in info.value.hint
    assert (run.path / "a.py").read_text() == "x = 1\n"  # nothing was touched
