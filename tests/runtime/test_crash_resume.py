"""Kill -9 a real `loopdsl run` at known moments; `loopdsl resume` must finish it as if
nothing had happened, and never pay twice for an LLM call that had completed.

The loop (tests/data/durable/crash_loop.yaml) marks its slow steps with files, and its
`llm` state calls a loopback stub that counts requests per (state, visit, attempt) and
can hold a request open, so each kill lands at a chosen place. The processes run the
real CLI through bench/crash_torture.py's launcher, which only lowers the default run
lock TTL (a SIGKILLed holder's lock otherwise takes up to 15 s to expire). The runs that
call the model are forked from a server (tests/cli_forked.py) that has imported the CLI and
LiteLLM once and lowered the lock TTL as the launcher does, so each kill point costs a fork,
not a LiteLLM import; the side-effect tests start theirs as plain processes.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import crash_torture as ct
from cli_forked import ForkServer

import loopdsl
from loopdsl.api.durable import decide
from loopdsl.adapters.store.run_store import RunStore

DATA = Path(__file__).parents[1] / "data" / "durable"
PAUSE = "0.5"
# The `set` stretch (the loop's default is 150): long enough that a kill aimed at tick 60 lands
# inside it even when polling the store lags on a loaded machine (at 150 one landed past it).
TICKS = 300  # within the loop's budget of 400 steps
pytestmark = pytest.mark.xdist_group("crash_resume")  # one fork server per module


@pytest.fixture(scope="module")
def forks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ForkServer]:
    env = ct.cli_env({"FORKED_CLI_PRELOAD": "loopdsl.adapters.litellm_loading:ensure_litellm,crash_torture:shorten_lock_ttl",
                      "PYTHONPATH": os.pathsep.join(filter(None, [str(BENCH), os.environ.get("PYTHONPATH")]))})
    server = ForkServer(tmp_path_factory.mktemp("forked-output"), env)
    try:
        yield server
    finally:
        server.close()


def _forked_cli(forks: ForkServer, args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """`loopdsl ARGS` to its end in a forked process, as `ct.cli` runs it in a fresh one."""
    proc = forks.launch(args, cwd)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode is not None
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


@pytest.fixture
def counting_stub() -> Any:
    stub = ct.CountingStub().start()
    try:
        yield stub
    finally:
        stub.stop()


def _rises_past(count: Callable[[], int], start: int) -> Callable[[], bool]:
    return lambda: count() > start


def _run_args(loop: Path, store: Path, marks: Path) -> list[str]:
    return ["run", str(loop), "--store", str(store), "--input", f"marks={marks}", "--input", f"pause={PAUSE}",
            "--input", f"ticks={TICKS}"]


@pytest.mark.slow
def test_killed_at_ten_points_ends_like_an_uninterrupted_run(tmp_path: Path, counting_stub: ct.CountingStub,
                                                             forks: ForkServer) -> None:
    # The uninterrupted run, on its own stub, runs alongside the crashed one.
    base_stub = ct.CountingStub().start()
    try:
        base_marks = tmp_path / "base-marks"
        base_marks.mkdir()
        base_loop = ct.write_loop(tmp_path / "base", base_stub.api_base)
        baseline = forks.launch(_run_args(base_loop, tmp_path / "base-store", base_marks), tmp_path)

        marks, store = tmp_path / "marks", tmp_path / "store"
        marks.mkdir()
        loop = ct.write_loop(tmp_path / "crash", counting_stub.api_base)
        probe = RunStore(store)  # a reader beside the runs, as `loopdsl show` would be
        kills: list[tuple[str, bool]] = []
        done_calls: set[ct.CallKey] = set()
        run_id = ""

        def killed_at(name: str, proc: Any, reached: Callable[[], bool], *, timeout: float = 90.0) -> dict[str, Any]:
            nonlocal done_calls
            seen_before = len(counting_stub.keys)
            ct.wait_until(reached, proc, timeout=timeout, what=name)
            kills.append((name, ct.kill(proc)))
            for key in counting_stub.keys[seen_before:]:
                assert key not in done_calls, f"{name}: call {key} was paid again after it had completed"
            # The store opens clean after every kill, as a fresh process would open it.
            assert [r["run_id"] for r in ct.open_clean(store)] == ([run_id] if run_id else [r["run_id"] for r in probe.list_runs()])
            if run_id:
                done_calls |= ct.completed_calls(store, run_id, counting_stub.keys)
            return probe.load(run_id) if run_id else probe.list_runs()[0]

        def resume() -> Any:
            probe.lock(run_id, ttl=5.0, wait=ct.LOCK_TTL_S * 4 + 5).release()  # the dead holder's lock expired
            return forks.launch(["resume", run_id, "--store", str(store)], tmp_path)

        def begins() -> int:
            return ct.markers(marks, "begin")

        # 1. right after start: as soon as the run exists in the store
        proc = forks.launch(_run_args(loop, store, marks), tmp_path)
        rec = killed_at("start", proc, lambda: bool(probe.list_runs()))
        assert rec["status"] == "running" and rec["current"] in ("init", "begin")
        listed = _forked_cli(forks, ["runs", "--store", str(store), "--json"], tmp_path)
        assert listed.returncode == 0, listed.stderr
        run_id = json.loads(listed.stdout)[0]["run_id"]

        # 2-3. inside the same shell state, twice in a row
        for name in ("shell", "same shell again"):
            n = begins()
            rec = killed_at(name, resume(), _rises_past(begins, n))
            assert rec["current"] == "begin"

        # 4-5. inside a before-gate, then inside an after-gate
        n = ct.markers(marks, "gate_before")
        rec = killed_at("before-gate", resume(), lambda: ct.markers(marks, "gate_before") > n)
        assert rec["current"] == "check" and "check" not in rec["results"]
        n = ct.markers(marks, "gate_after")
        rec = killed_at("after-gate", resume(), lambda: ct.markers(marks, "gate_after") > n)
        assert rec["current"] == "check" and "check" not in rec["results"]

        # 6-7. twice inside the stretch of `set` states
        def ticks() -> int:
            return int(probe.load(run_id)["visits"].get("tick", 0))

        for at in (20, 60):
            rec = killed_at(f"set stretch at {at}", resume(), _rises_past(ticks, at - 1))
            assert rec["current"] == "tick" and at <= rec["visits"]["tick"] < TICKS

        # 8. during the LLM call: the stub holds the request until the client is gone
        counting_stub.hold("draft")
        rec = killed_at("llm call in flight", resume(), lambda: counting_stub.counts()[("draft", 1, 1)] >= 1)
        pending = rec["pending"]
        assert pending["kind"] == "llm" and pending["state"] == "draft" and probe.get_response(pending["key"]) is None
        reserved = float(pending["reserved"]["cost_usd"])

        # 9. right after the call completed: during the next shell state
        n = ct.markers(marks, "after_draft")
        rec = killed_at("after the llm call", resume(), lambda: ct.markers(marks, "after_draft") > n)
        assert rec["current"] == "after_draft" and rec["results"]["draft"]["ok"]
        assert ("draft", 1, 1) in done_calls

        # 10. during the end: the moment the end is committed
        rec = killed_at("end", resume(), lambda: probe.load(run_id)["status"] == "completed")
        assert rec["status"] == "completed"
        again = _forked_cli(forks, ["resume", run_id, "--store", str(store)], tmp_path)
        assert again.returncode == 2 and "already ended with status completed" in again.stderr
        assert "Traceback" not in again.stderr

        _out, err = baseline.communicate(timeout=120)
        assert baseline.returncode == 0, err
        expected = ct.summary_of(RunStore(tmp_path / "base-store").list_runs()[0])
        final = probe.load(run_id)
        probe.close()
    finally:
        base_stub.stop()

    assert len(kills) == 10
    assert all(landed for name, landed in kills if name != "end"), kills
    assert ct.summary_of(final) == expected
    assert expected["status"] == "completed" and expected["outputs"]["ticks"] == TICKS
    # One request per call, except the one killed in flight, asked once more.
    assert base_stub.counts() == Counter({("draft", 1, 1): 1})
    assert counting_stub.counts() == Counter({("draft", 1, 1): 2})
    # The call killed in flight is charged its whole reservation on top of what the re-asked one cost.
    base_cost = RunStore(tmp_path / "base-store").list_runs()[0]["ledger"]["cost_usd"]
    assert final["ledger"]["cost_usd"] == pytest.approx(base_cost + reserved)
    assert final["ledger"]["tokens"] > RunStore(tmp_path / "base-store").list_runs()[0]["ledger"]["tokens"]


# ----------------------------------------------------------------- side effects cut off


def _side_effect_loop(tmp_path: Path, idempotent: bool) -> Path:
    text = (DATA / "side_effect.yaml").read_text(encoding="utf-8")
    path = tmp_path / "side_effect.yaml"
    path.write_text(text.replace("idempotent: false", f"idempotent: {str(idempotent).lower()}"), encoding="utf-8")
    return path


def _cut_off_mid_command(tmp_path: Path, idempotent: bool) -> tuple[Path, Path, str]:
    marks, store = tmp_path / "marks", tmp_path / "store"
    marks.mkdir()
    loop = _side_effect_loop(tmp_path, idempotent)
    proc = ct.launch(["run", str(loop), "--store", str(store), "--input", f"marks={marks}"], tmp_path)
    ct.wait_until(lambda: ct.markers(marks, "work") == 1, proc, what="the command started")
    assert ct.kill(proc)
    run_id = ct.open_clean(store)[0]["run_id"]
    ct.wait_lock_free(store, run_id)
    return marks, store, run_id


def _waits_for_a_person(tmp_path: Path, store: Path, run_id: str) -> None:
    first = ct.cli(["resume", run_id, "--store", str(store)], tmp_path)
    assert first.returncode == 4, first.stderr
    assert f"loopdsl approve {run_id}" in first.stdout and f"loopdsl reject {run_id}" in first.stdout
    assert "cut off mid-way" in first.stdout + first.stderr
    rec = ct.record(store, run_id)
    assert rec["status"] == "waiting" and rec["waiting"]["reason"] == "interrupted"


@pytest.mark.slow
def test_cut_off_command_waits_and_approve_runs_it_again(tmp_path: Path) -> None:
    marks, store, run_id = _cut_off_mid_command(tmp_path, idempotent=False)
    _waits_for_a_person(tmp_path, store, run_id)
    assert ct.markers(marks, "work") == 1  # not re-run while waiting
    decide(run_id, "approve", "safe to repeat", store=store, by="tester")
    result = loopdsl.resume(run_id, store=store)
    assert result.status == "completed" and result.outputs == {"said": "worked"}
    assert ct.markers(marks, "work") == 2


@pytest.mark.slow
def test_cut_off_command_rejected_ends_the_run_failed(tmp_path: Path) -> None:
    marks, store, run_id = _cut_off_mid_command(tmp_path, idempotent=False)
    _waits_for_a_person(tmp_path, store, run_id)
    decide(run_id, "reject", store=store, by="tester")
    result = loopdsl.resume(run_id, store=store)
    assert result.status == "failed" and "declined" in result.state.error["message"]
    assert ct.markers(marks, "work") == 1  # never run again


@pytest.mark.slow
def test_cut_off_idempotent_command_is_run_again_without_asking(tmp_path: Path) -> None:
    marks, store, run_id = _cut_off_mid_command(tmp_path, idempotent=True)
    done = ct.cli(["resume", run_id, "--store", str(store)], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert ct.record(store, run_id)["status"] == "completed"
    assert ct.markers(marks, "work") == 2


# ----------------------------------------------------------------- the stored-response key


def _gate_start_committed(store: Path) -> bool:
    """The after-gate's command is in the store (runtime/commands.py commits it as it starts),
    so the store's ledger already holds what the call cost."""
    try:
        return any(ct.record(store, run["run_id"]).get("meta", {}).get("commands") for run in ct.open_clean(store))
    except Exception:  # noqa: BLE001 - the store is still being created
        return False


@pytest.mark.slow
@pytest.mark.parametrize("kill_when", ["gate started", "gate start committed"])
def test_prompt_reading_the_budget_is_not_paid_again_after_a_crash(tmp_path: Path, counting_stub: ct.CountingStub,
                                                                   kill_when: str, forks: ForkServer) -> None:
    """Killed after the paid reply was stored but before the state committed: on resume the
    killed call's reservation is charged, so `budget.remaining` (in the prompt) renders
    differently; the stored reply must still be reused, not bought a second time. Also when a
    commit made mid-state (the gate's command starting) already holds the call's real cost."""
    marks, store = tmp_path / "marks", tmp_path / "store"
    marks.mkdir()
    loop = ct.write_loop(tmp_path / "loop", counting_stub.api_base, DATA / "budget_prompt.yaml")
    proc = forks.launch(["run", str(loop), "--store", str(store), "--input", f"marks={marks}"], tmp_path)
    ct.wait_until(lambda: ct.markers(marks, "gate_after") == 1, proc, what="the after-gate started")
    if kill_when == "gate start committed":
        ct.wait_until(lambda: _gate_start_committed(store), proc, what="the gate's start was committed")
    assert ct.kill(proc)
    assert counting_stub.counts() == Counter({("draft", 1, 1): 1})
    run_id = ct.open_clean(store)[0]["run_id"]
    rec = ct.record(store, run_id)
    assert rec["pending"]["kind"] == "llm" and rec["pending"]["state"] == "draft"
    ct.wait_lock_free(store, run_id)
    (marks / "resumed").touch()  # the gate is quick from now on

    done = _forked_cli(forks, ["resume", run_id, "--store", str(store)], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    final = ct.record(store, run_id)
    assert final["status"] == "completed"
    assert ct.markers(marks, "gate_after") == 2  # the gate ran again; the call did not
    assert counting_stub.counts() == Counter({("draft", 1, 1): 1})
    # Charged once, at what the stub reported (20 + 10 tokens), not at the reservation.
    assert final["ledger"]["tokens"] == 30
    assert final["ledger"]["cost_usd"] == pytest.approx((20 * 1.0 + 10 * 2.0) / 1e6)


@pytest.mark.slow
def test_a_kill_while_a_refused_call_waits_to_retry_charges_it_nothing(tmp_path: Path, forks: ForkServer) -> None:
    """A 429 is charged nothing, but its release was first written with the next commit: a kill
    during the wait its Retry-After asked for left the reservation in the store, and the resume
    charged the refused call in full."""
    from stub_server import StubServer

    with StubServer() as stub:
        stub.reply_rate_limit("60")
        stub.reply_text("answered", prompt_tokens=11, completion_tokens=7)
        loop = tmp_path / "ask.yaml"
        loop.write_text(f"loopdsl: 1\nname: ask\nbudget: {{tokens: 100000}}\nmodels:\n"
                        f"  m: {{model: openai/gpt-4o-mini, api_base: \"{stub.api_base}\", max_tokens: 50}}\n"
                        "start: talk\nstates:\n  talk:\n    llm: {model: m, prompt: hi}\n"
                        "    retry: {max_attempts: 2, backoff: {initial: 0s}}\n    next: done\n  done: {end: completed}\n")
        store = tmp_path / "store"
        proc = forks.launch(["run", str(loop), "--store", str(store)], tmp_path)
        try:
            ct.wait_until(lambda: len(stub.requests) == 1 and _settled(store), proc, what="the 429, recorded", timeout=60)
        finally:
            assert ct.kill(proc)  # killed in the 60 s wait
        run_id = RunStore(store).list_runs()[0]["run_id"]
        resumed = _forked_cli(forks, ["resume", run_id, "--store", str(store)], tmp_path)
        assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert RunStore(store).load_run(run_id)["ledger"]["tokens"] == 18  # the answered call only


def _settled(store: Path) -> bool:
    try:
        with RunStore(store) as probe:
            runs = probe.list_runs()
    except Exception:  # not created yet
        return False
    return bool(runs) and bool((runs[0].get("pending") or {}).get("settled"))
