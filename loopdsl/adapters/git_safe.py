"""Running git on a repository the run does not trust.

A repository's config and `.gitattributes` can name commands git runs by itself: hooks,
an fsmonitor, clean/smudge/process filters, textconv and external diff drivers, auto gc
(which runs the `pre-auto-gc` hook). A loop run on a cloned repository must run none of
them, so every git call here carries `-c` overrides that switch them off, and the calls
that read or write file contents also blank every filter driver the config defines.
"""
from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

from ..language.errors import LoopdslError

# Used only when the user has no identity configured (a fresh CI box, a container).
FALLBACK_NAME = "loopdsl"
FALLBACK_EMAIL = "loopdsl@localhost"
# Variables that would point git at another repository or index than the one we name.
_REPO_LOCATION_VARS = (
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_INDEX_FILE",
    "GIT_COMMON_DIR",
    "GIT_OBJECT_DIRECTORY",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_NAMESPACE",
    "GIT_PREFIX",
    "GIT_CONFIG_PARAMETERS",  # -c values inherited from a parent git (a hook that runs loopdsl)
    "GIT_CONFIG_COUNT",
    "GIT_EXTERNAL_DIFF",
    "GIT_ATTR_SOURCE",
)

# Always on: nothing here needs hooks, an fsmonitor, gc, submodule recursion or signing.
HARDENED = (
    "-c", "core.hooksPath=/dev/null",
    "-c", "core.fsmonitor=false",
    "-c", "core.untrackedCache=false",
    "-c", "gc.auto=0",
    "-c", "maintenance.auto=false",
    "-c", "submodule.recurse=false",
    "-c", "commit.gpgsign=false",
)


class WorkspaceError(LoopdslError):
    """A workspace problem the user can act on: what happened and how to fix it."""

    def __init__(self, message: str, hint: str = "", exit_code: int | None = None) -> None:
        super().__init__(message, hint, exit_code)
        self.args = (f"{message}\n  hint: {hint}" if hint else message,)  # str() carries the hint too


def git_env(index_file: Path | None = None, config: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in _REPO_LOCATION_VARS and not k.startswith(("GIT_CONFIG_KEY_", "GIT_CONFIG_VALUE_"))}
    env["GIT_OPTIONAL_LOCKS"] = "0"
    env["GIT_TERMINAL_PROMPT"] = "0"
    if index_file is not None:
        env["GIT_INDEX_FILE"] = str(index_file)
    # Config through the environment, not `-c`: `-c` splits at the first "=", so a driver
    # named `a=b` could not be blanked that way; GIT_CONFIG_KEY_n takes any name.
    for i, (key, value) in enumerate(sorted((config or {}).items())):
        env[f"GIT_CONFIG_KEY_{i}"], env[f"GIT_CONFIG_VALUE_{i}"] = key, value
    if config:
        env["GIT_CONFIG_COUNT"] = str(len(config))
    return env


def run_git(cwd: Path, *args: str, check: bool = True, index_file: Path | None = None,
            config: Mapping[str, str] | None = None, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """`git <hardening> <args>` in `cwd` with `config` set too; a failure is a WorkspaceError when `check`."""
    try:
        proc = subprocess.run(
            ["git", *HARDENED, *args],
            cwd=cwd,
            env=git_env(index_file, config),
            input=stdin,
            stdin=None if stdin is not None else subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="surrogateescape",  # a file name need not be UTF-8
            check=False,  # callers decide; failures become WorkspaceError below
        )
    except FileNotFoundError:
        raise WorkspaceError(
            "git is not installed (needed for `workspace: {worktree: true}`)",
            "install git, or remove `workspace` from the loop",
        ) from None
    if check and proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip()
        raise WorkspaceError(
            f"`git {' '.join(args)}` failed in {cwd}: {detail}",
            "fix the repository state shown above and retry",
        )
    return proc


def z_fields(text: str) -> list[str]:
    """The fields of git's `-z` output."""
    return [f for f in text.split("\0") if f]


def printable(name: str) -> str:
    """A path as printable text (a name that is not UTF-8 keeps its bytes as escapes)."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def identity_args(path: Path) -> list[str]:
    """`-c user.name/-c user.email` only when git cannot find an identity of the user's own."""
    author = run_git(path, "var", "GIT_AUTHOR_IDENT", check=False)
    committer = run_git(path, "var", "GIT_COMMITTER_IDENT", check=False)
    if author.returncode == 0 and committer.returncode == 0:
        return []
    return ["-c", f"user.name={FALLBACK_NAME}", "-c", f"user.email={FALLBACK_EMAIL}"]


def no_filters(cwd: Path) -> dict[str, str]:
    """Config blanking every filter driver the repository's config defines.

    Read at the moment of the call, so a driver added during the run is blanked too. An
    empty command is "no filter" to git, and `required=false` keeps a blank one from
    failing the call. Built-in conversions (eol, ident) run no command and stay on, so
    what is read back matches what was checked out.
    """
    proc = run_git(cwd, "config", "--name-only", "-z", "--get-regexp", r"^filter\.", check=False)
    config: dict[str, str] = {}
    for key in z_fields(proc.stdout):
        if key.count(".") >= 2:
            driver = key[len("filter."):key.rindex(".")]
            for field, value in (("clean", ""), ("smudge", ""), ("process", ""), ("required", "false")):
                config[f"filter.{driver}.{field}"] = value
    return config
