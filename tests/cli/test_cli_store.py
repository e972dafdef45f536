"""The store commands at the command line: exit codes, messages, the `runs` table.

Every mistake is a `loopdsl: error:` line with a hint and exit 2, never a traceback.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cli_in_process import cli_in_process

import loopdsl
from loopdsl.api.durable import abort
from loopdsl.adapters.store.run_store import RunStore
from cli_forked import loopdsl_command

DATA = Path(__file__).parents[1] / "data" / "durable"
ROOT = Path(__file__).resolve().parents[2]


def _cli(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """In-process (tests/cli_in_process.py): the same exit codes and output, no Python start."""
    return cli_in_process(args, cwd, env)


def _process(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """A real `python -m loopdsl` subprocess."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("LOOPDSL_")}
    environ.update(env)
    return subprocess.run([*loopdsl_command(), *args], check=False, cwd=cwd, env=environ, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=60)


def _user_error(done: subprocess.CompletedProcess[str], *fragments: str, hint: bool = True) -> None:
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    lines = done.stderr.splitlines()
    assert lines[0].startswith("loopdsl: error: "), done.stderr
    assert not hint or any(line.startswith("  hint: ") for line in lines[1:]), done.stderr
    for fragment in fragments:
        assert fragment in done.stderr


def test_runs_table_lists_id_loop_status_started_spent_newest_first(tmp_path: Path) -> None:
    store = tmp_path / "store"
    empty = _cli(["runs", "--store", str(store)], tmp_path)
    assert empty.returncode == 0 and empty.stdout.split() == ["ID", "LOOP", "STATUS", "STARTED", "SPENT"]

    done = loopdsl.run(DATA / "counter.yaml", store=store, workdir=tmp_path)
    waiting = loopdsl.run(DATA / "checkpoint.yaml", store=store, workdir=tmp_path)
    aborted = loopdsl.run(DATA / "checkpoint.yaml", store=store, workdir=tmp_path)
    abort(aborted.run_id, store=store)

    # LOOPDSL_STORE picks the store when --store is not given.
    table = _cli(["runs"], tmp_path, LOOPDSL_STORE=str(store))
    assert table.returncode == 0, table.stderr
    header, *rows = table.stdout.splitlines()
    assert header.split() == ["ID", "LOOP", "STATUS", "STARTED", "SPENT"]
    cells = [row.split() for row in rows]
    assert [(c[0], c[1], c[2]) for c in cells] == [
        (aborted.run_id, "approval", "aborted"), (waiting.run_id, "approval", "waiting"), (done.run_id, "counter", "completed"),
    ]
    started = RunStore(store).load(done.run_id)["started_at"][:19].replace("T", " ")
    assert rows[-1].split(None, 3)[3].startswith(started) and rows[-1].endswith("$0.0000")
    # The columns line up under the header.
    assert all(row.index(status) == header.index("STATUS") for row, status in zip(rows, ("aborted", "waiting", "completed")))

    listed = json.loads(_cli(["runs", "--store", str(store), "--json"], tmp_path).stdout)
    assert [r["run_id"] for r in listed] == [aborted.run_id, waiting.run_id, done.run_id]
    assert set(listed[0]) == {"run_id", "loop", "status", "interrupted", "started_at", "ended_at", "ledger"}


@pytest.mark.parametrize("command", [["show"], ["resume"], ["approve"], ["reject"], ["decide", None, "ship"], ["abort"]])
def test_commands_on_an_unknown_run_say_so(tmp_path: Path, command: list[str | None]) -> None:
    store = tmp_path / "store"
    loopdsl.run(DATA / "counter.yaml", store=store, workdir=tmp_path)
    args = [c if c is not None else "nosuch" for c in command] if None in command else [*command, "nosuch"]
    run = _process if command == ["show"] else _cli  # one real process; the rest in-process
    _user_error(run([*args, "--store", str(store)], tmp_path), "no run matches 'nosuch'", "loopdsl runs")


def test_commands_that_do_not_fit_the_runs_state_are_refused(tmp_path: Path) -> None:
    store = tmp_path / "store"
    done = loopdsl.run(DATA / "counter.yaml", store=store, workdir=tmp_path).run_id
    _user_error(_cli(["resume", done, "--store", str(store)], tmp_path),
                f"run {done} already ended with status completed", f"loopdsl show {done}")
    _user_error(_cli(["decide", done, "ship", "--store", str(store)], tmp_path),
                f"run {done} is not waiting for a decision (status: completed)", hint=False)
    _user_error(_cli(["abort", done, "--store", str(store)], tmp_path), "already ended with status completed", hint=False)


def test_clean_outside_a_repository_and_a_store_path_that_is_a_file(tmp_path: Path) -> None:
    outside = tmp_path / "plain"
    outside.mkdir()
    _user_error(_cli(["clean", "--store", str(tmp_path / "store")], outside), "not inside a git repository")
    a_file = tmp_path / "afile"
    a_file.write_text("not a store\n")
    done = _cli(["runs", "--store", str(a_file)], tmp_path)
    assert done.returncode == 2 and "is a file" in done.stderr and "Traceback" not in done.stderr
    assert a_file.read_text() == "not a store\n"


def test_concurrency_conflicts_exit_0_when_skipped_and_1_when_failed(tmp_path: Path) -> None:
    store = tmp_path / "store"
    group = DATA / "group.yaml"
    first = loopdsl.run(group, store=store, workdir=tmp_path)
    failed = _process(["run", str(group), "--store", str(store)], tmp_path)
    assert failed.returncode == 1
    assert f"loopdsl: run(s) {first.run_id} of group 'nightly' still active" in failed.stderr
    skip = tmp_path / "skip.yaml"
    skip.write_text(group.read_text().replace("on_conflict: fail", "on_conflict: skip"))
    skipped = _process(["run", str(skip), "--store", str(store)], tmp_path)
    assert skipped.returncode == 0 and "loopdsl: skipped: run(s)" in skipped.stderr
    assert "Traceback" not in failed.stderr + skipped.stderr
    assert len(RunStore(store).list_runs()) == 1


# --------------------------------------------------------------------------- damaged records

WRONG_SHAPES = [
    ["not", "an", "object"],
    {"status": "running"},
    {"loop": "counter", "status": 5},
    {"loop": "counter", "status": "running", "visits": "abc"},
    {"loop": "counter", "status": "completed", "results": {"count": 3}},
    {"loop": "counter", "status": "running", "ledger": {"outstanding": 5}},
    {"loop": "counter", "status": "waiting", "path": [1, 2], "waiting": {"state": []}},
    # Each of these once passed the check and crashed `show`, `resume` or a decision (a fuzz
    # of every field of a real record with hostile values found them).
    {"loop": "counter", "status": "waiting", "waiting": {"state": "one", "choices": True}},
    {"loop": "counter", "status": "waiting", "waiting": {"state": "one", "timeout_s": "x"}},
    {"loop": "counter", "status": "waiting", "waiting": {"message": "at no state"}},
    {"loop": "counter", "status": "running", "meta": {"loop_path": "counter.yaml", "files": {"counter.yaml": None}}},
    {"loop": "counter", "status": "running", "meta": {"loop_path": "counter.yaml", "workdir": 5}},
    {"loop": "counter", "status": "completed", "usage": {"one": {"tokens": "x"}}},
    {"loop": "counter", "status": "running", "ledger": {"tokens": -1}},
    {"loop": "counter", "status": "waiting", "waiting": {"state": "one", "since": "2026-01-01T00:00:00", "timeout_s": 5}},
    {"loop": "counter", "status": "waiting", "waiting": {"state": "one"}, "decision": {"decision": "approve", "at": "soon"}},
]


@pytest.mark.slow
@pytest.mark.parametrize("shape", WRONG_SHAPES, ids=[str(i) for i in range(len(WRONG_SHAPES))])
def test_a_record_of_the_wrong_shape_is_named_and_does_not_hide_the_others(tmp_path: Path, shape: object) -> None:
    store = tmp_path / "store"
    good = loopdsl.run(DATA / "counter.yaml", store=store, workdir=tmp_path)
    bad = loopdsl.run(DATA / "counter.yaml", store=store, workdir=tmp_path)
    with RunStore(store) as opened:  # valid JSON, written the way another tool would
        opened._cache.set(f"run/{bad.run_id}/record", shape)
    # The first shape goes through real `python -m loopdsl` processes; the others in-process
    # (7 commands per shape: the process start was most of this test's cost).
    run = _process if shape is WRONG_SHAPES[0] else _cli

    for command in (["show", bad.run_id], ["show", bad.run_id, "--json"], ["resume", bad.run_id], ["abort", bad.run_id]):
        _user_error(run([*command, "--store", str(store)], tmp_path), f"run {bad.run_id}", str(store), "damaged")

    table = run(["runs", "--store", str(store)], tmp_path)
    assert table.returncode == 0, table.stderr
    rows = {row.split()[0]: row.split()[2] for row in table.stdout.splitlines()[1:]}
    assert rows == {good.run_id: "completed", bad.run_id: "damaged"}
    assert f"run {bad.run_id} in {store} is damaged" in table.stderr
    listed = json.loads(run(["runs", "--store", str(store), "--json"], tmp_path).stdout)
    assert [(r["run_id"], r["status"]) for r in listed] == [(bad.run_id, "damaged"), (good.run_id, "completed")]
    assert run(["show", good.run_id, "--store", str(store)], tmp_path).returncode == 0


def test_a_record_at_a_state_its_loop_does_not_have_is_refused_by_resume(tmp_path: Path) -> None:
    store = tmp_path / "store"
    waiting = loopdsl.run(DATA / "checkpoint.yaml", store=store, workdir=tmp_path)
    with RunStore(store) as opened:
        record = opened.load_run(waiting.run_id)
        opened._cache.set(f"run/{waiting.run_id}/record", {**record, "current": "gone", "waiting": {
            **record["waiting"], "state": "gone"}})
    _user_error(_cli(["resume", waiting.run_id, "--store", str(store)], tmp_path), "at state 'gone'", "does not have")
    # A decision is only recorded (it reads no loop file); the resume it asks for refuses too.
    assert _cli(["approve", waiting.run_id, "--store", str(store)], tmp_path).returncode == 0
    _user_error(_cli(["resume", waiting.run_id, "--store", str(store)], tmp_path), "at state 'gone'", "does not have")
    assert RunStore(store).load_run(waiting.run_id)["status"] == "waiting"  # the run did not move


@pytest.mark.parametrize("since", ["not-a-date", "2026-01-01T00:00:00", "2026-02-30T00:00:00+00:00"])
def test_a_decision_on_a_checkpoint_whose_start_is_not_a_time_is_refused(tmp_path: Path, since: str) -> None:
    """A checkpoint with a `timeout` compares its stored `since` with now: a value that is not
    an ISO time with a zone crashed `approve` (and the UI's decision) with an internal error."""
    loop = tmp_path / "ask.yaml"
    loop.write_text("loopdsl: 1\nname: ask\nstart: ask\nstates:\n"
                    "  ask: {checkpoint: {message: Ship?, timeout: 1h}, next: done}\n  done: {end: completed}\n")
    store = tmp_path / "store"
    waiting = loopdsl.run(loop, store=store, workdir=tmp_path)
    with RunStore(store) as opened:
        record = opened.load_run(waiting.run_id)
        opened._cache.set(f"run/{waiting.run_id}/record", {**record, "waiting": {**record["waiting"], "since": since}})
    for command in (["approve", waiting.run_id], ["resume", waiting.run_id]):
        _user_error(_cli([*command, "--store", str(store)], tmp_path), "damaged", "'waiting.since' is not an ISO 8601 time")


def test_a_set_value_that_is_not_json_fails_the_state_and_ends_the_run(tmp_path: Path) -> None:
    loop = tmp_path / "loop.yaml"
    loop.write_text("loopdsl: 1\nname: setter\ndescription: sets a method\nbudget: {steps: 5}\nstart: a\n"
                    "states:\n  a:\n    set: {x: \"feedback.upper\", b: \"budget\"}\n    next: done\n"
                    "  done: {end: completed}\n")
    assert _cli(["lint", str(loop)], tmp_path).returncode == 0
    store = tmp_path / "store"
    done = _cli(["run", str(loop), "--store", str(store)], tmp_path)
    assert done.returncode == 1, done.stderr
    assert "set x: a builtin_function_or_method is not a JSON value" in done.stdout + done.stderr
    (record,) = RunStore(store).list_runs()
    assert record["status"] == "failed" and record["error"]["kind"] == "parse"
    # A mapping view (`budget`) is stored as its plain JSON value.
    loop.write_text(loop.read_text().replace('x: "feedback.upper", ', ""))
    again = _cli(["run", str(loop), "--store", str(store)], tmp_path)
    assert again.returncode == 0, again.stderr
    assert set(RunStore(store).list_runs()[0]["results"]["a"]["b"]) == {"spent", "remaining"}


@pytest.fixture
def read_only_store(tmp_path: Path):
    """A real store (a waiting run and a completed one) seen through a read-only bind mount:
    the only way to deny writes to root, which CI runs as. Skipped where mounting is not allowed."""
    source, mounted = tmp_path / "store", tmp_path / "mounted"
    waiting = loopdsl.run(DATA / "checkpoint.yaml", store=source, workdir=tmp_path)
    done = loopdsl.run(DATA / "counter.yaml", store=source, workdir=tmp_path)
    mounted.mkdir()
    if subprocess.run(["mount", "--bind", str(source), str(mounted)], capture_output=True).returncode != 0:
        pytest.skip("bind mounts are not allowed here (needs root in a privileged enough container)")
    try:
        remount = subprocess.run(["mount", "-o", "remount,bind,ro", str(mounted)], capture_output=True)
        if remount.returncode != 0:
            pytest.skip("a read-only remount is not allowed here")
        yield mounted, waiting.run_id, done.run_id
    finally:
        subprocess.run(["umount", str(mounted)], capture_output=True)


def test_runs_and_show_read_a_store_this_process_may_not_write(tmp_path: Path, read_only_store) -> None:
    store, waiting, done = read_only_store
    assert not os.access(store, os.W_OK)
    before = sorted((p.name, p.stat().st_size) for p in store.iterdir())
    table = _cli(["runs", "--store", str(store)], tmp_path)
    assert table.returncode == 0, table.stderr
    assert {row.split()[0]: row.split()[2] for row in table.stdout.splitlines()[1:]} == {waiting: "waiting", done: "completed"}
    shown = _cli(["show", waiting, "--store", str(store)], tmp_path)
    assert shown.returncode == 0 and "waiting at 'ask'" in shown.stdout, shown.stderr
    assert str(store) in _cli(["show", "nosuchrun", "--store", str(store)], tmp_path).stderr  # the user's path, not a copy's
    assert sorted((p.name, p.stat().st_size) for p in store.iterdir()) == before
    refused = _cli(["approve", waiting, "--store", str(store)], tmp_path)  # a decision must write: it says why
    _user_error(refused, "Read-only file system")


def test_a_copied_store_leaves_its_symbolic_links_behind(tmp_path: Path) -> None:
    """A store read from a copy (a read-only one, a CI artifact the apply job must not trust)
    is copied without its symbolic links: a hostile store whose database is a link to another
    store's must not show that store's runs."""
    from loopdsl.adapters.store.disk import DB_NAME
    from loopdsl.api.store_access import store_copy

    other, hostile = tmp_path / "other", tmp_path / "hostile"
    elsewhere = loopdsl.run(DATA / "counter.yaml", store=other, workdir=tmp_path)
    loopdsl.run(DATA / "counter.yaml", store=hostile, workdir=tmp_path)
    (hostile / DB_NAME).unlink()
    (hostile / DB_NAME).symlink_to(other / DB_NAME)
    with RunStore(hostile) as direct:
        assert elsewhere.run_id in {r["run_id"] for r in direct.list_runs()}  # what a link-following copy shows
    with store_copy(hostile) as copied:
        assert copied.directory == hostile
        assert elsewhere.run_id not in {r["run_id"] for r in copied.list_runs()}


def test_a_credential_pasted_in_a_decision_comment_is_not_stored(tmp_path: Path) -> None:
    """The approving process read no loop's secrets, but knows its own environment's credentials."""
    store = tmp_path / "store"
    waiting = loopdsl.run(DATA / "checkpoint.yaml", store=store, workdir=tmp_path)
    done = _cli(["approve", waiting.run_id, "--store", str(store), "--comment", "use ghp_TOKEN_OF_THE_JOB_123 ok"],
                tmp_path, GH_TOKEN="ghp_TOKEN_OF_THE_JOB_123")
    assert done.returncode == 0, done.stderr
    decision = RunStore(store).load_run(waiting.run_id)["decision"]
    assert decision["comment"] == "use *** ok"


def test_a_bad_reply_script_records_no_run(tmp_path: Path) -> None:
    """The run was recorded before its script was read: a bad script left it `running` for good."""
    (tmp_path / "replies.yaml").write_text("- not\n- a mapping\n")
    store = tmp_path / "store"
    done = _cli(["run", str(DATA / "counter.yaml"), "--store", str(store), "--script", str(tmp_path / "replies.yaml")],
                tmp_path)
    assert done.returncode == 2, done.stderr
    assert not store.exists() or RunStore(store).list_runs() == []


def test_resume_from_another_folder_finds_the_runs_own_loop_file(tmp_path: Path) -> None:
    """The loop file was recorded as given (relative): a resume from another folder called it
    changed, and `--force` then ran the namesake loop of that folder."""
    first, other = tmp_path / "first", tmp_path / "other"
    first.mkdir()
    other.mkdir()
    (first / "ask.yaml").write_text((DATA / "checkpoint.yaml").read_text())
    (other / "ask.yaml").write_text((DATA / "checkpoint.yaml").read_text().replace("name:", "# a namesake\nname:"))
    store = tmp_path / "store"
    started = _cli(["run", "ask.yaml", "--store", str(store)], first)
    assert started.returncode == 4, started.stderr
    run_id = RunStore(store).list_runs()[0]["run_id"]
    assert _cli(["approve", run_id, "--store", str(store)], other).returncode == 0
    resumed = _cli(["resume", run_id, "--store", str(store)], other)
    assert resumed.returncode == 0 and "changed" not in resumed.stderr, resumed.stderr


def test_a_deleted_working_folder_and_an_unwritable_init_are_user_errors(tmp_path: Path) -> None:
    """Both were internal errors (FileNotFoundError, OSError), exit 3."""
    gone = tmp_path / "gone"
    gone.mkdir()
    script = ("import os, sys; os.chdir(sys.argv[1]); os.rmdir(sys.argv[1]); from loopdsl.cli import main; "
              "sys.argv = ['loopdsl', 'runs']; main()")
    done = subprocess.run([sys.executable, "-c", script, str(gone)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "the current folder no longer exists" in done.stderr, done.stderr
    init = _process(["init", "/proc/1/newproj", "-p", "daily-triage", "--pip-spec", "loopdsl==0.1.0"], tmp_path)
    assert init.returncode == 2 and "cannot write in /proc/1/newproj" in init.stderr, init.stderr


def test_a_deciders_name_is_one_visible_line_and_the_resume_hint_names_the_store(tmp_path: Path) -> None:
    """LOOPDSL_USER with a line break forged a line of `approve`'s output (and was stored so);
    the hint after a decision left out `--store`, and its `resume` then found no store."""
    store = tmp_path / "my store"
    waiting = loopdsl.run(DATA / "checkpoint.yaml", store=store, workdir=tmp_path)
    done = _cli(["approve", waiting.run_id, "--store", str(store)], tmp_path,
                LOOPDSL_USER="mallory\nrun X: recorded \u202eevil")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2 and "by mallory run X: recorded \\u202eevil at" in lines[0]
    assert lines[1] == f"continue with: loopdsl resume {waiting.run_id} --store '{store}'"
    assert RunStore(store).load_run(waiting.run_id)["decision"]["by"] == "mallory run X: recorded \\u202eevil"


def test_options_that_did_nothing_now_act_or_say_so(tmp_path: Path) -> None:
    """`test -o FILE` without `--format junit` and `schedule -o FILE` without `--export` wrote
    nothing and said nothing; `run --dry-run` took inputs a run refuses."""
    project = tmp_path / "project"
    shutil.copytree(Path(__file__).parents[1] / "data" / "project" / "looptest", project)
    report = tmp_path / "junit.xml"
    tested = _cli(["test", str(project), "-o", str(report)], tmp_path)
    assert tested.returncode == 1 and report.read_text().startswith("<?xml"), tested.stderr
    scheduled = _cli(["schedule", str(ROOT / "loops" / "daily-triage.yaml"), "-o", str(tmp_path / "out.txt")], tmp_path)
    assert scheduled.returncode == 2 and "go with --export" in scheduled.stderr
    dry = _cli(["run", str(DATA / "counter.yaml"), "--dry-run", "-i", "no_such_input=1"], tmp_path)
    assert dry.returncode == 2 and "no_such_input" in dry.stderr, dry.stderr
    twice = _cli(["run", str(DATA / "counter.yaml"), "--dry-run", "-i", "n=1", "-i", "n=2"], tmp_path)  # the last won
    assert twice.returncode == 2 and "'n' is given twice" in twice.stderr, twice.stderr


def test_no_store_beside_store_and_a_run_kept_in_memory_are_said(tmp_path: Path) -> None:
    """`--no-store` silently won over `--store`; a run kept in memory printed `approve` and
    `resume` lines that could never work."""
    both = _cli(["run", str(DATA / "counter.yaml"), "--store", str(tmp_path / "s"), "--no-store"], tmp_path)
    assert both.returncode == 2 and "--store and --no-store together" in both.stderr
    memory = _cli(["run", str(DATA / "checkpoint.yaml"), "--no-store"], tmp_path)
    assert memory.returncode == 4 and "kept in memory only" in memory.stdout + memory.stderr
    assert "loopdsl approve mem-" not in memory.stdout + memory.stderr
