"""kill -9 of loopdsl while a coding-agent CLI (the fake `claude`, scenario `hang`) runs,
then resume, with real processes: the CLI is never resumed mid-way, the spend committed
before the kill stands, its leftover process group is killed, and it runs again only when
the state is `idempotent: true`; otherwise a person decides (rerun|skip|fail), and an
unattended loop fails kind `interrupted`. The resumes after the first run in-process."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import loopdsl
from loopdsl.adapters.store.run_store import RunStore
from loopdsl.api.durable import decide

DRIVER = Path(__file__).with_name("agent_crash_driver.py")
FAKE_CLI = Path(__file__).resolve().parents[1] / "data" / "fake_cli" / "claude"
CAP = 0.5
# The fake reports 100,000 input tokens before it hangs: at $0.3/Mtok, $0.03 charged.
FIRST_EVENT_USD = 0.03


def write_loop(workdir: Path, *, idempotent: bool, unattended: bool = False, scenario: str = "hang") -> None:
    workdir.mkdir()
    (workdir / "loop.yaml").write_text(
        "loopdsl: 1\nname: cli-crash\n" + ("unattended: true\n" if unattended else "")
        + f"models:\n  claude: {{model: anthropic/claude-sonnet-4-5, max_tokens: 1000, cli_path: {FAKE_CLI},\n"
        "           price: {input_per_mtok: 0.3, output_per_mtok: 1.5}}\n"
        "budget: {cost_usd: 5}\nstart: review\nstates:\n"
        f"  review:\n    agent: {{cli: claude-code, model: claude, prompt: 'scenario {scenario}', max_turns: 4, "
        f"max_cost_usd: {CAP}}}\n    idempotent: {str(idempotent).lower()}\n    next: done\n"
        "  done: {end: completed}\n")


def env(tmp_path: Path) -> dict[str, str]:
    # TMPDIR: the CLI homes a killed loopdsl leaves go with the test, not into the machine's /tmp.
    (tmp_path / "tmp").mkdir(exist_ok=True)
    e = dict(os.environ, REQUESTS=str(tmp_path / "requests.log"), PYTHONUNBUFFERED="1", TMPDIR=str(tmp_path / "tmp"))
    e.pop("LOOPDSL_STORE", None)
    return e


def resume(tmp_path: Path, store: Path, run_id: str, *, process: bool = False) -> str:
    """The resume's status: in this process (what it does to the leftover CLI is the point,
    not its process), or with `process` through the driver in a process of its own."""
    if not process:
        return loopdsl.resume(run_id, store=store).status
    done = subprocess.run([sys.executable, str(DRIVER), "resume", str(store), run_id], cwd=tmp_path,
                          env=env(tmp_path), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return str(json.loads(done.stdout.strip().splitlines()[-1])["status"])


def crash_while_the_cli_runs(tmp_path: Path, workdir: Path, store: Path) -> tuple[str, Path]:
    """The run's id, and the CLI home the killed loopdsl left behind."""
    proc = subprocess.Popen([sys.executable, str(DRIVER), "run", str(store), str(workdir)], cwd=tmp_path,
                            env=env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (workdir / "hang.ready").exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.01)
    [run_id] = [r["run_id"] for r in RunStore(store).list_runs()]
    while float((RunStore(store).load_run(run_id).get("pending") or {}).get("charged_usd") or 0) <= 0:
        assert time.monotonic() < deadline  # the first usage event is committed
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate()
    (workdir / "hang.ready").unlink()
    # The CLI's home, which the killed loopdsl never removed (adapters/coding_cli_home.py).
    [home] = [home for home in (tmp_path / "tmp").glob(f"loopdsl-cli-*-{proc.pid}-*-*") if home.is_dir()]
    return run_id, home


def cli_runs(workdir: Path) -> list[dict[str, int]]:
    return [json.loads(line) for line in (workdir / "runs.txt").read_text().splitlines()]


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def kill_all(workdir: Path) -> None:
    for run in cli_runs(workdir):
        for pid in run.values():
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def dirs(tmp_path: Path):
    workdir, store = tmp_path / "w", tmp_path / "store"
    yield workdir, store
    if (workdir / "runs.txt").exists():
        kill_all(workdir)


def test_an_idempotent_cli_state_is_killed_and_rerun_with_its_first_spend_standing(tmp_path: Path, dirs) -> None:
    workdir, store = dirs
    write_loop(workdir, idempotent=True)
    run_id, left_home = crash_while_the_cli_runs(tmp_path, workdir, store)
    [first] = cli_runs(workdir)
    assert alive(first["pid"]) and alive(first["child_pid"])  # loopdsl died, the CLI did not
    # What the CLI did before the kill was committed as it happened: its tool use, and each
    # charge together with the pending record that holds it.
    before = RunStore(store).events(run_id)
    assert [(e["type"], e.get("name")) for e in before if e["type"] == "tool_call"] == [("tool_call", "Glob")]
    pending = RunStore(store).load_run(run_id)["pending"]
    assert max(e["charged_usd"] for e in before if e["type"] == "cli_charge") == pytest.approx(pending["charged_usd"])
    assert resume(tmp_path, store, run_id, process=True) == "completed"
    assert not alive(first["pid"]) and not alive(first["child_pid"])  # the leftover group was killed
    assert not left_home.exists()  # the rerun's attempt removed the home its killed maker left
    assert len(cli_runs(workdir)) == 2  # started afresh, never continued
    saved = RunStore(store).load_run(run_id)
    # The first run's reservation was charged in full on reload (it covers its reported
    # $0.03); the rerun is charged what it reported.
    assert saved["ledger"]["cost_usd"] == pytest.approx(CAP + saved["results"]["review"]["cost_usd"])
    assert saved["results"]["review"]["text"] == "All done: fixed a.py."
    events = RunStore(store).events(run_id)
    assert [e["type"] for e in events].count("stopped_leftover") == 1
    assert [e["seq"] for e in events] == sorted({e["seq"] for e in events})  # no event lost its place
    assert [e.get("name") for e in events if e["type"] == "tool_call"] == ["Glob", "Read"]  # the rerun's too


def test_a_cli_state_that_is_not_idempotent_waits_and_skip_completes_without_rerunning(
        tmp_path: Path, dirs, monkeypatch: pytest.MonkeyPatch) -> None:
    workdir, store = dirs
    write_loop(workdir, idempotent=False)
    run_id, left_home = crash_while_the_cli_runs(tmp_path, workdir, store)
    [first] = cli_runs(workdir)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # the in-process resume's temp dir
    assert resume(tmp_path, store, run_id) == "waiting"
    assert not left_home.exists()  # no attempt will run again, and the resume removed the home
    assert not alive(first["pid"]) and not alive(first["child_pid"])  # stopped before asking
    saved = RunStore(store).load_run(run_id)
    assert saved["waiting"]["choices"] == ["rerun", "skip", "fail"]
    assert "$0.030000 reported" in saved["waiting"]["message"]
    spent = saved["ledger"]["cost_usd"]
    assert spent == pytest.approx(CAP) and spent >= FIRST_EVENT_USD  # charged events stay charged
    decide(run_id, "skip", store=store)
    assert resume(tmp_path, store, run_id) == "completed"
    assert len(cli_runs(workdir)) == 1  # never run twice
    ended = RunStore(store).load_run(run_id)
    assert ended["results"]["review"]["stop"] == "interrupted"
    assert ended["ledger"]["cost_usd"] == pytest.approx(CAP)


@pytest.mark.parametrize("choice, status", [("rerun", "completed"), ("fail", "failed")])
def test_a_person_can_rerun_or_fail_a_cut_off_cli_state(tmp_path: Path, dirs, choice: str, status: str) -> None:
    workdir, store = dirs
    write_loop(workdir, idempotent=False)
    run_id, _ = crash_while_the_cli_runs(tmp_path, workdir, store)
    assert resume(tmp_path, store, run_id) == "waiting"
    decide(run_id, choice, store=store)
    assert resume(tmp_path, store, run_id) == status
    ended = RunStore(store).load_run(run_id)
    if choice == "fail":
        assert ended["error"]["kind"] == "interrupted"
        assert ended["ledger"]["cost_usd"] == pytest.approx(CAP)
    else:
        assert ended["results"]["review"]["text"] == "All done: fixed a.py."
        assert ended["ledger"]["cost_usd"] == pytest.approx(CAP + ended["results"]["review"]["cost_usd"])
    assert len(cli_runs(workdir)) == (2 if choice == "rerun" else 1)


def test_unattended_a_cut_off_cli_state_fails_interrupted(tmp_path: Path, dirs) -> None:
    workdir, store = dirs
    write_loop(workdir, idempotent=False, unattended=True)
    run_id, _ = crash_while_the_cli_runs(tmp_path, workdir, store)
    [first] = cli_runs(workdir)
    assert resume(tmp_path, store, run_id) == "failed"
    ended = RunStore(store).load_run(run_id)
    assert ended["error"]["kind"] == "interrupted"
    assert not alive(first["pid"]) and not alive(first["child_pid"])
    assert len(cli_runs(workdir)) == 1
