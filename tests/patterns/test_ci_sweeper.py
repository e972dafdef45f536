"""ci-sweeper end to end: a real failing test, a scripted agent whose tool calls really read,
search and edit the run's worktree and run the tests there, the loop's own gates, a fix commit."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
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
from cli_forked import loopdsl_command

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
    """The scripted provider, keeping every request so a test can read what the model was told
    (and, for an agent, what its tools answered)."""

    requests: list[tuple[str, LlmRequest]]

    async def complete(self, request: LlmRequest, *, state: str, attempt: int | None = None) -> LlmResponse:
        self.requests.append((state, request))
        return await super().complete(request, state=state, attempt=attempt)


def recording(script: Path) -> RecordingProvider:
    provider = RecordingProvider.from_data(YAML(typ="safe").load(script.read_text()), str(script))
    assert isinstance(provider, RecordingProvider)
    provider.requests = []
    return provider


def run_sweeper(repo: Path, store: Path, script: Path, **inputs: Any) -> tuple[Any, RecordingProvider]:
    provider = recording(script)
    # The fix stays on the local branch here (tests/cli/test_publish_cli.py publishes it to a fake GitHub).
    result = loopdsl.run(LOOP, {"test_command": TEST_COMMAND, **inputs}, provider=provider,
                         human=ScriptedHuman(provider.decision), store=store, workdir=repo, publish=False)
    return result, provider


def tool_results(request: LlmRequest) -> list[str]:
    """What the tools answered, as the model read them, in order."""
    return [m["content"] for m in request.messages if m["role"] == "tool"]


def tool_calls(result: Any, state: str = "fix") -> list[tuple[str, bool]]:
    return [(e["name"], e["ok"]) for e in result.events if e["type"] == "tool_call" and e["state"] == state]


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


def test_the_agent_fixes_the_failing_test_and_the_fix_is_committed(scratch_repo: Path, tmp_path: Path) -> None:
    buggy_project(scratch_repo)
    base = git(scratch_repo, "rev-parse", "HEAD").strip()
    before = checkout_snapshot(scratch_repo)

    result, provider = run_sweeper(scratch_repo, tmp_path / "store", REPLIES)

    assert result.status == "completed", result.state.error
    assert result.path == ["run_tests", "fix", "diff", "review", "approve", "finalize", "fixed"]
    assert result.outputs["outcome"] == "fixed" and result.outputs["changed"] == "calc.py"
    # The agent's tools ran for real in the worktree: the search found mean, the file was
    # read, the first edit left the test failing (the tool said so), the second fixed it.
    assert tool_calls(result) == [("search_files", True), ("read_file", True), ("edit_file", True),
                                  ("run_tests", False), ("edit_file", True), ("run_tests", True)]
    turns = [request for state, request in provider.requests if state == "fix"]
    assert len(turns) == 7
    first = turns[0].messages[-1]["content"]
    assert "AssertionError: 1 != 1.5" in first and "refused" not in first
    assert {t["function"]["name"] for t in turns[0].tools} == {"read_file", "list_files", "search_files",
                                                               "edit_file", "run_tests"}
    answers = tool_results(turns[-1])
    assert "calc.py" in answers[0] and "def mean" in answers[0]           # search_files
    assert "return sum(values) // len(values)" in answers[1]              # read_file: the real file
    assert "AssertionError: 1 != 1.5" in answers[3]                       # run_tests after the bad edit
    assert '"exit_code": 0' in answers[5]                                 # run_tests after the fix
    reviews = [request for state, request in provider.requests if state == "review"]
    assert len(reviews) == 1
    shown = reviews[0].messages[-1]["content"]
    assert "+    return sum(values) / len(values)" in shown and "-    return sum(values) // len(values)" in shown

    # The run branch holds exactly the approved fix, on top of the base, and its tests pass.
    run_branch = f"loopdsl/{result.run_id}"
    assert git(scratch_repo, "rev-list", "--parents", "-n", "1", run_branch).split()[1] == base
    assert git(scratch_repo, "diff", "--name-only", base, run_branch).split() == ["calc.py"]
    assert "return sum(values) / len(values)" in git(scratch_repo, "show", f"{run_branch}:calc.py")
    assert suite_passes_at(scratch_repo, run_branch, tmp_path / "fixed")
    assert not suite_passes_at(scratch_repo, "main", tmp_path / "still-broken")
    assert git(scratch_repo, "worktree", "list", "--porcelain").count("worktree ") == 1
    assert checkout_snapshot(scratch_repo) == before
    # Spent is what the scripted turns reported: seven fix turns and one review.
    assert result.tokens == 15780 + 740


def test_a_gate_refusal_and_the_reviewer_go_back_to_the_agent(scratch_repo: Path, tmp_path: Path) -> None:
    buggy_project(scratch_repo)
    before = checkout_snapshot(scratch_repo)
    bad = "return round(sum(values) // len(values), 1)"
    script = tmp_path / "feedback.replies.yaml"
    YAML(typ="safe").dump({
        "fix": [
            # Visit 1, attempt 1: an escape attempt (refused, the run goes on), then a wrong
            # edit the agent does not test: the loop's tests-pass gate refuses it.
            {"tool_calls": [{"name": "read_file", "args": {"path": "../../scratch.txt"}},
                            {"name": "edit_file", "args": {"path": "calc.py", "old": "return sum(values) // len(values)",
                                                           "new": bad}}]},
            '{"summary": "round the mean"}',
            # Attempt 2, told why: the right edit.
            {"tool_calls": [{"name": "edit_file", "args": {"path": "calc.py", "old": bad,
                                                           "new": "return sum(values) / len(values)"}}]},
            '{"summary": "true division in mean()"}',
            # Visit 2, after the reviewer's rejection: a docstring the reviewer asked for.
            {"tool_calls": [{"name": "edit_file", "args": {
                "path": "calc.py", "old": '"""The arithmetic mean of a non-empty list of numbers."""',
                "new": '"""The arithmetic mean of a non-empty list of numbers (true division)."""'}}]},
            '{"summary": "true division in mean(), and the docstring says so"}',
        ],
        "review": [{"text": '{"verdict": "reject", "feedback": "Say in the docstring that mean() divides exactly."}'},
                   {"text": '{"verdict": "accept", "feedback": "Good."}'}],
        "approve": [{"decision": "approve", "comment": "ok"}],
    }, script)

    result, provider = run_sweeper(scratch_repo, tmp_path / "store", script)

    assert result.status == "completed", result.state.error
    assert result.path == ["run_tests", "fix", "diff", "review", "fix", "diff", "review", "approve", "finalize", "fixed"]
    assert tool_calls(result) == [("read_file", False), ("edit_file", True), ("edit_file", True), ("edit_file", True)]
    prompts = [request.messages[-1]["content"] for state, request in provider.requests
               if state == "fix" and request.messages[-1]["role"] == "user"]
    assert len(prompts) == 3  # one conversation per attempt
    assert "refused" not in prompts[0]
    assert "tests-pass" in prompts[1] and "AssertionError: 1 != 1.5" in prompts[1].split("refused")[1]
    assert "Say in the docstring" in prompts[2]
    first_turn = next(request for state, request in provider.requests if state == "fix")
    escaped = [m for m in provider.requests[1][1].messages if m["role"] == "tool"][0]["content"]
    assert "error" in escaped and "the user's own uncommitted work" not in escaped
    assert first_turn.messages[-1]["role"] == "user"
    run_branch = f"loopdsl/{result.run_id}"
    fixed = git(scratch_repo, "show", f"{run_branch}:calc.py")
    assert "return sum(values) / len(values)" in fixed and "(true division)" in fixed
    assert suite_passes_at(scratch_repo, run_branch, tmp_path / "fixed")
    assert checkout_snapshot(scratch_repo) == before


def test_nothing_is_committed_when_the_person_rejects(scratch_repo: Path, tmp_path: Path) -> None:
    buggy_project(scratch_repo)
    base = git(scratch_repo, "rev-parse", "HEAD").strip()
    bundled = YAML(typ="safe").load(REPLIES.read_text())
    script = tmp_path / "reject.replies.yaml"
    YAML(typ="safe").dump({"fix": bundled["fix"], "review": bundled["review"],
                           "approve": [{"decision": "reject", "comment": "not now"}]}, script)
    before = checkout_snapshot(scratch_repo)

    result, _ = run_sweeper(scratch_repo, tmp_path / "store", script)

    assert result.status == "failed"
    assert result.path == ["run_tests", "fix", "diff", "review", "approve", "rejected"]
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
    completed = subprocess.run([*loopdsl_command(), "lint", "--strict", str(LOOP)],
                               capture_output=True, text=True, check=False)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "0 errors, 0 warnings in 1 file" in completed.stdout + completed.stderr


def fixer_turn(body: Any) -> Any:
    """The fixer as a provider would answer over HTTP, by the conversation so far: search,
    read, edit, run the tests, and answer only once the last test run passed."""
    from stub_server import StubReply, tool_call

    results = [m for m in body["messages"] if m["role"] == "tool"]
    steps = [("search_files", {"pattern": "def mean"}), ("read_file", {"path": "calc.py"}),
             ("edit_file", {"path": "calc.py", "old": "return sum(values) // len(values)",
                            "new": "return sum(values) / len(values)"}),
             ("run_tests", {})]
    if len(results) < len(steps):
        name, args = steps[len(results)]
        return StubReply(text=None, tool_calls=[tool_call(name, args, f"call_http_{len(results)}")],
                         prompt_tokens=900 + 150 * len(results), completion_tokens=25)
    assert json.loads(results[-1]["content"])["exit_code"] == 0, results[-1]["content"]
    return StubReply(text='{"summary": "mean() used floor division; it now divides exactly."}',
                     prompt_tokens=1600, completion_tokens=30)


def critic_turn(body: Any) -> Any:
    from stub_server import StubReply

    return StubReply(text='{"verdict": "accept", "feedback": "Fixes the cause; minimal."}',
                     prompt_tokens=700, completion_tokens=20)


@pytest.mark.xdist_group("litellm")  # an in-process run over LiteLLM: on the worker that imported it
def test_over_litellm_http_the_fix_is_committed_and_spent_equals_billed(
        scratch_repo: Path, tmp_path: Path, stub_server: Any) -> None:
    """The same loop, its models pointed at the loopback stubs (the fixer speaks OpenAI's
    format, the reviewer Anthropic's): LiteLLM's real tool-call path, end to end."""
    from loopdsl.adapters.litellm import ensure_litellm

    ensure_litellm()
    buggy_project(scratch_repo)
    copy = tmp_path / "pattern"
    (copy / "loops").mkdir(parents=True)
    (copy / "skills" / "ci-sweeper").mkdir(parents=True)
    shutil.copy(LOOPS_DIR.parent / "skills" / "ci-sweeper" / "SKILL.md", copy / "skills" / "ci-sweeper" / "SKILL.md")
    text = LOOP.read_text()
    text = text.replace("fixer: {model: openai/gpt-4o-mini,", f"fixer: {{model: openai/gpt-4o-mini, api_base: {stub_server.api_base},")
    text = text.replace("critic: {model: anthropic/claude-haiku-4-5,",
                        f"critic: {{model: anthropic/claude-haiku-4-5, api_base: {stub_server.anthropic_api_base},")
    (copy / "loops" / "ci-sweeper.yaml").write_text(text)
    stub_server.responder = lambda body: fixer_turn(body) if body.get("tools") else critic_turn(body)
    before = checkout_snapshot(scratch_repo)

    result = loopdsl.run(copy / "loops" / "ci-sweeper.yaml", {"test_command": TEST_COMMAND},
                         human=ScriptedHuman(lambda state: {"decision": "approve", "comment": "ok"}),
                         store=tmp_path / "store", workdir=scratch_repo, publish=False)

    assert result.status == "completed", result.state.error
    assert result.path == ["run_tests", "fix", "diff", "review", "approve", "finalize", "fixed"]
    assert tool_calls(result) == [("search_files", True), ("read_file", True), ("edit_file", True), ("run_tests", True)]
    assert stub_server.responder_errors == [] and len(stub_server.requests) == 6
    assert result.tokens == stub_server.billed["prompt_tokens"] + stub_server.billed["completion_tokens"]
    run_branch = f"loopdsl/{result.run_id}"
    assert git(scratch_repo, "diff", "--name-only", "main", run_branch).split() == ["calc.py"]
    assert suite_passes_at(scratch_repo, run_branch, tmp_path / "fixed")
    assert checkout_snapshot(scratch_repo) == before
