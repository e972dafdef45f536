"""Durable runs seen from outside: show/runs, run ids, changed files, abort, locks,
concurrency groups, the cross-run cache, what is (not) stored, and bad store input.

In-process runs (`loopdsl.run(..., store=DIR)`) where a real process is not the point;
the CLI wherever its message or exit code is.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import crash_torture as ct
from cli_forked import loopdsl_command
from cli_in_process import cli_in_process

import loopdsl
from loopdsl.api.durable import RunConflict, abort, decide
from loopdsl.adapters.store.run_store import RunLocked, RunStore

DATA = Path(__file__).parents[1] / "data" / "durable"
SECRET = "s3cr3t-value-7f1c9a"


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """The command's answer, in this process (tests/cli_in_process.py)."""
    return cli_in_process(args, cwd)


def _cli_process(args: list[str], cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`python -m loopdsl ARGS` as a process of its own, where a second process is the point."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPDSL_")}
    return subprocess.run([*loopdsl_command(), *args], check=False, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout)


def _no_traceback(done: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in done.stderr + done.stdout
    assert done.stderr.startswith("loopdsl: error: "), done.stderr


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def showcase(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The showcase loop pointed at a counting stub, with its secret in the environment."""
    monkeypatch.setenv("SHOWCASE_TOKEN", SECRET)
    stub = ct.CountingStub().start()
    try:
        yield stub, ct.write_loop(tmp_path / "loop", stub.api_base, DATA / "showcase.yaml")
    finally:
        stub.stop()


# ----------------------------------------------------------------- show and runs


@pytest.mark.slow
@pytest.mark.xdist_group("litellm")  # an in-process run over LiteLLM: on the worker that imported it
def test_show_reports_path_results_gates_usage_timings_and_files(tmp_path: Path, showcase: Any) -> None:
    _stub, loop = showcase
    store = tmp_path / "store"
    result = loopdsl.run(loop, store=store, workdir=tmp_path)
    assert result.status == "completed", result.state.error
    run_id = result.run_id

    text = _cli(["show", run_id[:5], "--store", str(store)], tmp_path)  # a unique prefix is enough
    assert text.returncode == 0, text.stderr
    out = text.stdout
    assert f"run {run_id}: completed" in out and "path: gather -> write -> done" in out
    assert "gather: ok" in out and "exit_code: 0" in out and "stdout: facts about owls" in out
    assert "gather after-gate has-facts: pass" in out
    assert "write #1 stubby: 20+10 tokens $0.000040" in out  # (20 x $1 + 10 x $2) / 1M
    assert "spent: 30 tokens, $0.000040, 2 steps" in out
    assert f"{_sha256(loop)[:16]}  {loop}" in out

    full = json.loads(_cli(["show", run_id, "--store", str(store), "--json"], tmp_path).stdout)
    run, events = full["run"], full["events"]
    assert run["path"] == ["gather", "write", "done"] and run["status"] == "completed"
    assert run["results"]["gather"]["exit_code"] == 0 and run["results"]["write"]["text"].startswith("write-says-")
    assert run["outputs"] == {"text": run["results"]["write"]["text"]}
    assert run["usage"]["write"]["tokens"] == 30 and run["usage"]["write"]["cost_usd"] == pytest.approx(4e-5)
    assert run["ledger"]["cost_usd"] == pytest.approx(4e-5) and run["ledger"]["steps"] == 2
    assert run["usage"]["gather"]["seconds"] > 0 and run["active_s"] > 0
    assert run["started_at"] <= run["ended_at"]
    assert run["meta"]["files"] == {str(loop): _sha256(loop)}
    gates = [e for e in events if e["type"] == "gate"]
    assert gates == [dict(gates[0], state="gather", phase="after", gate="has-facts", passed=True)]
    assert [e["usage"] for e in events if e["type"] == "llm"] == [{"prompt_tokens": 20, "completion_tokens": 10}]
    assert [e["seq"] for e in events] == sorted(e["seq"] for e in events) and all("t" in e for e in events)

    table = _cli(["runs", "--store", str(store)], tmp_path).stdout.splitlines()
    assert table[0].split() == ["ID", "LOOP", "STATUS", "STARTED", "SPENT"]
    assert table[1].split()[:3] == [run_id, "showcase", "completed"] and table[1].endswith("$0.000040")


@pytest.mark.xdist_group("litellm")  # an in-process run over LiteLLM: on the worker that imported it
def test_inputs_are_stored_secrets_never_and_the_store_is_private(tmp_path: Path, showcase: Any) -> None:
    _stub, loop = showcase
    store = tmp_path / "store"
    result = loopdsl.run(loop, inputs={"topic": "herons"}, store=store, workdir=tmp_path)
    assert result.status == "completed"
    record = RunStore(store).load(result.run_id)
    assert record["inputs"] == {"topic": "herons"}
    assert SECRET not in record["results"]["gather"]["stderr"] and "token=" in record["results"]["gather"]["stderr"]
    # Not in any byte of the store (database, WAL, marker), nor in what show prints.
    for path in store.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path
    assert SECRET not in _cli(["show", result.run_id, "--store", str(store), "--json"], tmp_path).stdout
    assert stat.S_IMODE(store.stat().st_mode) == 0o700
    assert stat.S_IMODE((store / "cache.db").stat().st_mode) == 0o600


@pytest.mark.slow
@pytest.mark.xdist_group("litellm")  # an in-process run over LiteLLM: on the worker that imported it
def test_cache_reuses_an_identical_response_across_runs_at_cost_zero(tmp_path: Path, showcase: Any) -> None:
    stub, loop = showcase
    store = tmp_path / "store"
    first = loopdsl.run(loop, store=store, workdir=tmp_path, cache=True)
    assert first.status == "completed" and len(stub.keys) == 1
    # A second process with --cache: no request reaches the provider (so no LiteLLM import either).
    second = _cli(["run", str(loop), "--store", str(store), "--cache", "--quiet"], tmp_path)
    assert second.returncode == 0, second.stderr
    assert len(stub.keys) == 1
    cached_id = RunStore(store).list_runs()[0]["run_id"]
    cached = RunStore(store).load(cached_id)
    assert cached["outputs"] == first.outputs and cached["ledger"]["cost_usd"] == 0
    shown = _cli(["show", cached_id, "--store", str(store)], tmp_path).stdout
    assert "write #1 stubby: 20+10 tokens $0.0000 cached" in shown
    # Without --cache the same call is paid again.
    third = loopdsl.run(loop, store=store, workdir=tmp_path)
    assert third.status == "completed" and len(stub.keys) == 2 and third.cost_usd == pytest.approx(4e-5)


# ----------------------------------------------------------------- run ids


def test_run_id_prefixes_resolve_or_are_refused_clearly(tmp_path: Path) -> None:
    store = tmp_path / "store"
    ids: list[str] = []
    while True:  # 36 possible first characters: a shared one turns up within 37 runs
        ids.append(loopdsl.run(DATA / "counter.yaml", store=store, workdir=tmp_path).run_id)
        firsts = [i[0] for i in ids]
        shared = next((c for c in firsts if firsts.count(c) > 1), None)
        if shared:
            break
    twins = sorted(i for i in ids if i[0] == shared)
    ambiguous = _cli(["show", shared, "--store", str(store)], tmp_path)
    assert ambiguous.returncode == 2
    assert f"run prefix '{shared}' is ambiguous: it matches {', '.join(twins)}" in ambiguous.stderr
    assert "type more characters" in ambiguous.stderr
    _no_traceback(ambiguous)
    unique = _cli(["show", twins[0][:7], "--store", str(store), "--json"], tmp_path)
    assert unique.returncode == 0 and json.loads(unique.stdout)["run"]["run_id"] == twins[0]
    unknown = _cli(["show", "nosuchid", "--store", str(store)], tmp_path)
    assert unknown.returncode == 2 and "no run matches 'nosuchid'" in unknown.stderr and "loopdsl runs" in unknown.stderr
    _no_traceback(unknown)


# ----------------------------------------------------------------- changed files, abort


def test_resume_against_a_changed_loop_is_refused_unless_forced(tmp_path: Path) -> None:
    loop = tmp_path / "approval.yaml"
    loop.write_text((DATA / "checkpoint.yaml").read_text())
    store = tmp_path / "store"
    run_id = loopdsl.run(loop, store=store, workdir=tmp_path).run_id
    decide(run_id, "approve", store=store, by="tester")
    loop.write_text(loop.read_text().replace('Ship {{ prepare.item }}?', 'Ship {{ prepare.item }} today?'))

    refused = _cli(["resume", run_id, "--store", str(store)], tmp_path)
    assert refused.returncode == 2
    _no_traceback(refused)
    assert f"changed since run {run_id} started: {loop}" in refused.stderr
    assert '-    checkpoint: {message: "Ship {{ prepare.item }}?"}' in refused.stderr
    assert '+    checkpoint: {message: "Ship {{ prepare.item }} today?"}' in refused.stderr
    assert "--force" in refused.stderr
    assert RunStore(store).load(run_id)["status"] == "waiting"  # untouched

    forced = _cli(["resume", run_id, "--store", str(store), "--force"], tmp_path)
    assert forced.returncode == 0, forced.stderr
    assert any(e["type"] == "resume" and e["forced"] for e in RunStore(store).events(run_id))


def test_a_run_whose_loop_file_is_gone_says_so_instead_of_offering_force(tmp_path: Path) -> None:
    loop = tmp_path / "checkpoint.yaml"
    shutil.copy(DATA / "checkpoint.yaml", loop)
    store = tmp_path / "store"
    run_id = loopdsl.run(loop, store=store, workdir=tmp_path).run_id
    loop.rename(tmp_path / "moved.yaml")
    for args in (["resume", run_id], ["resume", run_id, "--force"]):
        done = _cli([*args, "--store", str(store)], tmp_path)
        assert done.returncode == 2, done.stderr
        _no_traceback(done)
        assert f"run {run_id}'s loop file {loop} is gone (moved or deleted)" in done.stderr, done.stderr
        assert "--force" not in done.stderr  # a whole-file deletion diff and a --force that failed next


def test_abort_ends_a_run_for_good(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = tmp_path / "store"
    run_id = loopdsl.run(DATA / "checkpoint.yaml", store=store, workdir=tmp_path).run_id
    token = "ghp_" + "Ab3dE" * 8  # pasted by mistake: a credential of the aborting process stays out of the store
    monkeypatch.setenv("GITHUB_TOKEN", token)
    done = _cli(["abort", run_id, "--store", str(store), "--reason", f"superseded {token}"], tmp_path)
    assert done.returncode == 0 and f"run {run_id}: aborted" in done.stdout
    record = RunStore(store).load(run_id)
    assert record["status"] == "aborted" and record["ended_at"]
    assert record["error"]["kind"] == "aborted"
    assert record["error"]["message"].startswith("aborted with `loopdsl abort`: superseded "), record["error"]
    assert RunStore(store).events(run_id)[-1]["reason"].startswith("superseded ")
    assert RunStore(store).events(run_id)[-1] == dict(RunStore(store).events(run_id)[-1], type="end", status="aborted")
    assert not [f for f in store.rglob("*") if f.is_file() and token[:8].encode() in f.read_bytes()]
    for args in (["resume", run_id], ["abort", run_id], ["approve", run_id]):
        again = _cli([*args, "--store", str(store)], tmp_path)
        assert again.returncode == 2, args
        _no_traceback(again)
        assert "aborted" in again.stderr


# ----------------------------------------------------------------- locks


def test_a_second_process_cannot_advance_a_run_in_use(tmp_path: Path) -> None:
    marks, store = tmp_path / "marks", tmp_path / "store"
    marks.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-m", "loopdsl", "run", str(DATA / "sleeper.yaml"), "--store", str(store),
         "--input", f"marks={marks}", "--input", "seconds=30", "--quiet"],
        cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ct.wait_until(lambda: ct.markers(marks, "nap") == 1, holder, what="the shell state started")
        run_id = RunStore(store).list_runs()[0]["run_id"]
        for args in (["resume", run_id], ["abort", run_id]):
            refused = _cli_process([*args, "--store", str(store)], tmp_path)
            assert refused.returncode == 2, args
            _no_traceback(refused)
            assert f"run {run_id} is in use by process {holder.pid} on host" in refused.stderr
            assert "expires within 15 s" in refused.stderr
        assert RunStore(store).load(run_id)["status"] == "running"
        assert ct.markers(marks, "nap") == 1  # nothing ran a second time
    finally:
        ct.kill(holder)


_HOLD_LOCK = textwrap.dedent("""\
    import sys, time
    from loopdsl.adapters.store.run_store import RunStore
    store = RunStore(sys.argv[1])
    store.lock("the-run", ttl=float(sys.argv[2]))
    print("held", flush=True)
    time.sleep(120)
""")


@pytest.mark.slow  # mostly a wait: started early, beside tests that compute
def test_a_killed_holders_lock_is_kept_alive_by_heartbeat_and_expires_soon_after(tmp_path: Path) -> None:
    store_dir, ttl = tmp_path / "store", 1.0
    RunStore(store_dir).close()
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_LOCK, str(store_dir), str(ttl)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    store = RunStore(store_dir)
    time.sleep(ttl * 2.5)  # well past one TTL: only the heartbeat keeps it held
    with pytest.raises(RunLocked, match=f"in use by process {holder.pid}"):
        store.lock("the-run")
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    killed_at = time.monotonic()
    store.lock("the-run", wait=ttl + 3).release()
    assert time.monotonic() - killed_at <= ttl + 1.0
    store.close()


# ----------------------------------------------------------------- concurrency groups


def _group_loop(tmp_path: Path, on_conflict: str) -> Path:
    path = tmp_path / f"group-{on_conflict}.yaml"
    path.write_text((DATA / "group.yaml").read_text().replace("on_conflict: fail", f"on_conflict: {on_conflict}"))
    return path


def test_concurrency_group_skip_and_fail_while_another_run_is_active(tmp_path: Path) -> None:
    store = tmp_path / "store"
    first = loopdsl.run(_group_loop(tmp_path, "fail"), store=store, workdir=tmp_path)
    assert first.status == "waiting"
    with pytest.raises(RunConflict) as failed:
        loopdsl.run(_group_loop(tmp_path, "fail"), store=store, workdir=tmp_path)
    assert not failed.value.skipped and f"run(s) {first.run_id} of group 'nightly' still active" in failed.value.message
    with pytest.raises(RunConflict) as skipped:
        loopdsl.run(_group_loop(tmp_path, "skip"), store=store, workdir=tmp_path)
    assert skipped.value.skipped and skipped.value.message.startswith("skipped:")
    assert [r["run_id"] for r in RunStore(store).list_runs()] == [first.run_id]  # neither was created
    # Once the first run has ended, the group is free again.
    abort(first.run_id, store=store)
    assert loopdsl.run(_group_loop(tmp_path, "fail"), store=store, workdir=tmp_path).status == "waiting"


@pytest.mark.slow  # mostly a wait: started early, beside tests that compute
def test_concurrency_group_wait_starts_when_the_active_run_ends(tmp_path: Path) -> None:
    store = tmp_path / "store"
    first = loopdsl.run(_group_loop(tmp_path, "wait"), store=store, workdir=tmp_path)
    waiter = subprocess.Popen([sys.executable, "-m", "loopdsl", "run", str(_group_loop(tmp_path, "wait")),
                               "--store", str(store), "--quiet"], cwd=tmp_path, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(2.0)
        assert waiter.poll() is None and len(RunStore(store).list_runs()) == 1  # still waiting its turn
        abort(first.run_id, store=store)
        _out, err = waiter.communicate(timeout=30)
    finally:
        ct.kill(waiter)
    assert waiter.returncode == 4, err  # it ran, and now waits at its own checkpoint
    second = RunStore(store).list_runs()[0]
    assert second["run_id"] != first.run_id and second["status"] == "waiting"
    # It began only after the first run ended (its record's `started_at` is when it began waiting its turn).
    assert RunStore(store).events(second["run_id"])[0]["t"] > RunStore(store).load(first.run_id)["ended_at"]


# ----------------------------------------------------------------- bad store input


_SQLITE_FILES = ("cache.db", "cache.db-wal", "cache.db-shm")


def _snapshot(directory: Path, healthy: bool) -> dict[str, Any]:
    """Every file and its sha256; for a healthy store, SQLite's own files by what they hold
    (closing a connection checkpoints the WAL into cache.db: same data, other bytes)."""
    files = {str(p.relative_to(directory)): (_sha256(p) if p.is_file() else "dir") for p in sorted(directory.rglob("*"))}
    if not healthy:
        return files
    with RunStore(directory) as store:
        runs = store.list_runs()
        held = {r["run_id"]: (store.load(r["run_id"]), store.events(r["run_id"])) for r in runs}
    return {"files": {k: v for k, v in files.items() if k not in _SQLITE_FILES}, "runs": held}


def _corrupted(tmp_path: Path) -> Path:
    store = tmp_path / "store"
    loopdsl.run(DATA / "counter.yaml", store=store, workdir=tmp_path)
    for extra in ("cache.db-wal", "cache.db-shm"):
        (store / extra).unlink(missing_ok=True)
    (store / "cache.db").write_bytes(b"this is not an SQLite database at all " * 100)
    return store


def _foreign(tmp_path: Path) -> Path:
    store = tmp_path / "photos"
    store.mkdir()
    (store / "holiday.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    (store / "notes").mkdir()
    (store / "notes" / "todo.txt").write_text("buy film\n")
    return store


def _newer(tmp_path: Path) -> Path:
    store = tmp_path / "store"
    loopdsl.run(DATA / "counter.yaml", store=store, workdir=tmp_path)
    (store / "loopdsl-store.json").write_text(json.dumps({"format": 99, "tool": "loopdsl"}) + "\n")
    return store


def _fine(tmp_path: Path) -> Path:
    store = tmp_path / "store"
    loopdsl.run(DATA / "counter.yaml", store=store, workdir=tmp_path)
    return store


BAD_STORES = {
    "corrupted database": (_corrupted, ["runs"], "is unreadable"),
    "foreign directory": (_foreign, ["runs"], "is not empty and is not a loopdsl run store"),
    "newer format": (_newer, ["runs"], "written by a newer loopdsl (store format 99"),
    "unknown run id": (_fine, ["show", "zz9plural"], "no run matches 'zz9plural'"),
}


@pytest.mark.parametrize("case", list(BAD_STORES))
def test_bad_store_input_is_a_clear_error_and_deletes_nothing(tmp_path: Path, case: str) -> None:
    make, args, message = BAD_STORES[case]
    store = make(tmp_path)
    healthy = case == "unknown run id"
    before = _snapshot(store, healthy)
    for command in (args, ["resume", "zz9plural"], ["abort", "zz9plural"]):
        done = _cli([*command, "--store", str(store)], tmp_path)
        assert done.returncode == 2, (command, done.stderr)
        _no_traceback(done)
        if command is args:
            assert message in done.stderr
            assert "hint:" in done.stderr
    assert _snapshot(store, healthy) == before


# ----------------------------------------------------------------- loop text reaching the store


def test_a_folded_block_scalar_reaches_the_shell_as_written(tmp_path: Path) -> None:
    # Regression: the loader once kept ruamel's internal fold marker (\a) at each fold.
    loop = tmp_path / "folded.yaml"
    loop.write_text("loopdsl: 1\nname: folded\nstart: say\nstates:\n  say:\n    shell: >-\n      echo one\n      two\n"
                    "    next: done\n  done: {end: completed, output: {said: \"{{ say.stdout | trim }}\"}}\n")
    result = loopdsl.run(loop, store=tmp_path / "store", workdir=tmp_path)
    assert result.outputs == {"said": "one two"}
