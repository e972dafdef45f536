"""Snapshots of a run worktree as git trees, built with plumbing only.

`git add` and `git commit` run the repository's hooks and filters; these functions do not.
A snapshot hashes every tracked and untracked-not-ignored file into a throwaway index
(GIT_INDEX_FILE in a temp directory) and writes a tree from it; the worktree's own index
is never read for contents nor written. Filter drivers are blanked (git_safe.no_filters)
while built-in conversions (eol, ident) stay, so a file checked out and read back unchanged
hashes to the blob it came from.

`reset_workspace` restores a commit's tree: tracked files as in the commit, untracked
files that are not ignored removed, ignored files (build outputs, virtualenvs, `.env`)
kept, because they are never part of what a run commits or reports.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

from ..runtime.scratch import make_folder, remove_folder
from .git_safe import WorkspaceError, identity_args, no_filters, printable, run_git, z_fields

_GITLINK = "160000"
# The message of a visit-start commit of uncommitted files: reset_workspace restores its
# files but points the branch at its parent, the branch head when the visit began.
VISIT_START_MESSAGE = "loopdsl: workspace when the visit began\n"
_DIFF_SAFE = ("--no-textconv", "--no-ext-diff", "--no-color", "--no-renames")


def _listed(path: Path) -> tuple[dict[str, tuple[str, str]], list[str]]:
    """Tracked entries (path -> (mode, sha)) and untracked-not-ignored paths, from one
    `ls-files`: `-t` tags each record ("H " tracked, "? " untracked), so an untracked file
    named like a staged entry cannot pass for one."""
    tracked: dict[str, tuple[str, str]] = {}
    others: list[str] = []
    listing = run_git(path, "ls-files", "-z", "-t", "--cached", "--stage", "--others", "--exclude-standard").stdout
    for record in z_fields(listing):
        tag, rest = record[:2], record[2:]
        if tag == "? ":
            # A nested repository is listed as "dir/": it is not part of the run's tree.
            if not rest.endswith("/"):
                others.append(rest)
            continue
        meta, _, name = rest.partition("\t")
        mode, sha, _stage = meta.split()
        tracked[name] = (mode, sha)
    return tracked, others


def _hash_files(path: Path, names: list[str], filters: dict[str, str]) -> list[str]:
    """Write the blobs of regular files `names` (relative to `path`); their ids in order."""
    simple = [n for n in names if "\n" not in n]
    ids: dict[str, str] = {}
    if simple:
        out = run_git(path, "hash-object", "-w", "--stdin-paths", config=filters,
                      stdin="".join(f"{n}\n" for n in simple)).stdout.split()
        ids.update(zip(simple, out))
    for name in names:  # a name with a newline cannot go through --stdin-paths
        if name not in ids:
            ids[name] = run_git(path, "hash-object", "-w", "--", name, config=filters).stdout.strip()
    return [ids[n] for n in names]


def _under_real_dirs(path: Path, name: str, seen: dict[str, bool]) -> bool:
    """Whether every parent of `name` is a real directory: a symlink swapped in for a
    directory must not make the snapshot read files outside the worktree."""
    parts = name.split("/")[:-1]
    for depth in range(1, len(parts) + 1):
        parent = "/".join(parts[:depth])
        if parent not in seen:
            try:
                seen[parent] = stat.S_ISDIR(os.lstat(path / parent).st_mode)
            except OSError:
                seen[parent] = False
        if not seen[parent]:
            return False
    return True


def _index_entries(path: Path) -> list[tuple[str, str, str]]:
    """(mode, sha, name) of every file the worktree holds now, hashed without filter commands."""
    tracked, untracked = _listed(path)
    entries: list[tuple[str, str, str]] = []
    regular: list[tuple[str, str]] = []  # (mode, name) still to hash
    real_dirs: dict[str, bool] = {}
    for name in sorted(set(tracked) | set(untracked)):
        if not _under_real_dirs(path, name, real_dirs):
            continue  # its directory is gone or is a symlink now: the file is not in the worktree
        if name in tracked and tracked[name][0] == _GITLINK:
            entries.append((_GITLINK, tracked[name][1], name))  # a submodule keeps its recorded commit
            continue
        try:
            info = os.lstat(path / name)
        except (FileNotFoundError, NotADirectoryError):
            continue  # deleted
        if stat.S_ISLNK(info.st_mode):
            target = os.readlink(path / name)
            sha = run_git(path, "hash-object", "-w", "--no-filters", "--stdin", stdin=target).stdout.strip()
            entries.append(("120000", sha, name))
        elif stat.S_ISREG(info.st_mode):
            regular.append(("100755" if info.st_mode & stat.S_IXUSR else "100644", name))
    ids = _hash_files(path, [name for _, name in regular], no_filters(path))
    entries += [(mode, sha, name) for (mode, name), sha in zip(regular, ids)]
    return sorted(entries, key=lambda e: e[2])


class Snapshot:
    """A throwaway index of the worktree's files; `tree()` writes it as a tree object."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._dir = make_folder("loopdsl-index-")
        self.index = self._dir / "index"
        info = "".join(f"{mode} {sha}\t{name}\0" for mode, sha, name in _index_entries(self.path))
        run_git(self.path, "update-index", "-z", "--index-info", index_file=self.index, stdin=info)

    def remove(self, names: list[str]) -> None:
        if names:
            run_git(self.path, "update-index", "-z", "--force-remove", "--stdin", index_file=self.index,
                    stdin="".join(f"{n}\0" for n in names))

    def tree(self) -> str:
        return run_git(self.path, "write-tree", index_file=self.index).stdout.strip()

    def close(self) -> None:
        remove_folder(self._dir)

    def __enter__(self) -> Snapshot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def snapshot_tree(path: Path) -> str:
    """The tree of the worktree's tracked and untracked-not-ignored files as they are now."""
    with Snapshot(path) as snap:
        return snap.tree()


def resolve(path: Path, rev: str) -> str:
    """The object id `rev` names, or "" when it names none."""
    proc = run_git(path, "rev-parse", "--verify", "--quiet", rev, check=False)
    return proc.stdout.strip() if proc.returncode == 0 else ""


def visit_start(path: Path) -> str:
    """The commit to come back to: HEAD when the worktree is clean, else a commit of its files
    (child of HEAD, on no branch) so uncommitted work of earlier states is restored too."""
    # Both ids from one process; the `--` keeps a file named HEAD from making them ambiguous.
    proc = run_git(path, "rev-parse", "HEAD", "HEAD^{tree}", "--", check=False)
    ids = proc.stdout.split()
    if proc.returncode != 0 or len(ids) < 2:
        raise WorkspaceError(f"{path} has no HEAD commit", "the run's worktree is damaged: start a new run")
    head, head_tree = ids[0], ids[1]
    tree = snapshot_tree(path)
    if tree == head_tree:
        return head
    return run_git(path, *identity_args(path), "commit-tree", tree, "-p", head, stdin=VISIT_START_MESSAGE).stdout.strip()


def diff_names(path: Path, old: str, new: str) -> list[tuple[str, str]]:
    """(status letter, path) of every file that differs between two trees or commits."""
    fields = z_fields(run_git(path, "diff-tree", "-r", "-z", "--name-status", *_DIFF_SAFE, old, new).stdout)
    return list(zip(fields[::2], fields[1::2]))


def workspace_changes(path: Path, since: str) -> tuple[list[str], str]:
    """(changed_files, diff_stat) of the worktree against commit `since`, untracked files included.

    diff_stat is git's `--stat` text (file lines and the summary line), "" when nothing changed.
    """
    tree = snapshot_tree(path)
    names = [printable(name) for _, name in diff_names(path, since, tree)]
    if not names:
        return [], ""
    stat_text = run_git(path, "diff-tree", "-r", "--stat=100", *_DIFF_SAFE, since, tree).stdout
    return names, stat_text.rstrip("\n")


def reset_workspace(path: Path, sha: str) -> None:
    """Make the worktree hold exactly the files of `sha` (from visit_start) and its branch
    point where it did when the visit began.

    Untracked files that are not ignored are removed; ignored files are kept. Commits a
    command made during the attempt are dropped from the branch (they stay in the object
    store). No hook or filter command runs.
    """
    target = resolve(path, f"{sha}^{{commit}}")
    if not target:
        raise WorkspaceError(f"cannot reset {path}: {sha} is not a commit",
                             "the visit's start commit was pruned; start a new run")
    branch_at = target
    if run_git(path, "cat-file", "commit", target).stdout.partition("\n\n")[2] == VISIT_START_MESSAGE:
        branch_at = resolve(path, f"{target}^1")  # a snapshot of uncommitted files: never on the branch
    filters = no_filters(path)
    # The current index says which files the checkout may delete; what the attempt left
    # untracked is removed by `clean` below (-ff: nested repositories too, -d: directories).
    run_git(path, "read-tree", "--reset", "-u", target, config=filters)
    run_git(path, "clean", "-ffdq", "--", ".", config=filters)
    run_git(path, "read-tree", branch_at)  # index only: earlier uncommitted work stays uncommitted
    head = resolve(path, "HEAD")
    if head != branch_at:
        # Through HEAD's symbolic ref, so the run's branch moves, as `git reset` would do it.
        run_git(path, "update-ref", "-m", "loopdsl: reset workspace", "HEAD", branch_at, head)
