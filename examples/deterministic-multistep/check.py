"""Run the deterministic example offline and check what happened, from the run itself.

    python examples/deterministic-multistep/check.py

Every check below is computed from the run's result and events (and the files the
run wrote); nothing is hard-coded but the story the reply script tells.
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import loopdsl

HERE = Path(__file__).resolve().parent


def step_of_each_event(events: list[dict]) -> list[int]:
    """Which plan step (1-3) each event belongs to: the count of `step` entries so far."""
    step, out = 0, []
    for event in events:
        if event["type"] == "enter" and event["state"] == "step":
            step += 1
        out.append(max(step, 0))
    return out


def main() -> int:
    with tempfile.TemporaryDirectory() as workdir:
        result = loopdsl.run(HERE / "loop.yaml", script=HERE / "replies.yaml", workdir=workdir)
        written = {p.name: p.read_text() for p in (Path(workdir) / "out").glob("*.py")}
    events = result.events
    steps = step_of_each_event(events)
    # The first `step` entry is the one from `plan` (entry 1 -> step 1).
    gate_failures = [e for e, s in zip(events, steps) if e["type"] == "gate" and not e["passed"]]
    rejections = [e for e, s in zip(events, steps) if e["type"] == "ok" and e["state"] == "review"
                  and e["result"].get("verdict") == "reject"]
    step2_failures = [e for e in gate_failures + rejections if steps[events.index(e)] == 2]
    verified = [s for e, s in zip(events, steps) if e["type"] == "ok" and e["state"] == "verify"]
    checks = [
        ("final status is completed", result.status == "completed", result.status),
        ("step 2 failed twice (a gate, then the evaluator)", len(step2_failures) == 2
         and {e["type"] for e in step2_failures} == {"gate", "ok"}, f"{len(step2_failures)} failures"),
        ("no failure outside step 2", len(gate_failures) + len(rejections) == 2, f"{len(gate_failures)} gate, {len(rejections)} reject"),
        ("step 2 recovered: retried after the gate and revised after the review",
         any(e["type"] == "retry" and e["state"] == "write" for e in events)
         and result.path.count("write") == 4, f"write entered {result.path.count('write')} times"),
        ("all three steps verified", verified == [1, 2, 3], str(verified)),
        ("the three scripts exist with the reviewed code", written == {"step1.py": 'print("hello")\n',
         "step2.py": "print(2 + 2)\n", "step3.py": 'print("bye")\n'}, ", ".join(sorted(written))),
        ("spend stayed within the budget", result.tokens <= 30000 and result.cost_usd <= 0.05,
         f"{result.tokens} tokens, ${result.cost_usd:.6f}"),
    ]
    print("path: " + " -> ".join(result.path))
    for name, ok, detail in checks:
        print(f"{'PASS' if ok else 'FAIL'}  {name}  ({detail})")
    passed = sum(1 for _, ok, _ in checks if ok)
    print(f"{passed} passed, {len(checks) - passed} failed")
    return 0 if passed == len(checks) else 1


if __name__ == "__main__":
    sys.exit(main())
