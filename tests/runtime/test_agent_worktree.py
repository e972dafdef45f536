"""An agent fixes a failing test in a real git repository, in its worktree: it reads and
searches with the built-in tools, edits with edit_file, runs the tests with a shell tool,
and its fix is committed on the run branch while the person's checkout is untouched."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from git_repos import git_output as _git, owned_repo

import loopdsl
from loopdsl.runtime.model_port import LlmRequest

sys.path.insert(0, str(Path(__file__).parent))
from test_agent import Conversation  # noqa: E402  (the conversation-driven provider port)

# The nested pytest runs load no third-party plugins (the runner's xdist, hypothesis ...): a
# plain test_calc.py needs none, and their imports were most of each run's CPU. No bytecode
# is written: the agent's one-character fix keeps calc.py's size, and within the same second
# as the first test run Python would take the stale calc.pyc as current.
PYTEST = f"env PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 PYTHONDONTWRITEBYTECODE=1 {sys.executable} -m pytest -q -x -p no:cacheprovider test_calc.py"
LOOP = f"""\
loopdsl: 1
name: fixer
workspace: {{worktree: true}}
models:
  m: {{model: openai/gpt-4o-mini, max_tokens: 200, price: {{input_per_mtok: 1, output_per_mtok: 2}}}}
tools:
  run_tests:
    description: Run the tests; returns the exit code and output.
    shell: {PYTEST}
    idempotent: true
    timeout: 60s
start: fix
states:
  fix:
    agent:
      model: m
      prompt: The tests fail. Find the cause and fix it.
      tools: [read_file, search_files, edit_file, run_tests]
      max_turns: 6
      schema: {{type: object, required: [summary]}}
    gates: {{after: [{{shell: "{PYTEST}"}}]}}
    next: done
  done: {{end: completed}}
"""


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("LOOPDSL_STORE", raising=False)
    return owned_repo(tmp_path / "repo", {
        "calc.py": "def add(a, b):\n    return a - b\n",
        "test_calc.py": "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n",
        "fixer.yaml": LOOP, ".gitignore": "__pycache__/\n"})


def fixer(turn: int, request: LlmRequest) -> Any:
    if turn == 1:
        return [("search_files", {"pattern": "def add"}), ("run_tests", {})]
    if turn == 2:
        return [("read_file", {"path": "calc.py"}), ("read_file", {"path": "../outside.txt"})]
    if turn == 3:
        return [("edit_file", {"path": "calc.py", "old": "a - b", "new": "a + b"}), ("run_tests", {})]
    return json.dumps({"summary": "add subtracted; now it adds"})


def test_an_agent_fixes_a_failing_test_on_its_run_branch(repo: Path) -> None:
    (repo.parent / "outside.txt").write_text("not for the agent\n")
    before = _git(repo, "status", "--porcelain")
    provider = Conversation(fixer)
    result = loopdsl.run(repo / "fixer.yaml", workdir=repo, provider=provider)
    assert result.status == "completed", result.state.error
    calls = result.state.results["fix"]["tool_calls"]
    assert [(c["name"], c["ok"]) for c in calls] == [
        ("search_files", True), ("run_tests", False), ("read_file", True), ("read_file", False),
        ("edit_file", True), ("run_tests", True)]
    sent = json.dumps([list(r.messages) for r in provider.requests])
    assert "not for the agent" not in sent  # the escape came back as a tool error
    assert "1 failed" in sent and "1 passed" in sent  # the model saw both test runs
    run_id = result.run_id
    assert _git(repo, "show", f"loopdsl/{run_id}:calc.py") == "def add(a, b):\n    return a + b\n"
    assert (repo / "calc.py").read_text() == "def add(a, b):\n    return a - b\n"  # the checkout is untouched
    assert _git(repo, "status", "--porcelain") == before
    fix = result.state.results["fix"]
    assert fix["changed_files"] == ["calc.py"] and "1 insertion" in fix["diff_stat"]
    spent = result.state.ledger["cost_usd"]
    assert spent == pytest.approx(result.state.results["fix"]["cost_usd"])
