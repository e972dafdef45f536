"""Per-turn overhead of an `agent` state beside a bare LiteLLM tool loop and LangGraph's agent.

    python bench/agent_overhead.py [--turns 10] [--rounds 5] [--profile]

The same conversation three ways, against one loopback OpenAI-compatible stub
(tests/stub_server.py, in a process of its own so its CPU is not the client's): the model
asks for `read_file {"path": "note.txt"}` on each of `--turns` turns, then answers. The
tool reads a 5-line file of a temporary directory.
  - bare:      `litellm.acompletion` in a loop, the tool a Python function, messages
               appended by hand (what a person would write without a framework);
  - loopdsl:   an `agent` state (built-in read_file, reservation per turn, events, stored
               first request, started/done tool records), in memory and with a store;
  - langgraph: `langgraph.prebuilt.create_react_agent` with `langchain_openai.ChatOpenAI`
               pointed at the stub, the tool a `@tool` function.
Rounds are interleaved (each round runs every side once, in a rotating order) and the
best round of each side is kept; wall and CPU time of this process are both reported,
per turn (a turn = one model request and its tool calls). Ratios against the bare loop
are what we track; the absolute times move with the machine's load.

`--profile` runs loopdsl's in-memory side under cProfile and prints the top functions.
Needs: litellm (a loopdsl dependency), langgraph and langchain-openai (bench only).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODEL = "bench-model"
NOTE = "".join(f"line {i} of the note\n" for i in range(1, 6))
LOOP = """loopdsl: 1
name: agent-overhead
models:
  stub: {{model: openai/{model}, api_base: "{api_base}", max_tokens: 64,
          price: {{input_per_mtok: 1.0, output_per_mtok: 2.0}}}}
start: work
states:
  work:
    agent: {{model: stub, prompt: "Read note.txt until you are sure of it.", tools: [read_file],
             max_turns: {max_turns}, max_tool_calls: 1000}}
    next: done
  done: {{end: completed, output: {{answer: "{{{{ work.text }}}}"}}}}
"""
STUB = """
import json, sys
sys.path.insert(0, sys.argv[1])
from http.server import BaseHTTPRequestHandler
from stub_server import StubReply, StubServer, tool_call
# The stub writes headers and body separately: with Nagle's algorithm on, the client's
# delayed ACK holds the body ~40 ms, which would swamp every side's own time.
BaseHTTPRequestHandler.disable_nagle_algorithm = True
turns = int(sys.argv[2])
def respond(body):
    done = sum(1 for m in body["messages"] if m.get("role") == "tool")
    if done < turns:
        return StubReply(text=None, tool_calls=[tool_call("read_file", {"path": "note.txt"}, f"call_{done + 1}")],
                         prompt_tokens=40 + 30 * done, completion_tokens=12)
    return StubReply(text="The note has 5 lines.", prompt_tokens=40 + 30 * done, completion_tokens=8)
stub = StubServer(responder=respond).start()
print(stub.api_base, flush=True)
sys.stdin.read()
stub.stop()
"""
READ_FILE = {"type": "function", "function": {
    "name": "read_file", "description": "Read a text file of the workspace.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}


def make_repository(folder: Path) -> None:
    """note.txt committed in a git repository: an agent's workspace is a checkout, and the
    built-in tools ask git what is ignored."""
    (folder / "note.txt").write_text(NOTE, encoding="utf-8")
    (folder / ".gitignore").write_text("store/\n*.yaml\n", encoding="utf-8")
    git = ["git", "-c", "user.name=bench", "-c", "user.email=bench@localhost"]
    for args in (["init", "-q"], ["add", "note.txt", ".gitignore"], ["commit", "-q", "-m", "note"]):
        subprocess.run([*git, *args], cwd=folder, check=True)


def start_stub(turns: int) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, "-c", STUB, str(ROOT / "tests"), str(turns)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


# --------------------------------------------------------------------------- the three sides


def bare_side(api_base: str, folder: Path) -> Callable[[], Awaitable[int]]:
    from loopdsl.adapters.litellm import ensure_litellm

    litellm = ensure_litellm()  # the same settings loopdsl uses (offline price map, no retries)

    def read_file(path: str) -> str:
        return (folder / path).read_text(encoding="utf-8")

    async def conversation() -> int:
        messages: list[dict[str, Any]] = [{"role": "user", "content": "Read note.txt until you are sure of it."}]
        turns = 0
        while True:
            turns += 1
            reply = await litellm.acompletion(model=f"openai/{MODEL}", api_base=api_base, api_key="sk-local",
                                              messages=messages, tools=[READ_FILE], max_tokens=64, num_retries=0)
            message = reply.choices[0].message
            calls = message.tool_calls or []
            messages.append({"role": "assistant", "content": message.content, "tool_calls": [
                {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
                for c in calls]} if calls else {"role": "assistant", "content": message.content})
            if not calls:
                return turns
            for call in calls:
                result = read_file(**json.loads(call.function.arguments))
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result})

    return conversation


def loopdsl_side(api_base: str, folder: Path, turns: int, durable: bool) -> Callable[[], Awaitable[int]]:
    from loopdsl.api.runs import arun, resolve_loop

    path = folder / "agent.yaml"
    path.write_text(LOOP.format(model=MODEL, api_base=api_base, max_turns=turns + 1), encoding="utf-8")
    loop = resolve_loop(path)  # parsed once, as a long-lived process would; compiled per run
    store = folder / "store" if durable else None

    async def conversation() -> int:
        result = await arun(loop, workdir=folder, store=store)
        if result.status != "completed":
            raise SystemExit(f"the loopdsl run ended {result.status}: {result.state.error}")
        work = result.state.results["work"]
        if not all(call["ok"] and call["result"] == NOTE for call in work["tool_calls"]):
            raise SystemExit(f"a loopdsl tool call failed: {work['tool_calls'][:1]}")
        return int(work["turns"])

    return conversation


def langgraph_side(api_base: str, folder: Path, turns: int) -> Callable[[], Awaitable[int]]:
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.prebuilt import create_react_agent

    @tool
    def read_file(path: str) -> str:
        """Read a text file of the workspace."""
        return (folder / path).read_text(encoding="utf-8")

    model = ChatOpenAI(model=MODEL, base_url=api_base, api_key="sk-local", max_tokens=64, max_retries=0)
    agent = create_react_agent(model, [read_file])
    prompt = {"messages": [{"role": "user", "content": "Read note.txt until you are sure of it."}]}

    async def conversation() -> int:
        state = await agent.ainvoke(prompt, {"recursion_limit": 4 * turns + 10})
        return sum(1 for m in state["messages"] if m.type == "ai")

    return conversation


# --------------------------------------------------------------------------- measuring


async def timed(conversation: Callable[[], Awaitable[int]]) -> tuple[float, float, int]:
    started, cpu = time.perf_counter(), time.process_time()
    turns = await conversation()
    return time.perf_counter() - started, time.process_time() - cpu, turns


async def measure(sides: dict[str, Callable[[], Awaitable[int]]], rounds: int, expected: int) -> dict[str, dict[str, float]]:
    for conversation in sides.values():  # warm-up: imports, connection pools, first compiles
        await conversation()
    best: dict[str, dict[str, float]] = {name: {"wall": float("inf"), "cpu": float("inf")} for name in sides}
    names = list(sides)
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            wall, cpu, turns = await timed(sides[name])
            if turns != expected:
                raise SystemExit(f"{name} made {turns} turns, not {expected}")
            best[name]["wall"] = min(best[name]["wall"], wall / turns * 1e6)
            best[name]["cpu"] = min(best[name]["cpu"], cpu / turns * 1e6)
    return best


def profile(side: Callable[[], Awaitable[int]]) -> None:
    import cProfile
    import pstats

    profiler = cProfile.Profile()

    async def many() -> None:
        await side()  # warm-up outside the profile: imports, tokenizer, connection pool
        profiler.enable()
        for _ in range(10):
            await side()
        profiler.disable()

    asyncio.run(many())
    stats = pstats.Stats(profiler)
    stats.sort_stats("cumulative").print_stats("loopdsl/", 60)
    stats.sort_stats("tottime").print_stats(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=10, help="tool turns before the final answer (default 10)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds; the best of each side is kept")
    parser.add_argument("--profile", action="store_true", help="cProfile loopdsl's in-memory side instead")
    opts = parser.parse_args()
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    os.environ["OPENAI_API_KEY"] = "sk-local"  # the stub takes any key; loopdsl reads it from the environment
    stub, api_base = start_stub(opts.turns)
    try:
        with tempfile.TemporaryDirectory(prefix="agent-overhead-") as tmp:
            folder = Path(tmp)
            make_repository(folder)
            if opts.profile:
                profile(loopdsl_side(api_base, folder, opts.turns, durable=False))
                return
            sides = {"bare": bare_side(api_base, folder),
                     "loopdsl": loopdsl_side(api_base, folder, opts.turns, durable=False),
                     "loopdsl+store": loopdsl_side(api_base, folder, opts.turns, durable=True),
                     "langgraph": langgraph_side(api_base, folder, opts.turns)}
            best = asyncio.run(measure(sides, opts.rounds, opts.turns + 1))
    finally:
        assert stub.stdin is not None
        stub.stdin.close()
        stub.wait(timeout=10)
    report(best, opts)


def report(best: dict[str, dict[str, float]], opts: argparse.Namespace) -> None:
    bare = best["bare"]
    print(f"{opts.turns} tool turns + a final answer, best of {opts.rounds} interleaved rounds; us per turn")
    print(f"{'side':<15}{'wall':>10}{'cpu':>10}{'wall/bare':>11}{'cpu/bare':>10}")
    for name, fig in best.items():
        print(f"{name:<15}{fig['wall']:>10.0f}{fig['cpu']:>10.0f}{fig['wall'] / bare['wall']:>10.2f}x"
              f"{fig['cpu'] / bare['cpu']:>9.2f}x")
    ours, lg = best["loopdsl"], best["langgraph"]
    print(f"loopdsl / bare: {ours['wall'] / bare['wall']:.2f}x wall (target <= 1.15x); "
          f"loopdsl / langgraph: {ours['wall'] / lg['wall']:.2f}x wall (target < 1)")


if __name__ == "__main__":
    main()
