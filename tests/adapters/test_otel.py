"""OpenTelemetry traces of real `loopdsl run` processes, received over OTLP/HTTP by a loopback
collector written for the tests (tests/otlp_receiver.py, decoding with opentelemetry-proto).

The loops carry a declared secret through a command, a model reply, a gate and a failure;
the receiver's raw request bodies are searched for it byte by byte.
"""
from __future__ import annotations

import base64
import textwrap
from pathlib import Path
from typing import Any, Iterator

import pytest
from cli_in_process import cli_in_process
from otlp_receiver import OtlpReceiver, only, otel_env as clean_env, run_loopdsl as loopdsl

from loopdsl.adapters.otel import trace_id_for
from loopdsl.adapters.store.run_store import RunStore

pytestmark = pytest.mark.xdist_group("otel-traced-run")  # the traced run, once (tests/conftest.py)
SECRET = "otel-SECRET-9Qm2vXz8Lr"
VARIANTS = [SECRET.encode(), base64.b64encode(SECRET.encode()).rstrip(b"=")]
MODEL = "openai/gpt-4o-mini"

LOOP = f"""\
loopdsl: 1
name: traced
secrets: [MY_TOKEN]
models:
  m: {{model: {MODEL}, max_tokens: 100, price: {{input_per_mtok: 1, output_per_mtok: 2}}}}
tools:
  count_lines:
    description: Count the lines of a file.
    params: {{file: {{type: string}}}}
    required: [file]
    shell: wc -l -- {{{{ args.file }}}}
budget: {{tokens: 100000, cost_usd: 1, steps: 40}}
start: leak
states:
  leak:
    shell:
      cmd: echo "stdout $MY_TOKEN"
      env: {{MY_TOKEN: "{{{{ secrets.MY_TOKEN }}}}"}}
    next: ask
  ask:
    llm: {{model: m, prompt: "Shell said {{{{ leak.stdout }}}}"}}
    gates:
      after:
        - name: second-try
          shell:
            cmd: echo "gate saw $MY_TOKEN"; test "{{{{ run.attempt }}}}" -ge 2
            env: {{MY_TOKEN: "{{{{ secrets.MY_TOKEN }}}}"}}
    retry: {{max_attempts: 2, backoff: {{initial: 0s}}}}
    next: work
  work:
    agent: {{model: m, prompt: How many lines has a.txt?, tools: [count_lines], max_turns: 4}}
    next: boom
  boom:
    shell:
      cmd: echo "dying with $MY_TOKEN" >&2; exit 3
      env: {{MY_TOKEN: "{{{{ secrets.MY_TOKEN }}}}"}}
    next: done
  done: {{end: completed}}
"""

REPLIES = f"""\
ask:
  - {{text: "first {SECRET}", usage: {{prompt_tokens: 30, completion_tokens: 4}}}}
  - {{text: "second {SECRET}", usage: {{prompt_tokens: 31, completion_tokens: 5}}}}
work:
  - {{tool_calls: [{{name: count_lines, args: {{file: a.txt}}}}], usage: {{prompt_tokens: 40, completion_tokens: 9}}}}
  - {{text: It has 3 lines., usage: {{prompt_tokens: 70, completion_tokens: 6}}}}
"""


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    server = OtlpReceiver().start()
    try:
        yield server
    finally:
        server.stop()


def otel_env(endpoint: str | None, **extra: str) -> dict[str, str]:
    return clean_env(endpoint, MY_TOKEN=SECRET, OTEL_SERVICE_NAME="loopdsl-tests", **extra)


@pytest.fixture(scope="module")
def traced_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One failing run of LOOP (exit 1 at `boom`), traced to a loopback receiver."""
    base = tmp_path_factory.mktemp("otel")
    (base / "loop.yaml").write_text(LOOP, encoding="utf-8")
    (base / "replies.yaml").write_text(REPLIES, encoding="utf-8")
    (base / "a.txt").write_text("one\ntwo\nthree\n", encoding="utf-8")
    server = OtlpReceiver().start()
    try:
        done = loopdsl(["run", "loop.yaml", "--script", "replies.yaml", "--store", "store"], base,
                       otel_env(server.endpoint))
    finally:
        server.stop()
    run_id = RunStore(base / "store").list_runs()[0]["run_id"]
    return {"done": done, "spans": server.snapshot(), "bodies": server.bodies, "paths": server.paths,
            "run_id": run_id}


def test_a_failed_run_is_one_trace_with_a_span_per_attempt_under_the_run(traced_run: dict[str, Any]) -> None:
    done, spans = traced_run["done"], traced_run["spans"]
    assert done.returncode == 1, done.stderr
    assert set(traced_run["paths"]) == {"/v1/traces"}
    assert {s.trace_id for s in spans} == {f"{trace_id_for(traced_run['run_id']):032x}"}
    root = only(spans, "run traced")
    assert root.parent == "" and root.resource["service.name"] == "loopdsl-tests"
    assert root.attributes["loopdsl.run_id"] == traced_run["run_id"] and root.attributes["loopdsl.segment"] == "start"
    assert root.status == "ERROR" and root.attributes["loopdsl.status"] == "failed"
    assert root.attributes["error.type"] == "shell_exit"
    states = [s for s in spans if s.name.startswith("state ")]
    assert [(s.name, s.attributes["loopdsl.attempt"], s.status) for s in sorted(states, key=lambda s: s.start_ns)] == [
        ("state leak", 1, "OK"), ("state ask", 1, "ERROR"), ("state ask", 2, "OK"), ("state work", 1, "OK"),
        ("state boom", 1, "ERROR")]
    assert all(s.parent == root.span_id for s in states)
    assert all(root.start_ns <= s.start_ns <= s.end_ns <= root.end_ns for s in states)
    first_ask = next(s for s in states if s.name == "state ask" and s.attributes["loopdsl.attempt"] == 1)
    assert first_ask.attributes["error.type"] == "gate" and first_ask.attributes["loopdsl.retried"] is True
    boom = only(spans, "state boom")
    assert boom.attributes["loopdsl.error.kind"] == "shell_exit" and "exited with 3" in boom.status_message
    # Budget left after each attempt: 40 steps capped, 5 attempts taken by boom's end.
    assert boom.attributes["loopdsl.budget.remaining.steps"] == 35
    assert boom.attributes["loopdsl.budget.remaining.tokens"] == 100000 - (34 + 36 + 49 + 76)


def test_model_calls_follow_the_genai_conventions_under_their_attempt(traced_run: dict[str, Any]) -> None:
    spans = traced_run["spans"]
    by_id = {s.span_id: s for s in spans}
    chats = sorted((s for s in spans if s.name == f"chat {MODEL}"), key=lambda s: s.start_ns)
    assert [(by_id[c.parent].name, c.attributes["gen_ai.usage.input_tokens"], c.attributes["gen_ai.usage.output_tokens"])
            for c in chats] == [("state ask", 30, 4), ("state ask", 31, 5), ("state work", 40, 9), ("state work", 70, 6)]
    for chat in chats:
        assert chat.attributes["gen_ai.operation.name"] == "chat"
        assert chat.attributes["gen_ai.system"] == "openai" and chat.attributes["gen_ai.request.model"] == MODEL
        assert chat.status == "OK" and chat.attributes["loopdsl.cost_usd"] > 0
        assert by_id[chat.parent].start_ns <= chat.start_ns <= chat.end_ns <= by_id[chat.parent].end_ns
    assert chats[0].attributes["loopdsl.cost_usd"] == pytest.approx((30 * 1 + 4 * 2) / 1e6)
    assert [c.attributes.get("loopdsl.turn") for c in chats[2:]] == [1, 2]


def test_gates_tools_and_commands_are_spans_of_their_attempt(traced_run: dict[str, Any]) -> None:
    spans = traced_run["spans"]
    by_id = {s.span_id: s for s in spans}
    gates = sorted((s for s in spans if s.name == "gate second-try"), key=lambda s: s.start_ns)
    assert [(g.status, g.attributes["loopdsl.gate.phase"], g.attributes["loopdsl.gate.kind"]) for g in gates] == [
        ("ERROR", "after", "shell"), ("OK", "after", "shell")]
    assert [by_id[g.parent].attributes["loopdsl.attempt"] for g in gates] == [1, 2]
    tool = only(spans, "execute_tool count_lines")
    assert by_id[tool.parent].name == "state work" and tool.status == "OK"
    assert tool.attributes["gen_ai.tool.name"] == "count_lines" and tool.attributes["gen_ai.operation.name"] == "execute_tool"
    commands = {by_id[s.parent].name: s for s in spans if s.name == "shell"}
    assert set(commands) == {"state leak", "state boom"}
    assert commands["state leak"].attributes["process.exit.code"] == 0 and commands["state leak"].status == "OK"
    assert commands["state boom"].attributes["process.exit.code"] == 3 and commands["state boom"].status == "ERROR"


def test_no_secret_in_any_span(traced_run: dict[str, Any]) -> None:
    spans = traced_run["spans"]
    assert len(spans) >= 15
    for span in spans:
        texts = [span.name, span.status_message, *map(str, span.attributes.values()), *map(str, span.resource.values())]
        assert not any(SECRET in t for t in texts), span
    # The wire itself: every byte the collector received.
    assert not any(v in body for body in traced_run["bodies"] for v in VARIANTS)
    # The secret was there to leak: the gate's failure and boom's stderr quoted it (redacted).
    assert "***" in only(spans, "state boom").status_message


def test_a_run_stopped_by_its_budget_still_exports_its_spans(receiver: OtlpReceiver, tmp_path: Path) -> None:
    (tmp_path / "loop.yaml").write_text(textwrap.dedent("""\
        loopdsl: 1
        name: capped
        budget: {steps: 2}
        start: a
        states:
          a: {shell: 'true', next: b}
          b: {shell: 'true', next: c}
          c: {shell: 'true', next: done}
          done: {end: completed}
        """))
    done = loopdsl(["run", "loop.yaml"], tmp_path, clean_env(receiver.endpoint))  # in memory: no store
    assert done.returncode != 0 and "budget" in done.stderr
    spans = receiver.snapshot()
    root = only(spans, "run capped")
    assert root.resource["service.name"] == "loopdsl"  # without OTEL_SERVICE_NAME
    assert root.status == "ERROR" and root.attributes["loopdsl.status"] == "budget_exhausted"
    assert root.attributes["error.type"] == "budget" and root.attributes["loopdsl.budget.remaining.steps"] == 0
    assert [s.name for s in sorted(spans, key=lambda s: s.start_ns) if s.name.startswith("state ")] == ["state a", "state b"]


def test_child_runs_nest_under_their_state_and_a_decided_run_continues_its_trace(receiver: OtlpReceiver,
                                                                                   tmp_path: Path) -> None:
    (tmp_path / "child.yaml").write_text("loopdsl: 1\nname: child\nstart: work\nstates:\n"
                                         "  work: {shell: 'true', next: done}\n  done: {end: completed}\n")
    (tmp_path / "parent.yaml").write_text(
        "loopdsl: 1\nname: parent\nbudget: {steps: 20}\nstart: sub\nstates:\n"
        "  sub: {loop: child.yaml, next: ship}\n"
        "  ship: {checkpoint: {message: 'ship it?'}, next: done}\n"
        "  done: {end: completed}\n")
    env = otel_env(receiver.endpoint)
    first = loopdsl(["run", "parent.yaml", "--store", "store"], tmp_path, env)
    assert first.returncode == 4, first.stderr
    [run_id] = [r["run_id"] for r in RunStore(tmp_path / "store").list_runs() if "/" not in r["run_id"]]
    waiting = receiver.snapshot()
    by_id = {s.span_id: s for s in waiting}
    root = only(waiting, "run parent")
    assert root.attributes["loopdsl.status"] == "waiting" and root.status == "UNSET"
    child = only(waiting, "child run")
    assert by_id[child.parent].name == "state sub" and child.status == "OK"
    assert child.attributes["loopdsl.run_id"] == f"{run_id}/sub"
    assert by_id[only(waiting, "state work").parent] is child
    assert only(waiting, "state ship").attributes["loopdsl.waiting"] is True
    # a decision drives no engine, so it traces nothing: in this process
    assert cli_in_process(["approve", run_id, "--store", "store"], tmp_path, env).returncode == 0
    done = loopdsl(["resume", run_id, "--store", "store"], tmp_path, env)
    assert done.returncode == 0, done.stderr
    spans = receiver.snapshot()
    assert {s.trace_id for s in spans} == {f"{trace_id_for(run_id):032x}"}
    [resumed] = [s for s in spans[len(waiting):] if s.parent == ""]
    assert resumed.status == "OK" and resumed.attributes["loopdsl.segment"] == "resume"


@pytest.mark.slow  # LiteLLM's import in the child process takes seconds
def test_a_model_call_over_litellm_http_is_a_genai_span(stub_server: Any, receiver: OtlpReceiver, tmp_path: Path) -> None:
    """The real provider path: LiteLLM over HTTP to the loopback model stub; the traces go to
    the full URL of OTEL_EXPORTER_OTLP_TRACES_ENDPOINT."""
    stub_server.reply_text("fine", prompt_tokens=23, completion_tokens=8)
    (tmp_path / "loop.yaml").write_text(textwrap.dedent(f"""\
        loopdsl: 1
        name: http-call
        models:
          m: {{model: {MODEL}, api_base: {stub_server.api_base}, max_tokens: 50, price: {{input_per_mtok: 1, output_per_mtok: 2}}}}
        start: ask
        states:
          ask: {{llm: {{model: m, prompt: How are you?}}, next: done}}
          done: {{end: completed}}
        """))
    env = otel_env(None, OPENAI_API_KEY="sk-test-not-real",
                   OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=f"{receiver.endpoint}/tenant-a/traces")
    done = loopdsl(["run", "loop.yaml"], tmp_path, env)
    assert done.returncode == 0, done.stderr
    assert len(stub_server.requests) == 1 and set(receiver.paths) == {"/tenant-a/traces"}
    chat = only(receiver.snapshot(), f"chat {MODEL}")
    assert (chat.attributes["gen_ai.usage.input_tokens"], chat.attributes["gen_ai.usage.output_tokens"]) == (23, 8)
    assert chat.attributes["gen_ai.request.model"] == MODEL and chat.attributes["gen_ai.system"] == "openai"
    assert chat.attributes["loopdsl.cost_usd"] == pytest.approx((23 + 8 * 2) / 1e6)


