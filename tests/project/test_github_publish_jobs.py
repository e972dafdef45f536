"""`publish:` through the exported workflow's two jobs: the run job (read-only token) plans the
writes and makes none; the apply job, on a fresh checkout at the same path with the run's
artifact, pushes the branch and makes them, once. Real git (a bare origin), real HTTP to the
loopback fake GitHub; the run job is a real `loopdsl` subprocess, the other commands run
in-process (tests/cli_in_process.py)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from test_github_event import REPOSITORY, clone, loopdsl, repo, runs  # noqa: F401  (repo is a fixture)

FIXER = """loopdsl: 1
name: fixer
secrets: [GITHUB_TOKEN]
workspace: {worktree: true}
inputs:
  title: {default: ""}
on:
  issues: {inputs: {title: event.issue.title}}
start: write
states:
  write:
    shell: printf 'fixed\\n' > fix.txt
    next: done
  done: {end: completed}
publish:
  pull_request: {title: "Fix: {{ inputs.title }}", body: "Made by a loop."}
"""


def test_the_run_job_plans_and_the_apply_job_publishes_once(repo: Path, tmp_path: Path) -> None:  # noqa: F811
    pytest.importorskip("githubkit")
    from git_repos import git
    from github_fake import FakeGitHub

    (repo / "loops" / "fixer.yaml").write_text(FIXER)
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=a", "-c", "user.email=a@example.com", "commit", "-qm", "fixer")
    git(repo, "push", "-q", "origin", "main")
    with FakeGitHub() as fake:
        github = {"GITHUB_API_URL": fake.url, "GITHUB_REPOSITORY": fake.repository, "GITHUB_TOKEN": fake.token}
        issue = {"action": "opened", "repository": REPOSITORY, "issue": {"number": 4, "title": "@octocat closes #1"}}
        job = clone(tmp_path, "ws")
        done = loopdsl(job, "github-event", "loops/fixer.yaml", "--out", "out", event=("issues", issue), real=True,
                       **github)
        assert done.returncode == 0, done.stderr
        assert fake.writes == []  # the run job made no write, though it had a token
        [run] = runs(job)
        assert run["status"] == "completed"
        assert loopdsl(job, "github-store", "pack", "loops/fixer.yaml", "out").returncode == 0
        artifact = tmp_path / "artifact"
        shutil.copytree(job / "out", artifact)
        shutil.rmtree(job)  # the apply job: another machine, the same workspace path
        for attempt in range(2):  # a re-run of the apply job writes nothing more
            apply_job = clone(tmp_path, "ws")
            shutil.copytree(artifact, apply_job / "out")
            applied = loopdsl(apply_job, "github-apply", "loops/fixer.yaml", "out", **github)
            assert applied.returncode == 0, applied.stderr
            if attempt == 0:
                assert f"published run {run['run_id']}" in applied.stdout
                artifact = tmp_path / "artifact-after"  # what the next run job would restore: the saved store
                shutil.rmtree(apply_job / "out" / "store")
                assert loopdsl(apply_job, "github-store", "restore", "loops/fixer.yaml").returncode == 0
                shutil.copytree(apply_job / "out", artifact)
                shutil.copytree(apply_job / ".loopdsl", artifact / "store", ignore=shutil.ignore_patterns("worktrees"))
            else:
                assert "published run" not in applied.stdout and "the run store is unchanged" in applied.stdout, applied.stdout
            shutil.rmtree(apply_job)
        [pull] = fake.writes_to("POST", r"/pulls$")
        assert pull.body["head"].endswith(f"loopdsl/{run['run_id']}")
        assert pull.body["title"] != "Fix: @octocat closes #1" and "octocat" in pull.body["title"]  # neutralised
        branch = git(tmp_path / "origin.git", "show", f"loopdsl/{run['run_id']}:fix.txt")
        assert branch == "fixed"
