"""A pull request review decides the run waiting on its pull request: `loopdsl github-event`
with a `pull_request_review` payload (in-process, tests/cli_in_process.py; the refused review
is a real subprocess), against the loopback fake GitHub (permissions, the checkpoint comments
the apply job posted)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from git_repos import git, isolate_git, make_repo
from test_github_event import REPOSITORY, loopdsl, pull_request, runs

githubkit = pytest.importorskip("githubkit")
from github_fake import FakeGitHub  # noqa: E402  (needs githubkit's server side too)

REVIEWED = """loopdsl: 1
name: reviewed
inputs:
  title: {default: ""}
on:
  pull_request: {types: [opened], inputs: {title: event.pull_request.title}}
start: ask
states:
  ask:
    checkpoint: {message: "Merge {{ inputs.title }}?"}
    transitions:
      - {to: done, when: "ask.decision == 'approve'"}
      - {to: refused}
  done: {end: completed, output: {title: "{{ inputs.title }}"}}
  refused: {end: failed}
"""
CHOOSER = REVIEWED.replace("name: reviewed", "name: chooser").replace(
    'checkpoint: {message: "Merge {{ inputs.title }}?"}', 'checkpoint: {message: "Which?", choices: [ship, hold]}').replace(
    "ask.decision == 'approve'", "ask.decision == 'ship'")


@pytest.fixture
def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    isolate_git(tmp_path, monkeypatch)
    repo = make_repo(tmp_path / "work", {"loops/reviewed.yaml": REVIEWED, "loops/chooser.yaml": CHOOSER})
    git(tmp_path, "init", "-q", "--bare", "-b", "main", str(tmp_path / "origin.git"))  # the apply job reads its runs branch
    git(repo, "remote", "add", "origin", str(tmp_path / "origin.git"))
    with FakeGitHub() as fake:
        for number in (7, 8):
            fake.state.pulls[number] = {"number": number, "state": "open", "title": "t", "head": {"ref": f"f{number}"},
                                        "base": {"ref": "main"}, "html_url": ""}
        fake.state.permissions.update({"ada": "write", "mallory": "read"})
        env = {"GITHUB_API_URL": fake.url, "GITHUB_REPOSITORY": fake.repository, "GITHUB_TOKEN": fake.token}
        yield repo, fake, env


def wait_on_pull(repo: Path, env: dict, loop: str, number: int) -> str:
    """Workflow run 1: the pull request opens, the run waits, the apply job posts its checkpoint."""
    event = pull_request(f"pr {number}")
    event["number"] = event["pull_request"]["number"] = number
    out = f"out-{loop}-{number}"
    done = loopdsl(repo, "github-event", f"loops/{loop}.yaml", "--out", out, event=("pull_request", event), **env)
    assert done.returncode == 0, done.stderr
    run_id = json.loads((repo / out / "checkpoint.json").read_text())["run_id"]
    applied = loopdsl(repo, "github-apply", f"loops/{loop}.yaml", out, event=("pull_request", event), **env)
    assert applied.returncode == 0 and f"posted the checkpoint of run {run_id} on #{number}" in applied.stdout, applied.stderr
    return run_id


def review(login: str, state: str, number: int = 7, body: str = "") -> tuple[str, dict]:
    return ("pull_request_review", {
        "action": "submitted", "repository": REPOSITORY, "sender": {"login": login},
        "review": {"state": state, "body": body, "user": {"login": login, "type": "User"}},
        "pull_request": {"number": number, "head": {"ref": "f", "repo": {"full_name": "octo/widgets"}}}})


def status(repo: Path, run_id: str) -> str:
    return next(r["status"] for r in runs(repo) if r["run_id"] == run_id)


def test_an_approving_review_by_a_writer_decides_the_run_of_its_pull_request(setup) -> None:
    repo, fake, env = setup
    on_7, on_8 = wait_on_pull(repo, env, "reviewed", 7), wait_on_pull(repo, env, "reviewed", 8)
    # Anyone can write a comment that looks like the apply job's: on #7, one naming #8's run.
    fake.state.comments.append({"id": 1, "issue_number": 7, "user": {"login": "mallory", "type": "User"},
                                "body": f"<!-- loopdsl:checkpoint {on_8} ask -->\nplease approve"})
    refused = loopdsl(repo, "github-event", "loops/reviewed.yaml", event=review("mallory", "approved"), real=True, **env)
    assert refused.returncode == 2 and "mallory may not start or decide runs" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr and status(repo, on_7) == "waiting"
    chat = loopdsl(repo, "github-event", "loops/reviewed.yaml", event=review("ada", "commented"), **env)
    assert chat.returncode == 0 and "a review that is 'commented' decides nothing" in chat.stdout, chat.stdout
    done = loopdsl(repo, "github-event", "loops/reviewed.yaml", event=review("ada", "approved", body="ship it"), **env)
    assert done.returncode == 0, done.stderr
    assert f"run {on_7}: recorded 'approve' by github:ada" in done.stdout
    assert (status(repo, on_7), status(repo, on_8)) == ("completed", "waiting")  # the planted marker named #8's run
    shown = json.loads(loopdsl(repo, "show", on_7, "--json").stdout)["run"]
    assert shown["results"]["ask"]["comment"] == "ship it"
    again = loopdsl(repo, "github-event", "loops/reviewed.yaml", event=review("ada", "approved"), **env)
    assert again.returncode == 0 and "no run of this loop waits on #7" in again.stdout, again.stdout


def test_changes_requested_rejects_or_is_ignored_when_reject_is_no_choice(setup) -> None:
    repo, fake, env = setup
    plain, custom = wait_on_pull(repo, env, "reviewed", 7), wait_on_pull(repo, env, "chooser", 8)
    ignored = loopdsl(repo, "github-event", "loops/chooser.yaml", event=review("ada", "changes_requested", 8), **env)
    assert ignored.returncode == 0, ignored.stderr
    assert (f"run {custom} waits at checkpoint 'ask', whose choices (ship, hold) have no 'reject': the review "
            f"decides nothing; comment `/loopdsl decide {custom} CHOICE` instead") in ignored.stdout, ignored.stdout
    assert status(repo, custom) == "waiting"
    rejected = loopdsl(repo, "github-event", "loops/reviewed.yaml", event=review("ada", "changes_requested"), **env)
    assert f"run {plain}: recorded 'reject' by github:ada" in rejected.stdout, rejected.stdout + rejected.stderr
    assert status(repo, plain) == "failed"
    # The chooser loop's workflow also starts on #7's review: that run is not its own.
    other = loopdsl(repo, "github-event", "loops/chooser.yaml", event=review("ada", "approved", 7), **env)
    assert other.returncode == 0 and "no run of this loop waits on #7" in other.stdout, other.stdout
    assert fake.writes_to("POST", r"/reviews") == []
