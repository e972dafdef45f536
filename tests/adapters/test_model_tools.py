"""The model port with tools: tool calls out and results back over real HTTP through LiteLLM
to the loopback stubs (OpenAI chat completions and Anthropic Messages), hostile tool calls,
scripted tool turns, and the tool fields of stored responses."""
from __future__ import annotations

import asyncio
import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
from stub_server import StubReply, StubServer, tool_call

import loopdsl
from loopdsl.adapters.litellm import LiteLLMProvider, ScriptedProvider, ensure_litellm
from loopdsl.adapters.store.run_store import RunStore
from loopdsl.runtime.actions.llm import cache_key, request_key
from loopdsl.runtime.errors import ScriptExhausted
from loopdsl.runtime.model_port import LlmRequest, LlmResponse, ProviderError, ToolCall, stored_tool_calls

pytestmark = pytest.mark.xdist_group("litellm")  # LiteLLM imported in-process: once a run, on one worker

GREP = {"type": "function", "function": {
    "name": "grep", "description": "Search tracked files for a regular expression.",
    "parameters": {"type": "object", "properties": {"pattern": {"type": "string"}}, "required": ["pattern"]}}}
ASK = ({"role": "system", "content": "Use the tools."}, {"role": "user", "content": "Where is main defined?"})
OPENAI = "openai/gpt-4o-mini"
ANTHROPIC = "anthropic/claude-haiku-4-5"


@pytest.fixture(scope="module")
def litellm() -> Any:
    return ensure_litellm()  # one import per test process: it costs seconds


def complete(request: LlmRequest) -> LlmResponse:
    return asyncio.run(LiteLLMProvider().complete(request, state="fix"))


def request(stub: StubServer, model: str, messages: Any = ASK, **kw: Any) -> LlmRequest:
    base = stub.anthropic_api_base if model.startswith("anthropic/") else stub.api_base
    return LlmRequest(model=model, messages=tuple(messages), max_tokens=64, api_base=base, **kw)


# -- the request key ------------------------------------------------------------------------
def test_a_tool_less_request_keeps_its_key() -> None:
    """Response caches and run stores written before tools existed stay valid: this key was
    computed from this request before LlmRequest had tool fields."""
    plain = LlmRequest(model=OPENAI, messages=({"role": "system", "content": "Be brief."},
                                               {"role": "user", "content": "Say hello."}),
                       max_tokens=50, temperature=0.2, api_base="http://user:pw@127.0.0.1:9/v1", api_key="sk-x",
                       timeout=30, params={"seed": 7, "api_key": "k"}, response_schema={"type": "object"})
    assert cache_key(plain.canonical()) == "4713a29cbfed1ea7cfe238a6be9a7b2b8c6abf18007cd11b606c53b37092f542"
    assert not {"tools", "tool_choice", "parallel_tool_calls"} & set(plain.canonical())
    with_tools = LlmRequest(model=OPENAI, messages=ASK, max_tokens=50, tools=(GREP,), tool_choice="required",
                            parallel_tool_calls=False)
    canonical = with_tools.canonical()
    assert canonical["tools"] == [GREP] and canonical["tool_choice"] == "required"
    assert canonical["parallel_tool_calls"] is False


def test_a_request_is_not_changed_by_its_callers_conversation() -> None:
    conversation = [dict(ASK[1]), {"role": "assistant", "content": None,
                                   "tool_calls": [ToolCall("c1", "grep", "{}").to_message()]}]
    sent = LlmRequest(model=OPENAI, messages=conversation, max_tokens=5, tools=(GREP,))
    conversation[1]["tool_calls"].append({"id": "c2"})
    assert len(sent.messages[1]["tool_calls"]) == 1


# -- round trips over HTTP -------------------------------------------------------------------
def _openai_turn(body: Any) -> StubReply:
    """Answer by the conversation so far: call grep first, then answer from its result."""
    results = [m for m in body["messages"] if m["role"] == "tool"]
    if not results:
        return StubReply(text=None, tool_calls=[tool_call("grep", {"pattern": "def main"}, "call_a")],
                         prompt_tokens=40, completion_tokens=9)
    return StubReply(text=f"It is in {results[0]['content']}.", prompt_tokens=70, completion_tokens=6)


def _anthropic_turn(body: Any) -> StubReply:
    blocks = [b for m in body["messages"] if isinstance(m["content"], list) for b in m["content"]]
    results = [b for b in blocks if b.get("type") == "tool_result"]
    if not results:
        return StubReply(text="Let me look.", tool_calls=[tool_call("grep", {"pattern": "def main"}, "toolu_1")],
                         prompt_tokens=40, completion_tokens=9)
    content = results[0]["content"]
    text = content if isinstance(content, str) else "".join(part.get("text", "") for part in content)
    return StubReply(text=f"It is in {text}.", prompt_tokens=70, completion_tokens=6)


@pytest.mark.parametrize("model", [OPENAI, ANTHROPIC])
def test_a_tool_call_round_trip(litellm: Any, stub_server: StubServer, model: str) -> None:
    stub_server.responder = _anthropic_turn if model == ANTHROPIC else _openai_turn
    first = complete(request(stub_server, model, tools=(GREP,)))
    [call] = first.tool_calls
    assert (call.name, json.loads(call.arguments)) == ("grep", {"pattern": "def main"})
    assert first.finish_reason == "tool_calls"
    assert (first.prompt_tokens, first.completion_tokens) == (40, 9)
    conversation = [*ASK, first.assistant_message(),
                    {"role": "tool", "tool_call_id": call.id, "content": "src/app.py:12"}]
    final = complete(request(stub_server, model, conversation, tools=(GREP,)))
    assert final.tool_calls == () and final.finish_reason == "stop"
    assert final.text == "It is in src/app.py:12."
    assert len(stub_server.requests) == 2 and stub_server.unscripted == 0
    assert stub_server.billed == {"prompt_tokens": 110, "completion_tokens": 15}
    first_body, second_body = (r.body for r in stub_server.requests)
    if model == OPENAI:
        assert first_body["tools"] == [GREP] and stub_server.requests[0].path == "/v1/chat/completions"
        assert second_body["messages"][2]["tool_calls"][0]["id"] == "call_a"
        assert second_body["messages"][3] == {"role": "tool", "tool_call_id": "call_a", "content": "src/app.py:12"}
    else:  # LiteLLM translated the same conversation into Anthropic's blocks
        assert stub_server.requests[0].path == "/v1/messages"
        assert first_body["tools"][0]["name"] == "grep" and "input_schema" in first_body["tools"][0]
        assert first.text == "Let me look." and call.id == "toolu_1"
        assert second_body["system"][0]["text"] == "Use the tools." if isinstance(second_body["system"], list) \
            else second_body["system"] == "Use the tools."
        assistant = second_body["messages"][1]
        assert {"type": "tool_use", "id": "toolu_1", "name": "grep", "input": {"pattern": "def main"}} in [
            {k: b.get(k) for k in ("type", "id", "name", "input")} for b in assistant["content"]]
        [result] = [b for b in second_body["messages"][2]["content"] if b["type"] == "tool_result"]
        assert result["tool_use_id"] == "toolu_1"


def test_tool_choice_and_parallel_calls_are_sent_only_when_set(litellm: Any, stub_server: StubServer) -> None:
    stub_server.reply_text("a")
    stub_server.reply_text("b")
    complete(request(stub_server, OPENAI, tools=(GREP,)))
    complete(request(stub_server, OPENAI, tools=(GREP,), tool_choice="required", parallel_tool_calls=False))
    plain, chosen = (r.body for r in stub_server.requests)
    assert "tool_choice" not in plain and "parallel_tool_calls" not in plain
    assert chosen["tool_choice"] == "required" and chosen["parallel_tool_calls"] is False


def test_anthropic_gets_tool_choice_and_parallel_calls_in_its_own_words(litellm: Any, stub_server: StubServer) -> None:
    stub_server.reply_text("a")
    stub_server.reply_text("b")
    complete(request(stub_server, ANTHROPIC, tools=(GREP,), tool_choice="required", parallel_tool_calls=False))
    complete(request(stub_server, ANTHROPIC, tools=(GREP,),
                     tool_choice={"type": "function", "function": {"name": "grep"}}))
    required, named = (r.body for r in stub_server.requests)
    assert required["tool_choice"] == {"type": "any", "disable_parallel_tool_use": True}
    assert named["tool_choice"]["type"] == "tool" and named["tool_choice"]["name"] == "grep"


def test_a_failing_responder_answers_500_and_is_kept(litellm: Any, stub_server: StubServer) -> None:
    stub_server.responder = lambda body: body["no such key"]
    with pytest.raises(ProviderError) as info:
        complete(request(stub_server, OPENAI))
    assert info.value.kind == "server_error" and "stub responder failed" in info.value.message
    assert isinstance(stub_server.responder_errors[0], KeyError) and stub_server.unscripted == 0


def test_arguments_are_kept_as_the_raw_string(litellm: Any, stub_server: StubServer) -> None:
    stub_server.reply_tool_calls(tool_call("grep", '{"pattern": "x"', "c1"), tool_call("grep", "{}", "c2"))
    response = complete(request(stub_server, OPENAI, tools=(GREP,)))
    assert [(c.id, c.arguments) for c in response.tool_calls] == [("c1", '{"pattern": "x"'), ("c2", "{}")]


GARBAGE = [
    pytest.param([{"id": "c", "type": "function", "function": {"name": 5, "arguments": "{}"}}], id="name-not-a-string"),
    pytest.param("garbage", id="not-a-list"),
    pytest.param([5], id="call-not-an-object"),
    pytest.param([{"id": "c", "type": "function", "function": {"arguments": "{}"}}], id="no-name"),
]


@pytest.mark.parametrize("model", [OPENAI, ANTHROPIC])
@pytest.mark.parametrize("calls", GARBAGE)
@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings")
def test_malformed_tool_calls_are_a_parse_error(litellm: Any, stub_server: StubServer, model: str, calls: Any) -> None:
    stub_server.enqueue(StubReply(text=None, tool_calls=calls))
    with pytest.raises(ProviderError) as info:
        complete(request(stub_server, model, tools=(GREP,)))
    assert info.value.kind == "parse" and info.value.billed, info.value.message
    assert info.value.message.startswith(model)
    assert "Traceback" not in info.value.message, info.value.message
    assert "site-packages" not in info.value.message and "received_args" not in info.value.message
    assert len(stub_server.requests) == 1


def test_a_bad_tool_definition_is_not_blamed_on_the_model(litellm: Any, stub_server: StubServer) -> None:
    """LiteLLM fails building an Anthropic request from this definition: nothing was sent,
    so it is not the model's malformed answer."""
    broken = {"type": "function", "function": {"name": "x", "parameters": 5}}
    with pytest.raises(ProviderError) as info:
        complete(request(stub_server, ANTHROPIC, tools=(broken,)))
    assert info.value.kind != "parse" and stub_server.requests == []


@pytest.mark.parametrize("model", [OPENAI, ANTHROPIC])
def test_a_cut_off_answer_says_length(litellm: Any, stub_server: StubServer, model: str) -> None:
    stub_server.enqueue(StubReply(text="It is in src/", finish_reason="length"))
    response = complete(request(stub_server, model, tools=(GREP,)))
    assert (response.text, response.finish_reason, response.tool_calls) == ("It is in src/", "length", ())


@pytest.mark.parametrize("model", [OPENAI, ANTHROPIC])
@pytest.mark.parametrize("tools", [(), (GREP,)])
def test_a_malformed_body_stays_a_server_error(litellm: Any, stub_server: StubServer, model: str, tools: Any) -> None:
    """A body that is not JSON is the provider's fault, tools or not: retried like a 5xx."""
    stub_server.reply_malformed()
    with pytest.raises(ProviderError) as info:
        complete(request(stub_server, model, tools=tools))
    assert info.value.kind == "server_error" and info.value.billed
    assert "malformed response body" in info.value.message


def test_anthropic_errors_map_to_kinds(litellm: Any, stub_server: StubServer) -> None:
    stub_server.reply_rate_limit("3")
    with pytest.raises(ProviderError) as info:
        complete(request(stub_server, ANTHROPIC, tools=(GREP,)))
    assert info.value.kind == "rate_limit" and info.value.retry_after == 3
    assert stub_server.billed == {"prompt_tokens": 0, "completion_tokens": 0}


def test_token_counts_include_the_tool_definitions(litellm: Any) -> None:
    provider = LiteLLMProvider()
    bare = provider.count_tokens(OPENAI, ASK)
    assert provider.count_tokens(OPENAI, ASK, (GREP,)) > bare + 10
    turn = [*ASK, {"role": "assistant", "content": None, "tool_calls": [ToolCall("c", "grep", '{"pattern": "main"}')
                                                                       .to_message()]},
            {"role": "tool", "tool_call_id": "c", "content": "src/app.py:12: def main():"}]
    assert provider.count_tokens(OPENAI, turn, (GREP,)) > provider.count_tokens(OPENAI, ASK, (GREP,))


# -- structured output ----------------------------------------------------------------------
SCHEMA = {"type": "object", "required": ["summary"], "properties": {"summary": {"type": "string"}}}


def test_a_schema_is_sent_as_response_format_where_the_model_supports_it(litellm: Any, stub_server: StubServer) -> None:
    for _ in range(3):
        stub_server.reply_text('{"summary": "ok"}')
    complete(request(stub_server, OPENAI, response_schema=SCHEMA))
    complete(request(stub_server, "openai/my-local-llm", response_schema=SCHEMA))
    complete(request(stub_server, OPENAI, response_schema=SCHEMA, tools=(GREP,)))
    supported, unknown, with_tools = (r.body for r in stub_server.requests)
    assert supported["response_format"]["type"] == "json_schema"
    assert supported["response_format"]["json_schema"]["schema"] == SCHEMA
    assert "response_format" not in unknown
    assert "response_format" not in with_tools  # some providers turn it into a forced tool call


def test_a_schema_reaches_anthropic_in_its_own_form(litellm: Any, stub_server: StubServer) -> None:
    stub_server.reply_text('{"summary": "ok"}')
    answer = complete(request(stub_server, ANTHROPIC, response_schema=SCHEMA))
    assert answer.text == '{"summary": "ok"}' and answer.tool_calls == ()
    [sent] = stub_server.requests
    # LiteLLM's translation of response_format for Anthropic (an output format, not a forced tool).
    assert sent.body["output_format"]["schema"]["properties"] == SCHEMA["properties"]
    assert "tools" not in sent.body and "tool_choice" not in sent.body


def _loop(tmp_path: Path, stub: StubServer, states: str) -> Path:
    path = tmp_path / "loop.yaml"
    path.write_text(textwrap.dedent(f"""\
        loopdsl: 1
        name: structured
        models:
          m: {{model: {OPENAI}, api_base: {stub.api_base}, max_tokens: 100}}
        start: ask
        states:
        """) + textwrap.indent(textwrap.dedent(states), "  "), encoding="utf-8")
    return path


def test_llm_and_evaluate_states_send_their_schema(litellm: Any, stub_server: StubServer, tmp_path: Path) -> None:
    path = _loop(tmp_path, stub_server, """\
        ask:
          llm: {model: m, prompt: Summarise., output: json, schema: {type: object, required: [summary]}}
          next: judge
        judge:
          evaluate: {model: m, prompt: "Judge {{ ask.text }}", criteria: [short]}
          next: plain
        plain:
          llm: {model: m, prompt: Anything.}
          next: done
        done: {end: completed}
        """)
    stub_server.reply_text('{"summary": "s"}')
    stub_server.reply_text('{"verdict": "accept", "feedback": "fine"}')
    stub_server.reply_text("free text")
    work = tmp_path / "work"
    work.mkdir()
    result = loopdsl.run(path, workdir=work)
    assert result.status == "completed", result.state.error
    ask, judge, plain = (r.body for r in stub_server.requests)
    assert ask["response_format"]["json_schema"]["schema"] == {"type": "object", "required": ["summary"]}
    assert judge["response_format"]["json_schema"]["schema"]["properties"]["verdict"]["enum"] == ["accept", "reject"]
    assert "response_format" not in plain


# -- stored responses ------------------------------------------------------------------------
def test_stored_responses_carry_tool_calls_and_finish_reason(litellm: Any, stub_server: StubServer,
                                                              tmp_path: Path) -> None:
    """An llm state whose alias offers tools through `params` gets a tool-call reply: the run
    store keeps the calls and the finish reason, so a replayed turn is whole."""
    path = _loop(tmp_path, stub_server, """\
        ask:
          llm: {model: m, prompt: Look.}
          next: done
        done: {end: completed}
        """)
    text = path.read_text().replace("max_tokens: 100}", "max_tokens: 100, params: {tools: [" + json.dumps(GREP) + "]}}")
    path.write_text(text)
    stub_server.reply_tool_calls(tool_call("grep", '{"pattern": "main"}', "call_z"), text="Looking.")
    store_dir = tmp_path / "store"
    work = tmp_path / "work"
    work.mkdir()
    result = loopdsl.run(path, workdir=work, store=store_dir)
    assert stub_server.requests[0].body["tools"] == [GREP]
    with RunStore(store_dir) as store:
        stored = store.get_response(request_key(result.run_id, "ask", 1, 1, 0, OPENAI))
    assert stored is not None and stored["finish_reason"] == "tool_calls"
    assert stored_tool_calls(stored) == (ToolCall("call_z", "grep", '{"pattern": "main"}'),)
    assert stored_tool_calls({"text": "stored before v1.1"}) == ()


# -- scripted tool turns ----------------------------------------------------------------------
def scripted(messages: Any, tools: Any = (GREP,)) -> LlmRequest:
    return LlmRequest(model="anthropic/claude-haiku-4-5", messages=tuple(messages), max_tokens=200, tools=tools)


def test_scripted_tool_calls_have_known_ids_and_raw_arguments() -> None:
    provider = ScriptedProvider.from_data({"fix": [
        {"tool_calls": [{"name": "grep", "args": {"pattern": "main"}}, {"name": "grep", "args": '{"pattern": '}],
         "text": "Two searches."},
        {"tool_calls": [{"name": "read_file"}]},
        "Done.",
    ]})
    first = asyncio.run(provider.complete(scripted(ASK), state="fix"))
    assert [c.to_data() for c in first.tool_calls] == [
        {"id": "call_1_1", "name": "grep", "arguments": '{"pattern": "main"}'},
        {"id": "call_1_2", "name": "grep", "arguments": '{"pattern": '},
    ]
    assert (first.text, first.finish_reason) == ("Two searches.", "tool_calls")
    conversation = [*ASK, first.assistant_message(),
                    *({"role": "tool", "tool_call_id": c.id, "content": "x"} for c in first.tool_calls)]
    second = asyncio.run(provider.complete(scripted(conversation), state="fix"))
    assert [(c.id, c.arguments) for c in second.tool_calls] == [("call_2_1", "{}")]
    conversation += [second.assistant_message(), {"role": "tool", "tool_call_id": "call_2_1", "content": "y"}]
    final = asyncio.run(provider.complete(scripted(conversation), state="fix"))
    assert (final.text, final.tool_calls, final.finish_reason) == ("Done.", (), "stop")
    # The conversation so far, tool calls and tool definitions included, is what it bills.
    assert final.prompt_tokens > second.prompt_tokens > first.prompt_tokens
    assert provider.count_tokens("m", ASK, (GREP,)) > provider.count_tokens("m", ASK)
    with pytest.raises(ScriptExhausted, match=r"state 'fix' \(attempt 2, turn 4\) asked for reply 4"):
        asyncio.run(provider.complete(scripted([*conversation, final.assistant_message()]), state="fix", attempt=2))


def test_running_out_without_tools_names_no_turn() -> None:
    provider = ScriptedProvider.from_data({"draft": []})
    with pytest.raises(ScriptExhausted, match=r"state 'draft' asked for reply 1"):
        asyncio.run(provider.complete(scripted(ASK, tools=()), state="draft"))
