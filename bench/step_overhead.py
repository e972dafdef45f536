"""Per-step interpreter overhead of loopdsl beside its peers, in one process run.

    python bench/step_overhead.py [N]        (default N=1000)

The loop is the peers' trivial loop (../shared/bench/peers_step_overhead.py): two
states alternating, N state executions, a guard deciding when to stop. loopdsl runs
it as a loop file of two `set` states:
  - in memory (the engine with no store: what `loopdsl.run(...)` does by default);
  - durable (a diskcache run store, one committed transaction per step, SQLite WAL
    with synchronous NORMAL: a killed process resumes from the last step), holding the
    run's lock as `loopdsl run` does, so each commit also checks the lock's owner token.
Peers are measured by importing the shared peer benchmark when it is beside the
checkout; ratios are computed against figures from this same run.
"""
from __future__ import annotations

import asyncio
import importlib.util
import os
import sys
import tempfile
import time
from pathlib import Path

from loopdsl.adapters.store.ports import StoreResponses, StoreRunLog
from loopdsl.api.runs import new_run_state
from loopdsl.language.compile import compile_loop
from loopdsl.runtime.engine import Engine, MemoryResponses, MemoryRunLog, Ports
from loopdsl.language.model import build_loop
from loopdsl.adapters.store.run_store import RunStore

N = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
# The shared peer benchmark beside the checkout; LOOPDSL_BENCH_PEERS names it elsewhere
# (a git worktree of the project sits one level deeper).
PEERS = Path(os.environ.get("LOOPDSL_BENCH_PEERS")
             or Path(__file__).resolve().parents[2] / "shared" / "bench" / "peers_step_overhead.py")


def bench_loop(n: int):
    return build_loop({
        "loopdsl": 1, "name": "bench", "budget": {"steps": n + 10},
        "start": "act",
        "states": {
            "act": {"set": {"count": "run.visits"}, "next": "check"},
            "check": {"set": {"seen": "act.count * 2"},
                      "transitions": [{"to": "done", "when": f"check.seen >= {n}"}, {"to": "act"}]},
            "done": {"end": "completed"},
        },
    })


def _no_provider():
    raise RuntimeError("the benchmark loop makes no model calls")


def run_loopdsl(n: int, durable: bool) -> float:
    compiled = compile_loop(bench_loop(n))
    store = lock = None
    if durable:
        store = RunStore(Path(tempfile.mkdtemp()) / "store")
        run_id = store.new_run_id()
        lock = store.lock(run_id)
        run_log, responses = StoreRunLog(store, run_id, lock), StoreResponses(store, lock)
    else:
        run_id, run_log, responses = "bench", MemoryRunLog(), MemoryResponses()
    state = new_run_state(compiled.loop, run_id, {})
    if store is not None:
        store.create_run(run_id, state.to_json(), lock=lock)
    ports = Ports(provider=_no_provider, run_log=run_log, responses=responses, keep_events=False)
    engine = Engine(compiled, state, ports)
    t = time.perf_counter()
    asyncio.run(engine.execute())
    elapsed = time.perf_counter() - t
    assert state.status == "completed", state.error
    steps = engine.ledger.steps
    if store is not None:
        store.close()
    return elapsed / steps


def load_peers():
    if not PEERS.exists():
        return None
    spec = importlib.util.spec_from_file_location("peers_step_overhead", PEERS)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    saved = sys.argv
    sys.argv = [str(PEERS), str(N)]
    try:
        spec.loader.exec_module(module)
    finally:
        sys.argv = saved
    return module


def best_of(fn, repeat: int = 7) -> float:
    return min(fn() for _ in range(repeat))


def main() -> None:
    peers = load_peers()
    figures: dict[str, float] = {}
    if peers is not None:
        for name, fn in [("burr (no persister)", lambda: peers.bench_burr(False)),
                         ("langgraph (no checkpointer)", lambda: peers.bench_langgraph(False)),
                         ("burr + SQLite persister", lambda: peers.bench_burr(True)),
                         ("langgraph + SqliteSaver", lambda: peers.bench_langgraph(True))]:
            try:
                figures[name] = best_of(fn, repeat=3)
            except Exception as exc:  # a missing peer is reported, not fatal
                print(f"{name:34s} unavailable: {type(exc).__name__}: {exc}")
    else:
        print(f"peer benchmark not found at {PEERS}: printing loopdsl alone")
    # The ratios' two sides are measured interleaved, best of 7 rounds each, so that a
    # change in the machine's load affects both alike.
    rounds: dict[str, list[float]] = {"transitions (raw, in-memory)": [], "loopdsl (in memory)": [],
                                      "loopdsl (durable store)": []}
    for _ in range(7):
        if peers is not None:
            rounds["transitions (raw, in-memory)"].append(peers.bench_transitions())
        rounds["loopdsl (in memory)"].append(run_loopdsl(N, durable=False))
        rounds["loopdsl (durable store)"].append(run_loopdsl(N, durable=True))
    figures.update({name: min(values) for name, values in rounds.items() if values})
    print(f"N={N} steps, microseconds per step (best of 7 interleaved rounds; peers best of 3)")
    for name, seconds in sorted(figures.items(), key=lambda item: item[1]):
        print(f"{name:34s} {seconds * 1e6:10.1f} us/step")
    raw = figures.get("transitions (raw, in-memory)")
    if raw:
        print(f"ratio loopdsl in-memory / raw transitions: {figures['loopdsl (in memory)'] / raw:.2f}x (target <= 3x)")
    durable_peers = [figures[k] for k in ("burr + SQLite persister", "langgraph + SqliteSaver") if k in figures]
    if durable_peers:
        fastest = min(durable_peers)
        print(f"ratio loopdsl durable / fastest durable peer: {figures['loopdsl (durable store)'] / fastest:.2f}x (target <= 0.33x)")


if __name__ == "__main__":
    main()
