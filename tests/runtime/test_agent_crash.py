"""kill -9 in the middle of an agent's conversation, then resume, with real processes:
no turn is paid twice, a finished tool call is not run again, a cut-off call of an
idempotent tool runs again (its leftover process killed first), and a cut-off call of a
non-idempotent one waits for a person (here: skip, which the model is told). The runs
killed are real processes; most resumes run in this process."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import loopdsl
from loopdsl.adapters.store.run_store import RunStore
from loopdsl.api.durable import decide
from loopdsl.runtime.actions.agent_turns import agent_key

DRIVER = Path(__file__).with_name("agent_crash_driver.py")
sys.path.insert(0, str(DRIVER.parent))
from agent_crash_driver import Provider  # noqa: E402
PRICE = "price: {input_per_mtok: 1, output_per_mtok: 2}"


def write_loop(workdir: Path, idempotent: bool, unattended: bool = False) -> None:
    workdir.mkdir()
    (workdir / "loop.yaml").write_text(
        "loopdsl: 1\nname: crashy-agent\n"
        + ("unattended: true\n" if unattended else "")
        + f"models:\n  m: {{model: openai/gpt-4o-mini, max_tokens: 50, {PRICE}}}\n"
        "tools:\n  mark:\n    description: Record n, then wait.\n"
        "    params: {n: {type: integer}, sleep: {type: integer}}\n    required: [n, sleep]\n"
        "    shell: echo {{ args.n }} >> ran.txt; echo $$ > pid.txt; [ -e resumed ] || sleep {{ args.sleep }}\n"
        f"    idempotent: {str(idempotent).lower()}\n"
        "start: work\nstates:\n  work:\n    agent:\n      model: m\n      prompt: Mark three times.\n"
        "      tools: [mark]\n      max_turns: 6\n      output: json\n    next: done\n  done: {end: completed}\n")


def env(tmp_path: Path) -> dict[str, str]:
    e = dict(os.environ, REQUESTS=str(tmp_path / "requests.log"), PYTHONUNBUFFERED="1")
    e.pop("LOOPDSL_STORE", None)
    return e


def driver(tmp_path: Path, *args: str, timeout: float = 60, process: bool = False) -> dict:
    """`resume STORE RUN_ID` in this process with the driver's provider (what the resume does
    is the point), or with `process` (and for `run`) in the driver's own process."""
    if args[0] == "resume" and not process:
        saved = os.environ.get("REQUESTS")
        os.environ["REQUESTS"] = env(tmp_path)["REQUESTS"]
        try:
            result = loopdsl.resume(args[2], store=Path(args[1]), provider=Provider())
        finally:
            if saved is None:
                os.environ.pop("REQUESTS")
            else:
                os.environ["REQUESTS"] = saved
        return {"run_id": result.run_id, "status": result.status}
    done = subprocess.run([sys.executable, str(DRIVER), *args], cwd=tmp_path, env=env(tmp_path),
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def crash_in_second_call(tmp_path: Path, workdir: Path, store: Path) -> str:
    proc = subprocess.Popen([sys.executable, str(DRIVER), "run", str(store), str(workdir)], cwd=tmp_path,
                            env=env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    ran = workdir / "ran.txt"
    while not (ran.exists() and "2" in ran.read_text().split()):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.01)
    time.sleep(0.2)  # the call's process is in its sleep
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate()
    # A rerun of the cut-off call need not wait out its 30 s; the leftover keeps sleeping.
    (workdir / "resumed").touch()
    ids = [r["run_id"] for r in RunStore(store).list_runs()]
    assert len(ids) == 1
    return ids[0]


def leftover_alive(workdir: Path) -> bool:
    """The tool's shell, still running (a zombie awaiting init's reaping is not)."""
    pid = int((workdir / "pid.txt").read_text())
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def turns_paid(tmp_path: Path) -> list[str]:
    return (tmp_path / "requests.log").read_text().splitlines()


def test_a_cut_off_idempotent_call_reruns_and_nothing_paid_or_finished_runs_twice(tmp_path: Path) -> None:
    workdir, store = tmp_path / "w", tmp_path / "store"
    write_loop(workdir, idempotent=True)
    run_id = crash_in_second_call(tmp_path, workdir, store)
    assert turns_paid(tmp_path) == ["turn 1", "turn 2"]
    assert leftover_alive(workdir)  # loopdsl died, its tool's process did not
    ended = driver(tmp_path, "resume", str(store), run_id, process=True)
    assert ended["status"] == "completed"
    assert turns_paid(tmp_path) == ["turn 1", "turn 2", "turn 3", "turn 4"]  # turns 1 and 2 replayed from the store
    ledger = RunStore(store).load_run(run_id)["ledger"]
    assert ledger["tokens"] == 4 * 110  # each turn charged once, as reported (no reservation left charged)
    events = [e for e in RunStore(store).events(run_id) if e["type"] == "stopped_leftover"]
    assert len(events) == 1  # the cut-off call's process group was killed before the rerun
    assert (workdir / "ran.txt").read_text().split() == ["1", "2", "2", "3"]  # call 1 not rerun, call 2 rerun


def test_a_cut_off_call_of_a_non_idempotent_tool_waits_for_a_person(tmp_path: Path) -> None:
    workdir, store = tmp_path / "w", tmp_path / "store"
    write_loop(workdir, idempotent=False)
    run_id = crash_in_second_call(tmp_path, workdir, store)
    waiting = driver(tmp_path, "resume", str(store), run_id)
    assert waiting["status"] == "waiting"
    assert not leftover_alive(workdir)  # stopped before asking
    decide(run_id, "skip", store=store)
    ended = driver(tmp_path, "resume", str(store), run_id)
    assert ended["status"] == "completed"
    assert (workdir / "ran.txt").read_text().split() == ["1", "2", "3"]  # never run twice
    assert turns_paid(tmp_path) == ["turn 1", "turn 2", "turn 3", "turn 4"]


def test_unattended_a_cut_off_non_idempotent_call_fails_the_run_interrupted(tmp_path: Path) -> None:
    workdir, store = tmp_path / "w", tmp_path / "store"
    write_loop(workdir, idempotent=False, unattended=True)
    run_id = crash_in_second_call(tmp_path, workdir, store)
    ended = driver(tmp_path, "resume", str(store), run_id)
    assert ended["status"] == "failed"
    assert RunStore(store).load_run(run_id)["error"]["kind"] == "interrupted"
    assert (workdir / "ran.txt").read_text().split() == ["1", "2"]


def test_a_turn_in_flight_at_the_kill_is_charged_its_reservation_and_sent_again(tmp_path: Path) -> None:
    workdir, store = tmp_path / "w", tmp_path / "store"
    write_loop(workdir, idempotent=True)
    flag = tmp_path / "slow-turn"
    environment = dict(env(tmp_path), SLOW_TURN_FLAG=str(flag), CALL_2_SLEEP="0")
    proc = subprocess.Popen([sys.executable, str(DRIVER), "run", str(store), str(workdir)], cwd=tmp_path,
                            env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not flag.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate()
    [run_id] = [r["run_id"] for r in RunStore(store).list_runs()]
    done = subprocess.run([sys.executable, str(DRIVER), "resume", str(store), run_id], cwd=tmp_path,
                          env=environment, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1])["status"] == "completed"
    assert turns_paid(tmp_path) == ["turn 1", "turn 2", "turn 3", "turn 3", "turn 4"]
    assert (workdir / "ran.txt").read_text().split() == ["1", "2", "3"]  # no finished call ran twice
    ledger = RunStore(store).load_run(run_id)["ledger"]
    # Four answered turns as reported, plus the lost one's whole reservation (100 counted + 50 max_tokens).
    assert ledger["tokens"] == 4 * 110 + 150


def tamper_with_reply(store: Path, run_id: str, turn: int, arguments: dict) -> None:
    """Edit the stored model reply of `turn` in the run store, as a person or a bug might."""
    key = agent_key("turn", run=run_id, state="work", visit=1, attempt=1, turn=turn, fallback=0,
                    model="openai/gpt-4o-mini")
    opened = RunStore(store)
    reply = opened.get_response(key)
    assert reply is not None and reply["tool_calls"], "the turn's reply is where the test expects it"
    reply["tool_calls"][0]["arguments"] = json.dumps(arguments)
    opened.put_response(key, reply)
    opened.close()


@pytest.mark.parametrize("idempotent", [True, False])
def test_a_cut_off_call_whose_stored_reply_changed_fails_the_run(tmp_path: Path, idempotent: bool) -> None:
    """Rerunning (idempotent) or asking a person (not) would act on arguments that were
    never started: the recorded args hash does not match, so the run fails instead."""
    workdir, store = tmp_path / "w", tmp_path / "store"
    write_loop(workdir, idempotent=idempotent)
    run_id = crash_in_second_call(tmp_path, workdir, store)
    tamper_with_reply(store, run_id, 2, {"n": 7, "sleep": 0})
    ended = driver(tmp_path, "resume", str(store), run_id)
    assert ended["status"] == "failed"
    error = RunStore(store).load_run(run_id)["error"]
    assert error["kind"] == "interrupted"
    assert "call_2_1 (mark) was cut off by a crash" in error["message"]
    assert "other arguments" in error["message"] and "start a new run" in error["message"]
    assert (workdir / "ran.txt").read_text().split() == ["1", "2"]  # neither rerun (n=7 or 2) nor skipped on
    assert not leftover_alive(workdir)  # what was left of the call is stopped all the same
    assert turns_paid(tmp_path) == ["turn 1", "turn 2"]  # nothing more was asked of the model


def test_a_finished_call_whose_stored_reply_changed_fails_the_run(tmp_path: Path) -> None:
    workdir, store = tmp_path / "w", tmp_path / "store"
    write_loop(workdir, idempotent=True)
    run_id = crash_in_second_call(tmp_path, workdir, store)
    tamper_with_reply(store, run_id, 1, {"n": 5, "sleep": 0})
    ended = driver(tmp_path, "resume", str(store), run_id)
    assert ended["status"] == "failed"
    error = RunStore(store).load_run(run_id)["error"]
    assert "call_1_1 (mark) finished before the crash" in error["message"]
    assert (workdir / "ran.txt").read_text().split() == ["1", "2"]


def test_an_untouched_store_resumes_as_before(tmp_path: Path) -> None:
    """The check itself: the same store, read and written back unchanged, still resumes."""
    workdir, store = tmp_path / "w", tmp_path / "store"
    write_loop(workdir, idempotent=True)
    run_id = crash_in_second_call(tmp_path, workdir, store)
    tamper_with_reply(store, run_id, 2, {"n": 2, "sleep": 30})  # what the model sent: same arguments
    assert driver(tmp_path, "resume", str(store), run_id)["status"] == "completed"
