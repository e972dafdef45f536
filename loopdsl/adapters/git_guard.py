"""Did an agent attempt touch the repository's git setup?

An agent with a shell tool can write `.git/hooks/pre-commit`, add an fsmonitor or a
filter to `.git/config`, or move `main`; each would run code or change history outside
the run's branch once the user next types a git command. The engine takes
`guard_repository(repo, branch)` before an attempt and calls `changes()` after it: any
change it reports ends the run `failed` (docs/dsl.md, "Workspace confinement").

Watched: the shared config (`config`, `config.worktree`, every worktree's
`config.worktree`, `gitdir` and `commondir`), `info/`, `hooks/`, `objects/info/alternates`,
the `core.hooksPath` directory when it lies inside the repository, every ref other than
the run's own branch (loose or packed), the HEAD of every other worktree, and the run
worktree's `.git` file (which says which repository it is). The run's own branch and its
worktree's HEAD may move: that is the run's work, and `reset_workspace` moves them back;
so may the branches of the other items of a concurrent fan-out, for an item's attempt.
"""
from __future__ import annotations

import os
import stat
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from ..language.files import file_sha256
from .git_safe import git_env, run_git

_WATCHED_FILES = ("config", "config.worktree", "objects/info/alternates")
_WATCHED_DIRS = ("info", "hooks")
_ADMIN_FILES = ("config.worktree", "gitdir", "commondir")


def _digest(path: Path) -> str | None:
    """What a file is: kind, mode and content hash (a symlink: its target). None when absent."""
    try:
        info = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    if stat.S_ISLNK(info.st_mode):
        return "link:" + os.readlink(path)
    if stat.S_ISDIR(info.st_mode):
        return "dir"
    if not stat.S_ISREG(info.st_mode):
        return f"special:{stat.S_IFMT(info.st_mode):o}"
    return f"file:{info.st_mode & 0o7777:o}:{file_sha256(path)}"


def _tree_digests(root: Path, label: str) -> dict[str, str]:
    """label/relative-path -> digest of everything under `root` (symlinks not followed)."""
    found: dict[str, str] = {}
    top = _digest(root)
    if top is None:
        return found
    found[label] = top
    if top != "dir":
        return found
    for directory, dirs, files in os.walk(root, followlinks=False):
        for name in sorted(dirs + files):
            full = Path(directory) / name
            found[f"{label}/{full.relative_to(root).as_posix()}"] = _digest(full) or "gone"
    return found


def _hooks_path(repo: Path) -> Path | None:
    """The repository's own `core.hooksPath` (not loopdsl's -c override), resolved."""
    proc = subprocess.run(["git", "config", "--includes", "--get", "core.hooksPath"], cwd=repo, env=git_env(),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False)
    value = proc.stdout.strip()
    if proc.returncode != 0 or not value:
        return None
    return Path(os.path.expanduser(value)) if os.path.isabs(os.path.expanduser(value)) else repo / value


def _refs(repo: Path) -> dict[str, str]:
    out = run_git(repo, "for-each-ref", "--format=%(refname)%00%(objectname)%00%(symref)").stdout
    refs: dict[str, str] = {}
    for line in out.splitlines():
        name, _, rest = line.partition("\0")
        refs[name] = rest.replace("\0", " ").strip()
    return refs


@dataclass
class RepoGuard:
    """What `changes()` compares against: the state when the attempt began."""

    repo: Path
    branch: str  # the run's own branch, e.g. loopdsl/<run-id>
    shared: str = ""  # a fan-out item's: its siblings' branch prefix (their work moves them)
    common: Path = field(init=False)
    own_admin: str | None = field(init=False, default=None)
    before: dict[str, str] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.repo = Path(self.repo)
        common = run_git(self.repo, "rev-parse", "--git-common-dir").stdout.strip()
        self.common = (self.repo / common).resolve()
        own_head = f"ref: refs/heads/{self.branch}"
        for admin in sorted((self.common / "worktrees").glob("*")):
            if _read(admin / "HEAD") == own_head:
                self.own_admin = admin.name
        self.before = self._state()

    def _state(self) -> dict[str, str]:
        state: dict[str, str] = {}
        for name in _WATCHED_FILES:
            state[f"file {name}"] = _digest(self.common / name) or "absent"
        for name in _WATCHED_DIRS:
            state.update({f"file {k}": v for k, v in _tree_digests(self.common / name, name).items()})
        hooks = _hooks_path(self.repo)
        if hooks is not None and _inside(hooks, self.repo) and not _inside(hooks, self.common / "hooks"):
            state.update({f"hooks {k}": v for k, v in _tree_digests(hooks, str(hooks)).items()})
        for admin in sorted((self.common / "worktrees").glob("*")):
            names = _ADMIN_FILES if admin.name == self.own_admin else (*_ADMIN_FILES, "HEAD")
            for name in names:
                state[f"file worktrees/{admin.name}/{name}"] = _digest(admin / name) or "absent"
            if admin.name == self.own_admin:
                # The `.git` file of the run's checkout: which repository its git commands use.
                state["file <run worktree>/.git"] = _digest(Path(_read(admin / "gitdir"))) or "absent"
        state["ref HEAD"] = _digest(self.common / "HEAD") or "absent"  # the main checkout's
        own, siblings = f"refs/heads/{self.branch}", f"refs/heads/{self.shared}" if self.shared else None
        state.update({f"ref {k}": v for k, v in _refs(self.repo).items()
                      if k != own and not (siblings and k.startswith(siblings))})
        return state

    def changes(self) -> list[str]:
        """One line per change since the guard was taken, sorted; [] when nothing changed."""
        after = self._state()
        lines: list[str] = []
        for key in sorted(set(self.before) | set(after)):
            old, new = self.before.get(key), after.get(key)
            if old == new:
                continue
            kind, _, name = key.partition(" ")
            what = f"{'git file' if kind == 'file' else kind} {name}"
            if old is None or old == "absent":
                lines.append(f"{what} was created")
            elif new is None or new == "absent":
                lines.append(f"{what} was deleted")
            else:
                lines.append(f"{what} {'moved' if kind == 'ref' else 'was changed'}")
        return lines


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return ""


def _inside(path: Path, root: Path) -> bool:
    return Path(os.path.realpath(path)).is_relative_to(os.path.realpath(root))


def guard_repository(repo: Path, branch: str, shared: str = "") -> RepoGuard:
    """Take the repository's git setup before an agent attempt on branch `branch` (`shared`:
    the prefix of sibling branches a fan-out's items move concurrently)."""
    return RepoGuard(repo, branch, shared)


def describe_changes(changes: list[str], limit: int = 10) -> str:
    """The failure message for a run whose attempt changed the repository's git setup."""
    shown = "; ".join(changes[:limit]) + (f"; and {len(changes) - limit} more" if len(changes) > limit else "")
    return (f"the agent changed the repository's git setup outside its own branch ({shown}): "
            "hooks, git config and other refs are off limits, so the run failed; inspect the "
            "repository (`git config --list --show-origin`, `ls .git/hooks`, `git reflog`) and undo it")
