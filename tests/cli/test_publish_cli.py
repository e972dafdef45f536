"""`publish:` end to end: the `loopdsl` CLI, real git (a local bare repository is `origin`), and
real HTTP to the loopback fake GitHub (tests/github_fake.py). Commands whose answer is the
point run in-process (tests/cli_in_process.py); the run killed while publishing and the run
without the `github` extra are real subprocesses."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cli_in_process import cli_in_process

from github_fake import FakeGitHub
from patterns.conftest import LOOPS_DIR, SCRIPTS_DIR, _clean_env, commit_file, git, init_repo
from patterns.test_ci_sweeper import CALC_BUGGY, TESTS

pytest.importorskip("githubkit")

ROOT = Path(__file__).resolve().parents[2]
ZWJ = "\u200d"
SECRET = "s3cr3t-value-9f8e7d6c"

SIMPLE = """\
loopdsl: 1
name: simple-publish
inputs: {note: {type: string, default: all good}}
secrets: [GITHUB_TOKEN, API_KEY]
workspace: {worktree: true}
start: edit
states:
  edit:
    shell: "date +%s%N > fix.txt && echo {{ inputs.note }}"
    next: done
  done: {end: completed}
publish:
  pull_request:
    title: "Fix: {{ inputs.note }}"
    body: "Fixes #1 by the loop: {{ inputs.note }} ({{ edit.stdout | trim }})"
    branch: BRANCH
  comment: {on: pull_request, body: "Opened by run {{ run.id }}"}
"""


@pytest.fixture
def fake():
    with FakeGitHub() as server:
        yield server


def project(tmp_path: Path, loop_text: str | None = None) -> Path:
    repo = init_repo(tmp_path / "repo")
    git(tmp_path, "init", "-q", "--bare", str(tmp_path / "remote.git"))
    git(repo, "remote", "add", "origin", str(tmp_path / "remote.git"))
    git(repo, "push", "-q", "origin", "main")
    if loop_text is not None:
        commit_file(repo, "loop.yaml", loop_text, "the loop")
    return repo


def environment(fake: FakeGitHub, tmp_path: Path, **extra: str) -> dict[str, str]:
    env = _clean_env({"GITHUB_API_URL": fake.url, "GITHUB_REPOSITORY": fake.repository,
                      "GITHUB_TOKEN": fake.token, "API_KEY": SECRET, "HOME": str(tmp_path),
                      "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1", **extra})
    return {k: v for k, v in env.items() if k not in ("LOOPDSL_STORE", "OPENAI_API_KEY", "ANTHROPIC_API_KEY")}


def cli(repo: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return cli_in_process(args, repo, env, only_env=True)


def events(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def remote_branch(tmp_path: Path, branch: str) -> str:
    return git(tmp_path / "remote.git", "rev-parse", f"refs/heads/{branch}").strip()


def test_ci_sweeper_opens_exactly_one_pull_request_of_its_pushed_branch(fake: FakeGitHub, tmp_path: Path) -> None:
    repo = project(tmp_path)
    commit_file(repo, "calc.py", CALC_BUGGY, "add calc")
    commit_file(repo, "test_calc.py", TESTS, "test calc")
    # The models' words try to ping someone and close issues they were never asked about.
    replies = (SCRIPTS_DIR / "ci-sweeper.replies.yaml").read_text()
    replies = replies.replace("it now uses true division (/).", "it now uses true division (/). cc @octocat, closes #1")
    replies = replies.replace("tests untouched.", "tests untouched. Fixes octo/widgets#2")
    (tmp_path / "replies.yaml").write_text(replies)

    done = cli(repo, environment(fake, tmp_path), "run", str(LOOPS_DIR / "ci-sweeper.yaml"), "--json",
               "--script", str(tmp_path / "replies.yaml"), "-i", "test_command=python3 -m unittest -q")

    assert done.returncode == 0, done.stderr
    run_id = events(done.stdout)[0]["run_id"]
    [opened] = fake.writes_to("POST", r"/pulls$")
    assert opened.body["head"] == f"loopdsl/{run_id}" and opened.body["base"] == "main"
    assert remote_branch(tmp_path, f"loopdsl/{run_id}") == git(repo, "rev-parse", f"loopdsl/{run_id}").strip()
    assert git(repo, "diff", "--name-only", "main", f"loopdsl/{run_id}").split() == ["calc.py"]
    body = opened.body["body"]
    assert f"@{ZWJ}octocat" in body and "@octocat" not in body
    assert f"c{ZWJ}loses #1" in body and f"F{ZWJ}ixes octo/widgets#2" in body
    assert "closes #1" not in body.lower() and "fixes octo" not in body.lower()
    assert "**What changed:**" in body  # the template's own text is kept as written
    published = [e for e in events(done.stdout) if e["type"] == "published"]
    assert [(e["kind"], e["number"], e["action"]) for e in published] == [("pull_request", 1, "created")]
    shown = cli(repo, environment(fake, tmp_path), "show", run_id)
    assert "published pull_request #1 (created) https://github.example/octo/widgets/pull/1" in shown.stdout


def test_a_run_that_ends_with_nothing_to_fix_publishes_nothing(fake: FakeGitHub, tmp_path: Path) -> None:
    repo = project(tmp_path)
    commit_file(repo, "test_ok.py", "import unittest\n\nclass T(unittest.TestCase):\n    def test_ok(self):\n"
                "        pass\n", "passing test")
    done = cli(repo, environment(fake, tmp_path), "run", str(LOOPS_DIR / "ci-sweeper.yaml"),
               "--script", str(SCRIPTS_DIR / "ci-sweeper.replies.yaml"), "-i", "test_command=python3 -m unittest -q")
    assert done.returncode == 0, done.stderr
    assert fake.requests == []  # ended at `green`, not in `publish.ends`


@pytest.mark.parametrize("held", [("POST", r"/pulls$"), ("POST", r"/comments$")], ids=["pull", "comment"])
def test_killed_while_publishing_then_resumed_writes_each_thing_once(fake: FakeGitHub, tmp_path: Path,
                                                                     held: tuple[str, str]) -> None:
    repo = project(tmp_path, SIMPLE.replace("BRANCH", "run"))
    env = environment(fake, tmp_path)
    fake.hold_after(*held)  # the write happens on "GitHub"; its answer never reaches the run
    proc = subprocess.Popen([sys.executable, "-m", "loopdsl", "run", "loop.yaml", "--json"], cwd=repo, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert fake.held.wait(120), "the run never reached the held write"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=30)
        fake.release()
    assert proc.returncode == -signal.SIGKILL
    run_id = events(out)[0]["run_id"]

    resumed = cli(repo, env, "resume", run_id, "--json")

    assert resumed.returncode == 0, resumed.stderr
    assert len(fake.writes_to("POST", r"/pulls$")) == 1
    assert len(fake.writes_to("POST", r"/comments$")) == 1
    assert fake.state.comments[0]["issue_number"] == 1
    actions = {e["kind"]: e["action"] for e in events(resumed.stdout) if e["type"] == "published"}
    assert actions == ({"pull_request": "updated", "comment": "created"} if "pulls" in held[1]
                       else {"comment": "found"})
    shown = json.loads(cli(repo, env, "show", run_id, "--json").stdout)
    steps = [(e["type"], e.get("kind")) for e in shown["events"] if e["type"].startswith("publish")]
    assert steps == [("publish_planned", None), ("publish_intent", "pull_request"), ("published", "pull_request"),
                     ("publish_intent", "comment"), ("published", "comment")]  # each intent once, before the kill
    assert shown["run"]["status"] == "completed" and shown["run"]["meta"]["publish"]["status"] == "done"
    again = cli(repo, env, "resume", run_id)
    assert again.returncode == 2 and "already ended with status completed" in again.stderr


def test_a_fixed_branch_updates_its_open_pull_request(fake: FakeGitHub, tmp_path: Path) -> None:
    repo = project(tmp_path, SIMPLE.replace("BRANCH", "loopdsl/fixes"))
    env = environment(fake, tmp_path)
    first = cli(repo, env, "run", "loop.yaml", "-i", "note=first")
    second = cli(repo, env, "run", "loop.yaml", "-i", "note=second", "--json")

    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert len(fake.writes_to("POST", r"/pulls$")) == 1
    [updated] = fake.writes_to("PATCH", r"/pulls/1$")
    assert updated.body["title"] == "Fix: second" and fake.state.pulls[1]["title"] == "Fix: second"
    run_id = events(second.stdout)[0]["run_id"]
    assert remote_branch(tmp_path, "loopdsl/fixes") == git(repo, "rev-parse", f"loopdsl/{run_id}").strip()
    assert len(fake.writes_to("POST", r"/issues/1/comments$")) == 2  # one per run, on the same PR


def test_a_secret_in_a_body_writes_nothing(fake: FakeGitHub, tmp_path: Path) -> None:
    repo = project(tmp_path, SIMPLE.replace("BRANCH", "run"))
    done = cli(repo, environment(fake, tmp_path), "run", "loop.yaml", "-i", f"note=key {SECRET}")

    assert done.returncode == 6, done.stderr
    assert "nothing was written to GitHub" in done.stderr
    assert "pull_request.title holds the value of a declared secret on line 1" in done.stderr
    assert "pull_request.body holds the value of a declared secret" in done.stderr
    assert "Traceback" not in done.stderr and SECRET not in done.stdout + done.stderr
    assert fake.requests == []
    assert git(tmp_path / "remote.git", "for-each-ref", "--format=%(refname)").split() == ["refs/heads/main"]


def test_no_publish_plans_and_resume_publishes(fake: FakeGitHub, tmp_path: Path) -> None:
    repo = project(tmp_path, SIMPLE.replace("BRANCH", "run"))
    env = environment(fake, tmp_path)
    planned = cli(repo, env, "run", "loop.yaml", "--no-publish", "--json", "-i", "note=@dana")
    assert planned.returncode == 0, planned.stderr
    assert fake.requests == []
    run_id = events(planned.stdout)[0]["run_id"]
    assert "publish not finished" in cli(repo, env, "show", run_id).stdout
    assert f"completed, publish pending (resume {run_id})" in cli(repo, env, "runs").stdout
    published = cli(repo, env, "resume", run_id)
    assert published.returncode == 0, published.stderr
    assert len(fake.writes_to("POST", r"/pulls$")) == 1 and fake.state.pulls[1]["title"] == f"Fix: @{ZWJ}dana"


def test_missing_settings_and_library_stop_the_run_before_it_starts(fake: FakeGitHub, tmp_path: Path) -> None:
    repo = project(tmp_path, SIMPLE.replace("BRANCH", "run"))
    env = environment(fake, tmp_path)
    del env["GITHUB_REPOSITORY"]
    done = cli(repo, env, "run", "loop.yaml")
    assert done.returncode == 2 and "GITHUB_REPOSITORY is not set" in done.stderr and "Traceback" not in done.stderr
    assert "`loopdsl run --no-publish` keeps the run's result local" in done.stderr
    env = environment(fake, tmp_path)
    blocked = subprocess.run([sys.executable, "-c", "import sys; sys.modules['githubkit'] = None; "
                              "sys.argv[0] = 'loopdsl'; from loopdsl.cli import main; main()", "run", "loop.yaml"],
                             cwd=repo, env=env, capture_output=True, text=True, timeout=120)
    assert blocked.returncode == 2, blocked.stderr
    assert "needs the `github` extra" in blocked.stderr and "pip install 'loopdsl[github]'" in blocked.stderr
    assert not (repo / ".loopdsl").exists() or "edit" not in cli(repo, env, "runs").stdout
    assert fake.requests == []


LATER = """\
loopdsl: 1
name: later-job
secrets: [GITHUB_TOKEN]
models: {writer: {model: openai/gpt-4o-mini, max_tokens: 100}}
workspace: {worktree: true}
start: write
states:
  write:
    llm: {model: writer, prompt: "Write a note."}
    next: save
  save:
    shell: "printf '%s' {{ write.text }} > note.txt"
    next: done
  done: {end: completed}
publish:
  pull_request: {title: "A note", body: "{{ write.text }}"}
"""


def test_a_later_job_publishes_from_a_fresh_checkout_and_the_stored_plan(fake: FakeGitHub, tmp_path: Path) -> None:
    """The export's shape: the run job (no write token) plans; a later job, with a fresh
    checkout at the same path, the run store and a bundle of the run's branch, publishes,
    with neither the models' keys nor the reply script the run used."""
    repo = project(tmp_path, LATER)
    git(repo, "push", "-q", "origin", "main")
    (tmp_path / "replies.yaml").write_text("write:\n  - text: 'hello @dana'\n")
    env = environment(fake, tmp_path)
    planned = cli(repo, {k: v for k, v in env.items() if k != "GITHUB_TOKEN"}, "run", "loop.yaml",
                  "--no-publish", "--json", "--script", str(tmp_path / "replies.yaml"))
    assert planned.returncode == 0, planned.stderr
    run_id = events(planned.stdout)[0]["run_id"]
    git(repo, "bundle", "create", str(tmp_path / "run.bundle"), f"loopdsl/{run_id}")
    shutil.copytree(repo / ".loopdsl", tmp_path / "store")
    shutil.rmtree(repo)  # the next job starts from a fresh checkout at the same path
    (tmp_path / "replies.yaml").unlink()
    git(tmp_path, "clone", "-q", str(tmp_path / "remote.git"), str(repo))
    git(repo, "fetch", "-q", str(tmp_path / "run.bundle"), "refs/heads/loopdsl/*:refs/heads/loopdsl/*")

    published = cli(repo, env, "resume", run_id, "--store", str(tmp_path / "store"))

    assert published.returncode == 0, published.stderr
    [opened] = fake.writes_to("POST", r"/pulls$")
    assert opened.body["head"] == f"loopdsl/{run_id}" and opened.body["body"].startswith(f"hello @{ZWJ}dana")
    assert remote_branch(tmp_path, f"loopdsl/{run_id}") == git(repo, "rev-parse", f"loopdsl/{run_id}").strip()
    assert git(repo, "show", f"loopdsl/{run_id}:note.txt") == "hello @dana"
