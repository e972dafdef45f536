"""Crash torture of an `agent` conversation: `python bench/crash_torture.py --agent [--kills N]`.

The loop is one agent state answered by a loopback stub (by the conversation so far, so a
re-asked turn gets the same answer): four tool turns, each calling `note` (not idempotent:
it appends its tag to notes.txt, then sleeps) and `probe` (idempotent: sleeps, appends its
tag to probes.txt, prints how many notes there are), then a final JSON answer holding every
tool result the model saw. Each run is a real `loopdsl run` process, killed with SIGKILL at
a moment drawn from the uninterrupted run's duration, then `loopdsl resume`d (and killed
again) until it ends.

A `note` call cut off by a kill makes the run wait for a person (exit 4). The torture
answers as an operator would, from the file: the tag is in notes.txt -> `skip` (the effect
happened; the model is told `interrupted`), not there -> `rerun` (it never took effect).

Checked for every run: it ends `completed` with the uninterrupted run's path and outputs
(a run with a `skip` answer: the same but for the skipped results, which read
`interrupted`); notes.txt holds each tag exactly once (0 non-idempotent calls run twice);
no turn whose reply was stored before a kill is requested from the stub again (a turn in
flight at the kill may be: it is charged its reservation and re-sent).
"""
from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from crash_torture import LAUNCHER, cli, cli_env, deal_kills, kill, open_clean, record, wait_lock_free
from stub_server import StubReply, StubServer, tool_call

from loopdsl.adapters.store.run_store import RunStore

# The crash torture's launcher, with LiteLLM imported before the CLI starts and a line
# printed then: kill moments are drawn from that line on, inside the conversation, instead
# of mostly landing in the seconds the import takes on a loaded machine.
READY_LAUNCHER = LAUNCHER.replace(
    "sys.argv[0] = 'loopdsl'\n",
    "from loopdsl.adapters.litellm import ensure_litellm\nensure_litellm()\nprint('ready', flush=True)\n"
    "sys.argv[0] = 'loopdsl'\n")
TOOL_TURNS = 4
EXIT_WAITING = 4
LOOP = """loopdsl: 1
name: crash-agent
models:
  m: {{model: openai/torture-model, api_base: "{api_base}", max_tokens: 50,
       price: {{input_per_mtok: 1, output_per_mtok: 2}}}}
tools:
  note:
    description: Append a tag to notes.txt, then wait. Not idempotent.
    params: {{tag: {{type: integer}}, pause: {{type: number}}}}
    required: [tag, pause]
    shell: echo {{{{ args.tag }}}} >> notes.txt; sleep {{{{ args.pause }}}}
  probe:
    description: Wait, record the probe, count the notes.
    params: {{tag: {{type: integer}}, pause: {{type: number}}}}
    required: [tag, pause]
    shell: sleep {{{{ args.pause }}}}; echo {{{{ args.tag }}}} >> probes.txt; cat notes.txt | wc -l
    idempotent: true
start: work
states:
  work:
    agent: {{model: m, prompt: "Take four notes.", tools: [note, probe], max_turns: {max_turns}, output: json}}
    next: done
  done: {{end: completed, output: {{answer: "{{{{ work.text }}}}", turns: "{{{{ work.turns }}}}"}}}}
"""


DRIVER = Path(__file__).with_name("crash_agent_driver.py")


def launch(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    """Start a process that prints `ready` when loaded; return once it did (or ended)."""
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    proc.stdout.readline()
    return proc


class AgentStub(StubServer):
    """Answers each turn from the conversation; records the turn number of every request."""

    def __init__(self, pause: float) -> None:
        super().__init__(responder=self._answer)
        self.pause = pause
        self.turns: list[int] = []
        self._turn_lock = threading.Lock()

    def _answer(self, body: Any) -> StubReply:
        messages = body.get("messages", [])
        with self._turn_lock:
            self.turns.append(1 + sum(1 for m in messages if m.get("role") == "assistant"))
        text, calls, prompt, completion = answer(messages, self.pause)
        return StubReply(text=text, tool_calls=calls or None, prompt_tokens=prompt, completion_tokens=completion)


def answer(messages: list[dict[str, Any]], pause: float) -> tuple[str | None, list[dict[str, Any]], int, int]:
    """The model's reply to the conversation so far: (text, OpenAI tool calls, usage)."""
    turn = 1 + sum(1 for m in messages if m.get("role") == "assistant")
    if turn <= TOOL_TURNS:
        calls = [tool_call("note", {"tag": 10 * turn + 1, "pause": pause}, f"call_{turn}_1"),
                 tool_call("probe", {"tag": 10 * turn + 2, "pause": pause}, f"call_{turn}_2")]
        return None, calls, 30 * turn, 9
    seen = [m.get("content") for m in messages if m.get("role") == "tool"]
    return json.dumps({"seen": seen}), [], 30 * turn, 20


@dataclass
class AgentFigures:
    kills: int = 0
    kills_landed: int = 0
    resumes: int = 0
    runs: int = 0
    identical: int = 0
    asked_skip: int = 0
    asked_rerun: int = 0
    ended_like_baseline_with_skips: int = 0
    mismatches: int = 0
    duplicate_paid_turns: int = 0
    in_flight_turns_reasked: int = 0
    duplicate_note_calls: int = 0
    idempotent_reruns: int = 0
    store_open_failures: int = 0
    unexpected_exits: int = 0
    problems: list[str] = field(default_factory=list)

    def add(self, other: AgentFigures) -> None:
        for f in fields(self):
            if f.name != "problems":
                setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        self.problems.extend(other.problems)

    def bad(self) -> int:
        return self.mismatches + self.duplicate_paid_turns + self.duplicate_note_calls + self.store_open_failures \
            + self.unexpected_exits


def lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def summary(store: Path, run_id: str, work: Path) -> dict[str, Any]:
    rec = record(store, run_id)
    return {"status": rec.get("status"), "path": rec.get("path"), "outputs": rec.get("outputs"),
            "notes": sorted(lines(work / "notes.txt"))}


def in_flight_turn(store_dir: Path, run_id: str) -> int | None:
    """The turn whose request was committed as pending and whose reply is not stored."""
    with RunStore(store_dir) as store:
        pending = store.load(run_id).get("pending") or {}
        if pending.get("kind") == "llm" and store.get_response(str(pending.get("key"))) is None:
            return int(pending.get("turn") or 0)
    return None


def skipped_only(got: dict[str, Any], expected: dict[str, Any]) -> bool:
    """Equal to the baseline but for tool results the model was told were `interrupted`."""
    if {k: v for k, v in got.items() if k != "outputs"} != {k: v for k, v in expected.items() if k != "outputs"}:
        return False
    try:
        seen = json.loads(got["outputs"]["answer"])["seen"]
        want = json.loads(expected["outputs"]["answer"])["seen"]
    except (KeyError, TypeError, ValueError):
        return False
    return len(seen) == len(want) and all(s == w or "interrupted" in str(s) for s, w in zip(seen, want))


class AgentWorker:
    """One loop, one store per run; `http`: the real CLI with LiteLLM against AgentStub,
    else crash_agent_driver.py's provider port (same answers, a second to start)."""

    def __init__(self, base: Path, pause: float, rng: random.Random, http: bool = False) -> None:
        self.base = base
        self.pause = pause
        self.http = http
        self.stub = AgentStub(pause).start()
        self.rng = rng
        self.turn_log = base / "turns.log"
        self.runs = 0
        self.loop = base / "loop.yaml"
        base.mkdir(parents=True, exist_ok=True)
        self.loop.write_text(LOOP.format(api_base=self.stub.api_base, max_turns=TOOL_TURNS + 2), encoding="utf-8")

    def close(self) -> None:
        self.stub.stop()

    def start(self, store: Path, work: Path, run_id: str | None) -> subprocess.Popen[str]:
        if run_id is None:
            args = ["run", str(store), str(self.loop)] if not self.http else \
                ["run", str(self.loop), "--store", str(store), "--quiet"]
        else:
            args = ["resume", str(store), run_id] if not self.http else ["resume", run_id, "--store", str(store), "--quiet"]
        if self.http:
            return launch([sys.executable, "-c", READY_LAUNCHER, *args], work, cli_env())
        env = cli_env({"TORTURE_TURNS": str(self.turn_log), "TORTURE_PAUSE": str(self.pause)})
        return launch([sys.executable, str(DRIVER), *args], work, env)

    def turns(self) -> list[int]:
        """Every turn requested from the model so far, in order (the provider's log)."""
        if self.http:
            return list(self.stub.turns)
        return [int(t) for t in lines(self.turn_log)]

    def _fresh(self, name: str) -> tuple[Path, Path]:
        work, store = self.base / f"work-{name}", self.base / f"store-{name}"
        work.mkdir()
        (work / "notes.txt").write_text("")
        return work, store

    def baseline(self) -> tuple[dict[str, Any], float]:
        work, store = self._fresh("base")
        started = time.monotonic()
        proc = self.start(store, work, None)
        started = time.monotonic()  # the conversation's time, from `ready`
        out, err = proc.communicate(timeout=300)
        duration = time.monotonic() - started
        if proc.returncode != 0:
            raise SystemExit(f"the uninterrupted agent run failed (exit {proc.returncode}):\n{out}\n{err}")
        expected = summary(store, open_clean(store)[0]["run_id"], work)
        if expected["status"] != "completed" or len(expected["notes"]) != TOOL_TURNS:
            raise SystemExit(f"the uninterrupted agent run ended {expected}")
        return expected, duration

    def decide(self, fig: AgentFigures, store: Path, run_id: str, work: Path) -> None:
        """Answer the cut-off `note` call as an operator who looks at notes.txt."""
        rec = record(store, run_id)
        if rec.get("decision"):  # answered before, and the resume that would act on it was killed
            return
        waiting = rec.get("waiting") or {}
        message = str(waiting.get("message") or "")
        call = next((w for w in message.split() if w.startswith("call_")), "")
        tag = "" if not call else f"{call.split('_')[1]}1"  # note's tag for turn t is 10t+1
        choice = "skip" if tag and tag in lines(work / "notes.txt") else "rerun"
        done = cli(["decide", run_id, choice, "--store", str(store), "-m", "torture operator"], work)
        if done.returncode != 0:
            fig.unexpected_exits += 1
            fig.problems.append(f"run {self.runs}: decide {choice} failed: {done.stderr.strip()[-300:]}")
            return
        setattr(fig, f"asked_{choice}", getattr(fig, f"asked_{choice}") + 1)

    def torture_run(self, expected: dict[str, Any], duration: float, kills_left: int) -> AgentFigures:
        self.runs += 1
        fig = AgentFigures(runs=1)
        work, store = self._fresh(str(self.runs))
        self.stub.turns.clear()
        self.turn_log.write_text("")
        done_turns: set[int] = set()
        run_id: str | None = None
        while True:
            fig.resumes += run_id is not None
            seen_before = len(self.turns())
            proc = self.start(store, work, run_id)
            deadline = time.monotonic() + self.rng.uniform(0, duration)
            while proc.poll() is None and time.monotonic() < deadline and fig.kills < kills_left:
                time.sleep(0.002)
            killed = proc.poll() is None and fig.kills < kills_left
            err = ""
            if killed:
                fig.kills += 1
                fig.kills_landed += kill(proc)
            else:
                _out, err = proc.communicate()
            for turn in self.turns()[seen_before:]:
                if turn in done_turns:
                    fig.duplicate_paid_turns += 1
                    fig.problems.append(f"run {self.runs}: turn {turn} requested again after its reply was stored")
            try:
                listed = open_clean(store) if store.exists() else []
            except Exception as exc:  # noqa: BLE001 - any failure to open is what the torture counts
                fig.store_open_failures += 1
                fig.problems.append(f"run {self.runs}: store did not open after a kill: {exc}")
                return fig
            if run_id is None:
                run_id = listed[0]["run_id"] if listed else None
                if run_id is None:
                    continue  # killed before the run was created: start again
            in_flight = in_flight_turn(store, run_id)
            done_turns |= {t for t in self.turns() if t != in_flight}
            status = record(store, run_id).get("status")
            if not killed and proc.returncode == EXIT_WAITING and status == "waiting":
                self.decide(fig, store, run_id, work)
                continue
            if not killed and proc.returncode not in (0,):
                if proc.returncode == 2 and "in use" in err:
                    wait_lock_free(store, run_id)
                    continue
                fig.unexpected_exits += 1
                fig.problems.append(f"run {self.runs}: exit {proc.returncode} ({status}): {err.strip()[-400:]}")
                return fig
            if status not in ("running", "waiting"):
                break
            if status == "waiting":  # killed after the question was committed
                self.decide(fig, store, run_id, work)
                continue
            wait_lock_free(store, run_id)
        self._judge(fig, summary(store, run_id, work), expected, work)
        return fig

    def _judge(self, fig: AgentFigures, got: dict[str, Any], expected: dict[str, Any], work: Path) -> None:
        notes = Counter(lines(work / "notes.txt"))
        fig.duplicate_note_calls += sum(n - 1 for n in notes.values() if n > 1)
        if fig.duplicate_note_calls:
            fig.problems.append(f"run {self.runs}: a note ran twice: {dict(notes)}")
        probes = Counter(lines(work / "probes.txt"))
        fig.idempotent_reruns += sum(n - 1 for n in probes.values() if n > 1)
        turns = Counter(self.turns())
        fig.in_flight_turns_reasked += max(0, sum(n - 1 for n in turns.values()) - fig.duplicate_paid_turns)
        if got == expected:
            fig.identical += 1
        elif fig.asked_skip and skipped_only(got, expected):
            fig.ended_like_baseline_with_skips += 1
        else:
            fig.mismatches += 1
            fig.problems.append(f"run {self.runs}: {json.dumps(got)[:500]} != {json.dumps(expected)[:500]}")


def torture(kills: int, seed: int, pause: float, base: Path, workers: int = 1, http: bool = False) -> int:
    started = time.monotonic()
    pool = [AgentWorker(base / f"agent{i}", pause, random.Random(seed + i), http) for i in range(workers)]
    total = AgentFigures()
    try:
        expected, duration = pool[0].baseline()
        print(f"seed {seed}; uninterrupted agent run: {duration:.1f}s from `ready` on, "
              f"{TOOL_TURNS + 1} turns, {2 * TOOL_TURNS} tool calls; {workers} worker(s); "
              f"model: {'LiteLLM over HTTP to the stub' if http else 'a provider port'}", flush=True)

        def describe(worker: AgentWorker, fig: AgentFigures) -> str:
            verdict = "identical" if fig.identical else "skip-only" if fig.ended_like_baseline_with_skips else "BAD"
            return (f"w{pool.index(worker)} run {worker.runs:>3}: kills {fig.kills} resumes {fig.resumes} "
                    f"asked {fig.asked_skip + fig.asked_rerun} {verdict}")

        deal_kills(pool, kills, total, expected, duration, describe)
    finally:
        for w in pool:
            w.close()
    report(total, time.monotonic() - started)
    return 1 if total.bad() else 0


def report(total: AgentFigures, elapsed: float) -> None:
    print()
    print(f"kills:                         {total.kills} ({total.kills_landed} while the process was alive)")
    print(f"resumes:                       {total.resumes}")
    print(f"runs:                          {total.runs}")
    print(f"  identical to uninterrupted:  {total.identical}")
    print(f"  same but skipped results:    {total.ended_like_baseline_with_skips}")
    print(f"  mismatches:                  {total.mismatches}")
    print(f"person asked (cut-off note):   {total.asked_skip + total.asked_rerun} "
          f"(skip {total.asked_skip}, rerun {total.asked_rerun})")
    print(f"turns paid twice:              {total.duplicate_paid_turns}")
    print(f"in-flight turns re-asked:      {total.in_flight_turns_reasked} (allowed: charged the reservation)")
    print(f"non-idempotent calls run twice: {total.duplicate_note_calls}")
    print(f"idempotent calls rerun:        {total.idempotent_reruns} (allowed)")
    print(f"store-open failures:           {total.store_open_failures}")
    print(f"unexpected exits:              {total.unexpected_exits}")
    print(f"total time:                    {elapsed:.0f}s")
    for problem in total.problems[:20]:
        print("  problem:", problem)
