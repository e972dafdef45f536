"""The run page's parts that need a particular store: a run's branch diff (a real git
repository, a real worktree run), and the list query over hostile or odd records."""
from __future__ import annotations

import sqlite3
from pathlib import Path

from cli_in_process import cli_in_process
from git_repos import git_output as _git, owned_repo
from ui_support import cli

from loopdsl.adapters.store.listing import child_ids, run_count, summaries
from loopdsl.adapters.store.run_store import RunStore
from loopdsl.api.records import run_diff
from loopdsl.api.runs import new_run_state
from loopdsl.language.model import build_loop

LOOP = Path(__file__).parents[1] / "data" / "durable" / "worktree.yaml"


def _repo(tmp_path: Path) -> Path:
    return owned_repo(tmp_path / "repo", {"a.txt": "a.txt as committed\n"}, owner="Repo Owner")


def test_the_run_page_shows_the_diff_of_a_completed_and_of_a_failed_worktree_run(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    store = tmp_path / "store"
    # the repository asks git to run a command to show each file's diff: viewing must not
    pwned = tmp_path / "pwned"
    _git(repo, "config", "diff.evil.textconv", f"touch {pwned}; cat")
    _git(repo, "config", "diff.external", f"touch {pwned}")
    (repo / ".git" / "info").mkdir(exist_ok=True)
    (repo / ".git" / "info" / "attributes").write_text("* diff=evil\n")
    assert cli(["run", str(LOOP), "--store", str(store)], repo).returncode == 0
    assert cli_in_process(["run", str(LOOP), "--store", str(store), "--input", "fail=1"], repo).returncode == 1
    with RunStore(store) as st:
        completed, failed = st.list_runs()[::-1]
    for record in (completed, failed):
        assert record["meta"]["worktree"]
        diff = run_diff(record)
        assert diff is not None and "+agent line" in diff and "+made by agent" in diff, diff
        page = tmp_path / f"{record['run_id']}.html"
        assert cli_in_process(["show", record["run_id"], "--store", str(store), "--html", str(page)], repo).returncode == 0
        assert "+made by agent" in page.read_text(encoding="utf-8")
    assert not pwned.exists()
    # a record naming something other than a commit never reaches git as an argument
    hostile = {**completed, "meta": {"worktree": {**completed["meta"]["worktree"], "base_commit": "--output=/tmp/x"}}}
    assert run_diff(hostile) == "(the run's record names no valid base commit)"
    assert run_diff({"meta": {}}) is None


def _add(st: RunStore, loop_name: str, status: str, run_id: str | None = None, **extra: object) -> str:
    loop = build_loop({"loopdsl": 1, "name": loop_name, "start": "s", "states": {"s": {"end": "completed"}}})
    run_id = run_id or st.new_run_id()
    state = new_run_state(loop, run_id, {})
    st.create_run(run_id, {**state.to_json(), "status": status, **extra})
    return run_id


def test_the_list_query_skips_children_and_damaged_rows_and_reads_hostile_fields(tmp_path: Path) -> None:
    with RunStore(tmp_path / "store") as st:
        first = _add(st, "a", "completed")
        _add(st, "a", "completed", run_id=f"{first}.sub", parent=first)
        damaged = _add(st, "a", "failed")
        # a loop name made to look like a status in the stored JSON: the substring
        # pre-filter lets it through, the JSON test does not
        odd = _add(st, 'x","status":"waiting', "completed")
        quoted = _add(st, 'say "hi" <b>', "waiting")
        # a stored 'running' record with no live lock holder is an interrupted run
        crashed = _add(st, "a", "running")
        st._cache.set(f"run/{damaged}/record", ["not", "a", "record"])
        rows = summaries(st)
        assert [r.run_id for r in rows] == [crashed, quoted, odd, first]
        assert [r.interrupted for r in rows] == [True, False, False, False]
        assert [r.run_id for r in summaries(st, status="waiting")] == [quoted]
        assert [r.run_id for r in summaries(st, loop='say "hi" <b>')] == [quoted]
        assert [r.run_id for r in summaries(st, offset=1, limit=2)] == [quoted, odd]
        assert child_ids(st, first) == [f"{first}.sub"]
        assert run_count(st) == 6
    # a row that is not JSON at all (written behind the store's back) is skipped, not fatal
    with sqlite3.connect(tmp_path / "store" / "cache.db") as db:
        db.execute("UPDATE Cache SET value = '{not json' WHERE key = ?", (f"run/{first}/record",))
    with RunStore(tmp_path / "store") as st:
        assert [r.run_id for r in summaries(st)] == [crashed, quoted, odd]
