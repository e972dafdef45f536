"""How does `loopdsl lint` scale with the number of states in one file?

Usage: python bench/lint_states.py [--states 1000 5000 10000] [--runs 2]

Writes one loop per size (a chain of shell states, every fourth one reading the previous
state's output in its command and routing on it with `transitions`, so the template and
graph rules have work to do) and times a cold `loopdsl lint` of it (fresh process, best of
--runs), wall and CPU time. Target: 10,000 states under 5 s. Lint used to grow
quadratically here (full dominator sets per state, a fixed-point dead-end search): 10,000
states took 64 s.
"""
from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def loop_text(states: int) -> str:
    lines = ["loopdsl: 1", "name: many-states", "start: s0", "states:"]
    for i in range(states):
        following = f"s{i + 1}" if i + 1 < states else "done"
        lines.append(f"  s{i}:")
        if i % 4 == 3:
            lines.append(f"    shell: echo {{{{ s{i - 1}.stdout }}}}")
            lines.append("    transitions:")
            lines.append(f"      - {{to: {following}, when: \"s{i - 1}.exit_code == 0\"}}")
            lines.append("      - {to: failed}")
        else:
            lines.append(f"    shell: echo {i}")
            lines.append(f"    next: {following}")
    lines += ["  done:", "    end: completed", "  failed:", "    end: failed"]
    return "\n".join(lines) + "\n"


def timed_lint(path: Path) -> tuple[float, float, int]:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "loopdsl", "lint", str(path)], env=env,
                          capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, proc.returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--states", type=int, nargs="+", default=[1000, 5000, 10000])
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    print(f"{'states':>8} {'wall s':>8} {'cpu s':>8}  exit")
    worst = 0
    with tempfile.TemporaryDirectory() as tmp:
        for states in args.states:
            path = Path(tmp) / f"states-{states}.yaml"
            path.write_text(loop_text(states))
            best = min((timed_lint(path) for _ in range(args.runs)), key=lambda r: r[0])
            print(f"{states:>8} {best[0]:>8.2f} {best[1]:>8.2f}  {best[2]}")
            worst = max(worst, best[2])
    return 0 if worst == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
