"""Runs (`run STORE WORKDIR`) or resumes (`resume STORE RUN_ID`) the edit_file loop of
test_agent_edit_resume.py in a process of its own, so the test can SIGKILL it: turn 1 edits
calc.py, turn 2 hangs once (flag file $HANG_FLAG) so the test kills the run there, then answers."""
import asyncio
import json
import os

from crash_driver import run_or_resume, shorten_lock_ttl

from loopdsl.runtime.model_port import LlmResponse, ToolCall


class Provider:
    async def complete(self, request, *, state, attempt=None):
        turn = 1 + sum(1 for m in request.messages if m["role"] == "assistant")
        usage = {"prompt_tokens": 100, "completion_tokens": 10}
        if turn == 1:
            args = json.dumps({"path": "calc.py", "old": "a - b", "new": "a + b"})
            return LlmResponse(text="", cost_usd=None, model=request.model, tool_calls=(ToolCall("call_1_1", "edit_file", args),),
                               finish_reason="tool_calls", **usage)
        flag = os.environ["HANG_FLAG"]
        if not os.path.exists(flag):
            open(flag, "w").close()
            await asyncio.sleep(60)
        seen = [m["content"] for m in request.messages if m["role"] == "tool"]
        return LlmResponse(text=json.dumps({"seen": seen}), cost_usd=None, model=request.model, finish_reason="stop",
                           **usage)

    def count_tokens(self, model, messages, tools=()):
        return 100


shorten_lock_ttl()
asyncio.run(run_or_resume(Provider()))
