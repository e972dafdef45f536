"""What the store holds, for people: list the runs, show one, clean up after the unfinished."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..adapters.git_worktree import clean_worktrees, find_repo_root
from ..adapters.worktree_diff import worktree_diff
from ..adapters.store.listing import RunSummary, child_ids, run_count, spend_history, summaries
from ..adapters.store.run_store import default_store_dir
from ..runtime.errors import StoreError
from .store_access import UsageError, open_store, reading_store
from .transcript import model_calls


@dataclass
class RunListing:
    where: Path
    records: list[dict[str, Any]] = field(default_factory=list)

    @property
    def damaged(self) -> list[dict[str, Any]]:
        return [r for r in self.records if r.get("status") == "damaged"]


def list_runs(store: str | Path | None = None, cwd: Path | None = None) -> RunListing:
    """The top-level runs in the store, newest first; damaged records are listed, not raised."""
    here = cwd or Path.cwd()
    where = Path(store) if store else default_store_dir(here)
    # No store yet simply means no runs yet (and listing must not create one).
    if not where.exists():
        return RunListing(where)
    with reading_store(where, here) as opened:
        records = [r for r in opened.list_runs(check=True) if not r.get("parent")]
    return RunListing(where, records)


@dataclass
class RunView:
    record: dict[str, Any]
    events: list[dict[str, Any]]
    children: list[dict[str, Any]]
    transcript: list[dict[str, Any]] = field(default_factory=list)  # see `transcript.model_calls`


def show_run(run_id: str, store: str | Path | None = None, cwd: Path | None = None, *,
             transcript: bool = False) -> RunView:
    """One run's record, its event log and its (undamaged) child runs; with `transcript`,
    its model calls' prompts and replies too (read from the response store)."""
    with reading_store(store, cwd or Path.cwd()) as st:
        full = st.resolve(run_id)
        # Children are found through the index (their ids extend the parent's), so showing
        # a run does not decode every record of a large store.
        children = []
        for child in child_ids(st, full):
            try:
                record = st.load_run(child)
            except StoreError:  # a damaged child is reported by `loopdsl runs`, not here
                continue
            if record.get("parent") == full:
                children.append({**record, "run_id": record.get("run_id", child)})
        events = st.events(full)
        calls = model_calls(st, full, events) if transcript else []
        record = st.load_run(full)
        if st.interrupted(full, record):  # as `runs` says it (it said `running` here)
            record["interrupted"] = True
        return RunView(record, events, children, calls)


@dataclass
class RunPage:
    """One page of the run list (newest first) and whether another page follows."""

    where: Path
    rows: list[RunSummary]
    offset: int
    limit: int
    more: bool
    total: int


def runs_page(store: str | Path | None = None, *, status: str | None = None, loop: str | None = None,
              offset: int = 0, limit: int = 50, cwd: Path | None = None) -> RunPage:
    """A page of the top-level runs, filtered by status and loop; reads only that page's
    fields (the web UI's list answers in milliseconds for a store of 10,000 runs)."""
    here = cwd or Path.cwd()
    where = Path(store) if store else default_store_dir(here)
    if not where.exists():
        return RunPage(where, [], offset, limit, False, 0)
    with open_store(where, here) as st:
        rows = summaries(st, status=status, loop=loop, offset=offset, limit=limit + 1)
        return RunPage(where, rows[:limit], offset, limit, len(rows) > limit, run_count(st))


def loop_spend(loop: str, store: str | Path | None = None, cwd: Path | None = None) -> list[RunSummary]:
    """The latest runs of `loop`, oldest first: what a spend-per-run chart draws."""
    with open_store(store, cwd or Path.cwd(), create=False) as st:
        return spend_history(st, loop)


def run_diff(record: dict[str, Any], limit: int = 200_000) -> str | None:
    """The diff of a run's branch against where it started (None: the run had no worktree)."""
    info = (record.get("meta") or {}).get("worktree")
    if not isinstance(info, dict):
        return None
    return worktree_diff(info, limit)


def clean(store: str | Path | None = None, cwd: Path | None = None) -> list[str]:
    """Remove the worktrees of runs that are neither running nor waiting; the names removed."""
    here = cwd or Path.cwd()
    repo = find_repo_root(here)
    if repo is None:
        raise UsageError("not inside a git repository", "run `loopdsl clean` from the repository the runs worked on")
    st = open_store(store, here, create=False)
    active = [r["run_id"] for r in st.list_runs() if r.get("status") in ("running", "waiting")]
    return clean_worktrees(repo, st.worktrees_dir, keep=active)
