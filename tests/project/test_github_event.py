"""`loopdsl github-event` and the runs branch, as the exported workflow's jobs run them:
`loopdsl` commands with GITHUB_EVENT_NAME/GITHUB_EVENT_PATH, real git with a bare origin.

The commands run in-process (tests/cli_in_process.py: the same exit codes and output) unless
a test asks for a real `python -m loopdsl` subprocess (`real=True`); the hostile-title test
runs its whole job as real processes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_in_process import cli_in_process
from git_repos import git, isolate_git, make_repo
from cli_forked import loopdsl_command

GREETER = """loopdsl: 1
name: greeter
unattended: true
inputs:
  title: {default: ""}
  number: {type: integer, default: 0}
  base: {default: main}
on:
  pull_request:
    types: [opened]
    inputs: {title: event.pull_request.title, number: event.pull_request.number, base: event.pull_request.base.ref}
  issues:
    inputs: {title: event.issue.title}
  ci_failure:
    workflow: CI
    branches: [main]
  issue_comment:
    command: /greet
    inputs: {title: event.comment.body, number: event.issue.number}
start: say
states:
  say:
    shell: printf '%s' {{ inputs.title }}
    next: done
  done:
    end: completed
    output: {said: "{{ say.stdout }}", number: "{{ inputs.number }}", base: "{{ inputs.base }}"}
"""
ASKER = """loopdsl: 1
name: asker
inputs:
  title: {default: ""}
on:
  issues: {inputs: {title: event.issue.title}}
schedule: {cron: "0 9 * * 1-5"}
start: ask
states:
  ask:
    checkpoint: {message: "Label the issue {{ inputs.title }}?"}
    transitions:
      - {to: done, when: "ask.decision == 'approve'"}
      - {to: refused}
  done: {end: completed, output: {title: "{{ inputs.title }}"}}
  refused: {end: failed}
"""
REPOSITORY = {"full_name": "octo/widgets", "name": "widgets", "owner": {"login": "octo"}}


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    isolate_git(tmp_path, monkeypatch)
    origin = tmp_path / "origin.git"
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(origin)], check=True)
    work = make_repo(tmp_path / "work", {"loops/greeter.yaml": GREETER, "loops/asker.yaml": ASKER})
    git(work, "remote", "add", "origin", str(origin))
    git(work, "push", "-q", "origin", "main")
    return work


def clone(tmp_path: Path, name: str) -> Path:
    """A fresh checkout, as each job of a workflow run starts with."""
    target = tmp_path / name
    git(tmp_path, "clone", "-q", str(tmp_path / "origin.git"), str(target))
    return target


def loopdsl(cwd: Path, *args: str, event: tuple[str, dict] | None = None, real: bool = False,
            **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("LOOPDSL_", "GITHUB_"))}
    full.update(env)
    if event is not None:
        payload = cwd.parent / f"event-{cwd.name}.json"
        payload.write_text(json.dumps(event[1]))
        full.update(GITHUB_EVENT_NAME=event[0], GITHUB_EVENT_PATH=str(payload))
    full["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])  # for gates that import loopdsl
    if not real:
        return cli_in_process(args, cwd, full, only_env=True)
    return subprocess.run([*loopdsl_command(), *args], cwd=cwd, env=full, capture_output=True,
                          text=True, timeout=120)


def runs(cwd: Path, *, real: bool = False) -> list[dict]:
    done = loopdsl(cwd, "runs", "--json", real=real)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def outputs(cwd: Path, run_id: str, *, real: bool = False) -> dict:
    done = loopdsl(cwd, "show", run_id, "--json", real=real)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["run"]["outputs"]


def pull_request(title: str, *, action: str = "opened", head_repo: str = "octo/widgets", base: str = "main") -> dict:
    return {"action": action, "number": 7, "repository": REPOSITORY, "sender": {"login": "ada"},
            "pull_request": {"number": 7, "title": title, "body": None, "base": {"ref": base},
                             "head": {"ref": "feature", "repo": {"full_name": head_repo}}}}


def test_a_hostile_title_is_data_all_the_way_into_the_run(repo: Path) -> None:
    title = "fix'; touch pwned; echo \"$(touch pwned2)\" `touch pwned3` ${IFS}"
    done = loopdsl(repo, "github-event", "loops/greeter.yaml", event=("pull_request", pull_request(title)), real=True)
    assert done.returncode == 0, done.stderr
    [run] = runs(repo, real=True)
    assert run["status"] == "completed"
    assert outputs(repo, run["run_id"], real=True) == {"said": title, "number": 7, "base": "main"}
    assert not list(repo.rglob("pwned*"))


@pytest.mark.parametrize("name, payload, reason", [
    ("pull_request", pull_request("x", head_repo="mallory/widgets"), "from a fork"),
    ("pull_request", pull_request("x", action="synchronize"), "action 'synchronize' is not one of opened"),
    ("workflow_run", {"action": "completed", "repository": REPOSITORY, "workflow_run": {
        "name": "CI", "conclusion": "success", "head_branch": "main", "head_repository": REPOSITORY}},
     "did not end in failure"),
    ("workflow_run", {"action": "completed", "repository": REPOSITORY, "workflow_run": {
        "name": "Docs", "conclusion": "failure", "head_branch": "main", "head_repository": REPOSITORY}},
     "'Docs' is not one of CI"),
    ("workflow_run", {"action": "completed", "repository": REPOSITORY, "workflow_run": {
        "name": "CI", "conclusion": "failure", "head_branch": "main", "head_repository": {"full_name": "mallory/w"}}},
     "fork's code"),
    ("workflow_run", {"action": "completed", "repository": REPOSITORY, "workflow_run": {
        "name": "CI", "conclusion": "failure", "head_branch": "wip", "head_repository": REPOSITORY}},
     "not one of `branches`"),
    ("issue_comment", {"action": "created", "repository": REPOSITORY, "issue": {"number": 3},
                       "comment": {"body": "/triage please", "user": {"login": "ada"}}}, "not a command for this loop"),
    ("push", {"repository": REPOSITORY}, "no `on:` trigger for push events"),
])
def test_events_that_are_not_for_the_loop_start_nothing(repo: Path, name: str, payload: dict, reason: str) -> None:
    done = loopdsl(repo, "github-event", "loops/greeter.yaml", event=(name, payload))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("::notice::greeter:") and reason in done.stdout, done.stdout
    assert not (repo / ".loopdsl").exists() or runs(repo) == []


def test_a_failed_ci_run_on_a_watched_branch_starts_the_loop(repo: Path) -> None:
    payload = {"action": "completed", "repository": REPOSITORY, "workflow_run": {
        "name": "CI", "conclusion": "failure", "head_branch": "main", "head_repository": REPOSITORY,
        "pull_requests": [{"number": 12}]}}
    done = loopdsl(repo, "github-event", "loops/greeter.yaml", event=("workflow_run", payload))
    assert done.returncode == 0, done.stderr
    assert [r["status"] for r in runs(repo)] == ["completed"]


def test_a_payload_that_makes_a_wrong_input_stops_with_exit_2(repo: Path) -> None:
    payload = pull_request("x")
    payload["pull_request"]["number"] = "seven"  # not what GitHub sends: the input's type still holds
    done = loopdsl(repo, "github-event", "loops/greeter.yaml", event=("pull_request", payload))
    assert done.returncode == 2
    assert "input 'number' must be an integer" in done.stderr and "Traceback" not in done.stderr
    broken = repo.parent / "broken.json"
    broken.write_text("{not json")
    done = loopdsl(repo, "github-event", "loops/greeter.yaml", GITHUB_EVENT_NAME="issues", GITHUB_EVENT_PATH=str(broken))
    assert done.returncode == 2 and "is not JSON" in done.stderr
    done = loopdsl(repo, "github-event", "loops/greeter.yaml")
    assert done.returncode == 2 and "GITHUB_EVENT_NAME and GITHUB_EVENT_PATH must be set" in done.stderr


def test_an_out_folder_that_cannot_be_one_is_refused_before_the_run(repo: Path) -> None:
    payload = {"action": "completed", "repository": REPOSITORY, "workflow_run": {
        "name": "CI", "conclusion": "failure", "head_branch": "main", "head_repository": REPOSITORY,
        "pull_requests": [{"number": 12}]}}
    for out in ("/dev/null", "loops/greeter.yaml/sub"):  # a device; a path under a file
        done = loopdsl(repo, "github-event", "loops/greeter.yaml", "--out", out, event=("workflow_run", payload))
        assert done.returncode == 2, (out, done.stderr)  # was an internal error, after the run had been recorded
        assert f"--out {out}: cannot be a folder to write into" in done.stderr, done.stderr
        packed = loopdsl(repo, "github-store", "pack", "loops/greeter.yaml", out)
        assert packed.returncode == 2 and f"OUT_DIR {out}: cannot be a folder" in packed.stderr, packed.stderr
    assert runs(repo) == []


def test_a_waiting_run_survives_between_workflow_runs_on_the_runs_branch(repo: Path, tmp_path: Path) -> None:
    """Workflow run 1 (an issue opened): the run job waits at the checkpoint, the apply job
    saves the store on loopdsl-runs. Workflow run 2 (a manual dispatch with run_id and
    decision), on other fresh checkouts: the store is restored and the run completes."""
    issue = {"action": "opened", "repository": REPOSITORY, "sender": {"login": "ada"},
             "issue": {"number": 5, "title": "Crash on start"}}
    job = clone(tmp_path, "run-1")
    assert "a fresh store" in loopdsl(job, "github-store", "restore", "loops/asker.yaml").stdout
    done = loopdsl(job, "github-event", "loops/asker.yaml", "--out", "loopdsl-out", event=("issues", issue))
    assert done.returncode == 0, done.stderr  # waiting is no failure of the job
    [run] = runs(job)
    assert run["status"] == "waiting"
    record = json.loads((job / "loopdsl-out" / "checkpoint.json").read_text())
    assert record == {"run_id": run["run_id"], "loop": "asker", "state": "ask", "message": "Label the issue Crash on start?",
                      "choices": ["approve", "reject"], "number": 5}
    packed = loopdsl(job, "github-store", "pack", "loops/asker.yaml", "loopdsl-out")
    assert packed.returncode == 0 and "packed 3 store file(s)" in packed.stdout, packed.stdout + packed.stderr

    apply_job = clone(tmp_path, "apply-1")
    (job / "loopdsl-out" / "checkpoint.json").unlink()  # posting it needs GitHub: tested with the fake server
    subprocess.run(["cp", "-r", str(job / "loopdsl-out"), str(apply_job / "loopdsl-out")], check=True)
    applied = loopdsl(apply_job, "github-apply", "loops/asker.yaml", "loopdsl-out")
    assert applied.returncode == 0, applied.stderr
    assert "saved the run store on loopdsl-runs" in applied.stdout
    tree = git(tmp_path / "origin.git", "ls-tree", "-r", "--name-only", "loopdsl-runs").split()
    assert "asker/cache.db" in tree and not any(name.startswith("asker/worktrees") for name in tree)
    again = loopdsl(apply_job, "github-apply", "loops/asker.yaml", "loopdsl-out")
    assert "the run store is unchanged" in again.stdout  # a re-run of the job adds no commit

    # The next workflow run starts on a fresh machine, in the same workspace path (GitHub's
    # /home/runner/work/REPO/REPO): a resumed run finds its loop file where it started.
    subprocess.run(["rm", "-rf", str(job)], check=True)
    job2 = clone(tmp_path, "run-1")
    assert "restored 3 file(s)" in loopdsl(job2, "github-store", "restore", "loops/asker.yaml").stdout
    dispatch = {"inputs": {"run_id": run["run_id"], "decision": "approve"}, "repository": REPOSITORY,
                "sender": {"login": "ada"}}
    done = loopdsl(job2, "github-event", "loops/asker.yaml", event=("workflow_dispatch", dispatch))
    assert done.returncode == 0, done.stderr
    assert f"run {run['run_id']}: recorded 'approve' by github:ada" in done.stdout
    assert [r["status"] for r in runs(job2)] == ["completed"]
    assert outputs(job2, run["run_id"]) == {"title": "Crash on start"}


def test_two_loops_saving_at_once_keep_each_others_folders(repo: Path, tmp_path: Path) -> None:
    """The second push is refused (the branch moved) and rebuilt on the new tip."""
    stores = {}
    for name in ("greeter", "asker"):
        job = clone(tmp_path, f"run-{name}")
        loop = f"loops/{name}.yaml"
        event = ("pull_request", pull_request("hi")) if name == "greeter" else \
            ("issues", {"action": "opened", "repository": REPOSITORY, "issue": {"number": 1, "title": "t"}})
        assert loopdsl(job, "github-event", loop, "--out", "out", event=event).returncode == 0
        assert loopdsl(job, "github-store", "pack", loop, "out").returncode == 0
        (job / "out" / "checkpoint.json").unlink(missing_ok=True)  # posting it is tested with the fake GitHub
        stores[name] = job
    first, second = clone(tmp_path, "apply-a"), clone(tmp_path, "apply-b")
    # Both apply jobs fetched the branch before either pushed: `second` holds a stale tip.
    for target in (first, second):
        subprocess.run(["cp", "-r", str(stores["greeter" if target is first else "asker"] / "out"), str(target / "out")],
                       check=True)
    assert loopdsl(first, "github-apply", "loops/greeter.yaml", "out").returncode == 0
    done = loopdsl(second, "github-apply", "loops/asker.yaml", "out")
    assert done.returncode == 0, done.stderr
    tree = git(tmp_path / "origin.git", "ls-tree", "-r", "--name-only", "loopdsl-runs").split()
    assert {"greeter/cache.db", "asker/cache.db"} <= set(tree)
    assert len(git(tmp_path / "origin.git", "rev-list", "loopdsl-runs").split()) == 2


def test_restore_writes_only_plain_files_inside_the_store(repo: Path, tmp_path: Path) -> None:
    """Anyone who can push could plant a symlink on the runs branch; restore skips it."""
    planter = clone(tmp_path, "planter")
    git(planter, "checkout", "-q", "--orphan", "loopdsl-runs")
    git(planter, "rm", "-rq", "--cached", ".")
    for entry in list(planter.iterdir()):
        if entry.name != ".git":
            subprocess.run(["rm", "-rf", str(entry)], check=True)
    (planter / "asker").mkdir()
    (planter / "asker" / "cache.db").write_text("not really a database")
    os.symlink("/etc/passwd", planter / "asker" / "loopdsl-store.json")
    git(planter, "add", "-A")
    git(planter, "-c", "user.name=m", "-c", "user.email=m@example.com", "commit", "-qm", "plant")
    git(planter, "push", "-q", "origin", "loopdsl-runs")
    job = clone(tmp_path, "victim")
    done = loopdsl(job, "github-store", "restore", "loops/asker.yaml")
    assert done.returncode == 0 and "restored 1 file(s)" in done.stdout, done.stdout + done.stderr
    assert not (job / ".loopdsl" / "loopdsl-store.json").exists()


def test_a_checkpoint_is_posted_once_and_decided_only_by_a_writer(repo: Path, tmp_path: Path) -> None:
    """Against the loopback fake GitHub: the apply job comments the checkpoint on the issue
    (once, its text fenced), a reader's `/loopdsl approve` is refused, a writer's decides."""
    pytest.importorskip("githubkit")
    from github_fake import FakeGitHub

    with FakeGitHub() as fake:
        fake.state.issues[5] = {"number": 5, "title": "t", "body": "", "state": "open", "html_url": ""}
        fake.state.permissions.update({"ada": "write", "mallory": "read"})
        github = {"GITHUB_API_URL": fake.url, "GITHUB_REPOSITORY": fake.repository, "GITHUB_TOKEN": fake.token}
        title = "@octocat closes #1 ``` [x](http://evil.example)"
        issue = {"action": "opened", "repository": REPOSITORY, "issue": {"number": 5, "title": title}}
        done = loopdsl(repo, "github-event", "loops/asker.yaml", "--out", "out", event=("issues", issue), **github)
        assert done.returncode == 0, done.stderr
        [run] = runs(repo)
        for _ in range(2):  # a re-run of the apply job posts nothing new
            applied = loopdsl(repo, "github-apply", "loops/asker.yaml", "out", event=("issues", issue), **github)
            assert applied.returncode == 0, applied.stderr
        [comment] = [w.body["body"] for w in fake.writes_to("POST", r"/issues/5/comments")]
        assert f"`/loopdsl approve {run['run_id']}`" in comment
        fence = "````"  # longer than the ``` in the title, so the title cannot end the block
        assert f"{fence}text\nLabel the issue {title}?\n{fence}" in comment

        def comment_event(login: str) -> tuple[str, dict]:
            return ("issue_comment", {"action": "created", "repository": REPOSITORY, "issue": {"number": 5},
                                      "comment": {"body": f"/loopdsl approve {run['run_id']}\nlooks right",
                                                  "user": {"login": login}}})

        refused = loopdsl(repo, "github-event", "loops/asker.yaml", event=comment_event("mallory"), **github)
        assert refused.returncode == 2 and "mallory may not start or decide runs" in refused.stderr, refused.stderr
        assert [r["status"] for r in runs(repo)] == ["waiting"]
        nobody = loopdsl(repo, "github-event", "loops/asker.yaml", event=comment_event("ghost"), **github)
        assert nobody.returncode == 2 and "'none'" in nobody.stderr  # not a collaborator at all (404)
        decided = loopdsl(repo, "github-event", "loops/asker.yaml", event=comment_event("ada"), **github)
        assert decided.returncode == 0, decided.stderr
        assert f"run {run['run_id']}: recorded 'approve' by github:ada" in decided.stdout
        shown = json.loads(loopdsl(repo, "show", run["run_id"], "--json").stdout)["run"]
        assert shown["status"] == "completed" and shown["results"]["ask"]["comment"] == "looks right", shown["results"]
        assert [w.path for w in fake.writes] == [fake.writes_to("POST", r"/issues/5/comments")[0].path]


def test_a_comment_command_starts_a_run_only_for_a_writer(repo: Path) -> None:
    pytest.importorskip("githubkit")
    from github_fake import FakeGitHub

    with FakeGitHub() as fake:
        fake.state.permissions.update({"ada": "admin", "mallory": "read"})
        github = {"GITHUB_API_URL": fake.url, "GITHUB_REPOSITORY": fake.repository, "GITHUB_TOKEN": fake.token}

        def comment(login: str, body: str) -> tuple[str, dict]:
            return ("issue_comment", {"action": "created", "repository": REPOSITORY, "issue": {"number": 9},
                                      "comment": {"body": body, "user": {"login": login}}})

        refused = loopdsl(repo, "github-event", "loops/greeter.yaml", event=comment("mallory", "/greet me"), **github)
        assert refused.returncode == 2 and "mallory may not start or decide runs" in refused.stderr, refused.stderr
        assert not (repo / ".loopdsl").exists() or runs(repo) == []
        done = loopdsl(repo, "github-event", "loops/greeter.yaml", event=comment("ada", "/greet me"), **github)
        assert done.returncode == 0, done.stderr
        [run] = runs(repo)
        assert outputs(repo, run["run_id"]) == {"said": "/greet me", "number": 9, "base": "main"}
        # A decision for a run this loop's store does not hold is another loop's: nothing to do.
        other = loopdsl(repo, "github-event", "loops/greeter.yaml", event=comment("ada", "/loopdsl approve zzzz9999"),
                        **github)
        assert other.returncode == 0 and "no run zzzz9999 in this loop's store" in other.stdout, other.stderr
        half = loopdsl(repo, "github-event", "loops/greeter.yaml", event=comment("ada", "/loopdsl decide abc"), **github)
        assert half.returncode == 2 and "needs a run and a choice" in half.stderr
        assert fake.writes == []  # the run job writes nothing to GitHub


def test_a_push_failure_hides_the_token_before_it_cuts_the_message() -> None:
    """git's message was cut to 400 characters, then the token replaced: a token across the
    cut kept its first part in the error (printed, and in the job's log)."""
    from loopdsl.project.runs_branch import push_failure

    token = "ghs_" + "T0k3n" * 8
    message = push_failure("push", "remote: " + "x" * 380 + token + " denied", token).message
    assert "ghs_" not in message and "T0k3n" not in message and "[REDACT" in message
