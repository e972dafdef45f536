"""Carrying a waiting run's worktree from one workflow run to the next.

A worktree loop (ci-sweeper) waits at its checkpoint with the agent's change uncommitted in
the run's worktree, which lives on the CI machine that is gone when the decision arrives.
So the pack step snapshots each waiting run's worktree as a commit (git_snapshot's
visit-start commit: the files as they are, child of the branch head) into a git bundle
kept with the store on the runs branch; the restore step checks the run's branch out again
in a worktree at the same place and puts the snapshot's files back without committing them.
The resumed run sees what it left.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from ..adapters.git_safe import no_filters, run_git
from ..adapters.git_snapshot import reset_workspace, visit_start
from ..adapters.git_worktree import BRANCH_PREFIX
from ..api.runs import open_store

CARRY_DIR = "carried-worktrees"  # in the store's folder on the runs branch
_RUN_ID = re.compile(r"^[a-z0-9][a-z0-9._-]{0,79}$")
_ACTIVE = ("waiting", "running")


def _ref(run_id: str) -> str:
    return f"refs/loopdsl-carry/{run_id}"


def carry_out(repo: Path, store_dir: Path, target: Path) -> list[str]:
    """Bundle the worktree of every waiting run into `target/carried-worktrees`; their run ids."""
    worktrees = store_dir / "worktrees"
    if not worktrees.is_dir():
        return []
    store = open_store(store_dir, repo, create=False)
    try:
        active = [r["run_id"] for r in store.list_runs() if r.get("status") in _ACTIVE]
    finally:
        store.close()
    carried = []
    for run_id in active:
        path, meta = worktrees / run_id, worktrees / f"{run_id}.json"
        if not path.is_dir() or not meta.is_file():
            continue
        (target / CARRY_DIR).mkdir(parents=True, exist_ok=True)
        run_git(repo, "update-ref", _ref(run_id), visit_start(path))
        bundle = str((target / CARRY_DIR / f"{run_id}.bundle").resolve())
        try:
            # Only what origin lacks when that is anything; else the whole history of the snapshot.
            if run_git(repo, "bundle", "create", "--quiet", bundle, _ref(run_id), "--not", "--remotes=origin",
                       check=False).returncode != 0:
                run_git(repo, "bundle", "create", "--quiet", bundle, _ref(run_id))
        finally:
            run_git(repo, "update-ref", "-d", _ref(run_id))
        (target / CARRY_DIR / f"{run_id}.json").write_text(meta.read_text(encoding="utf-8"), encoding="utf-8")
        carried.append(run_id)
    return carried


def carry_in(repo: Path, store_dir: Path) -> list[str]:
    """Recreate the carried worktrees of a restored store; their run ids."""
    folder = store_dir / CARRY_DIR
    restored = []
    for bundle in sorted(folder.glob("*.bundle")) if folder.is_dir() else []:
        run_id = bundle.stem
        meta_file = folder / f"{run_id}.json"
        if not _RUN_ID.match(run_id) or not meta_file.is_file():
            continue
        run_git(repo, "fetch", "--no-tags", "--quiet", str(bundle.resolve()), f"+{_ref(run_id)}:{_ref(run_id)}")
        snapshot = run_git(repo, "rev-parse", f"{_ref(run_id)}^{{commit}}").stdout.strip()
        branch = BRANCH_PREFIX + run_id
        path = store_dir / "worktrees" / run_id
        path.parent.mkdir(parents=True, exist_ok=True)
        run_git(repo, "worktree", "add", "--quiet", "--force", "-B", branch, str(path.resolve()), snapshot,
                config=no_filters(repo))
        reset_workspace(path, snapshot)  # the files of the snapshot, the branch at its parent
        run_git(repo, "update-ref", "-d", _ref(run_id))
        meta = json.loads(meta_file.read_text(encoding="utf-8"))
        meta.update(repo=str(repo.resolve()), branch=branch)
        (store_dir / "worktrees" / f"{run_id}.json").write_text(json.dumps(meta) + "\n", encoding="utf-8")
        restored.append(run_id)
    return restored
