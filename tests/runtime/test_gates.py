from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import pytest

from loopdsl.runtime import gates as gates_module
from loopdsl.runtime.gates import OUTPUT_TAIL_BYTES, GateOutcome, GateRunner, strip_code_fence
from loopdsl.language.model import Gate, build_gate
from loopdsl.runtime.redaction import Redactor
from loopdsl.runtime.shell import ShellResult, run_command

SECRET = "Sup3r-Secret-Value-42"
ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "API_TOKEN": SECRET}


def gate(raw: Any, name: str | None = None) -> Gate:
    return build_gate(raw, ("test",), name=name)


def make_runner(cwd: Path, named: Mapping[str, Any] | None = None, run_shell: Any = run_command) -> GateRunner:
    return GateRunner(
        {key: gate(value, name=key) for key, value in (named or {}).items()},
        run_shell=run_shell,
        base_env=ENV,
        cwd=cwd,
        redactor=Redactor([SECRET]),
        secret_values=[SECRET],
    )


def run_gates(
    runner: GateRunner, raw_gates: Sequence[Any], context: Mapping[str, Any] | None = None,
    result: Mapping[str, Any] | None = None,
) -> list[GateOutcome]:
    return asyncio.run(runner.run([gate(g) for g in raw_gates], dict(context or {}), result))


def only(outcomes: list[GateOutcome]) -> GateOutcome:
    assert len(outcomes) == 1, outcomes
    return outcomes[0]


# ---------------------------------------------------------------- shell


def test_shell_gate_passes_on_exit_zero(tmp_path: Path) -> None:
    outcome = only(run_gates(make_runner(tmp_path), [{"shell": "true", "name": "ok"}]))
    assert (outcome.name, outcome.passed, outcome.kind) == ("ok", True, "shell")
    assert outcome.duration_s >= 0


def test_shell_gate_failure_gives_exit_code_and_output(tmp_path: Path) -> None:
    script = "echo 'collected 3 items'; echo 'E   assert 1 == 2' >&2; exit 4"
    outcome = only(run_gates(make_runner(tmp_path), [{"shell": script, "name": "tests-pass"}]))
    assert not outcome.passed
    assert "shell gate 'tests-pass' failed: exit code 4 (passes on 0)" in outcome.message
    assert "E   assert 1 == 2" in outcome.message
    assert "collected 3 items" in outcome.message


def test_shell_gate_ok_exit(tmp_path: Path) -> None:
    raw = {"shell": {"cmd": "exit 1", "ok_exit": [0, 1]}}
    assert only(run_gates(make_runner(tmp_path), [raw])).passed
    raw = {"shell": {"cmd": "exit 2", "ok_exit": [0, 1]}}
    outcome = only(run_gates(make_runner(tmp_path), [raw]))
    assert not outcome.passed and "exit code 2 (passes on 0, 1)" in outcome.message


def test_shell_gate_message_keeps_only_the_tail_of_long_output(tmp_path: Path) -> None:
    script = "for i in $(seq 1 5000); do echo \"line $i\"; done; exit 1"
    outcome = only(run_gates(make_runner(tmp_path), [{"shell": script}]))
    assert "line 5000" in outcome.message
    assert "line 1\n" not in outcome.message
    assert len(outcome.message.encode()) < OUTPUT_TAIL_BYTES + 300


def test_shell_gate_placeholders_are_data_not_code(tmp_path: Path) -> None:
    (tmp_path / "a file.txt").write_text("x")
    runner = make_runner(tmp_path)
    assert only(run_gates(runner, [{"shell": "test -f {{ name }}"}], {"name": "a file.txt"})).passed
    hostile = {"name": "x; touch pwned"}
    outcome = only(run_gates(runner, [{"shell": "test -f {{ name }}"}], hostile))
    assert not outcome.passed
    assert not (tmp_path / "pwned").exists()


def test_shell_gate_argv_cwd_and_env(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "inner.txt").write_text("x")
    code = "import os, sys; sys.exit(0 if sys.argv[1] == 'a b' and os.environ['MODE'] == 'fast' else 9)"
    raw = {"shell": {"argv": [sys.executable, "-c", code, "{{ value }}"], "cwd": "{{ folder }}",
                     "env": {"MODE": "{{ mode }}"}}}
    runner = make_runner(tmp_path)
    context = {"value": "a b", "folder": "sub", "mode": "fast"}
    assert only(run_gates(runner, [raw], context)).passed
    outcome = only(run_gates(runner, [raw], {**context, "mode": "slow"}))
    assert not outcome.passed and "exit code 9" in outcome.message
    in_cwd = {"shell": {"cmd": "test -f inner.txt", "cwd": "sub"}}
    assert only(run_gates(runner, [in_cwd])).passed


def test_shell_gate_timeout_stops_the_command(tmp_path: Path) -> None:
    started = time.monotonic()
    outcome = only(run_gates(make_runner(tmp_path), [{"shell": "echo begun; sleep 30", "timeout": "300ms",
                                                      "name": "slow"}]))
    assert time.monotonic() - started < 5
    assert not outcome.passed
    assert "shell gate 'slow' timed out after 0.3s" in outcome.message
    assert "begun" in outcome.message


def test_shell_gate_output_and_message_are_redacted(tmp_path: Path) -> None:
    outcome = only(run_gates(make_runner(tmp_path), [{"shell": 'echo "token is $API_TOKEN" >&2; exit 1'}]))
    assert not outcome.passed
    assert SECRET not in outcome.message
    assert "token is ***" in outcome.message


def test_shell_gate_render_error_fails_the_gate(tmp_path: Path) -> None:
    outcome = only(run_gates(make_runner(tmp_path), [{"shell": "test -f {{ missing_name }}"}]))
    assert not outcome.passed
    assert "missing_name" in outcome.message


def test_shell_gate_with_a_value_too_big_for_one_env_variable(tmp_path: Path) -> None:
    raw = {"shell": "test \"$(printf %s {{ big }} | wc -c)\" -eq 300000"}
    assert only(run_gates(make_runner(tmp_path), [raw], {"big": "x" * 300_000})).passed


def test_shell_gate_that_does_not_compile_fails_with_the_reason(tmp_path: Path) -> None:
    outcome = only(run_gates(make_runner(tmp_path), [{"shell": "echo '{{ name }}'", "name": "quoted"}],
                             {"name": "x"}))
    assert not outcome.passed and outcome.kind == "shell"
    assert outcome.message.startswith("shell gate 'quoted': ") and "single quotes" in outcome.message


def test_timeout_on_a_ref_overrides_the_named_gate(tmp_path: Path) -> None:
    calls: list[dict[str, Any]] = []

    async def fake_shell(**kwargs: Any) -> ShellResult:
        calls.append(kwargs)
        return ShellResult(stdout="", stderr="", exit_code=0, duration_s=0.0)

    runner = make_runner(tmp_path, {"quick": {"shell": "true", "timeout": "5m"}}, run_shell=fake_shell)
    assert run_gates(runner, [{"ref": "quick", "timeout": "2s"}, {"ref": "quick"}])[0].passed
    assert [c["timeout"] for c in calls] == [2.0, 300.0]
    assert calls[0]["env"]["API_TOKEN"] == SECRET and calls[0]["cwd"] == tmp_path


# ---------------------------------------------------------------- expr


def test_expr_gate(tmp_path: Path) -> None:
    runner = make_runner(tmp_path)
    context = {"draft": {"json": [1, 2]}}
    assert only(run_gates(runner, [{"expr": "draft.json | length > 0", "name": "non_empty"}], context)).passed
    outcome = only(run_gates(runner, [{"expr": "draft.json | length > 5", "name": "big"}], context))
    assert not outcome.passed and outcome.kind == "expr"
    assert "draft.json | length > 5" in outcome.message and "False" in outcome.message


def test_expr_gate_that_raises_fails_with_the_error(tmp_path: Path) -> None:
    outcome = only(run_gates(make_runner(tmp_path), [{"expr": "nothing_here.field == 1"}], {}))
    assert not outcome.passed
    assert "nothing_here" in outcome.message


def test_compiled_once_per_gate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    real = gates_module.templates.compile_expression

    def counting(source: str) -> Any:
        calls.append(source)
        return real(source)

    monkeypatch.setattr(gates_module.templates, "compile_expression", counting)
    runner = make_runner(tmp_path)
    the_gate = gate({"expr": "n > 1"})
    for n in (2, 3, 0):
        asyncio.run(runner.run([the_gate], {"n": n}, None))
    assert calls == ["n > 1"]
    # Another runner has its own cache.
    asyncio.run(make_runner(tmp_path).run([the_gate], {"n": 2}, None))
    assert calls == ["n > 1", "n > 1"]


# ---------------------------------------------------------------- json_schema

SCHEMA = {"type": "array", "items": {"type": "object", "required": ["title", "priority"],
                                     "properties": {"priority": {"type": "integer"}}}}


def test_json_schema_gate_passes(tmp_path: Path) -> None:
    result = {"text": "...", "json": [{"title": "a", "priority": 1}]}
    assert only(run_gates(make_runner(tmp_path), [{"json_schema": SCHEMA}], result=result)).passed


def test_json_schema_gate_names_path_and_problem(tmp_path: Path) -> None:
    result = {"json": [{"title": "a", "priority": 1}, {"title": "b", "priority": "high"}, {"priority": 2}]}
    outcome = only(run_gates(make_runner(tmp_path), [{"json_schema": SCHEMA, "name": "shape"}], result=result))
    assert not outcome.passed and outcome.kind == "json_schema"
    assert "$[1].priority: 'high' is not of type 'integer'" in outcome.message
    assert "$[2]: 'title' is a required property" in outcome.message


@pytest.mark.parametrize(("result", "needle"), [({"text": "hi", "json": None}, "json is null"),
                                                (None, "move it to `after` gates")])
def test_json_schema_gate_without_json_fails(tmp_path: Path, result: Any, needle: str) -> None:
    outcome = only(run_gates(make_runner(tmp_path), [{"json_schema": SCHEMA}], result=result))
    assert not outcome.passed and needle in outcome.message


def test_json_schema_gate_with_an_invalid_schema(tmp_path: Path) -> None:
    outcome = only(run_gates(make_runner(tmp_path), [{"json_schema": {"type": "nope"}}], result={"json": 1}))
    assert not outcome.passed and "invalid schema" in outcome.message


# ---------------------------------------------------------------- built-ins


def test_strip_code_fence() -> None:
    assert strip_code_fence("```python\nx = 1\n```") == "x = 1"
    assert strip_code_fence("  ```\nx = 1\ny = 2\n```\n") == "x = 1\ny = 2"
    assert strip_code_fence("x = 1") == "x = 1"
    assert strip_code_fence("see:\n```\nx\n```") == "see:\n```\nx\n```"


def test_python_syntax_on_llm_text_with_a_fence(tmp_path: Path) -> None:
    result = {"text": "```python\ndef f(x):\n    return x + 1\n```", "json": None}
    outcome = only(run_gates(make_runner(tmp_path), ["python_syntax"], result=result))
    assert outcome.passed and outcome.kind == "builtin" and outcome.name == "python_syntax"


def test_python_syntax_failure_gives_line_and_error(tmp_path: Path) -> None:
    result = {"text": "import os\n\ndef f(x)\n    return x\n"}
    outcome = only(run_gates(make_runner(tmp_path), ["python_syntax"], result=result))
    assert not outcome.passed
    assert "line 3" in outcome.message and "def f(x)" in outcome.message
    assert "expected ':'" in outcome.message


def test_python_syntax_on_shell_stdout(tmp_path: Path) -> None:
    runner = make_runner(tmp_path)
    assert only(run_gates(runner, ["python_syntax"], result={"stdout": "x = [1, 2]\n", "exit_code": 0})).passed
    assert not only(run_gates(runner, ["python_syntax"], result={"stdout": "x = [1, 2\n", "exit_code": 0})).passed


def test_builtin_with_value_in_before_gates(tmp_path: Path) -> None:
    runner = make_runner(tmp_path)
    raw = {"builtin": "python_syntax", "value": "{{ code }}"}
    assert only(run_gates(runner, [raw], {"code": "print('hi')"})).passed
    outcome = only(run_gates(runner, [raw], {"code": "print('hi'"}))
    assert not outcome.passed and "line 1" in outcome.message


def test_builtin_without_value_in_before_gates_says_what_to_do(tmp_path: Path) -> None:
    outcome = only(run_gates(make_runner(tmp_path), ["no_secrets"], result=None))
    assert not outcome.passed and "`value`" in outcome.message


def test_no_secrets_names_the_kind_never_the_value(tmp_path: Path) -> None:
    token = "ghp_" + "Qw3r" * 9
    runner = make_runner(tmp_path)
    outcome = only(run_gates(runner, ["no_secrets"], result={"text": f"config:\n  token = {token}\n"}))
    assert not outcome.passed
    assert "GitHub token on line 2" in outcome.message
    assert token not in outcome.message and "Qw3r" not in outcome.message
    declared = only(run_gates(runner, ["no_secrets"], result={"text": f"key={SECRET}"}))
    assert not declared.passed and "declared secret" in declared.message and SECRET not in declared.message
    clean = only(run_gates(runner, ["no_secrets"], result={"text": "Send password reset instructions."}))
    assert clean.passed


def test_unknown_builtin(tmp_path: Path) -> None:
    outcome = only(run_gates(make_runner(tmp_path), [{"builtin": "spell_check"}], result={"text": ""}))
    assert not outcome.passed and "python_syntax, no_secrets" in outcome.message


# ---------------------------------------------------------------- refs and order


def test_ref_resolves_named_gates_and_chains(tmp_path: Path) -> None:
    named = {"tests-pass": {"shell": "test -f ok"}, "alias": {"ref": "tests-pass"}}
    runner = make_runner(tmp_path, named)
    outcome = only(run_gates(runner, [{"ref": "alias"}]))
    assert not outcome.passed and outcome.name == "alias" and outcome.kind == "shell"
    (tmp_path / "ok").write_text("")
    assert only(run_gates(runner, ["tests-pass"])).passed


def test_unknown_ref_suggests_a_name(tmp_path: Path) -> None:
    runner = make_runner(tmp_path, {"tests-pass": {"shell": "true"}})
    outcome = only(run_gates(runner, [{"ref": "test-pass"}]))
    assert not outcome.passed
    assert outcome.message == "unknown gate 'test-pass'; did you mean 'tests-pass'?"
    bare = only(run_gates(make_runner(tmp_path), [{"ref": "lint"}]))
    assert "no named gates are defined" in bare.message


def test_ref_cycle_fails_instead_of_looping(tmp_path: Path) -> None:
    runner = make_runner(tmp_path, {"a": {"ref": "b"}, "b": {"ref": "a"}})
    outcome = only(run_gates(runner, [{"ref": "a"}]))
    assert not outcome.passed and "cycle: a -> b -> a" in outcome.message


def test_gates_run_in_order_and_stop_at_the_first_failure(tmp_path: Path) -> None:
    later = tmp_path / "later-gate-ran"
    raw_gates = [
        {"shell": f"touch {tmp_path / 'first'}", "name": "first"},
        {"expr": "false", "name": "second"},
        {"shell": f"touch {later}", "name": "third"},
    ]
    outcomes = run_gates(make_runner(tmp_path), raw_gates)
    assert [(o.name, o.passed) for o in outcomes] == [("first", True), ("second", False)]
    assert (tmp_path / "first").exists()
    assert not later.exists()


def test_all_passing_gates_run(tmp_path: Path) -> None:
    outcomes = run_gates(make_runner(tmp_path), [{"expr": "true"}, {"shell": "true"}, {"expr": "1"}])
    assert [o.passed for o in outcomes] == [True, True, True]
    assert run_gates(make_runner(tmp_path), []) == []
