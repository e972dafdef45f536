"""Agents in a real git worktree: the guard of the repository's git setup around each
attempt, `retry.reset_workspace`, feedback on retry, and `changed_files`/`diff_stat`
against the visit-start commit, redacted."""
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

SECRET = "zq-very-5ecret-token"
HEADER = """\
loopdsl: 1
name: wired
workspace: {worktree: true}
secrets: [WIRE_TOKEN]
models:
  m: {model: openai/gpt-4o-mini, max_tokens: 200, price: {input_per_mtok: 1, output_per_mtok: 2}}
tools:
  own_commit:
    description: Commit on the run's own branch.
    shell: git -c user.name=a -c user.email=a@example.com commit -q --allow-empty -m own
  new_branch:
    description: Create another branch.
    shell: git branch -q other
  add_hook:
    description: Write a pre-commit hook into the repository.
    shell: echo "exit 0" > "$(git rev-parse --git-common-dir)/hooks/pre-commit"
"""


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("LOOPDSL_STORE", raising=False)
    monkeypatch.setenv("WIRE_TOKEN", SECRET)
    return owned_repo(tmp_path / "repo", {"README": "hello\n"})


def agent_loop(tools: str, extra: str = "", prompt: str = "Work.") -> str:
    return HEADER + f"""start: work
states:
  work:
    agent:
      model: m
      prompt: "{prompt}"
      tools: [{tools}]
      max_turns: 4
{extra}    next: done
  done: {{end: completed}}
"""


def run_loop(repo: Path, text: str, provider: Conversation) -> Any:
    (repo / "loop.yaml").write_text(text)
    return loopdsl.run(repo / "loop.yaml", workdir=repo, provider=provider)


def calling(*calls: tuple[str, dict[str, Any]]) -> Conversation:
    def answer(turn: int, request: LlmRequest) -> Any:
        return [calls[turn - 1]] if turn <= len(calls) else "done"
    return Conversation(answer)


def test_moving_the_runs_own_branch_is_fine(repo: Path) -> None:
    result = run_loop(repo, agent_loop("own_commit"), calling(("own_commit", {})))
    assert result.status == "completed", result.state.error
    assert result.state.results["work"]["tool_calls"][0]["ok"] is True


@pytest.mark.parametrize("tool, expected", [("new_branch", "ref refs/heads/other was created"),
                                            ("add_hook", "git file hooks/pre-commit was created")])
def test_changing_the_git_setup_fails_the_run_without_a_retry(repo: Path, tool: str, expected: str) -> None:
    provider = calling((tool, {}))
    retry = "    retry: {max_attempts: 3, on: [gate, parse], backoff: {initial: 0s}}\n"
    result = run_loop(repo, agent_loop(tool, retry), provider)
    assert result.status == "failed"
    error = result.state.error
    assert error["kind"] == "workspace" and expected in error["message"], error
    assert "off limits" in error["message"]
    assert len(provider.requests) == 2  # one attempt: tool turn + answer, never retried
    assert result.state.results["work"]["tool_calls"][0]["name"] == tool


RESET_LOOP = HEADER + """start: prep
states:
  prep:
    shell: echo prepared > prep.txt
    next: work
  work:
    agent:
      model: m
      prompt: "Write good.txt. {{ feedback }}"
      tools: [write_file, list_files]
      max_turns: 4
    retry: {max_attempts: 2, on: [gate], backoff: {initial: 0s}%s}
    gates: {after: [{name: has-good, shell: "cat prep.txt; test -f good.txt"}]}
    next: done
  done: {end: completed}
"""


def retried(request: LlmRequest) -> bool:
    return any("has-good" in str(m.get("content")) for m in request.messages if m["role"] == "user")


def resetting(turn: int, request: LlmRequest) -> Any:
    if turn == 1:
        return [("list_files", {})]
    if turn == 2:
        return [("write_file", {"path": "good.txt" if retried(request) else f"bad-{SECRET}.txt", "content": "x\n"})]
    return "written"


@pytest.mark.parametrize("reset", [True, False])
def test_reset_workspace_restores_the_visit_start_on_a_new_attempt(repo: Path, reset: bool) -> None:
    provider = Conversation(resetting)
    result = run_loop(repo, RESET_LOOP % (", reset_workspace: true" if reset else ""), provider)
    assert result.status == "completed", result.state.error
    second = [r for r in provider.requests if retried(r) and sum(m["role"] == "assistant" for m in r.messages) == 1]
    prompt = next(m["content"] for m in second[0].messages if m["role"] == "user")
    assert "after-gate 'has-good' failed" in prompt and "prepared" in prompt  # the gate's name and output
    names = second[0].messages[-1]["content"]  # what list_files found when the second attempt began
    assert ("bad-" in names) is (not reset)  # the first attempt's file is gone only with a reset
    assert "prep.txt" in names  # uncommitted work of an earlier state is kept either way
    work = result.state.results["work"]
    if reset:
        assert work["changed_files"] == ["good.txt"]
    else:
        assert len(work["changed_files"]) == 2 and "good.txt" in work["changed_files"]
        assert SECRET not in json.dumps(work) and SECRET not in work["diff_stat"]  # redacted before stored
    assert "prep.txt" not in work["changed_files"]  # measured from the visit start, not the branch base


CHILD = """\
loopdsl: 1
name: writer
workspace: {worktree: true}
unattended: true
inputs:
  name: {type: string}
models:
  m: {model: openai/gpt-4o-mini, max_tokens: 200, price: {input_per_mtok: 1, output_per_mtok: 2}}
start: work
states:
  work:
    agent: {model: m, prompt: "Write {{ inputs.name }}.", tools: [write_file], max_turns: 3}
    next: done
  done: {end: completed}
"""


def parent_loop(worktree: bool, fan_out: str) -> str:
    return (f"loopdsl: 1\nname: caller\n{'workspace: {worktree: true}' if worktree else ''}\nstart: each\n"
            f"states:\n  each:\n    loop: child.yaml\n{fan_out}    with: {{name: \"{{{{ item | default('one') }}}}\"}}\n"
            "    retry: {max_attempts: 3, backoff: {initial: 0s}}\n    next: done\n  done: {end: completed}\n")


def writer(turn: int, request: LlmRequest) -> Any:
    name = request.messages[-1]["content"].split()[-1].rstrip(".") if turn == 1 else ""
    return [("write_file", {"path": f"{name}.txt", "content": "x\n"})] if turn == 1 else "written"


@pytest.mark.parametrize("worktree, fan_out, expected", [
    (False, "", "declares `workspace: {worktree: true}` but loop 'caller' runs without a worktree"),
    # Under a caller with a worktree, concurrent writers each get one: test_fan_out_worktrees.py.
    (False, "    for_each: \"['a', 'b']\"\n    concurrency: 2\n", "runs without a worktree"),
])
def test_a_writing_child_is_refused_where_it_would_share_a_checkout(repo: Path, worktree: bool, fan_out: str,
                                                                   expected: str) -> None:
    (repo / "child.yaml").write_text(CHILD)
    provider = Conversation(writer)
    result = run_loop(repo, parent_loop(worktree, fan_out), provider)
    assert result.status == "failed"
    assert expected in result.state.error["message"], result.state.error
    assert provider.requests == []  # refused before any child ran (and not retried)
    assert not any(repo.glob("*.txt"))  # nothing written into the person's checkout


def test_a_writing_fan_out_runs_one_child_at_a_time_in_the_worktree(repo: Path) -> None:
    (repo / "child.yaml").write_text(CHILD)
    result = run_loop(repo, parent_loop(True, "    for_each: \"['a', 'b']\"\n    concurrency: 1\n"), Conversation(writer))
    assert result.status == "completed", result.state.error
    branch = f"loopdsl/{result.run_id}"
    assert _git(repo, "show", f"{branch}:a.txt") == "x\n" and _git(repo, "show", f"{branch}:b.txt") == "x\n"
    assert not any(repo.glob("*.txt"))
