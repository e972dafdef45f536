"""Pushing a run's branch to the `origin` remote, with real git.

The push goes through `git_safe.run_git` (no hooks, so no `pre-push` hook of the
repository runs). The token reaches git through a credential helper that reads it from
this process's environment: it is never on a command line (visible in `ps`) nor written
to a config file, and git asks the helper only when the remote wants credentials, so the
`http.extraheader` that actions/checkout persists keeps working unchanged (two
Authorization headers would be refused). A local path or `file://` remote (the tests'
bare repository) needs no credentials at all.
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..git_safe import WorkspaceError, run_git
from .settings import GitHubError

_TOKEN_VAR = "LOOPDSL_GIT_PUSH_TOKEN"
# A fixed shell text (never built from a value): the token is read from the environment.
_HELPER = f'!f() {{ echo username=x-access-token; echo "password=${_TOKEN_VAR}"; }}; f'


@contextmanager
def git_token(token: str | None) -> Iterator[dict[str, str]]:
    """The git config that hands `token` to the git commands run inside, through the helper
    (the token is set in this process's environment meanwhile; nothing when there is none)."""
    if not token:
        yield {}
        return
    previous = os.environ.get(_TOKEN_VAR)
    os.environ[_TOKEN_VAR] = token  # read by the helper git runs; removed right after
    try:
        yield {"credential.helper": _HELPER}
    finally:
        os.environ.pop(_TOKEN_VAR, None)
        if previous is not None:
            os.environ[_TOKEN_VAR] = previous


def remote_sha(repo: Path, branch: str, remote: str = "origin") -> str | None:
    """The commit `branch` points at on `remote`, or None when the remote has no such branch."""
    proc = run_git(repo, "ls-remote", "--heads", remote, f"refs/heads/{branch}", check=False)
    if proc.returncode != 0:
        raise GitHubError(f"cannot read remote {remote!r}: {_clean(proc.stderr)}",
                          f"check `git remote get-url {remote}` in {repo} and the token's access")
    for line in proc.stdout.splitlines():
        sha, _, ref = line.partition("\t")
        if ref == f"refs/heads/{branch}":
            return sha
    return None


def push_branch(repo: Path, local_ref: str, branch: str, token: str | None,
                force: bool = False, remote: str = "origin") -> str:
    """Push `local_ref` to `branch` on `remote`; returns the commit pushed.

    Pushing the same commit again is a no-op, so a resumed publish may push twice. `force`
    replaces what the remote branch holds (a fixed branch the loop owns, reused by each run).
    """
    try:
        sha = run_git(repo, "rev-parse", "--verify", f"{local_ref}^{{commit}}").stdout.strip()
    except WorkspaceError:
        raise GitHubError(f"the run's commit {local_ref[:40]!r} is not in the repository {repo}",
                          "publish from the repository the run worked in, or fetch the run's branch into "
                          "this one first (e.g. `git fetch RUN.bundle 'refs/heads/loopdsl/*:refs/heads/loopdsl/*'` "
                          "from a `git bundle` the run's job made)") from None
    spec = f"{'+' if force else ''}{sha}:refs/heads/{branch}"
    with git_token(token) as config:
        proc = run_git(repo, "push", "--porcelain", remote, spec, check=False, config=config)
    if proc.returncode != 0:
        detail = _clean(f"{proc.stdout} {proc.stderr}").replace(token or "\0", "[REDACTED]")
        hint = ("the remote branch has commits the run's branch lacks: delete it or use `branch: run`"
                if "[rejected]" in detail or "non-fast-forward" in detail
                else "check `git remote get-url origin` and that the token may push (contents: write)")
        raise GitHubError(f"pushing {branch!r} to {remote} failed: {detail}", hint)
    return sha


def _clean(text: str) -> str:
    return " ".join(text.split())[:400]
