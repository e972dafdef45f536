"""The run store on a real diskcache directory, with real processes for crashes and locks."""
from __future__ import annotations

import hashlib
import json
import os
import pickle
import random
import signal
import sqlite3
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from loopdsl.adapters.store.run_store import (
    FORMAT_VERSION,
    MARKER_NAME,
    RunLocked,
    RunStore,
    default_store_dir,
)
from loopdsl.runtime.actions.llm import request_key
from loopdsl.adapters.store.disk import database_error
from loopdsl.runtime.errors import StoreError


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def store(store_dir: Path):
    with RunStore(store_dir) as s:
        yield s


def _tree_snapshot(directory: Path) -> dict[str, str]:
    """Every file under `directory` with the sha256 of its bytes."""
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def _spawn(code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


# ------------------------------------------------------------------ layout and safety


def test_new_store_layout_and_modes(store: RunStore, store_dir: Path) -> None:
    run_id = store.new_run_id()
    store.create_run(run_id, {"status": "running"})
    assert stat.S_IMODE(os.stat(store_dir).st_mode) == 0o700
    assert (store_dir / ".gitignore").read_text() == "*\n"
    assert json.loads((store_dir / MARKER_NAME).read_text()) == {
        "format": FORMAT_VERSION,
        "tool": "loopdsl",
    }
    sqlite_files = [p for p in store_dir.iterdir() if p.name.startswith("cache.db")]
    assert any(p.name == "cache.db-wal" for p in sqlite_files)  # WAL mode is on
    for path in sqlite_files:
        assert stat.S_IMODE(os.stat(path).st_mode) & 0o077 == 0, path


def test_sqlite_settings_never_evict_and_survive_process_death(store: RunStore, store_dir: Path) -> None:
    con = sqlite3.connect(store_dir / "cache.db")
    settings = dict(con.execute("SELECT key, value FROM Settings").fetchall())
    (journal,) = con.execute("PRAGMA journal_mode").fetchone()
    con.close()
    assert settings["eviction_policy"] == "none"
    assert settings["sqlite_synchronous"] == 1
    assert journal == "wal"


def test_nothing_is_evicted_past_the_size_limit(store: RunStore) -> None:
    store._cache.reset("size_limit", 4096)  # far below what we write next
    run_id = store.new_run_id()
    store.create_run(run_id, {"n_events": 0})
    blob = "x" * 2000
    for n in range(1, 101):
        store.commit(run_id, {"n_events": n}, [{"n": n, "blob": blob}])
        store.put_response(f"k{n}", {"text": blob})
    assert [e["n"] for e in store.events(run_id)] == list(range(1, 101))
    assert all(store.get_response(f"k{n}") == {"text": blob} for n in range(1, 101))
    assert store.load(run_id)["n_events"] == 100


def test_reopen_keeps_everything(store_dir: Path) -> None:
    with RunStore(store_dir) as first:
        first.create_run("abc12345", {"status": "running", "n_events": 0})
        first.commit("abc12345", {"status": "completed", "n_events": 2}, [{"a": 1}, {"b": 2}])
    with RunStore(store_dir) as second:
        record = second.load("abc12345")
        assert record["status"] == "completed" and "updated_at" in record
        assert second.events("abc12345") == [{"a": 1}, {"b": 2}]


def test_foreign_directory_is_refused_and_untouched(tmp_path: Path) -> None:
    foreign = tmp_path / "photos"
    foreign.mkdir()
    (foreign / "cat.jpg").write_bytes(b"\xff\xd8meow")
    before = _tree_snapshot(foreign)
    with pytest.raises(StoreError) as info:
        RunStore(foreign)
    assert "not a loopdsl run store" in info.value.message
    assert "LOOPDSL_STORE" in info.value.hint
    assert _tree_snapshot(foreign) == before
    assert sorted(p.name for p in foreign.iterdir()) == ["cat.jpg"]


def test_empty_existing_directory_becomes_a_store(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir(mode=0o755)
    with RunStore(empty) as s:
        s.create_run("r1", {})
    assert stat.S_IMODE(os.stat(empty).st_mode) == 0o700


def test_newer_format_is_refused_and_untouched(store_dir: Path) -> None:
    with RunStore(store_dir) as s:
        s.create_run("r1", {"status": "running"})
    (store_dir / MARKER_NAME).write_text(json.dumps({"format": FORMAT_VERSION + 1, "tool": "loopdsl"}))
    before = _tree_snapshot(store_dir)
    with pytest.raises(StoreError) as info:
        RunStore(store_dir)
    assert "newer loopdsl" in info.value.message
    assert "upgrade" in info.value.hint
    assert _tree_snapshot(store_dir) == before


def test_corrupted_database_is_refused_and_untouched(store_dir: Path) -> None:
    with RunStore(store_dir) as s:
        s.create_run("r1", {"status": "running"})
    for extra in ("cache.db-wal", "cache.db-shm"):
        (store_dir / extra).unlink(missing_ok=True)
    garbage = bytes(random.Random(7).getrandbits(8) for _ in range(8192))
    (store_dir / "cache.db").write_bytes(garbage)
    with pytest.raises(StoreError) as info:
        RunStore(store_dir)
    assert "unreadable" in info.value.message
    assert "move the store directory aside" in info.value.hint
    assert (store_dir / "cache.db").read_bytes() == garbage


def test_planted_pickle_is_refused_not_unpickled(store: RunStore, store_dir: Path, tmp_path: Path) -> None:
    store.create_run("victim", {"status": "running"})
    canary = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self):  # unpickling this would create the canary file
            return (Path.touch, (canary,))

    con = sqlite3.connect(store_dir / "cache.db")
    con.execute(
        "UPDATE Cache SET mode = 4, value = ? WHERE key = ?",
        (pickle.dumps(Exploit()), "run/victim/record"),
    )
    con.commit()
    con.close()
    with pytest.raises(StoreError) as info:
        store.load("victim")
    assert "not JSON" in info.value.message
    assert not canary.exists()


def test_values_are_stored_as_json_text(store: RunStore, store_dir: Path) -> None:
    store.put_response("k", {"text": "héllo", "usage": {"prompt_tokens": 3}})
    con = sqlite3.connect(store_dir / "cache.db")
    (value,) = con.execute("SELECT value FROM Cache WHERE key = 'response/k'").fetchone()
    con.close()
    assert json.loads(value) == {"text": "héllo", "usage": {"prompt_tokens": 3}}


# ------------------------------------------------------------------ runs


def test_unknown_run_id(store: RunStore) -> None:
    for call in (store.load, store.events, lambda r: store.commit(r, {}, [{}])):
        with pytest.raises(StoreError) as info:
            call("nosuchid")
        assert "no run 'nosuchid'" in info.value.message
        assert "loopdsl runs" in info.value.hint


def test_create_twice_is_refused(store: RunStore) -> None:
    store.create_run("r1", {"v": 1})
    with pytest.raises(StoreError, match="already exists"):
        store.create_run("r1", {"v": 2})
    assert store.load("r1")["v"] == 1


def test_invalid_run_id_is_refused(store: RunStore) -> None:
    with pytest.raises(StoreError, match="invalid run id"):
        store.create_run("a/b", {})


def test_new_run_ids_are_short_and_unique(store: RunStore) -> None:
    ids = set()
    for _ in range(50):
        run_id = store.new_run_id()
        assert len(run_id) == 8 and run_id.isalnum() and run_id == run_id.lower()
        store.create_run(run_id, {})
        ids.add(run_id)
    assert len(ids) == 50


def test_resolve_prefixes(store: RunStore) -> None:
    for run_id in ("abc11111", "abc22222", "xyz00000"):
        store.create_run(run_id, {})
    assert store.resolve("x") == "xyz00000"
    assert store.resolve("abc2") == "abc22222"
    assert store.resolve("abc11111") == "abc11111"
    with pytest.raises(StoreError) as info:
        store.resolve("abc")
    assert "ambiguous" in info.value.message
    assert "abc11111" in info.value.message and "abc22222" in info.value.message
    with pytest.raises(StoreError, match="no run matches 'q'"):
        store.resolve("q")
    with pytest.raises(StoreError):
        store.resolve("")


def test_list_runs_newest_first(store: RunStore) -> None:
    for n, run_id in enumerate(("first", "second", "third")):
        store.create_run(run_id, {"n": n})
    store.commit("first", {"n": 0, "status": "completed"})
    runs = store.list_runs()
    assert [r["run_id"] for r in runs] == ["third", "second", "first"]
    assert runs[2]["status"] == "completed"


def test_commit_is_atomic_when_an_event_is_not_json(store: RunStore) -> None:
    store.create_run("r1", {"n_events": 0})
    store.commit("r1", {"n_events": 1}, [{"i": 1}])
    with pytest.raises(TypeError):
        store.commit("r1", {"n_events": 3}, [{"i": 2}, {"bad": object()}])
    assert store.load("r1")["n_events"] == 1
    assert store.events("r1") == [{"i": 1}]
    store.commit("r1", {"n_events": 2}, [{"i": 2}])
    assert store.events("r1") == [{"i": 1}, {"i": 2}]


def test_events_appended_by_another_holder_between_two_locks_are_kept(store: RunStore, store_dir: Path) -> None:
    """A store remembers a run's event count between its commits under one lock; a later
    lock of the same run, taken after another store wrote under its own, reads it again."""
    store.create_run("r1", {"status": "running"})
    with store.lock("r1") as lock:
        store.commit("r1", {"status": "running"}, [{"i": 1}], lock=lock)
        store.commit("r1", {"status": "running"}, [{"i": 2}], lock=lock)
    with RunStore(store_dir) as other, other.lock("r1") as lock:
        other.commit("r1", {"status": "running"}, [{"i": 3}], lock=lock)
    with store.lock("r1") as lock:
        store.commit("r1", {"status": "running"}, [{"i": 4}], lock=lock)
    assert store.events("r1") == [{"i": 1}, {"i": 2}, {"i": 3}, {"i": 4}]


def _record_row_bytes(store_dir: Path, run_id: str) -> int:
    with sqlite3.connect(store_dir / "cache.db") as con:
        (size,) = con.execute("SELECT length(value) FROM Cache WHERE key = ?", (f"run/{run_id}/record",)).fetchone()
    return size


def test_a_long_path_reads_back_whole_and_the_record_row_stays_small(store: RunStore, store_dir: Path) -> None:
    # Each step appends to the path; a record holding all of it made every commit cost more
    # than the one before (encoding and writing the whole history again).
    store.create_run("long", {"status": "running", "path": []})
    sizes = []
    for step in range(1, 1201):
        path = [f"s{i % 7}" for i in range(step)]
        store.commit("long", {"status": "running", "path": path}, [{"n": step}])
        if step in (300, 1068):  # the same length past a multiple of 64 (the chunk)
            sizes.append(_record_row_bytes(store_dir, "long"))
            assert store.load("long")["path"] == path
    assert sizes[1] <= sizes[0] + 10  # 3.5x the path, not 3.5x the bytes per commit
    assert "path_chunks" not in store.load("long")
    with RunStore(store_dir) as other:  # another process (no memory of what was written)
        assert other.load("long")["path"] == path
        assert other.list_runs()[0]["path"] == path
        other.commit("long", {"status": "done", "path": [*path, "end"]}, [])
    assert store.load("long")["path"] == [*path, "end"]
    assert len(store.events("long")) == 1200
    # A caller that commits a different path is stored as it says, chunks included.
    store.commit("long", {"status": "done", "path": ["x"] * 600}, [])
    assert store.load("long")["path"] == ["x"] * 600


def test_a_path_list_that_grows_in_place_reads_back_whole(store: RunStore) -> None:
    """The engine appends to one list for the whole run; the store then skips comparing the
    head it wrote, and still stores every state once."""
    store.create_run("grow", {"status": "running", "path": []})
    path: list[str] = []
    for step in range(1, 400):
        path.append(f"s{step}")
        store.commit("grow", {"status": "running", "path": path}, [])
        if step in (63, 64, 65, 128, 300):
            assert store.load("grow")["path"] == [f"s{i}" for i in range(1, step + 1)]
    rewritten = [f"t{i}" for i in range(399)]  # another list: compared, so rewritten
    store.commit("grow", {"status": "running", "path": rewritten}, [])
    assert store.load("grow")["path"] == rewritten


def test_a_missing_part_of_the_path_is_a_damaged_run(store: RunStore, store_dir: Path) -> None:
    store.create_run("holed", {"status": "running", "path": []})
    store.commit("holed", {"status": "running", "path": ["a"] * 700}, [])
    store.create_run("fine", {"status": "running", "path": []})
    with sqlite3.connect(store_dir / "cache.db") as con:
        con.execute("DELETE FROM Cache WHERE key = 'run/holed/path/000001'")
    with pytest.raises(StoreError, match="damaged: part 1 of its path is missing"):
        store.load("holed")
    listed = {r["run_id"]: r["status"] for r in store.list_runs()}
    assert listed == {"holed": "damaged", "fine": "running"}


@pytest.mark.parametrize("value, said", [("null", "the record is a JSON null, not an object"),
                                         ('{"run_id":"vxh', "is not valid JSON")])
def test_a_record_turned_null_or_cut_is_a_damaged_run_named_with_its_store(store: RunStore, store_dir: Path,
                                                                           value: str, said: str) -> None:
    """A stored `null` read as "no such run": the run vanished from `runs` and `show`; a cut
    record's error named neither the run nor the store."""
    store.create_run("hurt", {"status": "running", "path": []})
    store.create_run("fine", {"status": "running", "path": []})
    with sqlite3.connect(store_dir / "cache.db") as con:
        con.execute("UPDATE Cache SET value = ? WHERE key = 'run/hurt/record'", (value,))
    with pytest.raises(StoreError, match=f"run hurt in the store {store_dir} is damaged: .*{said}"):
        store.load("hurt")
    listed = {r["run_id"]: r["status"] for r in store.list_runs()}
    assert listed == {"hurt": "damaged", "fine": "running"}


def test_a_format_1_store_is_upgraded_and_still_read(store_dir: Path) -> None:
    with RunStore(store_dir) as s:
        s.create_run("old", {"status": "completed", "path": ["a", "b"]})
    (store_dir / MARKER_NAME).write_text(json.dumps({"format": 1, "tool": "loopdsl"}))
    with RunStore(store_dir) as s:
        assert s.load("old")["path"] == ["a", "b"]
    assert json.loads((store_dir / MARKER_NAME).read_text())["format"] == FORMAT_VERSION == 2


def test_response_and_cache_namespaces_are_separate(store: RunStore) -> None:
    key = request_key("r1", "draft", 1, 1, 0, "m")
    assert store.get_response(key) is None
    store.put_response(key, {"text": "paid"})
    assert store.get_response(key) == {"text": "paid"}
    assert store.get_cached(key) is None
    store.put_cached(key, {"text": "cached"})
    assert store.get_cached(key) == {"text": "cached"}
    assert store.get_response(key) == {"text": "paid"}


def test_default_store_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOOPDSL_STORE", raising=False)
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / "src" / "deep").mkdir(parents=True)
    assert default_store_dir(repo / "src" / "deep") == repo.resolve() / ".loopdsl"
    plain = tmp_path / "plain"
    plain.mkdir()
    assert default_store_dir(plain) == plain.resolve() / ".loopdsl"
    monkeypatch.setenv("LOOPDSL_STORE", str(tmp_path / "elsewhere"))
    assert default_store_dir(repo) == tmp_path / "elsewhere"


# ------------------------------------------------------------------ crash safety

_WRITER = """
import sys
from pathlib import Path
from loopdsl.adapters.store.run_store import RunStore
store = RunStore(Path(sys.argv[1]))
run_id = sys.argv[2]
n = store.load(run_id)["n_events"]
commits = 0
while True:
    batch = 1 + n % 3   # 1, 2 or 3 events per commit
    events = [{"n": n + i + 1, "pad": "p" * 300} for i in range(batch)]
    n += batch
    store.commit(run_id, {"status": "running", "n_events": n}, events)
    commits += 1
    if commits == 1:
        print("ready", flush=True)  # at least one commit landed this round
"""


def test_kill_9_during_commits_leaves_a_consistent_store(store_dir: Path) -> None:
    with RunStore(store_dir) as s:
        s.create_run("crashy", {"status": "running", "n_events": 0})
    rng = random.Random()
    last = 0
    for _ in range(6):
        writer = _spawn(_WRITER, str(store_dir), "crashy")
        assert writer.stdout is not None
        assert writer.stdout.readline().strip() == "ready", writer.stderr.read() if writer.stderr else ""
        time.sleep(rng.uniform(0.02, 0.15))
        writer.send_signal(signal.SIGKILL)
        writer.wait(timeout=10)
        assert writer.returncode == -signal.SIGKILL
        with RunStore(store_dir) as s:  # opens clean after the crash
            record = s.load("crashy")
            events = s.events("crashy")
            assert record["n_events"] == len(events)
            assert [e["n"] for e in events] == list(range(1, len(events) + 1))
            assert len(events) > last  # the writer really committed something this round
            last = len(events)


# ------------------------------------------------------------------ locks

_HOLDER = """
import sys, time
from pathlib import Path
from loopdsl.adapters.store.run_store import RunStore
store = RunStore(Path(sys.argv[1]))
lock = store.lock(sys.argv[2], ttl=float(sys.argv[3]))
print("held", flush=True)
time.sleep(float(sys.argv[4]))
lock.release()
store.close()
print("released", flush=True)
"""


def _start_holder(store_dir: Path, run_id: str, ttl: float, hold: float) -> subprocess.Popen[str]:
    holder = _spawn(_HOLDER, str(store_dir), run_id, str(ttl), str(hold))
    assert holder.stdout is not None
    line = holder.stdout.readline().strip()
    assert line == "held", holder.stderr.read() if holder.stderr else line
    return holder


def test_lock_across_processes_and_release(store: RunStore, store_dir: Path) -> None:
    store.create_run("r1", {})
    holder = _start_holder(store_dir, "r1", ttl=5.0, hold=0.6)
    try:
        with pytest.raises(RunLocked) as info:
            store.lock("r1")
        assert f"process {holder.pid}" in info.value.message
        assert "since" in info.value.message and "on host" in info.value.message
        assert "expires within 5 s" in info.value.hint
        # Once the holder releases, waiting for the lock succeeds.
        with store.lock("r1", wait=5.0) as handle:
            assert not handle.lost
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.slow  # mostly a wait: started early, beside tests that compute
def test_heartbeat_keeps_the_lock_past_its_ttl(store: RunStore, store_dir: Path) -> None:
    holder = _start_holder(store_dir, "r1", ttl=1.0, hold=30.0)
    try:
        time.sleep(2.3)  # more than twice the ttl: only the heartbeat keeps it
        with pytest.raises(RunLocked):
            store.lock("r1")
        assert holder.poll() is None
    finally:
        holder.kill()
        holder.wait()


def test_lock_of_a_killed_holder_expires_within_ttl(store: RunStore, store_dir: Path) -> None:
    ttl = 0.8
    holder = _start_holder(store_dir, "r1", ttl=ttl, hold=30.0)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    killed_at = time.monotonic()
    with store.lock("r1", ttl=5.0, wait=ttl + 2.0):
        assert time.monotonic() - killed_at <= ttl + 0.5


def test_second_lock_in_same_process_is_refused_and_release_frees(store: RunStore) -> None:
    first = store.lock("r1", ttl=2.0)
    with pytest.raises(RunLocked):
        store.lock("r1")
    first.release()
    first.release()  # idempotent
    with store.lock("r1"):
        pass


def test_active_runs(store: RunStore) -> None:
    store.create_run("live", {"group": "g", "status": "running"})
    store.create_run("crashed", {"group": "g", "status": "running"})  # no live lock
    store.create_run("paused", {"group": "g", "status": "waiting"})
    store.create_run("done", {"group": "g", "status": "completed"})
    store.create_run("other", {"group": "h", "status": "running"})
    with store.lock("live"), store.lock("other"):
        assert sorted(store.active_runs("g")) == ["live", "paused"]
        assert store.active_runs("h") == ["other"]
    assert store.active_runs("g") == ["paused"]
    assert store.active_runs("none") == []


# ------------------------------------------------------------------ events read in one scan


def test_events_read_in_one_scan_keep_order_and_skip_other_runs(store: RunStore) -> None:
    store.create_run("r1", {"status": "running"})
    store.create_run("r10", {"status": "running"})  # its keys sort right after r1's
    for i in range(120):
        store.commit("r1", {"status": "running"}, [{"seq": 2 * i}, {"seq": 2 * i + 1}])
        store.commit("r10", {"status": "running"}, [{"seq": -i}])
    assert [e["seq"] for e in store.events("r1")] == list(range(240))
    assert [e["seq"] for e in store.events("r10")] == [-i for i in range(120)]


def test_a_planted_pickle_among_events_is_refused_not_unpickled(store: RunStore, store_dir: Path, tmp_path: Path) -> None:
    store.create_run("victim", {"status": "running"})
    for i in range(3):
        store.commit("victim", {"status": "running"}, [{"seq": i}])
    canary = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self):  # unpickling this would create the canary file
            return (Path.touch, (canary,))

    with sqlite3.connect(store_dir / "cache.db") as con:
        con.execute("UPDATE Cache SET mode = 4, value = ? WHERE key = ?",
                    (pickle.dumps(Exploit()), "run/victim/event/0000000001"))
    with pytest.raises(StoreError, match="not JSON"):
        store.events("victim")
    assert not canary.exists()


def test_a_missing_event_batch_is_a_damaged_run(store: RunStore, store_dir: Path) -> None:
    store.create_run("holed", {"status": "running"})
    for i in range(3):
        store.commit("holed", {"status": "running"}, [{"seq": i}])
    with sqlite3.connect(store_dir / "cache.db") as con:
        con.execute("DELETE FROM Cache WHERE key = 'run/holed/event/0000000001'")
    with pytest.raises(StoreError, match="counts 3 event batches but 2 are stored"):
        store.events("holed")


def test_a_locked_database_is_reported_busy_not_damaged(tmp_path: Path) -> None:
    # Seen for real: a process stopped inside a write holds SQLite's write lock, and the next
    # process's open waits its whole busy timeout (30 s, too long for a test) then fails. The
    # advice for a damaged database (move the store aside) would hide a healthy store's runs.
    busy = str(database_error(tmp_path, sqlite3.OperationalError("database is locked")))
    assert "stayed locked by another process" in busy and "stopped or stuck loopdsl process" in busy
    assert "move the store directory aside" not in busy
    damaged = str(database_error(tmp_path, sqlite3.DatabaseError("file is not a database")))
    assert "is unreadable (file is not a database)" in damaged and "move the store directory aside" in damaged


def test_an_event_of_the_wrong_shape_is_a_damaged_run(store: RunStore) -> None:
    """Found by a fuzz of real event logs: an event's `state` or `type` that is a list or a
    mapping crashed `show` and `resume` (both use them as keys)."""
    store.create_run("odd", {"status": "running"})
    store.commit("odd", {"status": "running"}, [{"seq": 1, "type": "start"}, {"seq": 2, "type": "ok", "state": ["a"]}])
    with pytest.raises(StoreError, match=r"damaged: event 2: 'state' is a JSON array, not a string or null"):
        store.events("odd")
