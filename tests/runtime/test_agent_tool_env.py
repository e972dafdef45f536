"""Shell tools' `env:` and `cwd:` (DSL.md v1.1, "Processes and environment"): as for shell
states, an env value is a literal, a template over args/inputs/run, or exactly
`{{ secrets.X }}` of a declared secret; `cwd` is confined to the workspace. Real commands in
a tmp workspace; the model is the conversation-driven provider port of test_agent.py."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import loopdsl
from test_agent import Conversation, loop_text, run, tool_messages


def result_of(provider: Conversation, turn: int = 2) -> Any:
    return json.loads(tool_messages(provider.requests[turn - 1])[0]["content"])


def test_env_literals_templates_and_a_passed_secret_reach_the_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("API_TOKEN", "tok-5ecret-value")
    monkeypatch.setenv("OTHER_TOKEN", "other-5ecret")
    tools = ("  show_env:\n    description: Print its environment.\n    params: {who: {type: string}}\n"
             "    required: [who]\n"
             "    shell:\n      cmd: 'echo \"$MODE|$WHO|$(printf %s \"$TOKEN\" | wc -c)|${OTHER_TOKEN:-none}\"'\n"
             "      env: {MODE: fast, WHO: '{{ args.who }}', TOKEN: '{{ secrets.API_TOKEN }}'}\n")
    provider = Conversation(lambda turn, r: [("show_env", {"who": "a b; rm -rf /"})] if turn == 1 else "ok")
    result = run(tmp_path, loop_text("tools: [show_env]\nmax_turns: 3", tools, extra="secrets: [API_TOKEN, OTHER_TOKEN]"),
                 provider)
    assert result.status == "completed", result.state.error
    out = result_of(provider)
    # The secret reached the command whole (16 characters), is not echoed, and the other
    # declared secret, not passed, did not reach it at all.
    assert "fast|a b; rm -rf /|16|none" in json.dumps(out)


def test_cwd_runs_the_command_in_a_workspace_folder_and_never_outside(tmp_path: Path) -> None:
    (tmp_path / "sub" / "deeper").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    (tmp_path / "sub" / "link").symlink_to(tmp_path.parent)
    tools = ("  where:\n    description: Print the working folder.\n    params: {dir: {type: string}}\n"
             "    required: [dir]\n    shell: {cmd: pwd, cwd: 'sub/{{ args.dir }}'}\n")
    dirs = ["deeper", "../outside", "link", "/etc"]
    provider = Conversation(lambda turn, r: [("where", {"dir": dirs[turn - 1]})] if turn <= len(dirs) else "ok")
    result = run(tmp_path, loop_text("tools: [where]\nmax_turns: 6", tools), provider)
    assert result.status == "completed", result.state.error
    calls = result.state.results["work"]["tool_calls"]
    assert [c["ok"] for c in calls] == [True, False, False, False]
    assert str(tmp_path / "sub" / "deeper") in json.dumps(result_of(provider, 2))
    assert "'..'" in calls[1]["error"] and "symlink" in calls[2]["error"]
    assert all("outside" not in json.dumps(result_of(provider, t)).replace("../outside", "")
               for t in (3, 4))


def test_lint_refuses_an_env_secret_that_is_not_declared_and_other_roots(tmp_path: Path) -> None:
    tools = ("  leaky:\n    description: Uses names it may not.\n"
             "    shell:\n      cmd: 'echo \"$T\"'\n"
             "      env: {T: '{{ secrets.NOPE }}', U: '{{ work.text }}'}\n      cwd: '{{ state.x }}'\n"
             "  upward:\n    description: Runs above the workspace.\n    shell: {cmd: pwd, cwd: ../up}\n")
    path = tmp_path / "loop.yaml"
    path.write_text(loop_text("tools: [leaky, upward]\nmax_turns: 3", tools))
    from loopdsl.lint.pipeline import lint_file

    found = lint_file(path)
    rules = sorted((d.rule, d.message) for d in found if "leaky" in d.message)
    assert [d.rule for d in found if "../up" in d.message] == ["cwd-outside-workspace"]
    assert any(rule == "unknown-secret" and "NOPE" in message for rule, message in rules), rules
    assert sum(1 for rule, _m in rules if rule == "tool-template") == 2, rules
