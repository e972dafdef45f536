"""`loopdsl run` and friends as a user meets them: real files, exit codes and messages. The
loops here are shell-only, so no subprocess pays for importing LiteLLM. The commands run
in-process (tests/cli_in_process.py: the same exit codes and output) but for the first test's,
a real `python -m loopdsl` subprocess.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from cli_in_process import cli_in_process
from cli_forked import loopdsl_command

DATA = Path(__file__).parents[1] / "data" / "runs"
TYPED = DATA / "typed_inputs.yaml"
CHECKPOINT = DATA / "checkpoint.yaml"
BROKEN = DATA / "lint_errors.yaml"


def loopdsl(*args: str, cwd: Path, real: bool = False) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "LOOPDSL_STORE"}
    env["LOOPDSL_USER"] = "cli-test"
    if not real:
        return cli_in_process(args, cwd, env, only_env=True)
    return subprocess.run([*loopdsl_command(), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120, input="")


def assert_clean_usage_error(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr


# ---------------------------------------------------------------- inputs


def test_typed_inputs_json_events_and_exit_0(tmp_path: Path) -> None:
    proc = loopdsl("run", str(TYPED), "--input", "count=3", "--input", "name=a b;c", "--input", "flag=yes",
                   "--json", "--store", str(tmp_path / "store"), cwd=tmp_path, real=True)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    events = [json.loads(line) for line in lines]  # every line is one JSON object
    assert all(isinstance(e, dict) and "type" in e for e in events)
    summary = events[-1]
    assert summary["type"] == "summary" and summary["status"] == "completed"
    assert summary["outputs"] == {"described": "3|a b;c|true|12"}
    assert [e["state"] for e in events if e["type"] == "enter"] == ["finish"]
    assert (tmp_path / "typed.txt").read_text() == "3|a b;c|true|12"


def test_inputs_file_and_quiet(tmp_path: Path) -> None:
    inputs = tmp_path / "inputs.yaml"
    inputs.write_text("count: 5\nname: from-file\nratio: 0.5\n")
    proc = loopdsl("run", str(TYPED), "--inputs", str(inputs), "--quiet", "--store", str(tmp_path / "store"),
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "" and proc.stderr == ""  # --quiet: nothing but the exit code
    assert (tmp_path / "typed.txt").read_text() == "5|from-file|false|0.5"


def test_a_wrong_value_in_an_inputs_file_names_the_file(tmp_path: Path) -> None:
    inputs = tmp_path / "inputs.yaml"
    for text, expected in (("count: three\n", "inputs.yaml: input 'count' must be an integer, got str 'three'"),
                           ("count: 2\ncuont: 3\n", "inputs.yaml: loop 'typed-inputs' has no input 'cuont'; did you mean 'count'?"),
                           ("count: 0\n", "inputs.yaml: input 'count' must be at least 1")):
        inputs.write_text(text)
        for mode in ((), ("--dry-run",)):
            proc = loopdsl("run", str(TYPED), "--inputs", "inputs.yaml", *mode, "--store", str(tmp_path / "store"),
                           cwd=tmp_path)
            assert_clean_usage_error(proc)
            assert expected in proc.stderr, proc.stderr
    # An --input given too wins over the file's value, as before.
    inputs.write_text("count: three\n")
    proc = loopdsl("run", str(TYPED), "--inputs", "inputs.yaml", "--input", "count=2", "--store", str(tmp_path / "store"),
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    # A wrong --input is not blamed on the file.
    inputs.write_text("name: x\n")
    proc = loopdsl("run", str(TYPED), "--inputs", "inputs.yaml", "--input", "count=0", "--store", str(tmp_path / "store"),
                   cwd=tmp_path)
    assert_clean_usage_error(proc)
    assert "inputs.yaml" not in proc.stderr and "'count' must be at least 1" in proc.stderr


def test_bad_integer_names_the_input(tmp_path: Path) -> None:
    proc = loopdsl("run", str(TYPED), "--input", "count=three", "--store", str(tmp_path / "store"), cwd=tmp_path)
    assert_clean_usage_error(proc)
    assert "count" in proc.stderr and "integer" in proc.stderr and "three" in proc.stderr
    assert not (tmp_path / "typed.txt").exists()


def test_input_out_of_range_and_missing_required(tmp_path: Path) -> None:
    low = loopdsl("run", str(TYPED), "--input", "count=0", "--store", str(tmp_path / "store"), cwd=tmp_path)
    assert_clean_usage_error(low)
    assert "count" in low.stderr and "at least 1" in low.stderr
    missing = loopdsl("run", str(TYPED), "--store", str(tmp_path / "store"), cwd=tmp_path)
    assert_clean_usage_error(missing)
    assert "'count' is required" in missing.stderr


def test_unknown_input_suggests_the_right_name(tmp_path: Path) -> None:
    proc = loopdsl("run", str(TYPED), "--input", "count=1", "--input", "nmae=x", "--store", str(tmp_path / "store"),
                   cwd=tmp_path)
    assert_clean_usage_error(proc)
    assert "nmae" in proc.stderr and "did you mean 'name'" in proc.stderr


# ---------------------------------------------------------------- exit codes


def test_failed_run_exits_1(tmp_path: Path) -> None:
    loop = tmp_path / "fails.yaml"
    loop.write_text(textwrap.dedent("""\
        loopdsl: 1
        name: fails
        start: boom
        states:
          boom: {shell: "echo broken >&2; exit 5", next: done}
          done: {end: completed}
        """))
    proc = loopdsl("run", str(loop), "--store", str(tmp_path / "store"), cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "failed" in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr


def test_checkpoint_waits_exit_4_then_approve_and_resume(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    first = loopdsl("run", str(CHECKPOINT), "--json", "--store", store, cwd=tmp_path)
    assert first.returncode == 4, first.stderr
    summary = json.loads(first.stdout.splitlines()[-1])
    assert summary["status"] == "waiting"
    run_id = summary["run_id"]
    assert any(json.loads(line)["type"] == "waiting" for line in first.stdout.splitlines())
    approved = loopdsl("approve", run_id, "--comment", "ship it", "--store", store, cwd=tmp_path)
    assert approved.returncode == 0, approved.stderr
    assert "approve" in approved.stdout and "cli-test" in approved.stdout
    resumed = loopdsl("resume", run_id, "--json", "--store", store, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    final = json.loads(resumed.stdout.splitlines()[-1])
    assert final["status"] == "completed"
    assert final["outputs"] == {"decided": "approve by cli-test: ship it"}
    assert (tmp_path / "shipped.txt").exists()


def test_missing_script_file_is_a_usage_error(tmp_path: Path) -> None:
    proc = loopdsl("run", str(TYPED), "--input", "count=1", "--script", str(tmp_path / "nope.yaml"), cwd=tmp_path)
    assert_clean_usage_error(proc)
    assert "nope.yaml" in proc.stderr


def test_missing_loop_file_is_a_usage_error(tmp_path: Path) -> None:
    proc = loopdsl("run", str(tmp_path / "absent.yaml"), cwd=tmp_path)
    assert_clean_usage_error(proc)
    assert "absent.yaml" in proc.stderr


def test_lint_errors_exit_2_with_diagnostics(tmp_path: Path) -> None:
    proc = loopdsl("run", str(BROKEN), "--store", str(tmp_path / "store"), cwd=tmp_path)
    assert_clean_usage_error(proc)
    # path:line:col: severity: message [rule]
    assert f"{BROKEN}:" in proc.stderr
    assert "error:" in proc.stderr and "[" in proc.stderr
    assert "finsh" in proc.stderr and "did you mean" in proc.stderr
    assert not (tmp_path / "store").exists()  # nothing ran, no run was recorded


# ---------------------------------------------------------------- graph


def test_graph_mermaid_with_guards_and_dot(tmp_path: Path) -> None:
    mermaid = loopdsl("graph", str(CHECKPOINT), cwd=tmp_path)
    assert mermaid.returncode == 0, mermaid.stderr
    assert "stateDiagram-v2" in mermaid.stdout
    assert "ask --> ship: route [ask.decision == 'approve']" in mermaid.stdout
    assert "ask --> stop: route\n" in mermaid.stdout
    assert "[*] --> ask" in mermaid.stdout
    dot = loopdsl("graph", str(CHECKPOINT), "--format", "dot", cwd=tmp_path)
    assert dot.returncode == 0, dot.stderr
    assert dot.stdout.lstrip().startswith("digraph")
    assert "\"ask\" -> \"ship\" [label=\"route [ask.decision == 'approve']\"]" in dot.stdout


@pytest.mark.parametrize("command", ["graph", "run"])
def test_commands_report_lint_errors_the_same_way(command: str, tmp_path: Path) -> None:
    proc = loopdsl(command, str(BROKEN), "--store", str(tmp_path / "s"), cwd=tmp_path) if command == "run" else \
        loopdsl(command, str(BROKEN), cwd=tmp_path)
    assert_clean_usage_error(proc)
    assert "unknown" in proc.stderr.lower() or "did you mean" in proc.stderr


def test_a_reply_script_key_that_names_no_state_is_refused_before_the_run(tmp_path: Path) -> None:
    (tmp_path / "child.yaml").write_text(textwrap.dedent("""\
        loopdsl: 1
        name: child
        models: {m: {model: openai/gpt-4o-mini, max_tokens: 20}}
        start: summarize
        states:
          summarize: {llm: {model: m, prompt: "sum"}, next: done}
          done: {end: completed}
        """))
    (tmp_path / "parent.yaml").write_text(textwrap.dedent("""\
        loopdsl: 1
        name: parent
        models: {m: {model: openai/gpt-4o-mini, max_tokens: 20}}
        start: ask
        states:
          ask: {llm: {model: m, prompt: "hi"}, next: sub}
          sub: {loop: child.yaml, next: done}
          done: {end: completed}
        """))
    replies = tmp_path / "replies.yaml"
    replies.write_text("ask:\n  - text: one\nsumarize:\n  - text: two\n")
    proc = loopdsl("run", "parent.yaml", "--script", "replies.yaml", "--store", str(tmp_path / "store"), cwd=tmp_path)
    assert_clean_usage_error(proc)
    assert ("replies.yaml: 'sumarize' is not a state of loop 'parent' or of its sub-loops (did you mean \"summarize\"?)"
            in proc.stderr), proc.stderr
    listed = loopdsl("runs", "--store", str(tmp_path / "store"), "--json", cwd=tmp_path)
    assert listed.returncode == 0 and json.loads(listed.stdout) == [], listed.stdout  # no run was started
    # On Temporal too, before the server is asked anything (none listens here).
    remote = loopdsl("run", "parent.yaml", "--script", "replies.yaml", "--temporal", "127.0.0.1:9", cwd=tmp_path)
    assert_clean_usage_error(remote)
    assert "'sumarize' is not a state of loop 'parent'" in remote.stderr, remote.stderr
    # A sub-loop's state is one the script may answer for.
    replies.write_text("ask:\n  - text: one\nsummarize:\n  - text: two\n")
    proc = loopdsl("run", "parent.yaml", "--script", "replies.yaml", "--store", str(tmp_path / "store"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr


def test_detach_without_temporal_and_json_past_a_bound_are_explained(tmp_path: Path) -> None:
    (tmp_path / "arr.yaml").write_text(textwrap.dedent("""\
        loopdsl: 1
        name: arr
        inputs: {arr: {type: array}}
        start: a
        states:
          a: {shell: "true", next: done}
          done: {end: completed}
        """))
    detached = loopdsl("run", "arr.yaml", "-i", "arr=[]", "--detach", "--no-store", cwd=tmp_path)
    assert_clean_usage_error(detached)  # it ran in the foreground, silently
    assert "--detach is for runs on Temporal" in detached.stderr
    digits = "9" * 5000
    big = loopdsl("run", "arr.yaml", "-i", f"arr=[{digits}]", "--no-store", cwd=tmp_path)
    assert_clean_usage_error(big)  # it said "must be an array" of a JSON array, and printed every digit
    assert "input 'arr': a number has 5,000 digits, more than the 1,000 allowed" in big.stderr, big.stderr
    assert digits[:200] not in big.stderr


def test_a_file_that_is_no_loop_is_called_so_not_sent_to_lint(tmp_path: Path) -> None:
    """The hint was `loopdsl lint FILE`, which passes over a file without `loopdsl:` (as
    pre-commit needs) and said "0 files"."""
    (tmp_path / "config.yaml").write_text("foo: 1\n")
    for command in ("cost", "schedule", "run", "graph"):
        done = loopdsl(command, "config.yaml", cwd=tmp_path)
        assert_clean_usage_error(done)
        assert "missing the required keys `loopdsl`" in done.stderr  # the findings, each command alike
        assert "loopdsl lint config.yaml" not in done.stderr
        if command in ("cost", "schedule"):  # those that sum up with a line of their own
            assert "config.yaml is not a loop file: it has no `loopdsl:` or `states:` key" in done.stderr, done.stderr
    (tmp_path / "broken.yaml").write_text("loopdsl: 1\nname: b\n")  # a loop with errors: lint shows them
    done = loopdsl("cost", "broken.yaml", cwd=tmp_path)
    assert_clean_usage_error(done)
    assert "hint: fix them first: `loopdsl lint broken.yaml`" in done.stderr


def test_a_reply_script_given_to_resume_is_checked_as_at_the_start(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    waiting = loopdsl("run", str(CHECKPOINT), "--store", store, cwd=tmp_path)
    assert waiting.returncode == 4, waiting.stderr
    run_id = json.loads(loopdsl("runs", "--store", store, "--json", cwd=tmp_path).stdout)[0]["run_id"]
    (tmp_path / "typo.yaml").write_text("no_such_state:\n  - text: x\n")
    resumed = loopdsl("resume", run_id, "--script", "typo.yaml", "--store", store, cwd=tmp_path)
    assert_clean_usage_error(resumed)
    assert "'no_such_state' is not a state of loop" in resumed.stderr, resumed.stderr
