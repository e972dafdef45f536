"""Cost of one run-store commit (record + one event, one transaction), in microseconds.

Compared, in the same process and on the same disk, with the floor: a raw sqlite3
INSERT + COMMIT in WAL mode with synchronous=NORMAL.

    python bench/store_txn.py [--commits N]
"""
from __future__ import annotations

import argparse
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

from loopdsl.adapters.store.run_store import RunStore


def bench_store(directory: Path, commits: int) -> list[float]:
    record = {"status": "running", "state": "draft", "n_events": 0, "budget": {"spent": 0.0}}
    with RunStore(directory) as store:
        run_id = store.new_run_id()
        store.create_run(run_id, record)
        timings = []
        for n in range(1, commits + 1):
            event = {"kind": "step", "state": "draft", "attempt": 1, "cost": 0.0012, "n": n}
            start = time.perf_counter()
            store.commit(run_id, {**record, "n_events": n}, [event])
            timings.append(time.perf_counter() - start)
        assert len(store.events(run_id)) == commits
    return timings


def bench_raw_sqlite(path: Path, commits: int) -> list[float]:
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=NORMAL")
    con.execute("CREATE TABLE t (k TEXT PRIMARY KEY, v TEXT)")
    timings = []
    for n in range(commits):
        start = time.perf_counter()
        con.execute("BEGIN IMMEDIATE")
        con.execute("INSERT INTO t VALUES (?, ?)", (f"event/{n:010d}", f'{{"n":{n}}}'))
        con.execute("COMMIT")
        timings.append(time.perf_counter() - start)
    con.close()
    return timings


def describe(name: str, timings: list[float]) -> str:
    us = sorted(t * 1e6 for t in timings)
    p95 = us[int(len(us) * 0.95) - 1]
    return f"{name:<34} median {statistics.median(us):7.1f} us/commit   p95 {p95:7.1f} us"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=3000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store_timings = bench_store(Path(tmp) / "store", args.commits)
        raw_timings = bench_raw_sqlite(Path(tmp) / "raw.db", args.commits)
    print(describe("RunStore.commit (record + 1 event)", store_timings))
    print(describe("raw sqlite3 insert + commit", raw_timings))
    ratio = statistics.median(store_timings) / statistics.median(raw_timings)
    print(f"overhead: {ratio:.1f}x the raw floor")


if __name__ == "__main__":
    main()
