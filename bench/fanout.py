"""Fan-out benchmark: 200 children of a 5-call loop beside a bare asyncio.gather.

    python bench/fanout.py [--children 200] [--latency 0.1] [--rounds 1]

Both sides make the same 1,000 `litellm.acompletion` calls to a loopback
OpenAI-compatible stub that answers each after `--latency` seconds:
  - bare:    asyncio.gather of 200 tasks, each awaiting its 5 calls in a row;
  - loopdsl: a parent loop whose `loop:` state fans out over 200 items with
             `concurrency: 200`, each child a loop of five `llm` states
             (reservation, token count, settle, events: the whole engine).
Each side runs in its own process so peak memory (max RSS) is its own; the time
excludes interpreter start and the LiteLLM import. A third run gives the parent a
budget that fits only part of the calls and checks the cap is never exceeded while
200 children reserve concurrently. With `--rounds N` the two sides alternate N times and
the best time of each is compared (a loaded machine moves single runs a lot).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import resource
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # stub_server and the helpers it imports

CHILD = """loopdsl: 1
name: fanout-child
inputs: {{i: {{type: integer}}}}
models:
  stub: {{model: openai/bench-model, api_base: "{api_base}", max_tokens: 16, price: {{input_per_mtok: 1.0, output_per_mtok: 2.0}}}}
start: c1
states:
  c1: {{llm: {{model: stub, prompt: "item {{{{ inputs.i }}}} call 1"}}, next: c2}}
  c2: {{llm: {{model: stub, prompt: "item {{{{ inputs.i }}}} call 2"}}, next: c3}}
  c3: {{llm: {{model: stub, prompt: "item {{{{ inputs.i }}}} call 3"}}, next: c4}}
  c4: {{llm: {{model: stub, prompt: "item {{{{ inputs.i }}}} call 4"}}, next: c5}}
  c5: {{llm: {{model: stub, prompt: "item {{{{ inputs.i }}}} call 5"}}, next: done}}
  done: {{end: completed, output: {{last: "{{{{ c5.text }}}}"}}}}
"""
PARENT = """loopdsl: 1
name: fanout-parent
inputs: {{n: {{type: integer, default: 200}}}}
budget: {budget}
start: prepare
states:
  prepare: {{set: {{list: {items}}}, next: fan}}
  fan:
    loop: child.yaml
    for_each: prepare.list
    concurrency: {n}
    tolerate_failures: {n}
    with: {{i: "{{{{ item }}}}"}}
    next: done
  done: {{end: completed}}
"""


def child_process(mode: str, api_base: str, n: int, budget: str) -> dict:
    from loopdsl.adapters.litellm import ensure_litellm

    lib = ensure_litellm()  # imported before timing: both sides pay it outside the clock
    if mode == "bare":
        async def chain(i: int) -> None:
            for call in range(1, 6):
                await lib.acompletion(model="openai/bench-model", api_base=api_base, api_key="sk-local",
                                      messages=[{"role": "user", "content": f"item {i} call {call}"}],
                                      max_tokens=16, num_retries=0, max_retries=0)

        async def everything() -> None:
            await asyncio.gather(*(chain(i) for i in range(n)))

        started, cpu = time.perf_counter(), time.process_time()
        asyncio.run(everything())
        return {"seconds": time.perf_counter() - started, "cpu_s": time.process_time() - cpu, "calls": n * 5}
    import loopdsl

    folder = Path(tempfile.mkdtemp())
    (folder / "child.yaml").write_text(CHILD.format(api_base=api_base))
    (folder / "parent.yaml").write_text(PARENT.format(n=n, budget=budget, items=list(range(n))))
    started, cpu = time.perf_counter(), time.process_time()
    result = loopdsl.run(folder / "parent.yaml", {"n": n})
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    fan = result.state.results.get("fan") or {}
    items = fan.get("items") or []
    # Why children failed, by error (the children's events reach the parent tagged `child`).
    failures = Counter(f"{e['event'].get('kind')}: {str(e['event'].get('message'))[:200]}" for e in result.events
                       if e.get("type") == "child" and e["event"].get("type") == "failed")
    return {
        "failures": dict(failures.most_common(5)),
        "seconds": seconds,
        "cpu_s": cpu,  # CPU time of the process: what the load of the machine moves least
        "status": result.status,
        "children_completed": sum(1 for it in items if it.get("status") == "completed"),
        "tokens": result.tokens,
        "cost_usd": result.cost_usd,
        "error": result.state.error,
    }


def listen_overflows() -> int | None:
    """Connections this host's kernel dropped because a listening socket's accept queue was
    full (Linux's TcpExt ListenOverflows, host-wide); None where it cannot be read."""
    try:
        lines = Path("/proc/net/netstat").read_text().splitlines()
    except OSError:
        return None
    for names, values in zip(lines, lines[1:]):
        if names.startswith("TcpExt:") and values.startswith("TcpExt:"):
            counters = dict(zip(names.split(), values.split()))
            return int(counters["ListenOverflows"]) if "ListenOverflows" in counters else None
    return None


def measure(mode: str, api_base: str, n: int, budget: str = "{}", root: Path = ROOT) -> dict:
    """One side in a fresh process; `root` is the checkout whose loopdsl it imports."""
    before = listen_overflows()
    out = subprocess.run(
        [sys.executable, __file__, "--child", mode, "--api-base", api_base, "--children", str(n), "--budget", budget,
         "--root", str(root)],
        capture_output=True, text=True, check=False,
    )
    if out.returncode != 0:
        raise SystemExit(f"{mode} run failed:\n{out.stderr[-3000:]}")
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    after = listen_overflows()
    figures["listen_overflows"] = None if before is None or after is None else after - before
    return figures


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--children", type=int, default=200)
    parser.add_argument("--latency", type=float, default=0.1)
    parser.add_argument("--rounds", type=int, default=1, help="alternate the two sides this many times; best of each")
    parser.add_argument("--child")
    parser.add_argument("--api-base")
    parser.add_argument("--budget", default="{}")
    parser.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        sys.path.insert(0, str(args.root))
        figures = child_process(args.child, args.api_base, args.children, args.budget)
        figures["max_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(json.dumps(figures))
        return
    from stub_server import StubReply, StubServer

    with StubServer() as stub:
        def refill() -> None:
            stub.reset()
            stub.enqueue(*[StubReply(text="ok", prompt_tokens=12, completion_tokens=4, delay_s=args.latency)
                           for _ in range(args.children * 5)])

        rounds: list[tuple[dict, dict]] = []
        for index in range(args.rounds):
            refill()
            bare_round = measure("bare", stub.api_base, args.children)
            refill()
            ours_round = measure("loopdsl", stub.api_base, args.children)
            ours_round["served"] = len(stub.requests)
            rounds.append((bare_round, ours_round))
            if args.rounds > 1:
                print(f"round {index + 1}: bare {bare_round['seconds']:.2f} s, loopdsl {ours_round['seconds']:.2f} s "
                      f"({ours_round['seconds'] / bare_round['seconds']:.2f}x), "
                      f"{ours_round['children_completed']} children completed", flush=True)
        bare = min((b for b, _ in rounds), key=lambda f: f["seconds"])
        ours = min((o for _, o in rounds), key=lambda f: f["seconds"])
        served_ours = ours["served"]
        # Each call reserves about 16 + 15 tokens: a cap of 10,000 tokens fits ~300 of 1,000.
        refill()
        capped = measure("loopdsl", stub.api_base, args.children, budget="{tokens: 10000}")
    print(f"{args.children} children x 5 calls, stub latency {args.latency * 1000:.0f} ms, one process each")
    print(f"bare asyncio.gather of litellm.acompletion: {bare['seconds']:.2f} s (CPU {bare['cpu_s']:.2f} s), "
          f"max RSS {bare['max_rss_mb']:.0f} MB")
    print(f"loopdsl fan-out (concurrency {args.children}):    {ours['seconds']:.2f} s (CPU {ours['cpu_s']:.2f} s), max RSS {ours['max_rss_mb']:.0f} MB, "
          f"status {ours['status']}, {ours['children_completed']} children completed, {served_ours} requests served")
    for error, count in sum((Counter(o["failures"]) for _, o in rounds), Counter()).most_common():
        print(f"  {count} failed calls (all rounds): {error}")
    print("connections the kernel dropped from a full accept queue (ListenOverflows, whole host): "
          f"bare {[b['listen_overflows'] for b, _ in rounds]}, loopdsl {[o['listen_overflows'] for _, o in rounds]}, "
          f"capped {capped['listen_overflows']}")
    print(f"ratio loopdsl / bare: {ours['seconds'] / bare['seconds']:.2f}x (target <= 1.3x)")
    within = capped["tokens"] <= 10000
    print(f"capped run (tokens 10000): spent {capped['tokens']} tokens, status {capped['status']}, "
          f"{capped['children_completed']} children completed: cap {'held' if within else 'EXCEEDED'}")
    if not within:
        sys.exit(1)


if __name__ == "__main__":
    main()
