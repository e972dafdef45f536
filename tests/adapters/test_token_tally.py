"""The reservation's token count, counted once per message (adapters/litellm_tokens.py):
over generated conversations it always equals LiteLLM's count of the whole request, so a
turn is never reserved for fewer tokens than a whole count would give."""
from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loopdsl.adapters.litellm import LiteLLMProvider, ensure_litellm
from loopdsl.adapters.litellm_tokens import TokenTally, count_prompt_tokens

pytestmark = pytest.mark.xdist_group("litellm")  # LiteLLM imported in-process: once a run, on one worker

MODELS = ("openai/gpt-4o-mini", "anthropic/claude-haiku-4-5", "openai/my-local-llm")
TOOL = {"type": "function", "function": {"name": "read_file", "description": "Read a file.",
                                         "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}
OTHER_TOOL = {"type": "function", "function": {"name": "grep", "description": "Search ünïcode ✓.",
                                               "parameters": {"type": "object", "properties": {}}}}

text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=60)
user = st.builds(lambda t: {"role": "user", "content": t}, text)
system = st.builds(lambda t: {"role": "system", "content": t}, text)
tool_result = st.builds(lambda t, i: {"role": "tool", "tool_call_id": f"call_{i}", "content": t}, text, st.integers(0, 99))
assistant = st.builds(
    lambda t, args: {"role": "assistant", "content": t or None, "tool_calls": [
        {"id": f"call_{i}", "type": "function", "function": {"name": "read_file", "arguments": a}}
        for i, a in enumerate(args)] or None},
    text, st.lists(text, max_size=3))
named = st.builds(lambda t, n: {"role": "user", "content": t, "name": n}, text, st.from_regex(r"[a-z]{1,8}", fullmatch=True))
message = st.one_of(user, assistant, tool_result, named, system)
# One step of a run: append messages, rewrite an earlier message (a new conversation), or
# change the model or the tools offered.
step = st.one_of(
    st.tuples(st.just("append"), st.lists(message, min_size=1, max_size=3)),
    st.tuples(st.just("rewrite"), st.tuples(st.integers(0, 50), message)),
    st.tuples(st.just("model"), st.sampled_from(MODELS)),
    st.tuples(st.just("tools"), st.sampled_from(((), (TOOL,), (TOOL, OTHER_TOOL)))),
    st.tuples(st.just("other"), st.integers(0, 2)),  # switch between conversations in flight
)


@pytest.fixture(scope="module", autouse=True)
def litellm() -> Any:
    return ensure_litellm()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(first=st.lists(message, min_size=1, max_size=3), steps=st.lists(step, max_size=14))
def test_tally_equals_a_whole_count_of_every_request(first: list[dict[str, Any]], steps: list[tuple[str, Any]]) -> None:
    tally = TokenTally()
    conversations = [list(first), list(first), [{"role": "user", "content": "another"}]]
    current, model, tools = 0, MODELS[0], (TOOL,)
    for kind, value in [("append", []), *steps]:
        messages = conversations[current]
        if kind == "append":
            messages.extend(value)
        elif kind == "rewrite":
            messages[value[0] % len(messages)] = value[1]
        elif kind == "model":
            model = value
        elif kind == "tools":
            tools = value
        else:
            current = value
        sent = [dict(m) for m in conversations[current]]  # each request holds copies, as LlmRequest does
        assert tally.count(model, sent, tools) == count_prompt_tokens(model, sent, tools)


def test_a_growing_conversation_tokenizes_each_message_once(litellm: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The point of the tally: turn n counts only the messages turn n-1 did not have."""
    provider = LiteLLMProvider()
    counted: list[int] = []
    real = litellm.token_counter

    def counting(**kw: Any) -> int:
        counted.append(len(kw.get("messages") or ()))
        return int(real(**kw))

    monkeypatch.setattr(litellm, "token_counter", counting)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Go."}]
    for turn in range(1, 31):
        total = provider.count_tokens("openai/gpt-4o-mini", [dict(m) for m in messages], (TOOL,))
        monkeypatch.setattr(litellm, "token_counter", real)
        assert total == count_prompt_tokens("openai/gpt-4o-mini", messages, (TOOL,))
        monkeypatch.setattr(litellm, "token_counter", counting)
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{turn}", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a"}'}}]})
        messages.append({"role": "tool", "tool_call_id": f"c{turn}", "content": "line\n" * turn})
    # The first request whole (2 messages), the constant of no message once, then the 2 new
    # messages of each later turn in one call.
    assert counted == [2, 2, 0] + [2] * 28
