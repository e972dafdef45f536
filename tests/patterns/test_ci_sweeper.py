"""ci-sweeper end to end: a real failing test, scripted diffs through real git gates, a fix commit."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

import loopdsl
from loopdsl.adapters.humans import ScriptedHuman
from loopdsl.runtime.model_port import LlmRequest, LlmResponse
from loopdsl.adapters.litellm import ScriptedProvider

from .conftest import (
    LOOPS_DIR,
    SCRIPTS_DIR,
    branches,
    checkout_snapshot,
    commit_file,
    git,
)

LOOP = LOOPS_DIR / "ci-sweeper.yaml"
REPLIES = SCRIPTS_DIR / "ci-sweeper.replies.yaml"
TEST_COMMAND = "python3 -m unittest -q"

CALC_BUGGY = '''"""Small arithmetic helpers."""


def add(a, b):
    return a + b


def mean(values):
    """The arithmetic mean of a non-empty list of numbers."""
    return sum(values) // len(values)
'''
TESTS = '''import unittest

from calc import add, mean


class CalcTest(unittest.TestCase):
    def test_add(self):
        self.assertEqual(add(2, 3), 5)

    def test_mean(self):
        self.assertEqual(mean([1, 2]), 1.5)
'''


class RecordingProvider(ScriptedProvider):
    """The scripted provider, keeping every request so a test can read what the model was told."""

    requests: list[tuple[str, LlmRequest]]

    async def complete(self, request: LlmRequest, *, state: str) -> LlmResponse:
        self.requests.append((state, request))
        return await super().complete(request, state=state)


def recording(script: Path) -> RecordingProvider:
    provider = RecordingProvider.from_data(YAML(typ="safe").load(script.read_text()), str(script))
    assert isinstance(provider, RecordingProvider)
    provider.requests = []
    return provider


def run_sweeper(repo: Path, store: Path, script: Path, **inputs: Any) -> tuple[Any, RecordingProvider]:
    provider = recording(script)
    result = loopdsl.run(LOOP, {"test_command": TEST_COMMAND, **inputs}, provider=provider,
                         human=ScriptedHuman(provider.decision), store=store, workdir=repo)
    return result, provider


def suite_passes_at(repo: Path, ref: str, where: Path) -> bool:
    """Run the test command on `ref`'s tree, exported to a scratch directory."""
    where.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", ref], cwd=repo, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive, check=True)
    return subprocess.run(TEST_COMMAND.split(), cwd=where, capture_output=True,
                          env={"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"}, check=False).returncode == 0


def buggy_project(repo: Path) -> None:
    commit_file(repo, "calc.py", CALC_BUGGY, "add calc")
    commit_file(repo, "test_calc.py", TESTS, "test calc")
    (repo / "scratch.txt").write_text("the user's own uncommitted work\n")


def test_a_failing_test_is_fixed_after_feedback_from_both_gates(scratch_repo: Path, tmp_path: Path) -> None:
    buggy_project(scratch_repo)
    base = git(scratch_repo, "rev-parse", "HEAD").strip()
    before = checkout_snapshot(scratch_repo)

    result, provider = run_sweeper(scratch_repo, tmp_path / "store", REPLIES)

    assert result.status == "completed", result.state.error
    assert result.path == ["run_tests", "collect", "propose", "apply", "propose", "apply",
                           "review", "approve", "finalize", "fixed"]
    assert result.outputs["outcome"] == "fixed"
    assert result.outputs["changed"] == "calc.py"

    # What the model was told: the real failure, the real source, then each gate's refusal.
    proposals = [request for state, request in provider.requests if state == "propose"]
    assert len(proposals) == 3
    first = proposals[0].messages[-1]["content"]
    assert "AssertionError: 1 != 1.5" in first and "=== calc.py ===" in first and CALC_BUGGY in first
    assert "refused" not in first
    assert "diff-applies" in proposals[1].messages[-1]["content"]
    assert "patch does not apply" in proposals[1].messages[-1]["content"]
    third = proposals[2].messages[-1]["content"]
    assert "tests-pass" in third and "AssertionError: 1 != 1.5" in third.split("refused")[1]
    reviews = [request for state, request in provider.requests if state == "review"]
    assert len(reviews) == 1 and "return sum(values) / len(values)" in reviews[0].messages[-1]["content"]

    # The run branch holds exactly the approved fix, on top of the base, and its tests pass.
    run_branch = f"loopdsl/{result.run_id}"
    assert git(scratch_repo, "rev-list", "--parents", "-n", "1", run_branch).split()[1] == base
    assert git(scratch_repo, "diff", "--name-only", base, run_branch).split() == ["calc.py"]
    assert "return sum(values) / len(values)" in git(scratch_repo, "show", f"{run_branch}:calc.py")
    assert suite_passes_at(scratch_repo, run_branch, tmp_path / "fixed")
    assert not suite_passes_at(scratch_repo, "main", tmp_path / "still-broken")
    assert git(scratch_repo, "worktree", "list", "--porcelain").count("worktree ") == 1
    assert checkout_snapshot(scratch_repo) == before


def test_nothing_is_committed_when_the_person_rejects(scratch_repo: Path, tmp_path: Path) -> None:
    buggy_project(scratch_repo)
    base = git(scratch_repo, "rev-parse", "HEAD").strip()
    bundled = YAML(typ="safe").load(REPLIES.read_text())
    script = tmp_path / "reject.replies.yaml"
    YAML(typ="safe").dump({"propose": [bundled["propose"][2]], "review": bundled["review"],
                           "approve": [{"decision": "reject", "comment": "not now"}]}, script)
    before = checkout_snapshot(scratch_repo)

    result, _ = run_sweeper(scratch_repo, tmp_path / "store", script)

    assert result.status == "failed"
    assert result.path == ["run_tests", "collect", "propose", "apply", "review", "approve", "rejected"]
    run_branch = f"loopdsl/{result.run_id}"
    assert git(scratch_repo, "rev-parse", run_branch).strip() == base   # no commit
    kept = Path(result.state.meta["worktree"]["path"])                  # kept for inspection
    assert "sum(values) / len(values)" in (kept / "calc.py").read_text()
    assert checkout_snapshot(scratch_repo) == before


def test_passing_tests_end_the_run_without_a_model_call(scratch_repo: Path, tmp_path: Path) -> None:
    commit_file(scratch_repo, "calc.py", CALC_BUGGY.replace("//", "/"), "add calc")
    commit_file(scratch_repo, "test_calc.py", TESTS, "test calc")
    before = checkout_snapshot(scratch_repo)
    names_before = branches(scratch_repo)

    result, provider = run_sweeper(scratch_repo, tmp_path / "store", REPLIES)

    assert result.status == "completed"
    assert result.path == ["run_tests", "green"]
    assert provider.requests == [] and result.tokens == 0
    run_branch = f"loopdsl/{result.run_id}"
    assert branches(scratch_repo) == names_before | {run_branch}
    assert git(scratch_repo, "rev-parse", run_branch) == git(scratch_repo, "rev-parse", "main")
    assert checkout_snapshot(scratch_repo) == before


def test_lint_strict_passes() -> None:
    completed = subprocess.run([sys.executable, "-m", "loopdsl", "lint", "--strict", str(LOOP)],
                               capture_output=True, text=True, check=False)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "0 errors, 0 warnings in 1 file" in completed.stdout + completed.stderr
