"""Runs (`run STORE WORKDIR`) or resumes (`resume STORE RUN_ID`) the agent loop of
test_agent_crash.py in a process of its own, so the test can SIGKILL it mid-conversation.

The model is a provider port answering by the conversation so far; before answering it
appends one line per request to $REQUESTS (`turn N`), so the test counts what was paid.
The run lock's TTL is lowered (crash_driver.py). test_agent_crash.py also imports `Provider`
to resume runs in its own process.
"""
import asyncio
import json
import os

from crash_driver import run_or_resume, shorten_lock_ttl

from loopdsl.runtime.model_port import LlmResponse, ToolCall


class Provider:
    async def complete(self, request, *, state, attempt=None):
        turn = 1 + sum(1 for m in request.messages if m["role"] == "assistant")
        with open(os.environ["REQUESTS"], "a") as log:
            log.write(f"turn {turn}\n")
        slow = os.environ.get("SLOW_TURN_FLAG")
        if slow and turn == 3 and not os.path.exists(slow):  # hang once in turn 3: the test kills us here
            open(slow, "w").close()
            await asyncio.sleep(60)
        usage = {"prompt_tokens": 100, "completion_tokens": 10}
        if turn <= 3:
            calls = (ToolCall(f"call_{turn}_1", "mark", json.dumps({"n": turn, "sleep": int(os.environ.get("CALL_2_SLEEP", "30")) if turn == 2 else 0})),)
            return LlmResponse(text="", cost_usd=None, model=request.model, tool_calls=calls,
                               finish_reason="tool_calls", **usage)
        seen = [m["content"] for m in request.messages if m["role"] == "tool"]
        return LlmResponse(text=json.dumps({"seen": seen}), cost_usd=None, model=request.model,
                           finish_reason="stop", **usage)

    def count_tokens(self, model, messages, tools=()):
        return 100


if __name__ == "__main__":
    shorten_lock_ttl()
    asyncio.run(run_or_resume(Provider()))
