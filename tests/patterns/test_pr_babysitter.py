"""pr-babysitter end to end: real branches, real test runs, a scripted review agent whose read-only
tools really read each branch, scripted model, reports on the run branch."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import loopdsl
from loopdsl.adapters.litellm import ScriptedProvider

from .conftest import (
    LOOPS_DIR,
    SCRIPTS_DIR,
    branches,
    checkout_snapshot,
    commit_file,
    git,
    run_loop,
)
from cli_forked import loopdsl_command

LOOP = LOOPS_DIR / "pr-babysitter.yaml"
REPLIES = SCRIPTS_DIR / "pr-babysitter.replies.yaml"
# unittest starts in milliseconds; pytest would do the same job, only slower.
TEST_COMMAND = "python3 -m unittest -q"

CALC_OK = "def add(a, b):\n    return a + b\n"
CALC_BROKEN = "def add(a, b):\n    return a - b\n"
TESTS = (
    "import unittest\n\nfrom calc import add\n\n\n"
    "class CalcTest(unittest.TestCase):\n"
    "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n"
)


def build_project(repo: Path) -> dict[str, str]:
    """main passes; feature/docs passes; fix/subtract fails; already-merged has nothing new.

    Leaves the user on main with an uncommitted edit and an untracked file, which the
    run must not touch. Returns the branch tips.
    """
    commit_file(repo, "calc.py", CALC_OK, "add calc.add")
    commit_file(repo, "test_calc.py", TESTS, "test calc.add")
    git(repo, "branch", "already-merged")
    git(repo, "checkout", "-q", "-b", "feature/docs")
    commit_file(repo, "docs/usage.md", "Call calc.add(a, b).\n", "document calc.add")
    git(repo, "checkout", "-q", "-b", "fix/subtract", "main")
    commit_file(repo, "calc.py", CALC_BROKEN, "make add subtract")
    git(repo, "checkout", "-q", "main")
    (repo / "README.md").write_text("# scratch\n\nwork in progress\n")
    (repo / "notes.txt").write_text("not committed\n")
    return {name: git(repo, "rev-parse", name).strip() for name in ("main", "feature/docs", "fix/subtract")}


def scripted_tokens(state: str) -> int:
    from ruamel.yaml import YAML

    replies = YAML(typ="safe").load(REPLIES.read_text())
    return sum(r["usage"]["prompt_tokens"] + r["usage"]["completion_tokens"] for r in replies[state])


def worktree_count(repo: Path) -> int:
    return git(repo, "worktree", "list", "--porcelain").count("\nworktree ") + 1


def test_local_branches_get_reports_with_verdicts(scratch_repo: Path, tmp_path: Path) -> None:
    tips = build_project(scratch_repo)
    before = checkout_snapshot(scratch_repo)
    branches_before = branches(scratch_repo)

    result = run_loop("pr-babysitter", scratch_repo, tmp_path / "store",
                      {"source": "git", "test_command": TEST_COMMAND})

    assert result.status == "completed", result.state.error
    assert result.path == ["list_prs", "prs", "check_each", "tally", "tidy", "write_index", "done"]
    assert json.loads(result.outputs["verdicts"]) == {"feature/docs": "pass", "fix/subtract": "fail"}
    assert (result.outputs["checked"], result.outputs["failing"]) == (2, 1)
    # The summariser was asked once, for the failing branch only; the reviewer on both.
    assert result.tokens == scripted_tokens("summarise") + scripted_tokens("review")
    review_calls = [(e["run_id"].rsplit("/", 1)[-1], e["event"]["name"], e["event"]["ok"]) for e in result.events
                    if e["type"] == "child" and e["event"]["type"] == "tool_call"]
    assert review_calls == [("0", "branch_diff", True), ("1", "branch_diff", True), ("1", "branch_grep", True),
                            ("1", "branch_file", True)]

    run_branch = f"loopdsl/{result.run_id}"
    assert branches(scratch_repo) == branches_before | {run_branch}
    assert git(scratch_repo, "rev-list", "--count", f"main..{run_branch}").strip() == "1"
    assert sorted(git(scratch_repo, "diff", "--name-only", f"main...{run_branch}").split()) == [
        "reports/README.md", "reports/feature/docs.md", "reports/fix/subtract.md"]

    failing = git(scratch_repo, "show", f"{run_branch}:reports/fix/subtract.md")
    assert failing.startswith("# fix/subtract: tests fail")
    assert "Verdict: **fail**" in failing
    assert "add(2, 3) returns -1 instead of 5" in failing          # the model's summary
    assert "`test_add (test_calc.CalcTest.test_add)`" in failing
    assert "AssertionError: -1 != 5" in failing                     # the real test output
    assert tips["fix/subtract"][:7] in failing
    passing = git(scratch_repo, "show", f"{run_branch}:reports/feature/docs.md")
    assert "Verdict: **pass**" in passing and tips["feature/docs"][:7] in passing
    index = git(scratch_repo, "show", f"{run_branch}:reports/README.md")
    assert "| feature/docs |  | pass | looks good | [feature/docs.md](feature/docs.md) |" in index
    assert "| fix/subtract |  | fail | concerns | [fix/subtract.md](fix/subtract.md) |" in index
    assert "Verdict: **concerns**" in failing and "- `calc.py:2`: add() now subtracts" in failing
    assert "Verdict: **looks good**" in passing
    assert "already-merged" not in index
    assert "base `main`" in index                                   # found, not given

    # The branches checked were only read, their worktrees are gone, the checkout is as it was.
    assert {name: git(scratch_repo, "rev-parse", name).strip() for name in tips} == tips
    assert worktree_count(scratch_repo) == 1
    assert checkout_snapshot(scratch_repo) == before


def test_a_base_that_does_not_exist_is_a_clear_failure(scratch_repo: Path, tmp_path: Path) -> None:
    build_project(scratch_repo)
    result = run_loop("pr-babysitter", scratch_repo, tmp_path / "store",
                      {"source": "git", "base": "trunk", "test_command": TEST_COMMAND})
    assert result.status == "failed"
    assert result.path == ["list_prs"]
    assert "base branch 'trunk' does not exist" in result.state.error["message"]
    assert "--input base=" in result.state.error["message"]


def test_nothing_unmerged_means_nothing_to_check(scratch_repo: Path, tmp_path: Path) -> None:
    commit_file(scratch_repo, "calc.py", CALC_OK, "add calc.add")
    git(scratch_repo, "branch", "already-merged")
    result = run_loop("pr-babysitter", scratch_repo, tmp_path / "store", {"source": "git"})
    assert result.status == "completed"
    assert result.path == ["list_prs", "prs", "nothing_open"]
    assert result.outputs["checked"] == "0" and result.tokens == 0
    assert git(scratch_repo, "rev-parse", f"loopdsl/{result.run_id}") == git(scratch_repo, "rev-parse", "main")


FAKE_GH = """#!/bin/sh
# A stand-in for the GitHub CLI: logged in, two open pull requests, comments recorded.
echo "$*" >> "$FAKE_GH_DIR/calls.log"
case "$1 $2" in
  "auth status") exit 0 ;;
  "pr list") printf '7 feature/docs\\n8 fix/subtract\\n' ;;
  "pr comment") cp "$4" "$FAKE_GH_DIR/comment-$6.md" ;;  # pr comment --body-file FILE -- NUMBER
  *) echo "fake gh: unexpected arguments: $*" >&2; exit 1 ;;
esac
"""


def with_fake_github(repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Pull requests #7 (feature/docs) and #8 (fix/subtract) on a real remote, a fake gh on PATH."""
    # A remote that serves the pull requests' heads as GitHub does (refs/pull/<n>/head).
    origin = tmp_path / "origin.git"
    git(tmp_path, "init", "-q", "--bare", str(origin))
    git(repo, "remote", "add", "origin", str(origin))
    git(repo, "push", "-q", "origin", "main", "feature/docs:refs/pull/7/head", "fix/subtract:refs/pull/8/head")
    fake = tmp_path / "fake-gh"
    (fake / "bin").mkdir(parents=True)
    (fake / "bin" / "gh").write_text(FAKE_GH)
    (fake / "bin" / "gh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_GH_DIR", str(fake))
    return fake


def test_pull_requests_are_commented_only_after_approval(
    scratch_repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tips = build_project(scratch_repo)
    fake = with_fake_github(scratch_repo, tmp_path, monkeypatch)
    before = checkout_snapshot(scratch_repo)

    result = run_loop("pr-babysitter", scratch_repo, tmp_path / "store", {"test_command": TEST_COMMAND})

    assert result.status == "completed", result.state.error
    assert result.path == ["list_prs", "prs", "check_each", "tally", "tidy", "write_index",
                           "approve_comments", "post_comments", "commented"]
    assert json.loads(result.outputs["verdicts"]) == {"feature/docs": "pass", "fix/subtract": "fail"}
    assert result.outputs["commented"] == 2
    decided = [e for e in result.events if e["type"] == "decided"]
    assert [(e["state"], e["decision"]) for e in decided] == [("approve_comments", "approve")]
    # The comment was posted after the decision, never before it.
    order = [e["type"] for e in result.events if e["type"] in ("decided", "enter") and
             e.get("state") in ("approve_comments", "post_comments")]
    assert order == ["enter", "decided", "enter"]

    calls = (fake / "calls.log").read_text().splitlines()
    assert calls[0] == "auth status"
    assert calls[1].startswith("pr list --state open --base main --limit 10 --json number,headRefName")
    assert calls[2:] == ["pr comment --body-file reports/feature/docs.md -- 7",
                         "pr comment --body-file reports/fix/subtract.md -- 8"]
    run_branch = f"loopdsl/{result.run_id}"
    for number, report in (("7", "reports/feature/docs.md"), ("8", "reports/fix/subtract.md")):
        assert (fake / f"comment-{number}.md").read_text() == git(scratch_repo, "show", f"{run_branch}:{report}")
    assert "Pull request #8." in (fake / "comment-8.md").read_text()
    assert "Verdict: **fail**" in (fake / "comment-8.md").read_text()

    assert {name: git(scratch_repo, "rev-parse", name).strip() for name in tips} == tips
    assert worktree_count(scratch_repo) == 1
    assert checkout_snapshot(scratch_repo) == before


def test_the_review_tools_read_the_branch_and_refuse_what_is_not_in_it(scratch_repo: Path, tmp_path: Path) -> None:
    build_project(scratch_repo)
    from ruamel.yaml import YAML

    pwned = tmp_path / "pwned"
    bundled = YAML(typ="safe").load(REPLIES.read_text())
    hostile = [{"tool_calls": [{"name": "branch_file", "args": {"path": "../../../../etc/passwd"}},
                               {"name": "branch_file", "args": {"path": "docs/usage.md"}},
                               {"name": "branch_grep", "args": {"pattern": f"--open-files-in-pager=touch {pwned}"}},
                               {"name": "branch_diff", "args": {"extra": "not a param"}}]},
               '{"verdict": "looks_good", "summary": "docs only", "findings": []}']
    script = tmp_path / "hostile.replies.yaml"
    YAML(typ="safe").dump({"review": hostile + bundled["review"][2:], "summarise": bundled["summarise"]}, script)
    before = checkout_snapshot(scratch_repo)
    asked: list[Any] = []

    class Recording(ScriptedProvider):
        async def complete(self, request: Any, *, state: str, attempt: int | None = None) -> Any:
            asked.append((state, request))
            return await super().complete(request, state=state, attempt=attempt)

    provider = Recording.from_data(YAML(typ="safe").load(script.read_text()), str(script))
    result = loopdsl.run(LOOP, {"source": "git", "test_command": TEST_COMMAND}, provider=provider,
                         store=tmp_path / "store", workdir=scratch_repo)

    assert result.status == "completed", result.state.error
    second_turn = [request for state, request in asked if state == "review"][1]
    answers = [m["content"] for m in second_turn.messages if m["role"] == "tool"]
    assert len(answers) == 4
    assert "error" in answers[0] and "root:" not in answers[0]           # outside the repository: nothing read
    assert "Call calc.add(a, b)." in answers[1]                          # the branch's own file
    assert "exit code 1" in answers[2] and not pwned.exists()            # a pattern, never an option
    assert "invalid arguments" in answers[3]                             # extra arguments refused
    assert checkout_snapshot(scratch_repo) == before


def test_lint_strict_passes() -> None:
    completed = subprocess.run(
        [*loopdsl_command(), "lint", "--strict", str(LOOP), str(LOOPS_DIR / "parts" / "pr-check.yaml")],
        capture_output=True, text=True, check=False,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "0 errors, 0 warnings in 2 files" in completed.stdout + completed.stderr


def test_loads_through_the_python_api() -> None:
    loop = loopdsl.load(LOOP)
    assert loop.workspace.worktree and loop.budget.cost_usd is not None
    assert {"base", "test_command", "source", "max_prs"} <= set(loop.inputs)


def test_an_unanswered_checkpoint_posts_nothing_until_approved(
    scratch_repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    build_project(scratch_repo)
    fake = with_fake_github(scratch_repo, tmp_path, monkeypatch)
    from ruamel.yaml import YAML

    script = tmp_path / "no-decision.replies.yaml"     # the model's replies, but no person's decision
    bundled = YAML(typ="safe").load(REPLIES.read_text())
    YAML(typ="safe").dump({"review": bundled["review"], "summarise": bundled["summarise"]}, script)
    store = tmp_path / "store"

    waiting = loopdsl.run(LOOP, {"test_command": TEST_COMMAND}, script=script, store=store, workdir=scratch_repo)

    assert waiting.status == "waiting" and waiting.path[-1] == "approve_comments"
    assert "#7 pass, #8 fail" in waiting.state.waiting["message"]
    assert not any(line.startswith("pr comment") for line in (fake / "calls.log").read_text().splitlines())
    worktree = Path(waiting.state.meta["worktree"]["path"])
    assert (worktree / "reports" / "fix" / "subtract.md").is_file()  # the reports wait with the run

    from loopdsl.api.durable import decide

    decide(waiting.run_id, "approve", "ok", store=store, by="reviewer")
    resumed = loopdsl.resume(waiting.run_id, store=store)

    assert resumed.status == "completed", resumed.state.error
    assert resumed.path[-3:] == ["approve_comments", "post_comments", "commented"]
    assert sorted(p.name for p in fake.glob("comment-*.md")) == ["comment-7.md", "comment-8.md"]
