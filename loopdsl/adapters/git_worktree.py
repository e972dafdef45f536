"""A git worktree per run, so agent edits never touch the user's checkout.

Each run gets branch `loopdsl/<run-id>` checked out in `<worktrees_dir>/<run-id>` (under
the run store, whose `.gitignore` of `*` keeps the user's `git status` clean). Nothing
here runs a command that writes the user's index, HEAD or working tree: worktrees have
their own index and HEAD, and every git call sets GIT_OPTIONAL_LOCKS=0 so even read-only
commands never refresh the user's index file. Every git call also runs no command the
repository names (hooks, fsmonitor, filters: git_safe), and the run's work is committed
with plumbing (git_snapshot), not `git add`/`git commit`.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..runtime.redaction import Redactor
from .git_safe import (
    FALLBACK_EMAIL,
    FALLBACK_NAME,
    WorkspaceError,
    git_env,
    identity_args,
    no_filters,
    printable,
    run_git,
    z_fields,
)
from .git_snapshot import Snapshot, diff_names, resolve

# Re-exported: callers and tests name them from here, where the worktree lives.
__all__ = ["BRANCH_PREFIX", "CREDENTIAL_FILE", "ITEM_SEPARATOR", "FALLBACK_EMAIL", "FALLBACK_NAME", "SecretInCommit",
           "WorkspaceError", "Worktree", "clean_worktrees", "create_worktree", "find_repo_root", "finish_worktree", "keep_worktree",
           "open_worktree"]

BRANCH_PREFIX = "loopdsl/"
# A fan-out item's worktree and branch: `<run-id>--<state>--<index>` (git_workspace.py).
ITEM_SEPARATOR = "--"


# Files that hold credentials by convention. A run never commits one it created, whatever
# it contains (a command writes `.npmrc` before `npm ci`); one the base commit already
# tracks is committed like any other file, after the secret search.
CREDENTIAL_FILE = re.compile(
    r"(?:\A|/)(?:\.npmrc|\.netrc|_netrc|\.pypirc|\.git-credentials|\.env(?:\.(?!example\Z|sample\Z|template\Z)[^/]+)?"
    r"|id_(?:rsa|dsa|ecdsa|ed25519)|[^/]+\.(?:pem|key|p12|pfx))\Z"
)


@dataclass(frozen=True)
class Worktree:
    repo: Path
    path: Path
    branch: str
    base_commit: str


def _git(cwd: Path, *args: str, check: bool = True, **kw: Any) -> subprocess.CompletedProcess[str]:
    return run_git(cwd, *args, check=check, **kw)


def find_repo_root(path: Path) -> Path | None:
    """The top of the git working tree containing `path`, or None when it is not in one."""
    path = Path(path)
    directory = path if path.is_dir() else path.parent
    if not directory.is_dir():
        return None
    try:
        proc = _git(directory, "rev-parse", "--show-toplevel", check=False)
    except WorkspaceError:
        return None
    if proc.returncode != 0 or not proc.stdout.strip():
        return None
    return Path(proc.stdout.strip())


def _require_repo(repo: Path) -> Path:
    root = find_repo_root(repo)
    if root is None:
        raise WorkspaceError(
            f"{repo} is not inside a git repository, so a run worktree cannot be made",
            "run loopdsl inside a git repository (git init; git commit), or remove "
            "`workspace: {worktree: true}` from the loop",
        )
    return root


def _meta_path(worktrees_dir: Path, run_id: str) -> Path:
    return worktrees_dir / f"{run_id}.json"


def create_worktree(repo: Path, worktrees_dir: Path, run_id: str, base: str = "HEAD") -> Worktree:
    """Check out `base` on a new branch `loopdsl/<run_id>` in `<worktrees_dir>/<run_id>`."""
    root = _require_repo(repo)
    resolved = _git(root, "rev-parse", "--verify", "--quiet", f"{base}^{{commit}}", check=False)
    if resolved.returncode != 0:
        has_commits = _git(root, "rev-parse", "--verify", "--quiet", "HEAD", check=False)
        hint = (
            "the repository has no commits yet: make a first commit"
            if has_commits.returncode != 0
            else "use a branch, tag or commit that exists (`git log --oneline` shows commits)"
        )
        raise WorkspaceError(f"workspace base {base!r} is not a commit in {root}", hint)
    base_commit = resolved.stdout.strip()
    branch = BRANCH_PREFIX + run_id
    if _git(root, "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}", check=False).returncode == 0:
        raise WorkspaceError(
            f"branch {branch} already exists in {root}",
            f"delete it (`git branch -D {branch}`) or start a new run",
        )
    worktrees_dir = Path(worktrees_dir)
    path = worktrees_dir / run_id
    if path.exists():
        raise WorkspaceError(
            f"the worktree path {path} already exists",
            "remove it with `loopdsl clean`, or start a new run",
        )
    worktrees_dir.mkdir(parents=True, exist_ok=True)
    # Pin the resolved commit, not the ref, so the recorded base is what was checked out.
    # The checkout runs no smudge filter or post-checkout hook of the repository (git_safe).
    _git(root, "worktree", "add", "--quiet", "-b", branch, str(path), base_commit, config=no_filters(root))
    meta = {"repo": str(root), "branch": branch, "base_commit": base_commit}
    _meta_path(worktrees_dir, run_id).write_text(json.dumps(meta) + "\n")
    return Worktree(repo=root, path=path, branch=branch, base_commit=base_commit)


def _registered_worktrees(root: Path) -> list[dict[str, str]]:
    """`git worktree list --porcelain` as a list of {worktree, branch, locked, ...}."""
    out = _git(root, "worktree", "list", "--porcelain").stdout
    entries: list[dict[str, str]] = []
    for block in out.strip().split("\n\n"):
        entry: dict[str, str] = {}
        for line in block.splitlines():
            key, _, value = line.partition(" ")
            entry[key] = value
        if "worktree" in entry:
            entries.append(entry)
    return entries


def _same_path(a: Path | str, b: Path | str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def open_worktree(repo: Path, worktrees_dir: Path, run_id: str) -> Worktree | None:
    """The run's existing worktree (for resume), or None when there is none."""
    root = _require_repo(repo)
    path = Path(worktrees_dir) / run_id
    if not path.is_dir():
        return None
    if not any(_same_path(e["worktree"], path) for e in _registered_worktrees(root)):
        return None
    branch = BRANCH_PREFIX + run_id
    try:
        meta = json.loads(_meta_path(Path(worktrees_dir), run_id).read_text())
        base_commit = str(meta["base_commit"])
    except (OSError, ValueError, KeyError, TypeError):
        # Metadata lost: the fork point of the branch from where the user was is the best guess.
        base_commit = _git(root, "merge-base", "HEAD", branch).stdout.strip()
    return Worktree(repo=root, path=path, branch=branch, base_commit=base_commit)


class SecretInCommit(WorkspaceError):
    """What the run would commit holds a declared secret: nothing is committed."""


def _leave_out_credential_files(wt: Worktree, snap: Snapshot) -> str:
    """Drop (and delete) the credential files the run created from the snapshot; its tree."""
    created = [path for status, path in diff_names(wt.path, wt.base_commit, snap.tree())
               if status == "A" and CREDENTIAL_FILE.search(path)]
    snap.remove(created)
    for path in created:
        (wt.path / path).unlink(missing_ok=True)  # the worktree is removed; the file must not outlive the run
    return snap.tree()


def _new_blobs(wt: Worktree, tree: str) -> dict[str, str]:
    """Blob id -> path of every file content the run would add to its branch: what the
    snapshot `tree` holds, and what commands of the run committed themselves since the base."""
    blobs: dict[str, str] = {}
    raw = _git(wt.path, "diff-tree", "-r", "-z", "--raw", "--no-abbrev", "--no-renames", wt.base_commit, tree).stdout
    fields = z_fields(raw)
    for meta, path in zip(fields[::2], fields[1::2]):
        new_id = meta.split()[3]
        if set(new_id) != {"0"}:  # a deletion has no new content
            blobs[new_id] = path
    listed = _git(wt.path, "rev-list", "--objects", f"{wt.base_commit}..HEAD").stdout
    for line in listed.splitlines():
        object_id, _, path = line.partition(" ")
        if path:
            blobs.setdefault(object_id, path)
    return blobs


def _files_with_secrets(wt: Worktree, tree: str, redactor: Redactor) -> list[str]:
    """Paths (sorted) whose name or new content holds a secret, in any form the redactor knows."""
    blobs = _new_blobs(wt, tree)
    found = {path for path in blobs.values() if redactor(path) != path}
    ids = [object_id for object_id, path in blobs.items() if path not in found]
    if not ids:
        return sorted(found)
    proc = subprocess.run(["git", "cat-file", "--batch"], cwd=wt.path, env=git_env(), capture_output=True,
                          input="".join(f"{i}\n" for i in ids).encode(), check=False)
    data, at = proc.stdout, 0
    if proc.returncode != 0 or data.count(b"\n") < len(ids):
        raise WorkspaceError(f"could not read the run's changes in {wt.path} to check them for secrets: "
                             f"{proc.stderr.decode(errors='replace').strip()}", "the worktree is kept; inspect it with git")
    for object_id in ids:
        header_end = data.index(b"\n", at)
        header = data[at:header_end].split()
        at = header_end + 1
        if len(header) < 3 or header[1] not in (b"blob", b"tree", b"commit", b"tag"):
            continue  # "missing": nothing to read
        size = int(header[2])
        if header[1] == b"blob":
            text = data[at:at + size].decode("utf-8", errors="surrogateescape")
            if redactor(text) != text:
                found.add(blobs[object_id])
        at += size + 1
    messages = _git(wt.path, "log", "--format=%B", f"{wt.base_commit}..HEAD").stdout
    if redactor(messages) != messages:
        found.add("the message of a commit a command made")
    return sorted(found)


def finish_worktree(wt: Worktree, message: str, secret_values: Iterable[str] = ()) -> str | None:
    """Commit every change onto the run's branch, then remove the worktree.

    The commit is made with plumbing (git_snapshot): no hook, filter or fsmonitor of the
    repository runs, and the user's signing setup is not asked (they review, and may
    re-sign, the branch when merging). Credential files the run created are left out (see
    CREDENTIAL_FILE). When what would be committed holds a declared secret in any form the
    redactor knows, nothing is committed: SecretInCommit names the files, the branch is
    moved back to the base (so commits a command made cannot be pushed) and the worktree
    is kept with the changes staged. Returns the new commit sha, or None when there was
    nothing to commit.
    """
    with Snapshot(wt.path) as snap:
        tree = _leave_out_credential_files(wt, snap)
        redactor = Redactor(secret_values)
        leaked = _files_with_secrets(wt, tree, redactor) if redactor else []
        if leaked:
            _refuse_commit(wt, tree, [redactor(printable(p)) for p in leaked])
    head = resolve(wt.path, "HEAD")
    sha: str | None = None
    if tree != resolve(wt.path, "HEAD^{tree}"):
        sha = _git(wt.path, *identity_args(wt.path), "commit-tree", tree, "-p", head, stdin=message).stdout.strip()
        # With the old value, so a concurrent move of the branch fails instead of being lost.
        _git(wt.path, "update-ref", "-m", "loopdsl: commit the run's work", "HEAD", sha, head)
        # Staged, so the worktree reads clean to anyone who looks before it is removed.
        _git(wt.path, "read-tree", sha)
    # --force: everything not ignored was committed above, and ignored files never are.
    removed = _git(wt.repo, "worktree", "remove", "--force", str(wt.path), check=False)
    if removed.returncode != 0:
        raise WorkspaceError(
            f"the run's work is on branch {wt.branch}, but its worktree {wt.path} could not "
            f"be removed: {removed.stderr.strip()}",
            "inspect it, then `git worktree remove --force` it or run `loopdsl clean`",
        )
    _meta_path(wt.path.parent, wt.path.name).unlink(missing_ok=True)
    return sha


def _refuse_commit(wt: Worktree, tree: str, shown: list[str]) -> None:
    """Move the branch back to the base, stage `tree` for inspection, raise SecretInCommit."""
    head = resolve(wt.path, "HEAD")
    if head != wt.base_commit:
        _git(wt.path, "update-ref", "-m", "loopdsl: drop commits holding a secret", "HEAD", wt.base_commit, head)
    _git(wt.path, "read-tree", tree)  # index only (no -u): the files stay as the run left them
    raise SecretInCommit(
        f"not committing the run's changes: {', '.join(shown)} contain(s) the value of a declared secret",
        f"the worktree {wt.path} is kept with the changes staged: remove the secret from the file "
        "(pass it to the command through `env:` instead of writing it), or `loopdsl clean`",
    )


def keep_worktree(wt: Worktree) -> None:
    """Leave the worktree in place for inspection (a run that did not complete)."""
    del wt  # deliberately nothing: the worktree and its uncommitted changes stay


def clean_worktrees(repo: Path, worktrees_dir: Path, keep: Iterable[str] = ()) -> list[str]:
    """Remove this repository's leftover run worktrees (not their branches); prune git's list.

    Worktrees of other repositories sharing the store, locked worktrees and the run ids
    in `keep` are left alone. Returns the run ids whose worktrees were removed.
    """
    root = _require_repo(repo)
    worktrees_dir = Path(worktrees_dir)
    keep_ids = set(keep)
    removed: list[str] = []
    for entry in _registered_worktrees(root):
        path = Path(entry["worktree"])
        if not _same_path(path.parent, worktrees_dir):
            continue  # the main checkout or a worktree the user made themselves
        run_id = path.name
        if run_id.split(ITEM_SEPARATOR)[0] in keep_ids or "locked" in entry:  # a run's item worktrees too
            continue
        if path.exists():
            # --force: a kept worktree has uncommitted work by design; cleaning discards it.
            _git(root, "worktree", "remove", "--force", str(path))
        # else: the directory is already gone; the prune below drops git's record of it.
        _meta_path(worktrees_dir, run_id).unlink(missing_ok=True)
        removed.append(run_id)
    _git(root, "worktree", "prune")
    return sorted(removed)
