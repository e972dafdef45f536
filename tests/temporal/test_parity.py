"""Parity: the bundled pattern loops and the deterministic example give the same path,
status, outputs and spend on the local backend and on Temporal.

Each case builds two identical scratch repositories: one runs the loop in-process on the
local backend, the other is served by a `loopdsl worker` and the run is started with
`loopdsl run --temporal`. What differs by nature (run ids, the two folders) is replaced
by placeholders before comparing.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Callable

import pytest

import loopdsl
from tests.patterns import conftest as patterns
from tests.patterns import test_changelog_drafter as changelog
from tests.patterns import test_ci_sweeper as ci
from tests.patterns import test_daily_triage as triage
from tests.patterns import test_dependency_sweeper as deps
from tests.patterns import test_issue_triage as issues
from tests.patterns import test_post_merge_cleanup as cleanup
from tests.patterns import test_pr_babysitter as babysitter

from .conftest import ROOT, Workers, loopdsl as cli
from .replay import replay

pytestmark = pytest.mark.slow
Setup = Callable[[Path, Path], tuple[Path, dict[str, Any]]]  # (tmp, side) -> (repo, inputs)


def _example(tmp: Path, side: Path) -> tuple[Path, dict[str, Any]]:
    repo = side / "example"
    shutil.copytree(ROOT / "examples" / "deterministic-multistep", repo)
    return repo, {}


def _triage(tmp: Path, side: Path) -> tuple[Path, dict[str, Any]]:
    repo = patterns.init_repo(side / "repo")
    triage.build_triage_repo(repo)
    return repo, {"since": triage.SINCE, "issues_file": str(triage.write_issues(side / "issues.json"))}


def _changelog(tmp: Path, side: Path) -> tuple[Path, dict[str, Any]]:
    repo = patterns.init_repo(side / "repo")
    changelog.build_release_repo(repo)
    return repo, {"version": "v0.2.0"}


def _deps(tmp: Path, side: Path) -> tuple[Path, dict[str, Any]]:
    repo = patterns.init_repo(side / "repo")
    deps.pinned_project(repo)
    (repo / "outdated.json").write_text(json.dumps(deps.OUTDATED))
    return repo, {"outdated_file": "outdated.json", "test_command": deps.TEST_COMMAND}


def _issues(tmp: Path, side: Path) -> tuple[Path, dict[str, Any]]:
    repo = patterns.init_repo(side / "repo")
    (side / "issues.json").write_text(json.dumps(issues.ISSUES))
    return repo, {"issues_file": str(side / "issues.json"), "owners": issues.OWNERS}


def _cleanup(tmp: Path, side: Path) -> tuple[Path, dict[str, Any]]:
    return cleanup.build_cleanup_repo(side), {}


def _babysitter(tmp: Path, side: Path) -> tuple[Path, dict[str, Any]]:
    repo = patterns.init_repo(side / "repo")
    babysitter.build_project(repo)
    return repo, {"source": "git", "test_command": babysitter.TEST_COMMAND}


def _sweeper(tmp: Path, side: Path) -> tuple[Path, dict[str, Any]]:
    repo = patterns.init_repo(side / "repo")
    ci.buggy_project(repo)
    return repo, {"test_command": ci.TEST_COMMAND}


# An agent edits files in the run's worktree: its result's `changed_files` and `diff_stat`
# (the workspace git port) are outputs, so both backends must report the same edits. The
# guarded variant's tool moves the repository's git setup: the run fails on both.
AGENT_LOOP = """\
loopdsl: 1
name: agent-edits
workspace: {worktree: true}
models:
  m: {model: openai/gpt-4o-mini, max_tokens: 200, price: {input_per_mtok: 1, output_per_mtok: 2}}
tools:
  tweak_git: {description: Adjust git., shell: "git config --local loopdsl.touched yes", idempotent: true}
start: fix
states:
  fix:
    agent: {model: m, prompt: Improve the project., tools: [read_file, write_file, edit_file, tweak_git], max_turns: 4}
    next: done
  done: {end: completed, output: {files: "{{ fix.changed_files | tojson }}", stat: "{{ fix.diff_stat }}"}}
"""
AGENT_REPLIES = """\
fix:
  - tool_calls:
      - {name: write_file, args: {path: notes/new.txt, content: "a new note\\n"}}
      - {name: edit_file, args: {path: README.md, old: "# scratch", new: "# scratch, improved"}}
    usage: {prompt_tokens: 300, completion_tokens: 40}
  - text: Added a note and improved the README.
    usage: {prompt_tokens: 400, completion_tokens: 20}
"""


def _agent(tmp: Path, side: Path, *, guarded: bool = False) -> tuple[Path, dict[str, Any]]:
    repo = patterns.init_repo(side / "repo")
    replies = AGENT_REPLIES
    if guarded:
        replies = replies.replace("- {name: edit_file", "- {name: tweak_git, args: {}}\n      - {name: edit_file")
    patterns.commit_file(repo, "loop.yaml", AGENT_LOOP, "the loop")
    patterns.commit_file(repo, "replies.yaml", replies, "its replies")
    return repo, {}


def _pattern(name: str, repo: Path) -> tuple[Path, Path]:
    """The pattern's loop and reply script, copied into `repo` (a worker runs only the loops of
    the repository it serves) in a folder git ignores, so the loop sees the repository as it was."""
    kit = repo / ".patterns"
    if not kit.exists():
        shutil.copytree(patterns.LOOPS_DIR, kit / "loops", ignore=shutil.ignore_patterns("*.test.yaml"))
        shutil.copytree(ROOT / "skills", kit / "skills")
        (repo / ".git" / "info").mkdir(exist_ok=True)
        with (repo / ".git" / "info" / "exclude").open("a") as exclude:
            exclude.write("/.patterns/\n")
    return kit / "loops" / f"{name}.yaml", kit / "loops" / "scripts" / f"{name}.replies.yaml"


CASES: dict[str, Setup] = {
    "deterministic-example": _example, "daily-triage": _triage, "changelog-drafter": _changelog,
    "dependency-sweeper": _deps, "issue-triage": _issues, "post-merge-cleanup": _cleanup,
    "pr-babysitter": _babysitter, "ci-sweeper": _sweeper,
    "agent-worktree": _agent, "agent-git-guard": lambda tmp, side: _agent(tmp, side, guarded=True),
}


def _loop_files(case: str, repo: Path) -> tuple[Path, Path]:
    if case in ("deterministic-example", "agent-worktree", "agent-git-guard"):
        return repo / "loop.yaml", repo / "replies.yaml"
    return _pattern(case, repo)


def _normal(value: Any, swaps: dict[str, str]) -> Any:
    text = json.dumps(value, sort_keys=True)
    for old, new in sorted(swaps.items(), key=lambda kv: -len(kv[0])):
        text = text.replace(old, new)
    return json.loads(text)


@pytest.mark.parametrize("case", list(CASES))
def test_both_backends_take_the_same_path_with_the_same_spend(case: str, tmp_path: Path, workers: Workers) -> None:
    setup = CASES[case]
    local_repo, local_inputs = setup(tmp_path, tmp_path / "local")
    remote_repo, remote_inputs = setup(tmp_path, tmp_path / "tmprl")  # as long as "local": paths reach prompts
    loop, script = _loop_files(case, local_repo)
    # `publish:` is planned on both sides and written on neither (test_publish.py writes).
    local = loopdsl.run(loop, local_inputs, script=script, store=tmp_path / "store", workdir=local_repo,
                        publish=False)

    remote_loop, remote_script = _loop_files(case, remote_repo)
    workers.start(remote_repo, models=False)  # scripted runs
    args = ["run", str(remote_loop), "--script", str(remote_script), "--temporal", workers.address,
            "--task-queue", workers.queue, "--json", "--quiet", "--no-publish"]
    for key, value in remote_inputs.items():
        args += ["--input", f"{key}={json.dumps(value) if not isinstance(value, str) else value}"]
    out = cli(*args, cwd=remote_repo)
    assert out.returncode in (0, 1, 4), out.stderr
    summary = json.loads(out.stdout.splitlines()[-1])

    swaps = {local.run_id: "RUN", summary["run_id"]: "RUN", str(tmp_path / "local"): "SIDE",
             str(tmp_path / "tmprl"): "SIDE"}
    assert summary["status"] == local.status, (out.stdout[-3000:].splitlines()[-6:], local.state.error)
    assert summary["path"] == local.path
    assert _normal(summary["outputs"], swaps) == _normal(local.outputs, swaps)
    if local.state.meta.get("publish"):  # the same writes planned, word for word
        shown = json.loads(cli("show", summary["run_id"], "--temporal", workers.address, "--json", cwd=remote_repo).stdout)
        planned = shown["run"]["meta"]["publish"]
        assert planned["status"] == local.state.meta["publish"]["status"]
        def texts(items: list[dict[str, Any]]) -> Any:  # the commits differ by their time stamps
            return _normal([{k: v for k, v in item.items() if k != "commit"} for item in items], swaps)

        assert texts(planned["items"]) == texts(local.state.meta["publish"]["items"])
    if case == "agent-worktree":  # the edits were seen, not two empty results
        assert json.loads(local.outputs["files"]) == ["README.md", "notes/new.txt"], local.outputs
    if case == "agent-git-guard":
        assert "changed the repository's git setup" in local.state.error["message"]
    for key in ("tokens", "cost_usd", "steps"):
        assert summary["spent"][key] == local.state.ledger[key], key

    # Determinism: the recorded history replays against the current code, the engine sandboxed.
    replay(workers.address, summary["run_id"], remote_repo)
