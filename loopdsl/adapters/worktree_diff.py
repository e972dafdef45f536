"""What a run changed in its git worktree, as a diff a person reads (the run page).

Through `git_safe.run_git`, with every filter driver blanked, `--no-ext-diff` and
`--no-textconv`: the repository is not trusted, and reading a diff runs none of its commands."""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from .git_safe import no_filters, run_git, z_fields


_SHA = re.compile(r"[0-9a-f]{7,64}")
_UNTRACKED_SHOWN = 50


def _diff(cwd: Path, *args: str) -> Any:
    return run_git(cwd, "diff", "--no-color", "--no-ext-diff", "--no-textconv", *args, check=False,
                   config=no_filters(cwd))


def _untracked_diff(path: Path, limit: int) -> str:
    """New files a kept worktree has not staged, as diffs from nothing (what `git diff` omits)."""
    names = z_fields(run_git(path, "ls-files", "--others", "--exclude-standard", "-z", check=False).stdout)
    out = []
    for name in names[:_UNTRACKED_SHOWN]:
        out.append(_diff(path, "--no-index", "--", os.devnull, name).stdout)
        if sum(map(len, out)) > limit:
            break
    more = len(names) - _UNTRACKED_SHOWN
    return "".join(out) + (f"\n... and {more} more new files\n" if more > 0 else "")


def worktree_diff(info: dict[str, Any], limit: int = 200_000) -> str:
    """What a run changed, as a unified diff (at most `limit` characters): its commit against
    the base once it completed, else its kept worktree (staged and unstaged) against the base.
    `info` is the run record's `meta.worktree`; a repository gone or moved says so instead."""
    base, commit = str(info.get("base_commit") or ""), info.get("commit")
    repo, path = Path(str(info.get("repo") or "")), Path(str(info.get("path") or ""))
    # The values come from a record: only commit ids reach git, never something read as a flag.
    if not _SHA.fullmatch(base) or (commit and not _SHA.fullmatch(str(commit))):
        return "(the run's record names no valid base commit)"
    if commit and repo.is_dir():
        proc = _diff(repo, base, str(commit), "--")
    elif path.is_dir():
        proc = _diff(path, base, "--")
        if proc.returncode == 0:
            proc.stdout += _untracked_diff(path, limit)
    else:
        return "(the run's worktree and repository are no longer where the run left them)"
    if proc.returncode != 0:
        return f"(git diff failed: {proc.stderr.strip()[:500]})"
    text = proc.stdout
    return text if len(text) <= limit else text[:limit] + f"\n... ({len(text) - limit} more characters)"
