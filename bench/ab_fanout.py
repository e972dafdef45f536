"""A/B of fanout.py: bare gather, another checkout's fan-out (`--base`) and this one's, interleaved.

    python bench/ab_fanout.py --base ../main [--rounds 3] [--children 200] [--latency 0.1]

Each round runs the three sides one after the other against the same loopback stub, each
in its own process (fanout.py's `--child` mode importing that checkout's loopdsl), and prints the
best of the rounds with each fan-out's ratio to the bare gather.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "bench"))
sys.path.insert(0, str(HERE / "tests"))  # stub_server and the helpers it imports


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--children", type=int, default=200)
    parser.add_argument("--latency", type=float, default=0.1)
    args = parser.parse_args()
    from stub_server import StubReply, StubServer

    import fanout as this  # this driver; each side's process imports its own checkout's loopdsl
    seconds: dict[str, list[float]] = {"bare": [], "base": [], "this": []}
    cpu: dict[str, list[float]] = {"bare": [], "base": [], "this": []}
    with StubServer() as stub:
        sides = {"bare": lambda: this.measure("bare", stub.api_base, args.children),
                 "base": lambda: this.measure("loopdsl", stub.api_base, args.children, root=args.base.resolve()),
                 "this": lambda: this.measure("loopdsl", stub.api_base, args.children)}
        for index in range(args.rounds):
            for name, run in sides.items():
                stub.reset()
                stub.enqueue(*[StubReply(text="ok", prompt_tokens=12, completion_tokens=4, delay_s=args.latency)
                               for _ in range(args.children * 5)])
                figures = run()
                seconds[name].append(figures["seconds"])
                cpu[name].append(figures["cpu_s"])
                print(f"round {index + 1} {name:4s} {figures['seconds']:6.2f} s, CPU {figures['cpu_s']:5.2f} s", flush=True)
    best = {name: min(values) for name, values in seconds.items()}
    print(f"{args.children} children x 5 calls, best of {args.rounds} rounds: bare {best['bare']:.2f} s, "
          f"base {best['base']:.2f} s ({best['base'] / best['bare']:.2f}x), "
          f"this {best['this']:.2f} s ({best['this'] / best['bare']:.2f}x)")
    low = {name: min(values) for name, values in cpu.items()}
    print(f"CPU seconds, least of the rounds: bare {low['bare']:.2f}, base {low['base']:.2f}, this {low['this']:.2f} "
          f"(loopdsl's own: base {(low['base'] - low['bare']) / args.children * 1000:.1f} ms, "
          f"this {(low['this'] - low['bare']) / args.children * 1000:.1f} ms a child)")


if __name__ == "__main__":
    main()
