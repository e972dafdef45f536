"""How an agent's listing of a tool narrows it (DSL.md v1.1, "Untrusted text"): `paths:`
on a built-in applies to that listing only, not to the other built-ins the agent lists."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from test_agent import Conversation, loop_text, run, tool_messages


def test_paths_narrow_only_the_built_in_they_are_listed_on(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "m.py").write_text("x = 1\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "d.md").write_text("notes\n")
    calls = [("read_file", {"path": "src/m.py"}), ("read_file", {"path": "docs/d.md"}),
             ("list_files", {}), ("search_files", {"pattern": "notes"})]
    provider = Conversation(lambda turn, r: calls if turn == 1 else "ok")
    agent = ("tools: [{name: read_file, paths: ['src/**']}, list_files, {name: search_files, paths: ['docs/**']}]\n"
             "max_turns: 3")
    result = run(tmp_path, loop_text(agent), provider)
    assert result.status == "completed", result.state.error
    ok = [c["ok"] for c in result.state.results["work"]["tool_calls"]]
    assert ok == [True, False, True, True]
    contents = [m["content"] for m in tool_messages(provider.requests[1])]
    assert "outside the paths" in contents[1]
    assert "docs/d.md" in contents[2] and "src/m.py" in contents[2]  # list_files is not narrowed
    assert "docs/d.md" in contents[3] and "src/m.py" not in json.dumps(contents[3])


def test_tool_choice_goes_with_turn_one_only_and_parallel_tool_calls_only_when_set(tmp_path: Path) -> None:
    provider = Conversation(lambda turn, r: [("count_lines", {"file": "a.txt"})] if turn <= 2 else "ok")
    result = run(tmp_path, loop_text("tools: [count_lines]\nmax_turns: 4\ntool_choice: count_lines"), provider)
    assert result.status == "completed", result.state.error
    sent = [(r.tool_choice, r.parallel_tool_calls) for r in provider.requests]
    assert sent == [({"type": "function", "function": {"name": "count_lines"}}, None), (None, None), (None, None)]
    provider = Conversation(lambda turn, r: [("count_lines", {"file": "a.txt"})] if turn == 1 else "ok")
    result = run(tmp_path, loop_text("tools: [count_lines]\nmax_turns: 3\ntool_choice: required\n"
                                     "parallel_tool_calls: false"), provider)
    assert result.status == "completed", result.state.error
    assert [(r.tool_choice, r.parallel_tool_calls) for r in provider.requests] == [("required", False), (None, False)]
    assert all("tool_choice" not in r.canonical() for r in provider.requests[1:])


def test_an_mcp_servers_startup_timeout_comes_from_the_loop_file(tmp_path: Path) -> None:
    import sys
    import time

    from test_agent import MCP_SERVER

    tools = (f"  slow:\n    description: A server that never starts.\n"
             f"    mcp: {{command: [{sys.executable}, {MCP_SERVER}, --hang], startup_timeout: 1s}}\n"
             "    allow: [echo]\n")
    provider = Conversation(lambda turn, r: "never asked")
    started = time.monotonic()
    result = run(tmp_path, loop_text("tools: [slow]\nmax_turns: 2", tools), provider)
    elapsed = time.monotonic() - started
    assert result.status == "failed"
    assert "within 1s (startup_timeout)" in result.state.error["message"]
    assert elapsed < 15  # the default would have waited 30s
    assert provider.requests == []


def _git_workspace(tmp_path: Path) -> None:
    import subprocess

    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / ".gitignore").write_text(".env\n")
    (tmp_path / ".env").write_text("API=local-only\n")


def test_read_ignored_from_the_agent_opens_git_ignored_files(tmp_path: Path) -> None:
    _git_workspace(tmp_path)
    outcomes = []
    for extra in ("", "\nread_ignored: true"):
        provider = Conversation(lambda turn, r: [("read_file", {"path": ".env"})] if turn == 1 else "ok")
        result = run(tmp_path, loop_text("tools: [read_file]\nmax_turns: 2" + extra), provider)
        assert result.status == "completed", result.state.error
        outcomes.append(tool_messages(provider.requests[1])[0]["content"])
    assert "read_ignored" in outcomes[0] and "local-only" not in outcomes[0]
    assert "local-only" in outcomes[1]


def test_write_file_listed_with_approve_asks_and_writable_opens_a_protected_path(tmp_path: Path) -> None:
    import os
    import subprocess

    import loopdsl
    from test_agent import PRICE, Approver

    repo = tmp_path / "repo"
    repo.mkdir()
    env = dict(os.environ, GIT_AUTHOR_NAME="o", GIT_AUTHOR_EMAIL="o@example.com",
               GIT_COMMITTER_NAME="o", GIT_COMMITTER_EMAIL="o@example.com")
    (repo / "a.txt").write_text("one\n")
    (repo / "w.yaml").write_text(
        "loopdsl: 1\nname: writer\nworkspace: {worktree: true}\n"
        f"models:\n  m: {{model: openai/gpt-4o-mini, max_tokens: 100, {PRICE}}}\n"
        "start: work\nstates:\n  work:\n    agent:\n      model: m\n      prompt: Write.\n"
        "      tools: [{name: write_file, approve: true}, edit_file]\n      writable: ['.github/**']\n"
        "      max_turns: 3\n    next: done\n  done: {end: completed}\n")
    for args in (["init", "-q", "-b", "main"], ["add", "."], ["commit", "-q", "-m", "init"]):
        subprocess.run(["git", *args], cwd=repo, check=True, env=env)
    calls = [("write_file", {"path": ".github/ci.yml", "content": "on: push\n"}),
             ("write_file", {"path": "b.txt", "content": "two\n"}),
             ("edit_file", {"path": "a.txt", "old": "one", "new": "uno"}),
             ("edit_file", {"path": ".claude/settings.json", "old": "x", "new": "y"})]
    provider = Conversation(lambda turn, r: calls if turn == 1 else "ok")
    human = Approver({"decision": "approve"}, {"decision": "reject", "comment": "no b"})
    result = loopdsl.run(repo / "w.yaml", workdir=repo, provider=provider, human=human)
    assert result.status == "completed", result.state.error
    assert len(human.asked) == 2  # write_file asks each time; edit_file, listed plainly, does not
    contents = [m["content"] for m in tool_messages(provider.requests[1])]
    assert json.loads(contents[1]) == {"error": "rejected: no b"}
    assert "protected" in contents[3]
    assert sorted(result.state.results["work"]["changed_files"]) == [".github/ci.yml", "a.txt"]
    assert (repo / "a.txt").read_text() == "one\n" and not (repo / ".github").exists()  # the checkout is untouched


def test_an_agent_may_list_one_tool_of_an_mcp_server(tmp_path: Path) -> None:
    import sys

    from loopdsl.lint.pipeline import lint_file
    from test_agent import MCP_SERVER

    tools = (f"  srv:\n    description: A test server.\n    mcp: {{command: [{sys.executable}, {MCP_SERVER}]}}\n"
             "    allow: [echo, {name: add, as: plus}]\n")
    provider = Conversation(lambda turn, r: [("srv__echo", {"text": "hi"}), ("plus", {"a": 1, "b": 2})]
                            if turn == 1 else "ok")
    result = run(tmp_path, loop_text("tools: [plus]\nmax_turns: 2", tools), provider)
    assert result.status == "completed", result.state.error
    assert [t["function"]["name"] for t in provider.requests[0].tools] == ["plus"]
    assert [c["ok"] for c in result.state.results["work"]["tool_calls"]] == [False, True]  # echo was not listed
    assert "3" in tool_messages(provider.requests[1])[1]["content"]
    (tmp_path / "loop.yaml").write_text(loop_text("tools: [srv__echo, srv__nope]\nmax_turns: 2", tools))
    unknown = [d.message for d in lint_file(tmp_path / "loop.yaml") if d.rule == "unknown-tool"]
    assert len(unknown) == 1 and "srv__nope" in unknown[0]


def test_an_mcp_tools_own_timeout_bounds_its_calls(tmp_path: Path) -> None:
    """The entry's `timeout:` applies to its tools as offered (`<entry>__<tool>`), not the
    2-minute default: a call that takes longer comes back to the model as a tool error."""
    import sys
    import time

    from test_agent import MCP_SERVER

    tools = (f"  srv:\n    description: The test MCP server.\n"
             f"    mcp: {{command: [{sys.executable}, {MCP_SERVER}]}}\n"
             "    allow: [slow]\n    timeout: 1s\n")
    provider = Conversation(lambda turn, r: [("srv__slow", {"seconds": 30})] if turn == 1 else "ok")
    started = time.monotonic()
    result = run(tmp_path, loop_text("tools: [srv]\nmax_turns: 2", tools), provider)
    elapsed = time.monotonic() - started
    assert result.status == "completed", result.state.error
    [call] = result.state.results["work"]["tool_calls"]
    assert call["name"] == "srv__slow" and call["ok"] is False and "timed out" in call["error"], call
    assert elapsed < 25  # not the 30 s the tool asked for, nor the 120 s default


def test_no_tool_runs_before_git_has_listed_what_is_ignored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """git's listing of the ignored files runs behind the first turn; a shell tool of the
    first turn that rewrites `.gitignore` (un-ignoring `.env`) still runs after git read the
    old one, so `.env` stays unreadable. git is slowed down here to widen the window."""
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / ".gitignore").write_text(".env\n")
    (tmp_path / ".env").write_text("TOKEN=abc\n")
    subprocess.run(["git", "add", ".gitignore"], cwd=tmp_path, check=True)
    shims = tmp_path.parent / f"{tmp_path.name}-shims"
    shims.mkdir()
    real = shutil.which("git")
    (shims / "git").write_text(f'#!/bin/sh\ncase "$*" in *ls-files*) sleep 1;; esac\nexec "{real}" "$@"\n')
    (shims / "git").chmod(0o755)
    monkeypatch.setenv("PATH", f"{shims}{os.pathsep}{os.environ['PATH']}")
    calls = {1: [("unignore", {})], 2: [("read_file", {"path": ".env"})]}
    provider = Conversation(lambda turn, r: calls.get(turn, "ok"))
    tools = ("  unignore:\n    description: Empty .gitignore.\n    shell: ': > .gitignore'\n")
    result = run(tmp_path, loop_text("tools: [unignore, read_file]\nmax_turns: 4", tools=tools), provider)
    assert result.status == "completed", result.state.error
    read = result.state.results["work"]["tool_calls"][1]
    assert read["name"] == "read_file" and not read["ok"] and "ignored" in read["error"]
    assert "abc" not in json.dumps([m for r in provider.requests for m in r.messages])
