"""What the store holds, for people: list the runs, show one, clean up after the unfinished."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..adapters.git_worktree import clean_worktrees, find_repo_root
from ..adapters.store.run_store import default_store_dir
from .runs import UsageError, open_store


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
    records = [r for r in open_store(where, here).list_runs(check=True) if not r.get("parent")]
    return RunListing(where, records)


@dataclass
class RunView:
    record: dict[str, Any]
    events: list[dict[str, Any]]
    children: list[dict[str, Any]]


def show_run(run_id: str, store: str | Path | None = None, cwd: Path | None = None) -> RunView:
    """One run's record, its event log and its (undamaged) child runs."""
    st = open_store(store, cwd or Path.cwd(), create=False)
    full = st.resolve(run_id)
    children = [r for r in st.list_runs(check=True) if r.get("parent") == full and r.get("status") != "damaged"]
    return RunView(st.load_run(full), st.events(full), children)


def clean(store: str | Path | None = None, cwd: Path | None = None) -> list[str]:
    """Remove the worktrees of runs that are neither running nor waiting; the names removed."""
    here = cwd or Path.cwd()
    repo = find_repo_root(here)
    if repo is None:
        raise UsageError("not inside a git repository", "run `loopdsl clean` from the repository the runs worked on")
    st = open_store(store, here, create=False)
    active = [r["run_id"] for r in st.list_runs() if r.get("status") in ("running", "waiting")]
    return clean_worktrees(repo, st.worktrees_dir, keep=active)
