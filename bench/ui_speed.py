"""How fast `loopdsl ui` answers over real HTTP: the run list of a 10,000-run store, and the
page of a 1,000-step run.

    python bench/ui_speed.py [--runs 10000] [--steps 1000] [--repeat 20]

The store is filled through the real store API (`RunStore.create_run` + `commit`, records
made by `new_run_state` as `loopdsl run` makes them, four events a run, several loops and
statuses); the long run is a real durable run of a two-state loop. The app is served by
uvicorn on a free loopback port in this process, and each page is fetched with
http.client; the figures are the median and the worst of `--repeat` fetches.
Targets (issue 15): list < 300 ms, run page < 500 ms.
"""
from __future__ import annotations

import argparse
import http.client
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loopdsl.adapters.store.run_store import RunStore  # noqa: E402
from loopdsl.api.runs import new_run_state, run  # noqa: E402
from loopdsl.language.model import build_loop  # noqa: E402

LOOPS = ("nightly-triage", "release-notes", "fix-flaky-tests", "dependency-bump")
STATUSES = ("completed", "completed", "completed", "failed", "waiting", "aborted")
LONG_LOOP = """loopdsl: 1
name: long
budget: {steps: %d}
start: act
states:
  act: {set: {count: run.visits}, next: check}
  check:
    set: {seen: "act.count * 2"}
    transitions: [{to: done, when: "check.seen >= %d"}, {to: act}]
  done: {end: completed}
"""


def fill(store: RunStore, runs: int) -> None:
    loops = {name: build_loop({"loopdsl": 1, "name": name, "start": "a", "states": {"a": {"end": "completed"}}})
             for name in LOOPS}
    for i in range(runs):
        name = LOOPS[i % len(LOOPS)]
        run_id = store.new_run_id()
        state = new_run_state(loops[name], run_id, {"i": i}, {"loop_path": f"loops/{name}.yaml", "loop_text": "x" * 800})
        store.create_run(run_id, state.to_json())
        state.status = STATUSES[i % len(STATUSES)]
        state.ledger.update(tokens=100 + i % 900, cost_usd=0.0001 * (i % 97), steps=3)
        events = [{"seq": n, "t": state.started_at, "type": kind, "state": "a"}
                  for n, kind in enumerate(("start", "attempt", "ok", "end"), 1)]
        store.commit(run_id, state.to_json(), events)


def long_run(where: Path, store_dir: Path, steps: int) -> str:
    loop = where / "long.yaml"
    loop.write_text(LONG_LOOP % (steps + 10, steps), encoding="utf-8")
    result = run(loop, store=store_dir, workdir=where)
    assert result.status == "completed" and result.steps >= steps, (result.status, result.steps)
    return result.run_id


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(store_dir: Path) -> int:
    import uvicorn

    from loopdsl.ui.server import UiSettings, create_app

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(UiSettings(store=store_dir)), host="127.0.0.1", port=port,
                                           log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    return port


def timed(port: int, path: str, repeat: int) -> tuple[float, float, int]:
    seconds = []
    size = 0
    for _ in range(repeat):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        t = time.perf_counter()
        conn.request("GET", path)
        response = conn.getresponse()
        body = response.read()
        seconds.append(time.perf_counter() - t)
        assert response.status == 200, (path, response.status, body[:300])
        size = len(body)
        conn.close()
    return statistics.median(seconds), max(seconds), size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--keep", type=Path, help="build the store in this new directory and keep it; "
                        "given again, measure that store without rebuilding it")
    args = parser.parse_args()
    where = args.keep or Path(tempfile.mkdtemp(prefix="ui-speed-"))
    store_dir = where / "store"
    if not (where / "long-run-id").exists():
        where.mkdir(parents=True, exist_ok=True)
        t = time.perf_counter()
        with RunStore(store_dir) as store:
            fill(store, args.runs)
        print(f"filled a store with {args.runs} runs in {time.perf_counter() - t:.1f} s")
        (where / "long-run-id").write_text(long_run(where, store_dir, args.steps))
    long_id = (where / "long-run-id").read_text()
    port = serve(store_dir)
    pages = [("list, first page", "/"), ("list, status=waiting", "/?status=waiting"),
             ("list, loop=release-notes", "/?loop=release-notes"), ("list, page 100", "/?offset=4950"),
             ("list, status matching none", "/?status=escalated"),
             (f"run page, {args.steps}-step run", f"/runs/{long_id}")]
    print(f"{'page':<32} {'median':>9} {'worst':>9} {'bytes':>9}")
    for name, path in pages:
        median, worst, size = timed(port, path, args.repeat)
        print(f"{name:<32} {median * 1000:>7.1f}ms {worst * 1000:>7.1f}ms {size:>9}")


if __name__ == "__main__":
    main()
