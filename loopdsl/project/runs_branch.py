"""Keeping a loop's run store between GitHub Actions workflow runs on the `loopdsl-runs` branch.

A run that waits at a checkpoint is decided hours later by another workflow run, on
another machine: its state must outlive the first one. actions/cache evicts entries (after
7 days unused, or when the repository's 10 GB fill up), so a waiting run could silently be
lost. Artifacts expire too (90 days at most) and are found by workflow run, not by loop
run. A branch does not expire, is restored with plain git by any later job, and its history
says when each run changed. Each loop keeps its store in its own folder (`<loop-name>/`),
so two loops' workflows never write the same files; within a loop the workflow's
concurrency group makes the writes take turns, and a push that lost a race to another loop
is simply rebuilt on the new tip.

The commit is built with a temporary index (plumbing: hash-object, update-index,
write-tree, commit-tree), never in the user's checkout, and pushed without force.
"""
from __future__ import annotations

import shutil
import sqlite3
import subprocess
from pathlib import Path

from ..adapters.git_safe import HARDENED, git_env, run_git
from ..adapters.store.disk import DB_NAME
from ..adapters.github.push import git_token
from ..language.errors import LoopdslError
from ..runtime.scratch import scratch_folder

BRANCH = "loopdsl-runs"
_TRACKING = f"refs/loopdsl/{BRANCH}"  # where the fetched tip is kept (not a branch the user sees)
_PUSH_ATTEMPTS = 5
_BOT = {"user.name": "github-actions[bot]", "user.email": "41898282+github-actions[bot]@users.noreply.github.com"}
# Files of the store that are the runs themselves; worktrees and locks stay on the machine.
_SKIPPED = {"worktrees"}


class RunsBranchError(LoopdslError):
    """The runs branch cannot be read or written; exit 2."""


def push_failure(action: str, detail: str, token: str | None) -> RunsBranchError:
    # Hidden before the cut: a token cut in two would leave its first part to read.
    detail = " ".join((detail.replace(token, "[REDACTED]") if token else detail).split())[:400]
    return RunsBranchError(f"{action} failed: {detail}",
                           "check `git remote get-url origin` and that the job's token may read "
                           "(restore) or push (save: `permissions: contents: write`)")


def fetch(repo: Path, token: str | None, remote: str = "origin") -> str | None:
    """Fetch the runs branch; its tip, or None when the remote has no such branch yet."""
    with git_token(token) as config:
        listed = run_git(repo, "ls-remote", "--heads", remote, f"refs/heads/{BRANCH}", check=False, config=config)
        if listed.returncode != 0:
            raise push_failure(f"reading remote {remote!r}", listed.stderr, token)
        if not listed.stdout.strip():
            return None
        got = run_git(repo, "fetch", "--no-tags", "--quiet", remote, f"+refs/heads/{BRANCH}:{_TRACKING}",
                      check=False, config=config)
    if got.returncode != 0:
        raise push_failure(f"fetching {BRANCH}", got.stderr, token)
    return run_git(repo, "rev-parse", _TRACKING).stdout.strip()


def restore(repo: Path, loop_name: str, store_dir: Path, token: str | None) -> int:
    """Put the loop's stored runs into `store_dir` (which must be empty); how many files."""
    if store_dir.exists() and any(store_dir.iterdir()):
        raise RunsBranchError(f"{store_dir} already holds a run store; restoring would mix two stores",
                              "restore into a fresh job, or move that folder aside")
    tip = fetch(repo, token)
    if tip is None or run_git(repo, "cat-file", "-e", f"{tip}:{loop_name}", check=False).returncode != 0:
        return 0
    listing = run_git(repo, "ls-tree", "-r", "-z", "--full-tree", f"{tip}:{loop_name}").stdout
    count = 0
    for entry in filter(None, listing.split("\0")):
        meta, _, name = entry.partition("\t")
        mode, kind, blob = meta.split()
        rel = Path(name)
        # Only plain files at plain relative paths: the branch is written by workflows, but
        # anyone with push access could plant a symlink or a `..` there.
        if kind != "blob" or mode not in ("100644", "100755") or rel.is_absolute() or ".." in rel.parts:
            continue
        target = store_dir / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(run_git_bytes(repo, "cat-file", "blob", blob))
        count += 1
    return count


def run_git_bytes(repo: Path, *args: str) -> bytes:
    """A git command's stdout as bytes (a stored database is binary)."""
    proc = subprocess.run(["git", *HARDENED, *args], cwd=repo, env=git_env(), capture_output=True,
                          stdin=subprocess.DEVNULL, check=False)
    if proc.returncode != 0:
        raise RunsBranchError(f"`git {args[0]}` failed: {proc.stderr.decode(errors='replace').strip()[:400]}")
    return proc.stdout


def _fold_wal(store_dir: Path) -> None:
    """Fold the database's write-ahead log into it, so the database file alone holds every
    commit: runs published in this very process are still in the log, which is not copied."""
    database = store_dir / DB_NAME
    if not database.is_file():
        return
    connection = sqlite3.connect(str(database), timeout=30)
    try:
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    finally:
        connection.close()


def store_files(store_dir: Path, skip: frozenset[str] = frozenset()) -> list[Path]:
    """The files of a store that belong on the branch, relative to it (but the folders `skip`)."""
    _fold_wal(store_dir)
    out = []
    for path in sorted(store_dir.rglob("*")):
        rel = path.relative_to(store_dir)
        if rel.parts[0] in _SKIPPED | skip or not path.is_file() or path.is_symlink():
            continue
        if path.name.endswith(("-wal", "-shm")):
            continue  # folded into the database above
        out.append(rel)
    return out


def _tree(repo: Path, parent: str | None, loop_name: str, store_dir: Path) -> str:
    """The branch's tree with `<loop_name>/` replaced by the store's files."""
    with scratch_folder("loopdsl-index-") as scratch:
        index = scratch / "index"
        if parent:
            run_git(repo, "read-tree", parent, index_file=index)
            run_git(repo, "rm", "-r", "--cached", "--quiet", "--ignore-unmatch", "--", loop_name, index_file=index)
        for rel in store_files(store_dir):
            blob = run_git(repo, "hash-object", "-w", "--", str(store_dir / rel)).stdout.strip()
            run_git(repo, "update-index", "--add", "--cacheinfo", f"100644,{blob},{loop_name}/{rel.as_posix()}",
                    index_file=index)
        return run_git(repo, "write-tree", index_file=index).stdout.strip()


def save(repo: Path, loop_name: str, store_dir: Path, token: str | None, message: str) -> str | None:
    """Commit the store under `<loop_name>/` on the runs branch and push it; the new tip, or
    None when nothing changed. A push refused because the branch moved is rebuilt on the
    new tip (another loop saved meanwhile; its folder is kept as it is)."""
    for _ in range(_PUSH_ATTEMPTS):
        parent = fetch(repo, token)
        tree = _tree(repo, parent, loop_name, store_dir)
        if parent and run_git(repo, "rev-parse", f"{parent}^{{tree}}").stdout.strip() == tree:
            return None
        commit = run_git(repo, "commit-tree", tree, *(["-p", parent] if parent else []), "-m", message,
                         config=_BOT).stdout.strip()
        with git_token(token) as config:
            pushed = run_git(repo, "push", "--porcelain", "origin", f"{commit}:refs/heads/{BRANCH}",
                             check=False, config=config)
        if pushed.returncode == 0:
            return commit
        detail = f"{pushed.stdout} {pushed.stderr}"
        if "[rejected]" not in detail and "non-fast-forward" not in detail and "fetch first" not in detail:
            raise push_failure(f"pushing {BRANCH}", detail, token)
    raise RunsBranchError(f"pushing {BRANCH} was refused {_PUSH_ATTEMPTS} times: other jobs keep moving it",
                          "run the workflow again; its run store is in the job's artifact meanwhile")


def copy_store(store_dir: Path, target: Path, skip: frozenset[str] = frozenset()) -> int:
    """Copy the store's files (not its worktrees, nor the folders `skip`) into `target`; how many."""
    files = store_files(store_dir, skip) if store_dir.is_dir() else []
    for rel in files:
        (target / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(store_dir / rel, target / rel)
    return len(files)
