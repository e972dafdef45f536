"""Which files the workspace tools see, and searching them under a deadline.

The file set is git's: tracked plus untracked-but-not-ignored (what `git status` shows a
person), and the ignored ones only with `read_ignored` (`.env`, `.npmrc` hold credentials).
git runs with `core.fsmonitor=false` (an fsmonitor is a command the repository's config
names; a workspace must not run one) and without any GIT_* variable of ours pointing it
elsewhere. Every listed name is then checked through the confined root, so a tracked
symlink, a submodule or a file inside a nested repository never shows up.
"""
from __future__ import annotations

import math
import os
import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .confined import ConfinedRoot, PathRefused, is_dot_git

MAX_LIST_ENTRIES = 1000
MAX_SEARCH_MATCHES = 200
SEARCH_MAX_FILE_BYTES = 8 * 1024 * 1024  # bigger files are data, not source: skipped
MAX_MATCH_LINE_CHARS = 400
BINARY_PROBE_BYTES = 8 * 1024
_GIT_TIMEOUT_S = 30.0
MAX_PATTERN_CHARS = 2000
# Compiling `(?:a{60000}){60000}` takes minutes, before any matching timeout applies: the
# counted repetitions (all of them multiplied, whatever their nesting) are bounded instead.
MAX_PATTERN_REPEAT = 100_000
_COUNTED = re.compile(r"\{(\d+)(?:,(\d*))?\}")


def pattern_too_big(pattern: str) -> str | None:
    """Why compiling this pattern could take too long, or None."""
    if len(pattern) > MAX_PATTERN_CHARS:
        return f"the pattern is {len(pattern)} characters; at most {MAX_PATTERN_CHARS}"
    counts = [max(int(low), int(high or 0)) for low, high in _COUNTED.findall(pattern)]
    if math.prod(max(c, 1) for c in counts) > MAX_PATTERN_REPEAT:
        return f"the pattern's counted repetitions ({{n}}) multiply past {MAX_PATTERN_REPEAT}; use smaller counts"
    return None


def is_binary(data: bytes) -> bool:
    """A NUL in the first 8 KiB, or not UTF-8 at all (the contract's test for `binary`)."""
    if b"\0" in data[:BINARY_PROBE_BYTES]:
        return True
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def _git_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_OPTIONAL_LOCKS="0", GIT_TERMINAL_PROMPT="0", LC_ALL="C", LANGUAGE="C")  # English errors
    return env


class GitUnusable(Exception):
    """git cannot answer in this repository (dubious ownership, a broken index): the tools
    then refuse rather than treat ignored files as readable."""


def _outside_a_repository(done: subprocess.CompletedProcess[bytes], what: str = "list this workspace") -> bool:
    if done.returncode == 0:
        return False
    if b"not a git repository" in done.stderr:
        return True
    message = done.stderr.decode("utf-8", "replace").strip().splitlines()
    raise GitUnusable(f"git cannot {what}: {message[0] if message else done.returncode}")


def _git(root: Path, *args: str, timeout: float) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-c", "core.fsmonitor=false", "-c", "core.untrackedCache=false", *args],
                          cwd=root, env=_git_env(), stdin=subprocess.DEVNULL, capture_output=True,
                          timeout=min(timeout, _GIT_TIMEOUT_S), check=False)


def _names(raw: bytes) -> Iterator[str]:
    for item in raw.split(b"\0"):
        try:
            yield item.decode("utf-8")  # a name the model could not send back is left out
        except UnicodeDecodeError:
            continue


def _walked(root: ConfinedRoot) -> list[str]:
    """Outside a git repository: every file, walked by descriptor (fwalk never follows a
    symlink), leaving out `.git` and directories that are other repositories."""
    found: list[str] = []
    for dirpath, dirnames, filenames, dir_fd in os.fwalk(".", dir_fd=root.fd):
        if dirpath != "." and any(is_dot_git(name) for name in dirnames + filenames):
            dirnames[:] = []
            continue
        dirnames[:] = [d for d in dirnames if not is_dot_git(d)]
        prefix = "" if dirpath == "." else dirpath.removeprefix("./") + "/"
        found.extend(prefix + name for name in filenames if not is_dot_git(name))
    return found


def candidate_files(root: ConfinedRoot, *, ignored: bool, timeout: float) -> list[str]:
    """Sorted workspace-relative names, before the per-file confinement check."""
    listed = _git(root.path, "ls-files", "-z", "--cached", "--others", "--exclude-standard", timeout=timeout)
    if _outside_a_repository(listed):
        return sorted(set(_walked(root)))
    names = set(_names(listed.stdout))
    if ignored:
        more = _git(root.path, "ls-files", "-z", "--others", "--ignored", "--exclude-standard", timeout=timeout)
        names.update(() if _outside_a_repository(more) else _names(more.stdout))
    # `sub/` is how git lists an untracked nested repository: never a file of ours.
    return sorted(name for name in names if name and not name.endswith("/")
                  and not any(is_dot_git(part) for part in name.split("/")))


class StartListing:
    """(ignored, tracked) when the tools start, from two git processes run side by side.

    Ignored: files, and directories as `dir/`; a model that can write `.gitignore` could
    otherwise un-ignore `.env` and then read it. Tracked: the index; git never ignores a
    tracked file, so reading one needs no `check-ignore` process (one a read otherwise).
    A thread starts the processes when the tools open and reads their answers; the first
    call of any tool waits for it, so git runs while the first turn's request is out (no
    tool can change a file before git has answered)."""

    def __init__(self, root: ConfinedRoot, *, timeout: float) -> None:
        self._root = root.path
        self._timeout = min(timeout, _GIT_TIMEOUT_S)
        self._procs: list[subprocess.Popen[bytes]] = []
        self._closed = False
        self._lock = threading.Lock()  # between the thread starting processes and `close`
        self._sets: tuple[frozenset[str], frozenset[str]] | None = None
        self._problem: Exception | None = None
        self._thread = threading.Thread(target=self._list, name="loopdsl-git-listing", daemon=True)
        self._thread.start()

    def done(self) -> bool:
        """Whether git has answered (or failed): `result` then returns at once."""
        return not self._thread.is_alive()

    def result(self) -> tuple[frozenset[str], frozenset[str]]:
        """The two sets; GitUnusable when git could not list (again at every call)."""
        self._thread.join()
        if self._problem is not None:
            raise self._problem
        assert self._sets is not None
        return self._sets

    def _list(self) -> None:
        queries = (("--others", "--ignored", "--exclude-standard", "--directory"), ("--cached",))
        try:
            for query in queries:
                with self._lock:
                    if self._closed:
                        raise GitUnusable("the tools closed before git listed the workspace")
                    self._procs.append(subprocess.Popen(
                        ["git", "-c", "core.fsmonitor=false", "-c", "core.untrackedCache=false", "ls-files", "-z",
                         *query], cwd=self._root, env=_git_env(), stdin=subprocess.DEVNULL,
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE))
            sets: list[frozenset[str]] = []
            for proc in self._procs:
                out, err = proc.communicate(timeout=self._timeout)
                done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
                sets.append(frozenset() if _outside_a_repository(done) else frozenset(_names(out)))
            self._sets = (sets[0], sets[1])
        except subprocess.TimeoutExpired:
            self._problem = GitUnusable(f"git did not list the workspace within {self._timeout:g}s")
        except OSError as exc:  # no git on PATH: the tools that need it say so
            self._problem = GitUnusable(f"git cannot run: {exc.strerror or exc}")
        except Exception as exc:  # noqa: BLE001 - raised again by `result`, in the caller's thread
            self._problem = exc
        finally:
            self._stop()

    def _stop(self) -> None:
        for proc in self._procs:  # a timeout or GitUnusable leaves none running
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()

    def close(self) -> None:
        """The attempt ended before any tool call: stop git if it still runs, and wait."""
        with self._lock:
            self._closed = True
            for proc in self._procs:
                if proc.poll() is None:
                    proc.kill()
        self._thread.join()


def was_ignored(ignored: frozenset[str], rel: str) -> bool:
    """`rel` or one of its directories was in the ignored set at start."""
    if rel in ignored:
        return True
    parts = rel.split("/")
    return any("/".join(parts[:i]) + "/" in ignored for i in range(1, len(parts)))


def is_ignored(root: ConfinedRoot, rel: str, *, timeout: float) -> bool:
    """git's answer now for an untracked path (a tracked file is never ignored); outside a
    repository nothing is."""
    # `./` first: a name starting with `:` would otherwise be read as pathspec magic.
    done = _git(root.path, "check-ignore", "-q", "--", "./" + rel, timeout=timeout)
    return done.returncode == 0 or done.returncode != 1 and not _outside_a_repository(
        done, f"tell whether {rel!r} is ignored")


@dataclass
class Listing:
    entries: list[str] = field(default_factory=list)
    more: bool = False  # stopped at the limit


def confined_files(root: ConfinedRoot, names: Sequence[str], keep: Callable[[str], bool],
                   limit: int) -> Listing:
    """The names that `keep` accepts and that are, right now, regular single-link files
    reachable without a symlink or a nested repository; at most `limit` of them."""
    out = Listing()
    for name in names:
        if not keep(name):
            continue
        try:
            if root.kind(tuple(name.split("/"))) != "file":
                continue
        except PathRefused:
            continue
        if len(out.entries) >= limit:
            out.more = True
            break
        out.entries.append(name)
    return out


@dataclass
class SearchResult:
    matches: list[str] = field(default_factory=list)
    more: bool = False
    timed_out: bool = False
    files_searched: int = 0


def search_files(root: ConfinedRoot, names: Sequence[str], keep: Callable[[str], bool], compiled: object,
                 *, deadline: float) -> SearchResult:
    """`path:line:text` for each matching line, files in name order, at most 200 matches.
    `compiled` is a `regex` pattern (its `search` takes a timeout); past the deadline the
    search stops with `timed_out`, so a backtracking pattern cannot hold the run."""
    out = SearchResult()
    for name in names:
        if not keep(name):
            continue
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            out.timed_out = True
            return out
        try:
            data, _ = root.read_bytes(tuple(name.split("/")), max_bytes=SEARCH_MAX_FILE_BYTES)
        except PathRefused:
            continue
        if is_binary(data):
            continue
        out.files_searched += 1
        for number, line in enumerate(data.decode("utf-8").splitlines(), 1):
            try:
                found = compiled.search(line, timeout=max(deadline - time.monotonic(), 0.001))  # type: ignore[attr-defined]
            except TimeoutError:
                out.timed_out = True
                return out
            if found is None:
                continue
            if len(out.matches) >= MAX_SEARCH_MATCHES:
                out.more = True
                return out
            shown = line if len(line) <= MAX_MATCH_LINE_CHARS else line[:MAX_MATCH_LINE_CHARS] + " [...]"
            out.matches.append(f"{name}:{number}:{shown}")
    return out
