"""Crash torture: SIGKILL `loopdsl run`/`resume` at random moments, resume until done.

    python bench/crash_torture.py [--kills N] [--workers W] [--seed S]   (default N=200)
    python bench/crash_torture.py --agent [--kills N] [--seed S]          (an agent conversation)

The loop is tests/data/durable/crash_loop.yaml: a set state, an idempotent shell
state, a state with slow before- and after-gates, a stretch of `set` states, one
`llm` state answered by a loopback HTTP stub, and one more shell state. Each run is
a real `loopdsl run ... --store DIR` process; it is killed at a moment drawn
uniformly from the uninterrupted run's duration, then `loopdsl resume RUN_ID` is
started (and killed again, at a fresh random moment) until the run ends.

For every run the script checks: the final status, path and outputs equal those of
an uninterrupted run; the stub never receives a second request for an LLM call that
had completed before a kill (a call cut off in flight may be asked again: allowed);
the store opens and lists runs after every kill. It prints the figures at the end.

The module also holds the pieces tests/test_crash_resume.py uses (the counting stub,
the launcher, the store probes), so the test and the bench exercise the same thing.

Lock TTL: a SIGKILLed process cannot release its run lock, so `resume` waits until the
dead holder's lock expires (15 s by default, refreshed every 5 s while alive). To keep
hundreds of kills affordable the processes here run the real CLI through a launcher
that lowers that default to LOCK_TTL_S; nothing else differs from `python -m loopdsl`.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from stub_server import RecordedRequest, StubReply, StubServer

from loopdsl.adapters.store.run_store import RunStore
from loopdsl.runtime.errors import StoreError

LOOP_TEMPLATE = ROOT / "tests" / "data" / "durable" / "crash_loop.yaml"
STUB_PLACEHOLDER = "http://stub.invalid/v1"  # the api_base the loop files name, replaced by the stub's
LOCK_TTL_S = 0.5
# Runs the real CLI entry point with a shorter default run-lock TTL (see the docstring).
LAUNCHER = (
    "import os, sys\n"
    "import loopdsl.adapters.store.run_store as store\n"
    "store.RunStore.lock.__wrapped__.__kwdefaults__['ttl'] = float(os.environ['CRASH_LOCK_TTL'])\n"
    "sys.argv[0] = 'loopdsl'\n"
    "from loopdsl.cli import main\n"
    "main()\n"
)
_CALL = re.compile(r"state=(\w+) visit=(\d+) attempt=(\d+)")
CallKey = tuple[str, int, int]  # (state, visit, attempt) as the prompt states them


# --------------------------------------------------------------------------- the stub


class CountingStub(StubServer):
    """Answers every call from its prompt, so a repeated request gets the same answer.

    The prompt of each `llm` state starts `state=S visit=V attempt=A`; requests are
    counted per (S, V, A). `hold(state)` makes the next request of that state wait
    (until `stop()`), which lets a test kill the client with the call in flight.
    """

    HOLD_S = 120.0

    def __init__(self) -> None:
        super().__init__(host="127.0.0.1", port=0)
        self._held: set[str] = set()
        self.keys: list[CallKey] = []
        self.answered: list[CallKey] = []  # replies actually sent (not held)
        self._count_lock = threading.Lock()

    def start(self) -> CountingStub:
        super().start()
        return self

    def hold(self, state: str) -> None:
        with self._count_lock:
            self._held.add(state)

    def counts(self) -> Counter[CallKey]:
        with self._count_lock:
            return Counter(self.keys)

    def _next_reply(self, request: RecordedRequest) -> StubReply | None:
        messages = request.body.get("messages", []) if isinstance(request.body, dict) else []
        prompt = str(messages[-1].get("content", "")) if messages else ""
        found = _CALL.search(prompt)
        key: CallKey = (found.group(1), int(found.group(2)), int(found.group(3))) if found else ("?", 0, 0)
        with self._count_lock:
            self.requests.append(request)
            self.keys.append(key)
            delay = 0.0
            if key[0] in self._held:
                self._held.discard(key[0])
                delay = self.HOLD_S
            else:
                self.answered.append(key)
        digest = hashlib.sha256(prompt.encode()).hexdigest()[:10]
        return StubReply(text=f"{key[0]}-says-{digest}", prompt_tokens=20, completion_tokens=10, delay_s=delay)


# --------------------------------------------------------------------------- processes


def write_loop(directory: Path, api_base: str, template: Path = LOOP_TEMPLATE) -> Path:
    """Write `template` into `directory` with its model pointed at the stub."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "loop.yaml"
    path.write_text(template.read_text(encoding="utf-8").replace(STUB_PLACEHOLDER, api_base), encoding="utf-8")
    return path


def cli_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"CRASH_LOCK_TTL": str(LOCK_TTL_S), "LOOPDSL_USER": "crash-tester", "PYTHONUNBUFFERED": "1"})
    env.pop("LOOPDSL_STORE", None)
    env.update(extra or {})
    return env


def shorten_lock_ttl() -> None:
    """What LAUNCHER does before the CLI starts, for a process that forks CLI commands (the
    crash test's fork server, tests/cli_forked.py: FORKED_CLI_PRELOAD)."""
    RunStore.lock.__wrapped__.__kwdefaults__["ttl"] = float(os.environ["CRASH_LOCK_TTL"])  # type: ignore[attr-defined]


def launch(args: Iterable[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """Start the loopdsl CLI (through the lock-TTL launcher) as its own process."""
    return subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, *args], cwd=cwd, env=env or cli_env(),
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def cli(args: Iterable[str], cwd: Path, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run `python -m loopdsl ARGS` to completion (the plain entry point, no launcher)."""
    return subprocess.run([sys.executable, "-m", "loopdsl", *args], check=False, cwd=cwd, env=cli_env(),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)


def kill(proc: subprocess.Popen[str]) -> bool:
    """SIGKILL the process; True when it was still alive (the kill landed)."""
    alive = proc.poll() is None
    if alive:
        os.kill(proc.pid, signal.SIGKILL)
    proc.communicate()
    return alive


def wait_until(predicate: Callable[[], bool], proc: subprocess.Popen[str] | None, timeout: float = 60.0,
               what: str = "the kill point") -> None:
    """Poll `predicate` until true; fail if the process ends first or time runs out."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc is not None and proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"the process ended (exit {proc.returncode}) before {what}\n{out}\n{err}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def markers(marks: Path, name: str) -> int:
    return len(list(marks.glob(f"{name}.*")))


# --------------------------------------------------------------------------- store probes


def open_clean(store_dir: Path) -> list[dict[str, Any]]:
    """Open the store as a new process would and list its runs (raises on any problem)."""
    with RunStore(store_dir) as store:
        return store.list_runs()


def record(store_dir: Path, run_id: str) -> dict[str, Any]:
    with RunStore(store_dir) as store:
        return store.load(run_id)


def wait_lock_free(store_dir: Path, run_id: str, timeout: float = LOCK_TTL_S * 4 + 5) -> None:
    """Wait for a killed holder's run lock to expire (take it and give it back)."""
    with RunStore(store_dir) as store:
        store.lock(run_id, ttl=5.0, wait=timeout).release()


def completed_calls(store_dir: Path, run_id: str, seen: Iterable[CallKey]) -> set[CallKey]:
    """Calls the stub saw whose response the run had when it was killed.

    A call is complete unless it is the run's `pending` llm call and its response is not
    stored: that one was in flight at the kill and may be asked again.
    """
    with RunStore(store_dir) as store:
        rec = store.load(run_id)
        pending = rec.get("pending") or {}
        in_flight: CallKey | None = None
        if pending.get("kind") == "llm" and store.get_response(str(pending.get("key"))) is None:
            in_flight = (pending["state"], int(pending["visit"]), int(pending["attempt"]))
    return {key for key in seen if key != in_flight}


def summary_of(rec: dict[str, Any]) -> dict[str, Any]:
    """What must be equal between an interrupted run and an uninterrupted one."""
    return {"status": rec.get("status"), "path": rec.get("path"), "outputs": rec.get("outputs")}


def run_id_from_cli(store_dir: Path, cwd: Path) -> str | None:
    done = cli(["runs", "--store", str(store_dir), "--json"], cwd)
    if done.returncode != 0:
        raise AssertionError(f"`loopdsl runs --json` failed: {done.stderr}")
    runs = json.loads(done.stdout)
    return runs[0]["run_id"] if runs else None


# --------------------------------------------------------------------------- the torture


@dataclass
class Figures:
    kills: int = 0
    kills_landed: int = 0
    resumes: int = 0
    runs_completed: int = 0
    mismatches: int = 0
    duplicate_paid_calls: int = 0
    in_flight_repeats: int = 0
    store_open_failures: int = 0
    unexpected_exits: int = 0
    problems: list[str] = field(default_factory=list)

    def add(self, other: Figures) -> None:
        for name in ("kills", "kills_landed", "resumes", "runs_completed", "mismatches", "duplicate_paid_calls",
                     "in_flight_repeats", "store_open_failures", "unexpected_exits"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.problems.extend(other.problems)


class Worker:
    """One stub, one loop file, one store; runs torture runs one after another."""

    def __init__(self, base: Path, pause: float, ticks: int, rng: random.Random):
        self.base = base
        self.stub = CountingStub().start()
        self.loop = write_loop(base / "loop", self.stub.api_base)
        self.work = base / "work"
        self.work.mkdir(parents=True, exist_ok=True)
        self.inputs = ["--input", f"pause={pause}", "--input", f"ticks={ticks}"]
        self.rng = rng
        self.runs = 0

    def close(self) -> None:
        self.stub.stop()

    def _args(self, marks: Path, store: Path) -> list[str]:
        return ["run", str(self.loop), "--store", str(store), "--input", f"marks={marks}", *self.inputs, "--quiet"]

    def baseline(self) -> tuple[dict[str, Any], float]:
        marks, store = self.base / "base-marks", self.base / "base-store"
        marks.mkdir()
        started = time.monotonic()
        proc = launch(self._args(marks, store), self.work)
        out, err = proc.communicate(timeout=300)
        duration = time.monotonic() - started
        if proc.returncode != 0:
            raise SystemExit(f"the uninterrupted run failed (exit {proc.returncode}):\n{out}\n{err}")
        runs = open_clean(store)
        return summary_of(runs[0]), duration

    def torture_run(self, expected: dict[str, Any], duration: float, kills_left: int) -> Figures:
        """One run, killed at random moments and resumed until it ends."""
        self.runs += 1
        fig = Figures()
        marks, store = self.base / f"marks-{self.runs}", self.base / f"store-{self.runs}"
        marks.mkdir()
        self.stub.keys.clear()
        done_calls: set[CallKey] = set()
        run_id: str | None = None
        while True:
            args = self._args(marks, store) if run_id is None else ["resume", run_id, "--store", str(store), "--quiet"]
            if run_id is not None:
                fig.resumes += 1
            seen_before = len(self.stub.keys)
            proc = launch(args, self.work)
            deadline = time.monotonic() + self.rng.uniform(0, duration)
            while proc.poll() is None and time.monotonic() < deadline and fig.kills < kills_left:
                time.sleep(0.002)
            killed = proc.poll() is None and fig.kills < kills_left
            if killed:
                fig.kills += 1
                fig.kills_landed += kill(proc)
            else:
                _out, err = proc.communicate()
            # Every request this process made for a call that had completed before is a repeat payment.
            for key in self.stub.keys[seen_before:]:
                if key in done_calls:
                    fig.duplicate_paid_calls += 1
                    fig.problems.append(f"run {self.runs}: call {key} paid again after it had completed")
            try:
                listed = open_clean(store) if store.exists() else []
            except (StoreError, OSError) as exc:
                fig.store_open_failures += 1
                fig.problems.append(f"run {self.runs}: store did not open after a kill: {exc}")
                return fig
            if run_id is None:
                run_id = listed[0]["run_id"] if listed else None
                if run_id is None:
                    continue  # killed before the run was created: start it again
            if not killed:
                if proc.returncode not in (0, 2):
                    fig.unexpected_exits += 1
                    fig.problems.append(f"run {self.runs}: exit {proc.returncode}: {err.strip()[-400:]}")
                rec = record(store, run_id)
                if rec.get("status") in ("running", "waiting"):
                    if proc.returncode == 2 and "in use" in err:
                        wait_lock_free(store, run_id)
                        continue
                    fig.problems.append(f"run {self.runs}: process exited {proc.returncode} with the run {rec.get('status')}")
                    fig.mismatches += 1
                    return fig
                break
            rec = record(store, run_id)
            done_calls |= completed_calls(store, run_id, self.stub.keys)
            if rec.get("status") not in ("running", "waiting"):
                break  # killed after the end was committed: nothing to resume
            wait_lock_free(store, run_id)
        rec = record(store, run_id)
        got = summary_of(rec)
        if got == expected:
            fig.runs_completed += 1
        else:
            fig.mismatches += 1
            fig.problems.append(f"run {self.runs}: {json.dumps(got)[:400]} != {json.dumps(expected)[:400]}")
        repeats = sum(n - 1 for n in Counter(self.stub.keys).values() if n > 1)
        fig.in_flight_repeats += max(0, repeats - fig.duplicate_paid_calls)
        return fig


def deal_kills(pool: Sequence[Any], kills: int, total: Any, expected: dict[str, Any], duration: float,
               describe: Callable[[Any, Any], str]) -> None:
    """Torture runs on every worker of `pool` side by side until `kills` SIGKILLs are dealt,
    each run taking the kills still left; each run's figures are added to `total` (whose
    `kills` counts them) and described in one printed line."""
    lock = threading.Lock()

    def work(worker: Any) -> None:
        while True:
            with lock:
                left = kills - total.kills
            if left <= 0:
                return
            fig = worker.torture_run(expected, duration, left)
            with lock:
                total.add(fig)
                print(f"  {describe(worker, fig)}  [total kills {total.kills}]", flush=True)

    threads = [threading.Thread(target=work, args=(w,)) for w in pool]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=200, help="total SIGKILLs to deliver (default 200)")
    parser.add_argument("--workers", type=int, default=1, help="runs tortured side by side (default 1)")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: time)")
    parser.add_argument("--pause", type=float, default=0.3, help="seconds each slow shell step sleeps")
    parser.add_argument("--ticks", type=int, default=60, help="length of the `set` stretch")
    parser.add_argument("--agent", action="store_true", help="torture an agent conversation instead "
                        "(bench/crash_torture_agent.py; --pause is each tool call's sleep, default 0.15)")
    parser.add_argument("--http", action="store_true", help="with --agent: the real CLI and LiteLLM against the "
                        "HTTP stub (each process pays the LiteLLM import) instead of a provider port")
    opts = parser.parse_args(argv)
    seed = opts.seed if opts.seed is not None else int(time.time())
    if opts.agent:
        from crash_torture_agent import torture

        with tempfile.TemporaryDirectory(prefix="crash-torture-agent-") as tmp:
            return torture(opts.kills, seed, 0.15 if opts.pause == 0.3 else opts.pause, Path(tmp), opts.workers, opts.http)
    started = time.monotonic()
    total = Figures()
    with tempfile.TemporaryDirectory(prefix="crash-torture-") as tmp:
        workers = [Worker(Path(tmp) / f"w{i}", opts.pause, opts.ticks, random.Random(seed + i)) for i in range(opts.workers)]
        expected, duration = workers[0].baseline()
        print(f"seed {seed}; uninterrupted run: {duration:.1f}s, status {expected['status']}, "
              f"path of {len(expected['path'])} states", flush=True)

        deal_kills(workers, opts.kills, total, expected, duration,
                   lambda worker, fig: f"run {worker.runs:>3} (w{workers.index(worker)}): kills {fig.kills} "
                                       f"resumes {fig.resumes} {'ok' if fig.runs_completed else 'MISMATCH'}")
        for w in workers:
            w.close()
    elapsed = time.monotonic() - started
    runs = total.runs_completed + total.mismatches
    print()
    print(f"kills:                    {total.kills} ({total.kills_landed} while the process was alive)")
    print(f"resumes:                  {total.resumes}")
    print(f"runs completed:           {total.runs_completed} of {runs}")
    print(f"mismatches vs baseline:   {total.mismatches}")
    print(f"duplicate paid calls:     {total.duplicate_paid_calls}")
    print(f"in-flight calls re-asked: {total.in_flight_repeats} (allowed: cut off mid-call, charged the reservation)")
    print(f"store-open failures:      {total.store_open_failures}")
    print(f"unexpected exit codes:    {total.unexpected_exits}")
    print(f"total time:               {elapsed:.0f}s")
    for problem in total.problems[:20]:
        print("  problem:", problem)
    bad = total.mismatches + total.duplicate_paid_calls + total.store_open_failures + total.unexpected_exits
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
