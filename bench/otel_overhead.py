"""What tracing costs a run: an N-step loop of `set` states, in memory, with tracing off and
with OTLP traces sent to a loopback receiver (tests/otlp_receiver.py), interleaved rounds in
one process, best of each; then the end-of-run wait a dead collector adds.

    python bench/otel_overhead.py [--steps 500] [--rounds 5]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

import loopdsl  # noqa: E402 - after the path set-up above
from otlp_receiver import OtlpReceiver, dead_port  # noqa: E402

ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"


def chain(path: Path, steps: int) -> Path:
    lines = ["loopdsl: 1", "name: chain", f"budget: {{steps: {steps + 10}}}", "start: s0", "states:"]
    for i in range(steps):
        lines.append(f"  s{i}: {{set: {{x: '1'}}, next: {f's{i + 1}' if i + 1 < steps else 'done'}}}")
    lines.append("  done: {end: completed}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def timed(loop: Path, endpoint: str | None) -> float:
    if endpoint is None:
        os.environ.pop(ENDPOINT, None)
    else:
        os.environ[ENDPOINT] = endpoint
    started = time.perf_counter()
    result = loopdsl.run(loop, store=False)
    assert result.status == "completed", result.state.error
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    receiver = OtlpReceiver().start()
    with tempfile.TemporaryDirectory() as tmp:
        loop = chain(Path(tmp) / "chain.yaml", args.steps)
        timed(loop, receiver.endpoint)  # warm-up: lint, compile and the SDK's import
        off, on = [], []
        for _ in range(args.rounds):
            off.append(timed(loop, None))
            on.append(timed(loop, receiver.endpoint))
        per_step_ms = (min(on) - min(off)) / args.steps * 1000
        print(f"{args.steps} steps, best of {args.rounds}: off {min(off):.3f} s, traced {min(on):.3f} s, "
              f"+{per_step_ms:.3f} ms per step ({len(receiver.snapshot())} spans received)")
        dead = timed(loop, f"http://127.0.0.1:{dead_port()}")
        print(f"dead collector (connection refused): {dead:.3f} s, {dead - min(off):+.3f} s "
              f"(bound: OTEL_BSP_EXPORT_TIMEOUT, 2 s unless set)")
    receiver.stop()


if __name__ == "__main__":
    main()
