"""Runs (`run STORE REPO`) or resumes (`resume STORE RUN_ID`) the fan-out of
test_fan_out_worktrees.py in a process of its own, so the test can SIGKILL it while one
item's tool call holds (as long as `$TMPDIR/hold` exists) and another item has finished.

The model is a provider port answering by the conversation: item `a` writes a.txt and
answers; item `b` writes b.txt, calls `hold`, then answers. The run lock's TTL is lowered
(crash_driver.py).
"""
import asyncio
import json

from crash_driver import run_or_resume, shorten_lock_ttl

from loopdsl.runtime.model_port import LlmResponse, ToolCall


class Provider:
    async def complete(self, request, *, state, attempt=None):
        turn = 1 + sum(1 for m in request.messages if m["role"] == "assistant")
        name = request.messages[0]["content"].split()[-1].rstrip(".")
        plan = {1: [("write_file", {"path": f"{name}.txt", "content": f"{name}\n"})]}
        if name == "b":
            plan[2] = [("hold", {})]
        calls = plan.get(turn)
        usage = {"prompt_tokens": 100, "completion_tokens": 10}
        if calls is None:
            return LlmResponse(text=f"{name} done", cost_usd=None, model=request.model, finish_reason="stop", **usage)
        return LlmResponse(text="", cost_usd=None, model=request.model, finish_reason="tool_calls", **usage,
                           tool_calls=tuple(ToolCall(f"call_{turn}_{i}", n, json.dumps(a))
                                            for i, (n, a) in enumerate(calls, start=1)))

    def count_tokens(self, model, messages, tools=()):
        return 100


shorten_lock_ttl()
asyncio.run(run_or_resume(Provider(), lambda result: {"items": result.state.results.get("each", {}).get("items")}))
