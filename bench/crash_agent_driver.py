"""One `run` or `resume` of crash_torture_agent.py's loop in a process of its own, with the
model a provider port instead of LiteLLM over HTTP, so a process starts in about a second
(the LiteLLM import takes 5-15 s on a loaded machine, and a torture of 100 kills starts
hundreds of processes). The answers are those of crash_torture_agent.AgentStub; each
request appends `N` (its turn) to $TORTURE_TURNS before it is answered: the provider's log.

    python bench/crash_agent_driver.py run STORE LOOP      (in the run's working directory)
    python bench/crash_agent_driver.py resume STORE RUN_ID

Prints `ready` when loaded, then exits as the CLI would: 0 completed, 4 waiting for a
person, 2 (message on stderr) when the run could not be taken (its lock still held), 1 else.
"""
import asyncio
import json
import os
import sys
from pathlib import Path

import loopdsl.adapters.store.run_store as store

store.RunStore.lock.__wrapped__.__kwdefaults__["ttl"] = float(os.environ.get("CRASH_LOCK_TTL", "0.5"))

from loopdsl.api.durable import resume_durable  # noqa: E402
from loopdsl.api.runs import arun  # noqa: E402
from loopdsl.runtime.model_port import LlmResponse, ToolCall  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from crash_torture_agent import answer  # noqa: E402


class Provider:
    def __init__(self) -> None:
        self.pause = float(os.environ["TORTURE_PAUSE"])

    async def complete(self, request, *, state, attempt=None):
        messages = list(request.messages)
        turn = 1 + sum(1 for m in messages if m["role"] == "assistant")
        with open(os.environ["TORTURE_TURNS"], "a") as log:
            log.write(f"{turn}\n")
        text, calls, prompt, completion = answer(messages, self.pause)
        tool_calls = tuple(ToolCall(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in calls)
        return LlmResponse(text=text or "", cost_usd=None, model=request.model, tool_calls=tool_calls,
                           finish_reason="tool_calls" if tool_calls else "stop",
                           prompt_tokens=prompt, completion_tokens=completion)

    def count_tokens(self, model, messages, tools=()):
        return 40 * len(messages)


async def main() -> int:
    command, store_dir = sys.argv[1], Path(sys.argv[2])
    print("ready", flush=True)
    try:
        if command == "run":
            result = await arun(Path(sys.argv[3]), workdir=Path.cwd(), provider=Provider(), store=store_dir)
        else:
            result = await resume_durable(sys.argv[3], store=store_dir, provider=Provider())
    except Exception as exc:  # noqa: BLE001 - reported as the CLI would, for the torture to read
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({"run_id": result.run_id, "status": result.status}))
    return {"completed": 0, "waiting": 4}.get(result.status, 1)


sys.exit(asyncio.run(main()))
