"""The GitHub client over real HTTP to the loopback fake, and pushes to a real bare repository."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from git_repos import IDENTITY, git, isolate_git, make_repo
from github_fake import FakeGitHub
from loopdsl.adapters.github import (GitHubClient, GitHubError, push_branch, remote_sha,
                                     settings_from_env)

pytest.importorskip("githubkit")


@pytest.fixture
def fake():
    with FakeGitHub() as server:
        yield server


def client_for(fake: FakeGitHub, token: str | None = None) -> GitHubClient:
    env = {"GITHUB_API_URL": fake.url, "GITHUB_REPOSITORY": fake.repository,
           "GITHUB_TOKEN": token or fake.token}
    return GitHubClient(settings_from_env(env=env))


def test_settings_name_what_is_missing() -> None:
    with pytest.raises(GitHubError, match="GITHUB_REPOSITORY is not set"):
        settings_from_env(env={"GITHUB_TOKEN": "t"})
    with pytest.raises(GitHubError, match="not `owner/name`"):
        settings_from_env(env={"GITHUB_REPOSITORY": "a/b/c", "GITHUB_TOKEN": "t"})
    with pytest.raises(GitHubError, match="secret BOT_TOKEN .* not set") as info:
        settings_from_env("BOT_TOKEN", env={"GITHUB_REPOSITORY": "a/b", "GITHUB_TOKEN": "t"})
    assert "export BOT_TOKEN" in info.value.hint
    settings = settings_from_env("BOT_TOKEN", env={"GITHUB_REPOSITORY": "a/b", "BOT_TOKEN": "s3"})
    assert settings.api_url == "https://api.github.com" and settings.token == "s3"
    assert "s3" not in repr(settings)
    ghes = settings_from_env(env={"GITHUB_REPOSITORY": "a/b", "GITHUB_TOKEN": "t",
                                  "GITHUB_API_URL": "https://ghe.example/api/v3/"})
    assert ghes.api_url == "https://ghe.example/api/v3"


def test_pull_request_lifecycle(fake: FakeGitHub) -> None:
    gh = client_for(fake)
    assert gh.default_branch() == "main"
    assert gh.find_open_pull("loopdsl/r1") is None
    pull = gh.create_pull("Fix CI", "body", "loopdsl/r1", "main")
    assert pull.number == 1 and pull.url.endswith("/pull/1")
    assert gh.find_open_pull("loopdsl/r1") == pull
    assert gh.find_open_pull("loopdsl/other") is None
    gh.update_pull(1, "Fix CI (2)", "new body")
    assert fake.state.pulls[1]["title"] == "Fix CI (2)"
    review = gh.create_review(1, "REQUEST_CHANGES", "needs work <!-- m1 -->")
    assert gh.find_review(1, "<!-- m1 -->") == review.__class__(review.number, review.url, "<!-- m1 -->")
    assert fake.state.reviews[0]["state"] == "CHANGES_REQUESTED"
    assert [w.method for w in fake.writes] == ["POST", "PATCH", "POST"]


def test_comments_labels_issues_permissions(fake: FakeGitHub) -> None:
    gh = client_for(fake)
    issue = gh.create_issue("Flaky test", "seen twice <!-- loopdsl:x -->", ["ci"])
    assert gh.find_issue("<!-- loopdsl:x -->").number == issue.number
    assert gh.find_issue("<!-- loopdsl:y -->") is None
    comment = gh.create_comment(issue.number, "hello <!-- c -->")
    assert gh.find_comment(issue.number, "<!-- c -->").number == comment.number
    assert gh.find_comment(issue.number, "<!-- d -->") is None
    gh.add_labels(issue.number, ["bug", "needs triage", "ci"])
    gh.remove_label(issue.number, "needs triage")  # a space: the name is escaped in the path
    gh.remove_label(issue.number, "never-there")  # a 404 is "already removed"
    assert fake.state.labels[issue.number] == ["ci", "bug"]
    # A name is one path segment: `..` and `/` once reached GitHub as path (a DELETE of
    # /git/refs/heads/main, or of a label of the whole repository).
    gh.add_labels(issue.number, ["area/ui", ".."])
    writes = len(fake.writes)
    for name in ("area/ui", "../../../git/refs/heads/main", "..", "x?y=1#z"):
        gh.remove_label(issue.number, name)
    assert [w.raw_path.rsplit("/labels/", 1)[-1] for w in fake.writes[writes:]] == ["area%2Fui", "%2E%2E"]
    assert all(r.raw_path.startswith(f"/repos/{fake.repository}/issues/{issue.number}/labels/")
               for r in fake.requests[-4:]), [r.raw_path for r in fake.requests[-4:]]
    assert fake.state.labels[issue.number] == ["ci", "bug"]
    fake.state.permissions.update({"alice": "admin", "bob": "read"})
    assert [gh.permission(u) for u in ("alice", "bob", "mallory")] == ["admin", "read", "none"]


@pytest.mark.slow  # mostly a wait: started early, beside tests that compute
def test_secondary_rate_limit_is_waited_out_and_retried(fake: FakeGitHub) -> None:
    gh = client_for(fake)
    for status in (403, 429):
        fake.rate_limit(times=1, status=status, retry_after=1)
        started = time.monotonic()
        gh.create_comment(gh.create_issue("t", "b", []).number, "once")
        assert 1.0 <= time.monotonic() - started < 10
    assert len(fake.writes_to("POST", r"/comments$")) == 2  # each written once, after its retry
    assert [r.status for r in fake.requests].count(0) == 2  # the two refused requests


@pytest.mark.slow  # mostly a wait: started early, beside tests that compute
def test_rate_limit_that_persists_fails_clearly(fake: FakeGitHub) -> None:
    gh = client_for(fake)
    fake.rate_limit(times=10, status=403, retry_after=1)
    with pytest.raises(GitHubError, match="HTTP 403") as info:
        gh.create_issue("t", "b", [])
    assert "permission" in info.value.hint
    assert fake.writes == [] and len(fake.requests) == 4  # the first try and three retries


def test_long_retry_after_is_not_slept_through(fake: FakeGitHub) -> None:
    gh = client_for(fake)
    fake.rate_limit(times=1, status=429, retry_after=3600)
    started = time.monotonic()
    with pytest.raises(GitHubError, match="HTTP 429"):
        gh.create_issue("t", "b", [])
    assert time.monotonic() - started < 5


def test_bad_token_and_unreachable_server(fake: FakeGitHub) -> None:
    with pytest.raises(GitHubError, match="HTTP 401: Bad credentials") as info:
        client_for(fake, token="wrong").create_issue("t", "b", [])
    assert "GITHUB_TOKEN" in info.value.hint and "wrong" not in str(info.value)
    url = fake.url
    fake.stop()
    env = {"GITHUB_API_URL": url, "GITHUB_REPOSITORY": "octo/widgets", "GITHUB_TOKEN": "t"}
    with pytest.raises(GitHubError, match="could not reach"):
        GitHubClient(settings_from_env(env=env)).default_branch()


def test_server_error_retried_for_reads_only(fake: FakeGitHub) -> None:
    gh = client_for(fake)
    fake.fail_next(502)
    assert gh.find_open_pull("x") is None  # the read was retried
    fake.fail_next(502)
    with pytest.raises(GitHubError, match="HTTP 502"):
        gh.create_issue("t", "b", [])  # a write is not: it may have happened
    assert sum(1 for r in fake.requests if r.method == "POST") == 1


def test_push_branch_to_a_local_bare_remote(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    isolate_git(tmp_path, monkeypatch)
    repo = make_repo(tmp_path / "repo", {"a.txt": "one\n"})
    bare = tmp_path / "remote.git"
    git(tmp_path, "init", "-q", "--bare", str(bare))
    git(repo, "remote", "add", "origin", str(bare))
    git(repo, "checkout", "-q", "-b", "loopdsl/r1")
    (repo / "a.txt").write_text("two\n")
    git(repo, *IDENTITY, "commit", "-qam", "run work")
    hook = repo / ".git" / "hooks" / "pre-push"
    hook.write_text("#!/bin/sh\ntouch \"$PWD/hook-ran\"\nexit 1\n")
    hook.chmod(0o755)
    assert remote_sha(repo, "loopdsl/r1") is None
    sha = push_branch(repo, "loopdsl/r1", "loopdsl/r1", token="tok")
    assert remote_sha(repo, "loopdsl/r1") == sha == git(bare, "rev-parse", "loopdsl/r1")
    assert push_branch(repo, "loopdsl/r1", "loopdsl/r1", token=None) == sha  # again: a no-op
    assert not (repo / "hook-ran").exists()
    # a fixed branch holding other work: refused without force, replaced with it
    git(repo, "checkout", "-q", "main")
    (repo / "b.txt").write_text("other\n")
    git(repo, "add", "b.txt")
    git(repo, *IDENTITY, "commit", "-qm", "other")
    push_branch(repo, "main", "bot/fixes", token=None)
    with pytest.raises(GitHubError, match="pushing 'bot/fixes' to origin failed") as info:
        push_branch(repo, "loopdsl/r1", "bot/fixes", token=None)
    assert "branch: run" in info.value.hint
    assert push_branch(repo, "loopdsl/r1", "bot/fixes", token=None, force=True) == sha
    with pytest.raises(GitHubError, match="is not in the repository"):
        push_branch(repo, "loopdsl/missing", "x", token=None)
