"""Hostile model replies (huge integers, deep nesting) are `parse` failures, never crashes:
`loopdsl run` with scripted replies, in-process (tests/cli_in_process.py, where an exception
that is not an exit fails the test), and once as a real `python -m loopdsl` subprocess."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import loopdsl

from loopdsl.language import bounded_json
from loopdsl.language.user_schema import SchemaTimeout, ecma_pattern, schema_errors
from loopdsl.runtime.redaction import Redactor

sys.path.insert(0, str(Path(__file__).parents[1]))
from cli_in_process import cli_in_process  # noqa: E402
from cli_forked import loopdsl_command

LOOP = Path(__file__).parents[1] / "data" / "limits" / "json_reply.yaml"
SECRET = "sekrit-value-123"


def run_loop(tmp_path: Path, replies: list[str], *extra: str, process: bool = False) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "replies.json"
    script.write_text(json.dumps({"ask": replies}))
    args = ["run", str(LOOP), "--script", str(script), "--store", str(tmp_path / "store"), *extra]
    if not process:
        return cli_in_process(args, tmp_path, {"TOK": SECRET})
    env = {k: v for k, v in os.environ.items() if k != "LOOPDSL_STORE"}
    env["TOK"] = SECRET
    return subprocess.run([*loopdsl_command(), "run", str(LOOP), "--script", str(script),
                           "--store", str(tmp_path / "store"), *extra],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


HOSTILE = {
    "5000-digit integer": "1" * 5000,
    "100,000-deep array": "[" * 100_000 + "]" * 100_000,
    "600-deep array (the redactor walks it)": "[" * 600 + '"x"' + "]" * 600,
    "deep object": '{"a":' * 5000 + "1" + "}" * 5000,
    "infinity": "[1e999]",
}


@pytest.mark.parametrize("reply", list(HOSTILE.values()), ids=list(HOSTILE))
def test_hostile_reply_is_a_parse_failure_that_is_retried(tmp_path: Path, reply: str) -> None:
    proc = run_loop(tmp_path, [reply, '{"ok": 1}'], "--json")
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr
    events = [json.loads(line) for line in proc.stdout.splitlines()]
    retries = [e for e in events if e.get("type") == "retry"]
    assert [e["kind"] for e in retries] == ["parse"], retries


def test_only_hostile_replies_fail_the_run_cleanly(tmp_path: Path) -> None:
    proc = run_loop(tmp_path, ["[" * 100_000, "1" * 5000], process=True)
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-2000:])
    assert "internal error" not in proc.stderr
    assert "nests deeper than" in proc.stdout + proc.stderr or "digits" in proc.stdout + proc.stderr


def test_bounded_loads_limits() -> None:
    assert bounded_json.loads('{"a": [1, 2.5, "[[[["]}') == {"a": [1, 2.5, "[[[["]}
    assert bounded_json.loads("[" * 100 + "]" * 100) is not None
    # many brackets (past the count that skips the scan), but shallow: read
    assert len(bounded_json.loads("[" + "[1]," * 500 + "1]")) == 501
    # 101 deep, its brackets hidden among strings full of brackets: still refused
    with pytest.raises(bounded_json.JsonLimitError):
        bounded_json.loads("[" * 101 + '"{{{{"' + "]" * 101)
    for text in ("[" * 101 + "]" * 101, "9" * 1001, "-" + "9" * 1001, "NaN", "[-Infinity]", "1e400"):
        with pytest.raises(bounded_json.JsonLimitError):
            bounded_json.loads(text)
    with pytest.raises(json.JSONDecodeError):
        bounded_json.loads('{"a": ')


def test_redactor_walks_any_depth_without_recursion() -> None:
    value: object = SECRET
    for _ in range(50_000):
        value = [value]
    redacted = Redactor([SECRET]).redact_obj({"k": value})["k"]
    for _ in range(50_000):
        assert isinstance(redacted, list)
        redacted = redacted[0]
    assert redacted == "***"


def test_measure_counts_shared_parts_each_time() -> None:
    a = ["x" * 1000] * 10
    size, depth, walked = bounded_json.measure([[a] * 10] * 10, max_size=10**9)
    assert size > 1000 * 1000 and depth == 3 and walked == 2 * (10 + 10 + 10)  # each distinct list twice
    size, _, _ = bounded_json.measure([[a] * 10] * 10, max_size=5000)
    assert size > 5000


@pytest.mark.slow
def test_backtracking_schema_pattern_is_bounded_in_time(tmp_path: Path) -> None:
    """`^(a|a)*$` on 40 a's and a '!' takes hours in a backtracking engine; the check gives
    up at its deadline and the reply is a parse failure like any other."""
    loop = Path(__file__).parents[1] / "data" / "limits" / "schema_pattern.yaml"
    script = tmp_path / "replies.json"
    script.write_text(json.dumps({"ask": [json.dumps({"s": "a" * 40 + "!"}), '{"s": "aaaa"}']}))
    started = time.monotonic()
    proc = cli_in_process(["run", str(loop), "--script", str(script), "--store", str(tmp_path / "store"), "--json"],
                          tmp_path)
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    retries = [e for e in map(json.loads, proc.stdout.splitlines()) if e.get("type") == "retry"]
    assert len(retries) == 1 and retries[0]["kind"] == "parse" and "backtracks" in retries[0]["message"]
    assert elapsed < 120  # without the deadline: hours


def test_user_schema_patterns_are_ecma_and_bounded() -> None:
    name = {"type": "string", "pattern": "^[a-z]+$"}
    assert schema_errors(name, "abc") == []
    assert schema_errors(name, "abc\n") != []  # `$` is the end of the text, as in ECMA-262
    keys = {"type": "object", "patternProperties": {"^k$": {"type": "integer"}}, "additionalProperties": False}
    assert schema_errors(keys, {"k": 1}) == []
    assert len(schema_errors(keys, {"k\n": 1})) == 1
    started = time.monotonic()
    with pytest.raises(SchemaTimeout):
        schema_errors({"type": "string", "pattern": "^(a|a)*$"}, "a" * 40 + "!", timeout=0.5)
    assert time.monotonic() - started < 30
    assert ecma_pattern(r"^a$|[$]\$x$") == r"^a\Z|[$]\$x\Z"


@pytest.mark.parametrize("text", ["x: " + "[" * 3000 + "]" * 3000, "count: " + "{a: " * 2000 + "1" + "}" * 2000],
                         ids=["deep-list", "deep-map"])
def test_deep_inputs_file_is_a_usage_error(tmp_path: Path, text: str) -> None:
    inputs = tmp_path / "inputs.yaml"
    inputs.write_text(text + "\n")
    loop = Path(__file__).parents[1] / "data" / "runs" / "typed_inputs.yaml"
    proc = cli_in_process(["run", str(loop), "--inputs", str(inputs), "--store", str(tmp_path / "store")], tmp_path)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "nested deeper than" in proc.stderr and "internal error" not in proc.stderr


def test_a_set_value_too_big_to_print_fails_the_state_not_the_run(tmp_path: Path) -> None:
    """An integer past Python's 4,300-digit print limit would crash the store's encoder."""
    loop = tmp_path / "bigint.yaml"
    loop.write_text("loopdsl: 1\nname: bigint\nstart: a\nstates:\n  a:\n    set: {x: \"10 ** 5000\"}\n"
                    "    next: done\n  done:\n    end: completed\n")
    proc = cli_in_process(["run", str(loop), "--store", str(tmp_path / "store")], tmp_path)
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-2000:])
    assert "internal error" not in proc.stderr and "a power" in proc.stderr


def test_a_long_integer_input_is_stored_and_shown(tmp_path: Path) -> None:
    """What the store can write (an int of up to 4,300 digits) it reads back for `show`."""
    loop = tmp_path / "longint.yaml"
    loop.write_text("loopdsl: 1\nname: longint\ninputs:\n  n: {type: integer}\nstart: done\nstates:\n"
                    "  done:\n    end: completed\n")
    store = str(tmp_path / "store")
    run = cli_in_process(["run", str(loop), "--input", "n=" + "7" * 4000, "--store", store, "--json"], tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    run_id = json.loads(run.stdout.splitlines()[-1])["run_id"]
    shown = cli_in_process(["show", run_id, "--store", store, "--json"], tmp_path)
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert json.loads(shown.stdout)["run"]["inputs"]["n"] == int("7" * 4000)


def test_a_lone_surrogate_in_a_reply_is_replaced_and_every_view_of_the_run_works(tmp_path: Path) -> None:
    """`"\\ud800"` in a provider's JSON decodes to a string no UTF-8 stream takes: the run's
    end, `show` and `show --json` once died with an internal error, and a run that stored one
    could never be shown again (the stored record's, below, is planted)."""
    loop = tmp_path / "say.yaml"
    loop.write_text("loopdsl: 1\nname: say\nmodels:\n  m: {model: openai/gpt-4o-mini, max_tokens: 50}\n"
                    "outputs:\n  said: \"{{ talk.text }}\"\nstart: talk\nstates:\n"
                    "  talk: {llm: {model: m, prompt: hi}, next: done}\n  done: {end: completed}\n")
    script = tmp_path / "replies.json"
    script.write_text('{"talk": ["fin \\ud800 al"]}')  # a reply with no usage: its tokens are counted here
    store = str(tmp_path / "store")
    for extra in ([], ["--json"]):
        run = subprocess.run([*loopdsl_command(), "run", str(loop), "--script", str(script), "--store", store, *extra],
                             cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0 and "internal error" not in run.stderr, run.stderr[-2000:]
    run_id = json.loads(run.stdout.splitlines()[-1])["run_id"]
    shown = cli_in_process(["show", run_id, "--store", store, "--json"], tmp_path)
    assert json.loads(shown.stdout)["run"]["outputs"]["said"] == "fin \ufffd al"
    from loopdsl.adapters.store.run_store import RunStore

    with RunStore(tmp_path / "store") as opened:
        record = opened.load_run(run_id)
        opened._cache.set(f"run/{run_id}/record", {**record, "outputs": {"said": "planted \ud800"}})
    for extra in ([], ["--json"], ["--transcript"], ["--html", str(tmp_path / "run.html")]):
        shown = subprocess.run([*loopdsl_command(), "show", run_id, "--store", store, *extra],
                               cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert shown.returncode == 0 and "internal error" not in shown.stderr, (extra, shown.stderr[-2000:])
    assert "planted \\ud800" in shown.stdout or "planted \\ud800" in (tmp_path / "run.html").read_text()


def test_tool_arguments_with_a_lone_surrogate_are_an_error_the_model_reads() -> None:
    from loopdsl.runtime.actions.agent import _parse_args

    args, error = _parse_args('{"path": "a\\ud800"}')
    assert args is None and error is not None and "surrogate" in error
    assert _parse_args('{"path": "smile \\ud83d\\ude00"}') == ({"path": "smile \U0001F600"}, None)  # a pair is text


def test_usage_reported_past_a_cap_ends_the_run_budget_exhausted(tmp_path: Path) -> None:
    """The reservation was within the caps, the provider then reported 900 million tokens: the
    run charged them and went on to `completed`, far over both caps, saying nothing."""
    from loopdsl.runtime.model_port import LlmResponse

    class Overreporting:
        """A provider whose reply reports far more usage than the request could have used."""

        def count_tokens(self, model: str, messages: Any, tools: Any = ()) -> int:
            return 10

        async def complete(self, request: Any, *, state: str, attempt: int | None = None) -> LlmResponse:
            return LlmResponse(text="hi", prompt_tokens=900_000_000, completion_tokens=5, cost_usd=None, model=request.model)

    loop = tmp_path / "ask.yaml"
    loop.write_text("loopdsl: 1\nname: ask\nbudget: {tokens: 1000, cost_usd: 0.01}\n"
                    "models:\n  m: {model: openai/gpt-4o-mini, max_tokens: 100}\n"
                    "start: talk\nstates:\n  talk: {llm: {model: m, prompt: hi}, next: done}\n  done: {end: completed}\n")
    result = loopdsl.run(loop, store=tmp_path / "store", workdir=tmp_path, provider=Overreporting())
    assert result.status == "budget_exhausted" and result.tokens == 900_000_005  # charged as reported, then stopped
    assert "past the cap of 1,000" in result.state.error["message"]
