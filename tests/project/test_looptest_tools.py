"""Loop tests of agents: tool calls asserted per agent state, and tools stubbed so that
side-effecting and MCP tools run offline (runtime/tools/stubs.py, project/looptest.py).

The loop (tests/data/project/looptest_tools/triage.yaml) reads an issue from an MCP server
whose command does not exist, so a test that starts it could not pass, and posts a note
with a shell tool that appends to sent.txt, so a stub that lets it run is visible.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import loopdsl
from loopdsl.adapters.litellm import ScriptedProvider
from loopdsl.cli import cli
from loopdsl.project.testfile import TestFileError, load_tests

DATA = Path(__file__).parents[1] / "data" / "project" / "looptest_tools"
TURNS = [
    {"tool_calls": [{"name": "issues__get_issue", "args": {"number": 7}}]},
    {"tool_calls": [{"name": "notify", "args": {"text": "Issue 7: the app crashes on start"}},
                    {"name": "list_files", "args": {}}]},
    "Told the team about issue 7.",
]
ISSUE = {"number": 7, "title": "crash on start", "state": "open"}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    target = tmp_path / "project"
    shutil.copytree(DATA, target)
    return target


def write_test(project: Path, tools: dict[str, Any], expect: dict[str, Any], turns: list[Any] = TURNS) -> Path:
    path = project / "triage.test.yaml"
    path.write_text(json.dumps({"loop": "triage.yaml", "script": {"triage": turns}, "tools": tools, "expect": expect}))
    return path


def run_cli(*args: str) -> tuple[int, list[str]]:
    result = CliRunner().invoke(cli, ["test", *args])
    return result.exit_code, result.stdout.strip().splitlines()


def test_stubbed_tools_run_offline_and_their_calls_are_asserted(project: Path) -> None:
    test = write_test(project, {"issues__get_issue": {"result": ISSUE}, "notify": {"result": "posted"}}, {
        "status": "completed",
        "tool_calls": {"triage": [{"name": "issues__get_issue", "ok": True, "args": {"number": 7}},
                                  {"name": "notify", "args": {"text": "Issue 7: the app crashes on start"}},
                                  "list_files"]}})
    code, lines = run_cli(str(test), "--keep")
    assert code == 0, lines
    assert lines[0].startswith("PASS") and lines[-1] == "1 passed, 0 failed"
    kept = Path(lines[1].split("workspace kept in ")[1].rstrip(")"))
    try:
        assert not (kept / "work" / "sent.txt").exists()  # the stubbed notify did not run
    finally:
        shutil.rmtree(kept)


def run_with_stubs(project: Path, stubs: dict[str, Any], turns: list[Any]) -> tuple[Any, list[Any]]:
    asked: list[Any] = []

    class Recording(ScriptedProvider):
        async def complete(self, request: Any, *, state: str, attempt: int | None = None) -> Any:
            asked.append(request)
            return await super().complete(request, state=state, attempt=attempt)

    provider = Recording.from_data({"triage": turns}, "<test>")
    result = loopdsl.run(project / "triage.yaml", provider=provider, workdir=project, tool_stubs=stubs)
    return result, asked


def test_the_model_reads_the_stubbed_result_and_arguments_are_still_checked(project: Path) -> None:
    turns = [{"tool_calls": [{"name": "issues__get_issue", "args": {"number": 7}},
                             {"name": "notify", "args": {}},
                             {"name": "notify", "args": {"text": "hi", "channel": "all"}}]},
             "done"]
    result, asked = run_with_stubs(project, {"issues__get_issue": {"result": ISSUE}, "notify": {"result": "posted"}},
                                   turns)
    assert result.status == "completed", result.state.error
    offered = {tool["function"]["name"]: tool["function"] for tool in asked[0].tools}
    assert set(offered) == {"issues__get_issue", "notify", "list_files"}
    assert offered["notify"]["parameters"]["required"] == ["text"]  # the real definition is offered
    answers = [m["content"] for m in asked[1].messages if m["role"] == "tool"]
    assert json.loads(answers[0]) == ISSUE
    assert "invalid arguments" in answers[1] and "text" in answers[1]  # a stub checks like the tool
    assert "invalid arguments" in answers[2] and "channel" in answers[2]
    assert not (project / "sent.txt").exists()


def test_a_stubbed_error_fails_the_call_and_unstubbed_tools_run_for_real(project: Path) -> None:
    result, asked = run_with_stubs(project, {"issues__get_issue": {"error": "issue 7 is private"}}, TURNS)
    assert result.status == "completed", result.state.error
    answers = [m["content"] for m in asked[2].messages if m["role"] == "tool"]
    assert json.loads(answers[0]) == {"error": "issue 7 is private"}
    assert (project / "sent.txt").read_text() == "Issue 7: the app crashes on start\n"  # notify really ran
    calls = [(e["name"], e["ok"]) for e in result.events if e["type"] == "tool_call"]
    assert calls == [("issues__get_issue", False), ("notify", True), ("list_files", True)]


def test_tool_call_expectations_that_miss_are_reported(project: Path) -> None:
    stubs = {"issues__get_issue": {"error": "issue 7 is private"}, "notify": {"result": "posted"}}
    cases = {
        "count": ({"triage": ["issues__get_issue", "notify"]},
                  "tool_calls.triage: expected 2 call(s) (issues__get_issue, notify), got 3 "
                  "(issues__get_issue, notify, list_files)"),
        "name": ({"triage": ["issues__get_issue", "list_files", "notify"]},
                 "tool_calls.triage[2]: expected list_files, got notify (calls: issues__get_issue, notify, list_files)"),
        "ok": ({"triage": [{"name": "issues__get_issue", "ok": True}, "notify", "list_files"]},
               "tool_calls.triage[1]: issues__get_issue: expected ok true, got false (issue 7 is private) "
               "(calls: issues__get_issue, notify, list_files)"),
        "error": ({"triage": [{"name": "issues__get_issue", "error": "rate limit"}, "notify", "list_files"]},
                  "tool_calls.triage[1]: issues__get_issue: error 'issue 7 is private' does not contain /rate limit/ "
                  "(calls: issues__get_issue, notify, list_files)"),
        "args": ({"triage": ["issues__get_issue", {"name": "notify", "args": {"text": "other"}}, "list_files"]},
                 "tool_calls.triage[2]: notify: expected args.text = 'other', got 'Issue 7: the app crashes on start' "
                 "(calls: issues__get_issue, notify, list_files)"),
        "state": ({"review": ["branch_diff"]}, "tool_calls.review: expected 1 call(s) (branch_diff), got 0 (none)"),
    }
    for name, (expected, reason) in cases.items():
        code, lines = run_cli(str(write_test(project, stubs, {"status": "completed", "tool_calls": expected})))
        assert code == 1, name
        assert [line.strip() for line in lines[1:-1]] == [reason], name


@pytest.mark.parametrize("tools, expect, message", [
    ({"notify": {"result": "ok", "error": "no"}}, {}, "tools.notify"),
    ({"notify": {}}, {}, "tools.notify"),
    ({"no such/name": {"result": 1}}, {}, "`no such/name` is not valid"),
    ({}, {"tool_calls": {"triage": [{"name": "notify", "error": "("}]}}, "is not a valid regular expression"),
    ({}, {"tool_calls": {"triage": [{"name": "notify", "okay": True}]}}, "okay"),
])
def test_stub_and_expectation_mistakes_are_test_file_errors(project: Path, tools: dict[str, Any],
                                                             expect: dict[str, Any], message: str) -> None:
    path = project / "bad.test.yaml"
    path.write_text(json.dumps({"loop": "triage.yaml", "tools": tools, "expect": expect}, indent=1))
    with pytest.raises(TestFileError) as info:
        load_tests(path)
    assert message in str(info.value)
    assert info.value.line > 1


@pytest.mark.parametrize("stub", [{}, {"result": 1, "error": "x"}, {"error": ""}, {"answer": 1}, "posted"])
def test_a_malformed_stub_from_python_is_a_usage_error(project: Path, stub: Any) -> None:
    from loopdsl.api.runs import UsageError

    with pytest.raises(UsageError) as info:
        run_with_stubs(project, {"notify": stub}, TURNS)
    assert "the stub of tool 'notify'" in info.value.message
