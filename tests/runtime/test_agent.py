"""`agent` states end to end in process: the turn loop, shell tools, tool errors going back
to the model, limits, max_turns, the re-ask, sticky fallbacks, budget and durability.

The model is a provider port that answers by a function of the conversation so far (so a
test sees exactly what was sent); tools are real shell commands in a tmp workspace.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import pytest

import loopdsl
from loopdsl.runtime.model_port import LlmRequest, LlmResponse, ProviderError, ToolCall

PRICE = "price: {input_per_mtok: 1, output_per_mtok: 2}"


def loop_text(agent: str, tools: str = "", extra: str = "") -> str:
    """A loop whose state `work` is an agent with `agent` (YAML lines) added to its body;
    `tools` adds entries under `tools:` (indented two spaces), `extra` top-level lines."""
    agent_lines = "".join(f"      {line}\n" for line in agent.splitlines())
    return (
        "loopdsl: 1\nname: agent-test\n"
        f"models:\n  m: {{model: openai/gpt-4o-mini, max_tokens: 100, {PRICE}, fallbacks: [openai/gpt-4o]}}\n"
        f"{extra}\n"
        "tools:\n"
        "  count_lines:\n"
        "    description: Count the lines of a file.\n"
        "    params: {file: {type: string}, max: {type: integer, default: 10}}\n"
        "    required: [file]\n"
        "    shell: wc -l -- {{ args.file }}\n"
        "  fails:\n"
        "    description: Always fails.\n"
        "    shell: echo broken >&2; exit 3\n"
        f"{tools}"
        "start: work\nstates:\n  work:\n    agent:\n      model: m\n      prompt: Count the lines of a.txt.\n"
        f"{agent_lines}"
        "    next: done\n  done: {end: completed}\n"
    )


class Conversation:
    """A provider port answering each turn by `answer(turn, request)`: a str (final text),
    a list of (name, args) tool calls, or a ProviderError to raise."""

    def __init__(self, answer: Callable[[int, LlmRequest], Any]) -> None:
        self.answer = answer
        self.requests: list[LlmRequest] = []

    async def complete(self, request: LlmRequest, *, state: str, attempt: int | None = None) -> LlmResponse:
        self.requests.append(request)
        turn = 1 + sum(1 for m in request.messages if m["role"] == "assistant")
        reply = self.answer(turn, request)
        if isinstance(reply, ProviderError):
            raise reply
        usage = dict(prompt_tokens=self.count_tokens(request.model, request.messages, request.tools), completion_tokens=7)
        if isinstance(reply, str):
            return LlmResponse(text=reply, cost_usd=None, model=request.model, finish_reason="stop", **usage)
        calls = tuple(ToolCall(f"call_{turn}_{i}", name, args if isinstance(args, str) else json.dumps(args))
                      for i, (name, args) in enumerate(reply, start=1))
        return LlmResponse(text="", cost_usd=None, model=request.model, tool_calls=calls, finish_reason="tool_calls",
                           **usage)

    def count_tokens(self, model: str, messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] = ()) -> int:
        return 20 + len(json.dumps(list(messages))) // 4 + len(json.dumps(list(tools))) // 4


def run(tmp_path: Path, text: str, provider: Conversation, **kwargs: Any) -> Any:
    (tmp_path / "a.txt").write_text("one\ntwo\nthree\n")
    path = tmp_path / "loop.yaml"
    path.write_text(text)
    return loopdsl.run(path, workdir=tmp_path, provider=provider, **kwargs)


def tool_messages(request: LlmRequest) -> list[dict[str, Any]]:
    return [m for m in request.messages if m["role"] == "tool"]


def test_tool_calls_run_in_order_and_every_error_goes_back_to_the_model(tmp_path: Path) -> None:
    def answer(turn: int, request: LlmRequest) -> Any:
        if turn == 1:
            return [("count_lines", {"file": "a.txt"}), ("count_lines", {"file": "a.txt", "extra": 1}),
                    ("count_lines", "{not json"), ("rm_everything", {}), ("fails", {})]
        return '{"summary": "3 lines"}'

    provider = Conversation(answer)
    result = run(tmp_path, loop_text("tools: [count_lines, fails]\nmax_turns: 4\nschema: {type: object}"), provider)
    assert result.status == "completed", result.state.error
    work = result.state.results["work"]
    assert work["json"] == {"summary": "3 lines"} and work["stop"] == "answer" and work["turns"] == 2
    assert [c["id"] for c in work["tool_calls"]] == [f"call_1_{i}" for i in range(1, 6)]
    first, extra, bad_json, unknown, failing = work["tool_calls"]
    assert first["ok"] and first["result"]["stdout"].strip() == "3 a.txt" and first["args"] == {"file": "a.txt"}
    assert not extra["ok"] and "extra" in extra["error"]
    assert not bad_json["ok"] and "not valid JSON" in bad_json["error"]
    assert not unknown["ok"] and "unknown tool" in unknown["error"]
    assert not failing["ok"] and failing["error"] == "exit code 3"
    sent = tool_messages(provider.requests[1])
    assert [m["tool_call_id"] for m in sent] == [f"call_1_{i}" for i in range(1, 6)]
    assert json.loads(sent[4]["content"])["stderr"].strip() == "broken"  # the model sees why it failed
    assert [t["function"]["name"] for t in provider.requests[0].tools] == ["count_lines", "fails"]
    events = [e for e in result.events if e["type"] == "tool_call"]
    assert [(e["name"], e["ok"]) for e in events][0] == ("count_lines", True) and events[0]["summary"] == "a.txt"


def test_calls_past_the_turn_limit_are_answered_limit_and_not_run(tmp_path: Path) -> None:
    marker = tmp_path / "ran"

    def answer(turn: int, request: LlmRequest) -> Any:
        return [("touch", {}), ("touch", {})] if turn == 1 else "done"

    tools = f"  touch:\n    description: Mark.\n    shell: echo x >> {marker}\n"
    provider = Conversation(answer)
    result = run(tmp_path, loop_text("tools: [touch]\nmax_turns: 3\nmax_tool_calls_per_turn: 1", tools), provider)
    assert result.status == "completed"
    assert marker.read_text() == "x\n"
    assert [c["error"] for c in result.state.results["work"]["tool_calls"]] == [None, "limit"]
    assert json.loads(tool_messages(provider.requests[1])[1]["content"]) == {"error": "limit"}


def test_max_turns_fails_with_the_last_calls_not_run_and_keeps_what_was_spent(tmp_path: Path) -> None:
    provider = Conversation(lambda turn, request: [("count_lines", {"file": "a.txt"})])
    result = run(tmp_path, loop_text("tools: [count_lines]\nmax_turns: 2"), provider)
    assert result.status == "failed"
    error = result.state.error
    assert error["kind"] == "max_turns"
    work = result.state.history["work"][-1] if result.state.history.get("work") else result.state.results["work"]
    assert work["turns"] == 2 and work["stop"] == "max_turns"
    assert [c["error"] for c in work["tool_calls"]] == [None, "not_run"]
    assert work["cost_usd"] > 0 and abs(work["cost_usd"] - result.state.usage["work"]["cost_usd"]) < 1e-9


def test_an_answer_that_fails_its_schema_is_sent_back_once(tmp_path: Path) -> None:
    answers = iter(['{"wrong": 1}', '{"summary": "ok"}'])
    provider = Conversation(lambda turn, request: next(answers))
    agent = "max_turns: 3\nschema: {type: object, required: [summary]}"
    result = run(tmp_path, loop_text(agent), provider)
    assert result.status == "completed"
    assert result.state.results["work"]["turns"] == 2
    assert "summary" in provider.requests[1].messages[-1]["content"]


def test_fallbacks_stick_and_a_transient_error_is_retried_on_the_same_turn(tmp_path: Path) -> None:
    seen: list[str] = []

    def answer(turn: int, request: LlmRequest) -> Any:
        seen.append(request.model)
        if request.model == "openai/gpt-4o-mini":
            return ProviderError("server_error", "down")
        if turn == 2 and seen.count("openai/gpt-4o") == 2:
            return ProviderError("rate_limit", "slow down")
        return [("count_lines", {"file": "a.txt"})] if turn < 3 else "finished"

    provider = Conversation(answer)
    text = loop_text("tools: [count_lines]\nmax_turns: 5").replace(
        "    next: done", "    retry: {max_attempts: 2, backoff: {initial: 0, jitter: false}}\n    next: done")
    result = run(tmp_path, text, provider)
    assert result.status == "completed", result.state.error
    assert seen == ["openai/gpt-4o-mini", "openai/gpt-4o", "openai/gpt-4o", "openai/gpt-4o", "openai/gpt-4o"]
    assert result.state.results["work"]["models"] == ["openai/gpt-4o"]


@pytest.mark.parametrize("retry, kind, calls", [
    ("{max_attempts: 3, backoff: {initial: 0, jitter: false}}", "server_error", 3),
    ("{max_attempts: 3, on: [parse], backoff: {initial: 0, jitter: false}}", "rate_limit", 1),
])
def test_a_turns_retries_follow_the_states_retry_policy(tmp_path: Path, retry: str, kind: str, calls: int) -> None:
    """A turn retried in place on any transient error, whatever `retry.on` said, and then the
    attempt was retried again, each with its own in-place retries: 3 attempts sent 9 requests."""
    provider = Conversation(lambda turn, request: ProviderError(kind, "no"))
    text = loop_text("tools: [count_lines]\nmax_turns: 5").replace(
        "    next: done", f"    retry: {retry}\n    next: done").replace("fallbacks: [openai/gpt-4o]", "fallbacks: []")
    result = run(tmp_path, text, provider)
    assert result.status == "failed" and result.state.error["kind"] == kind
    assert len(provider.requests) == calls


def test_every_turn_is_reserved_with_the_tool_definitions_and_caps_hold(tmp_path: Path) -> None:
    provider = Conversation(lambda turn, request: [("count_lines", {"file": "a.txt"})])
    text = loop_text("tools: [count_lines]\nmax_turns: 50", extra="budget: {cost_usd: 0.01}")
    result = run(tmp_path, text, provider)
    assert result.status == "budget_exhausted"
    spent = result.state.ledger.get("cost_usd")
    assert spent is not None and 0 < spent <= 0.01
    assert 1 < len(provider.requests) < 50
    # Each turn's reservation counted the tool definitions: a request's prompt size as the
    # provider counts it (tools included) is what the usage reports.
    assert all(r.tools for r in provider.requests)


MCP_SERVER = Path(__file__).resolve().parents[1] / "adapters" / "mcp_server.py"


def test_an_mcp_server_serves_its_allowed_tools_and_its_secret_stays_out_of_the_conversation(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setenv("SRV_TOKEN", "tok-5ecret-value")

    def answer(turn: int, request: LlmRequest) -> Any:
        if turn == 1:
            return [("srv__echo", {"text": "hello"}), ("plus", {"a": 2, "b": 3}), ("srv__fail", {})]
        return "done"

    tools = (f"  srv:\n    description: A test server.\n"
             f"    mcp: {{command: [{sys.executable}, {MCP_SERVER}], env: {{TOKEN: \"$SRV_TOKEN\"}}}}\n"
             "    allow: [echo, {name: add, as: plus}]\n")
    provider = Conversation(answer)
    result = run(tmp_path, loop_text("tools: [srv]\nmax_turns: 3", tools, extra="secrets: [SRV_TOKEN]"), provider)
    assert result.status == "completed", result.state.error
    offered = sorted(t["function"]["name"] for t in provider.requests[0].tools)
    assert offered == ["plus", "srv__echo"]
    calls = result.state.results["work"]["tool_calls"]
    assert [c["ok"] for c in calls] == [True, True, False]
    assert "unknown tool" in calls[2]["error"]  # not allowed: not offered, not run
    sent = json.dumps([list(r.messages) for r in provider.requests])
    assert "hello" in sent and "tok-5ecret-value" not in sent


FAKE_CLI = Path(__file__).resolve().parents[1] / "data" / "fake_cli" / "claude"


def cli_loop(tmp_path: Path, scenario: str, cap: float) -> Path:
    path = tmp_path / "cli.yaml"
    path.write_text(
        "loopdsl: 1\nname: cli-agent\n"
        f"models:\n  claude: {{model: anthropic/claude-sonnet-4-5, max_tokens: 1000, cli_path: {FAKE_CLI},\n"
        "           price: {input_per_mtok: 0.3, output_per_mtok: 1.5}}\n"
        "budget: {cost_usd: 5}\n"
        "start: review\nstates:\n"
        f"  review:\n    agent: {{cli: claude-code, model: claude, prompt: 'scenario {scenario}', max_turns: 4, "
        f"max_cost_usd: {cap}}}\n    next: done\n"
        "  done: {end: completed}\n")
    return path


def test_a_cli_agent_answers_and_its_spend_is_charged(tmp_path: Path) -> None:
    result = loopdsl.run(cli_loop(tmp_path, "answer", 1.0), workdir=tmp_path)
    assert result.status == "completed", result.state.error
    review = result.state.results["review"]
    assert review["text"] == "All done: fixed a.py."
    assert 0 < review["cost_usd"] == pytest.approx(result.state.ledger["cost_usd"])


@pytest.mark.parametrize("scenario", ["spend", "overshoot"])
def test_a_cli_agent_at_its_reservation_ends_the_run_with_the_overspend_recorded(tmp_path: Path, scenario: str) -> None:
    result = loopdsl.run(cli_loop(tmp_path, scenario, 1.0), workdir=tmp_path)
    assert result.status == "budget_exhausted"
    overspend = result.state.meta.get("overspend_usd", 0.0)
    spent = result.state.ledger["cost_usd"]
    assert spent >= 1.0 and overspend == pytest.approx(spent - 1.0)
    if scenario == "overshoot":
        assert overspend == pytest.approx(0.7)
    assert any(e["type"] == "overspend" for e in result.events)


class Approver:
    """A human port answering tool approvals in turn."""

    def __init__(self, *answers: dict[str, Any]) -> None:
        self.answers = list(answers)
        self.asked: list[str] = []

    async def decide(self, state: str, message: str, choices: tuple[str, ...]) -> dict[str, Any] | None:
        self.asked.append(message)
        return self.answers.pop(0) if self.answers else None


def test_a_tool_that_needs_approval_runs_only_when_a_person_approves(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    tools = f"  touch:\n    description: Mark.\n    params: {{n: {{type: integer}}}}\n    required: [n]\n" \
            f"    approve: true\n    shell: echo {{{{ args.n }}}} >> {marker}\n"
    provider = Conversation(lambda turn, request: [("touch", {"n": 1}), ("touch", {"n": 2})] if turn == 1 else "ok")
    human = Approver({"decision": "approve"}, {"decision": "reject", "comment": "not that one"})
    result = run(tmp_path, loop_text("tools: [touch]\nmax_turns: 3", tools), provider, human=human)
    assert result.status == "completed"
    assert marker.read_text() == "1\n"
    assert '{"n": 2}' in human.asked[1]
    assert json.loads(tool_messages(provider.requests[1])[1]["content"]) == {"error": "rejected: not that one"}


def test_without_a_person_at_hand_an_approval_makes_the_run_wait_then_resume_runs_it(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    tools = f"  touch:\n    description: Mark.\n    shell: echo x >> {marker}\n"
    provider = Conversation(lambda turn, request: [("touch", {})] if turn == 1 else "ok")
    store = tmp_path / "store"
    agent = "tools: [{name: touch, approve: true}]\nmax_turns: 3"
    waiting = run(tmp_path, loop_text(agent, tools), provider, store=store)
    assert waiting.status == "waiting" and not marker.exists()
    loopdsl.decide(waiting.run_id, "approve", store=store)
    ended = loopdsl.resume(waiting.run_id, store=store, provider=provider)
    assert ended.status == "completed"
    assert marker.read_text() == "x\n"
    assert sum(1 for r in provider.requests if len(r.messages) == len(provider.requests[0].messages)) == 1  # turn 1 paid once


def test_a_sub_loop_tool_runs_a_child_with_the_arguments_as_inputs(tmp_path: Path) -> None:
    (tmp_path / "double.yaml").write_text(
        "loopdsl: 1\nname: double\nunattended: true\ninputs: {n: {type: integer}}\n"
        "start: calc\nstates:\n  calc: {set: {v: 'inputs.n * 2'}, next: done}\n"
        "  done: {end: completed, output: {doubled: '{{ calc.v }}'}}\n")
    asks = "loopdsl: 1\nname: asks\n{unattended}inputs: {{n: {{type: integer}}}}\nstart: done\nstates:\n  done: {{end: completed}}\n"
    # Unattended when the loop is loaded (lint refuses an attended sub-loop tool: tool-loop-attended);
    # changed on disk while the run goes, so the engine's own check must refuse it too.
    (tmp_path / "asks.yaml").write_text(asks.format(unattended="unattended: true\n"))

    def replies(turn: int, request: Any) -> Any:
        if turn != 1:
            return "ok"
        (tmp_path / "asks.yaml").write_text(asks.format(unattended=""))
        return [("double", {"n": 21}), ("double", {"n": "x"}), ("attended", {"n": 1})]

    tools = ("  double:\n    description: Double n.\n    params: {n: {type: integer}}\n    required: [n]\n"
             "    loop: double.yaml\n"
             "  attended:\n    description: Not unattended.\n    params: {n: {type: integer}}\n    required: [n]\n"
             "    loop: asks.yaml\n")
    provider = Conversation(replies)
    result = run(tmp_path, loop_text("tools: [double, attended]\nmax_turns: 3", tools), provider)
    assert result.status == "completed", result.state.error
    ok, bad, attended = result.state.results["work"]["tool_calls"]
    assert ok["ok"] and ok["result"]["outputs"] == {"doubled": 42} and ok["result"]["status"] == "completed"
    assert not bad["ok"] and "invalid arguments" in bad["error"]
    assert not attended["ok"] and "unattended" in attended["error"]
    assert result.state.ledger["steps"] >= 2  # the child's step counted against the parent


def test_workspace_path_params_are_confined_before_the_command_runs(tmp_path: Path) -> None:
    import os

    outside = tmp_path.parent / f"{tmp_path.name}-outside.txt"
    outside.write_text("secret stuff\n")
    (tmp_path / "link.txt").symlink_to(outside)
    tools = ("  show:\n    description: Print a file.\n"
             "    params: {file: {type: string, format: workspace-path}}\n    required: [file]\n"
             "    shell: cat -- {{ args.file }}\n")
    paths = ["a.txt", "../x.txt", str(outside), "link.txt", ".git/config", "sub/../a.txt"]
    provider = Conversation(lambda turn, request: [("show", {"file": p}) for p in paths] if turn == 1 else "ok")
    result = run(tmp_path, loop_text("tools: [show]\nmax_turns: 3", tools), provider)
    assert result.status == "completed"
    calls = result.state.results["work"]["tool_calls"]
    assert [c["ok"] for c in calls] == [True, False, False, False, False, False]
    assert all("file:" in c["error"] for c in calls[1:])
    assert "secret stuff" not in json.dumps([list(r.messages) for r in provider.requests])
    os.unlink(outside)


def test_approval_of_an_mcp_entry_covers_each_of_its_offered_tools(tmp_path: Path) -> None:
    import sys

    tools = (f"  srv:\n    description: A test server.\n    mcp: {{command: [{sys.executable}, {MCP_SERVER}]}}\n"
             "    allow: [echo]\n")
    provider = Conversation(lambda turn, request: [("srv__echo", {"text": "hi"})] if turn == 1 else "ok")
    human = Approver({"decision": "reject", "comment": "no echoes"})
    result = run(tmp_path, loop_text("tools: [{name: srv, approve: true}]\nmax_turns: 3", tools), provider,
                 human=human)
    assert result.status == "completed", result.state.error
    assert len(human.asked) == 1 and "srv__echo" in human.asked[0]
    assert result.state.results["work"]["tool_calls"][0]["error"] == "rejected: no echoes"


def test_a_turn_past_the_models_input_window_fails_before_it_is_sent(tmp_path: Path) -> None:
    class Huge(Conversation):
        def count_tokens(self, model: str, messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] = ()) -> int:
            return 10_000_000

    provider = Huge(lambda turn, request: "never asked")
    result = run(tmp_path, loop_text("tools: [count_lines]\nmax_turns: 2"), provider)
    assert result.status == "failed" and result.state.error["kind"] == "context_window"
    assert provider.requests == [] and result.state.ledger["tokens"] == 0


@pytest.mark.parametrize("what,tamper", [
    ("agent request", lambda r: {**r, "tools": "x"} if "tools" in r else None),
    ("model reply", lambda r: {**r, "tool_calls": "x"} if r.get("tool_calls") else None),
    ("model reply", lambda r: {**r, "tool_calls": [{"id": "c1", "arguments": "{}"}]} if r.get("tool_calls") else None),
])
def test_a_damaged_stored_response_is_named_and_the_run_left_to_abort(tmp_path: Path, what: str, tamper: Any) -> None:
    """The response store is hostile like the record: a tampered agent request or reply was an
    internal error (AttributeError, KeyError) and ended the run `failed` for good."""
    from loopdsl.adapters.store.run_store import RunStore
    from loopdsl.runtime.errors import StoreError

    tools = "  touch:\n    description: Mark.\n    shell: \"true\"\n"
    provider = Conversation(lambda turn, request: [("touch", {})] if turn == 1 else "ok")
    store = tmp_path / "store"
    waiting = run(tmp_path, loop_text("tools: [{name: touch, approve: true}]\nmax_turns: 3", tools), provider, store=store)
    assert waiting.status == "waiting"
    with RunStore(store) as opened:
        changed = 0
        for key in list(opened._cache.iterkeys()):
            if str(key).startswith("response/") and isinstance(opened._cache.get(key), dict):
                value = tamper(opened._cache.get(key))
                if value is not None:
                    opened._cache.set(key, value)
                    changed += 1
        assert changed == 1
    loopdsl.decide(waiting.run_id, "approve", store=store)
    with pytest.raises(StoreError, match=f"run {waiting.run_id} is damaged: a stored {what}: '"):
        loopdsl.resume(waiting.run_id, store=store, provider=provider)
    with RunStore(store) as opened:
        assert opened.load_run(waiting.run_id)["status"] == "waiting"  # left as it was, for a person to abort


def test_the_transcript_marks_a_turn_replayed_after_a_resume(tmp_path: Path) -> None:
    """A resumed attempt reads its paid turns back; the transcript listed each as another call."""
    from loopdsl.adapters.terminal import transcript_text
    from loopdsl.api.records import show_run

    tools = "  touch:\n    description: Mark.\n    shell: \"true\"\n"
    provider = Conversation(lambda turn, request: [("touch", {})] if turn == 1 else "ok")
    store = tmp_path / "store"
    waiting = run(tmp_path, loop_text("tools: [{name: touch, approve: true}]\nmax_turns: 3", tools), provider, store=store)
    loopdsl.decide(waiting.run_id, "approve", store=store)
    assert loopdsl.resume(waiting.run_id, store=store, provider=provider).status == "completed"
    calls = show_run(waiting.run_id, store, transcript=True).transcript
    assert [(c["turn"], c["replayed"]) for c in calls] == [(1, False), (1, True), (2, False)]
    assert "turn 1, agent turn, model openai/gpt-4o-mini (replayed after a resume, not paid again)" in transcript_text(calls)


def test_an_agents_skill_reaches_its_system_message(tmp_path: Path) -> None:
    """The skill of an `agent` state was never read (only `llm` states' were): the model got
    no skill text, silently, though docs/dsl.md gives `skill` to agents as to `llm`."""
    (tmp_path / "skills").mkdir()
    (tmp_path / "skills" / "SKILL.md").write_text("## When\nSKILL-TEXT-7d1: count carefully.\n")
    provider = Conversation(lambda turn, request: "done")
    result = run(tmp_path, loop_text("skill: skills/SKILL.md\ntools: [count_lines]\nmax_turns: 2"), provider)
    assert result.status == "completed", result.state.error
    system = [m["content"] for m in provider.requests[0].messages if m["role"] == "system"]
    assert any("SKILL-TEXT-7d1: count carefully." in text for text in system), provider.requests[0].messages
