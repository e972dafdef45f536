"""Where the test suite's time goes: CPU seconds per test, per file and per folder.

    python bench/suite_cost.py [--workers auto] [--top 25] [PYTEST_ARGS ...]

runs `python -m pytest -q -n WORKERS PYTEST_ARGS` with this file loaded as a plugin, which
records for each test the CPU time of the worker process and of the child processes it
waited for (subprocesses, servers a fixture stopped), and its wall time. It then prints the
suite's wall time, the CPU total and the costliest folders, files and tests.

Compare CPU, not wall time: the suite is CPU-bound on two cores, so its wall time only falls
when its CPU falls, and CPU moves far less than wall time on a loaded machine. A child that a
module- or session-scoped fixture starts is counted on the test during which it is reaped.
The `loopdsl` commands forked by tests/cli_forked.py are the children of a per-worker server
that ends after the last test, so they are counted nowhere: compare the system-wide total
(/proc/stat) for them.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

LOG_VAR = "LOOPDSL_SUITE_COST_DIR"


def _cpu() -> tuple[float, float]:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: Any, nextitem: Any) -> Iterator[None]:
    """Plugin side (in each pytest worker): one JSON line per test."""
    own0, children0 = _cpu()
    started = time.monotonic()
    yield
    own1, children1 = _cpu()
    with open(Path(os.environ[LOG_VAR]) / f"{os.getpid()}.jsonl", "a", encoding="utf-8") as log:
        log.write(json.dumps({"id": item.nodeid, "own": own1 - own0, "children": children1 - children0,
                              "wall": time.monotonic() - started}) + "\n")



def _records(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for path in folder.glob("*.jsonl") for line in path.read_text().splitlines()]


def _print_table(title: str, totals: dict[str, list[float]], top: int) -> None:
    print(f"\n{'cpu s':>8} {'wall s':>8} {'tests':>6}  {title}")
    for name, (cpu, wall, count) in sorted(totals.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"{cpu:8.1f} {wall:8.1f} {int(count):6d}  {name}")


def report(records: list[dict[str, Any]], wall_s: float, top: int) -> None:
    cpu_of = {r["id"]: r["own"] + r["children"] for r in records}
    print(f"{len(records)} tests, wall {wall_s:.1f} s; CPU {sum(cpu_of.values()):.1f} s "
          f"(workers {sum(r['own'] for r in records):.1f}, their children {sum(r['children'] for r in records):.1f})")
    for title, key in (("folder", lambda nodeid: nodeid.split("::")[0].rsplit("/", 1)[0]),
                       ("file", lambda nodeid: nodeid.split("::")[0]), ("test", lambda nodeid: nodeid)):
        totals: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0])
        for r in records:
            row = totals[key(r["id"])]
            row[0] += cpu_of[r["id"]]
            row[1] += r["wall"]
            row[2] += 1
        _print_table(title, totals, top)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="auto", help="pytest-xdist's -n (default auto)")
    parser.add_argument("--top", type=int, default=25, help="rows per table")
    args, pytest_args = parser.parse_known_args()
    root = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory(prefix="suite-cost-") as folder:
        env = dict(os.environ, **{LOG_VAR: folder})
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root / "bench"), env.get("PYTHONPATH")]))
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", args.workers, "-p", "suite_cost",
                               *pytest_args], cwd=root, env=env, check=False)
        wall_s = time.monotonic() - started
        report(_records(Path(folder)), wall_s, args.top)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
