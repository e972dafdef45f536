"""A/B of step_overhead.py: this checkout against another (`--base`), interleaved.

    python bench/ab_step_overhead.py --base ../main [--rounds 4] [--peer-rounds 2] [N]

Each round runs, in one fresh process per checkout (each importing its own loopdsl):
raw transitions, loopdsl in memory and durable (best of 3 each); the base's process also
runs the durable peers (Burr + SQLite, LangGraph + SqliteSaver) in the first
`--peer-rounds` rounds. Prints the best of the rounds and the ratios, so a change in the
machine's load between rounds touches both sides alike. The peers come from the shared
peer benchmark (see step_overhead.py; LOOPDSL_BENCH_PEERS names it elsewhere).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]

_ROUND = r'''
import json, sys
sys.argv = [sys.argv[0]]
sys.path.insert(0, "bench")
import step_overhead as so
peers = so.load_peers()
out = {}
for _ in range(3):
    for key, fn in (("raw", peers.bench_transitions), ("mem", lambda: so.run_loopdsl(N, False)),
                    ("dur", lambda: so.run_loopdsl(N, True))):
        out[key] = min(out.get(key, 1e9), fn())
if PEERS:
    out["peer"] = min(peers.bench_burr(True), peers.bench_langgraph(True))
print(json.dumps(out))
'''


def one_round(tree: Path, n: int, with_peers: bool) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    code = f"N = {n}\nPEERS = {with_peers}\n" + _ROUND
    out = subprocess.run([sys.executable, "-c", code], cwd=tree, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"round in {tree} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, required=True, help="a checkout to compare with (e.g. a worktree of main)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--peer-rounds", type=int, default=2)
    parser.add_argument("n", nargs="?", type=int, default=1000)
    args = parser.parse_args()
    trees = {"base": args.base.resolve(), "this": HERE}
    rounds: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for index in range(args.rounds):
        for name, tree in trees.items():
            figures = one_round(tree, args.n, name == "base" and index < args.peer_rounds)
            rounds[name].append(figures)
            print(f"round {index + 1} {name:4s} " + "  ".join(f"{k} {v * 1e6:7.1f}" for k, v in figures.items()), flush=True)
    peer = min((r["peer"] for r in rounds["base"] if "peer" in r), default=None)
    print(f"N={args.n}, us/step, best of {args.rounds} interleaved rounds")
    for name in trees:
        best = {key: min(r[key] for r in rounds[name]) for key in ("raw", "mem", "dur")}
        line = (f"{name:4s} raw {best['raw'] * 1e6:6.1f}  in memory {best['mem'] * 1e6:6.1f} "
                f"({best['mem'] / best['raw']:.2f}x raw)  durable {best['dur'] * 1e6:6.1f}")
        if peer:
            line += f" ({best['dur'] / peer:.2f}x the fastest durable peer, {peer * 1e6:.0f})"
        print(line)
    base_dur = min(r["dur"] for r in rounds["base"])
    this_dur = min(r["dur"] for r in rounds["this"])
    print(f"durable step, this / base: {this_dur / base_dur:.2f}")


if __name__ == "__main__":
    main()
