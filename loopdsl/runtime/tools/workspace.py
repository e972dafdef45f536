"""The built-in workspace tools: read_file, list_files, search_files, write_file, edit_file.

Every path goes through `confined.ConfinedRoot` (see there for what is refused and why);
this module adds the contract's per-tool rules: the writing tools only in a worktree and
never on protected paths unless the agent lists them in `writable`, ignored files only
with `read_ignored`, an agent's `paths:` narrowing, the line, entry and match limits, and
output redacted then capped. A refusal or failure is a `ToolOutcome.failure` the model
reads; nothing here raises for what a model sent.

Crash and resume: reading tools and `write_file` are idempotent (a rerun writes the same
bytes). `edit_file` is not: rerun after it was done, `old` is gone and it fails. Its
outcome carries the file's hash before and after; `planned_edit` gives the after-hash
before the edit runs (to record with `tool_started`), and `edit_done` tells, on resume,
whether the file already has it.
"""
from __future__ import annotations

import asyncio
import hashlib
import os
import stat
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .base import DEFAULT_TOOL_OUTPUT_LIMIT, ToolOutcome, ToolSpec, safe_output
from .confined import PROTECTED_WRITE_GLOBS, ConfinedRoot, PathRefused, split_path
from .globs import any_glob, glob_match
from .workspace_files import (
    GitUnusable,
    MAX_LIST_ENTRIES,
    MAX_SEARCH_MATCHES,
    candidate_files,
    confined_files,
    StartListing,
    is_binary,
    is_ignored,
    pattern_too_big,
    search_files,
    was_ignored,
)

READ_TOOLS = ("read_file", "list_files", "search_files")
WRITE_TOOLS = ("write_file", "edit_file")
BUILTIN_TOOLS = READ_TOOLS + WRITE_TOOLS
DEFAULT_READ_LINES = 2000
MAX_FILE_BYTES = 64 * 1024 * 1024  # read_file/edit_file hold a file in memory: bounded
# A read_file of a tracked file up to this size runs on the event loop: handing it to a thread
# and back costs more (~0.5 ms under load) than reading it.
INLINE_READ_BYTES = 256 * 1024
SEARCH_TIME_LIMIT_S = 20.0  # a search stops here even when the tool's timeout is longer

_PATH = {"type": "string", "description": "relative to the workspace root, '/'-separated"}
_GLOB = {"type": "string", "description": "e.g. '*.py' (any depth) or 'src/**/*.ts' (from the root)"}
SPECS = {
    "read_file": ToolSpec(
        "read_file", f"Read a text file of the workspace, at most `limit` lines (default {DEFAULT_READ_LINES}) "
        "from line `offset` (1-based). A binary file gives its size and sha256.",
        {"type": "object", "properties": {
            "path": _PATH, "offset": {"type": "integer", "minimum": 1, "default": 1},
            "limit": {"type": "integer", "minimum": 1, "default": DEFAULT_READ_LINES}},
         "required": ["path"], "additionalProperties": False}, idempotent=True),
    "list_files": ToolSpec(
        "list_files", f"List the workspace's files (tracked and untracked, not ignored), sorted, "
        f"at most {MAX_LIST_ENTRIES}, under `path` and matching `glob`.",
        {"type": "object", "properties": {"path": {**_PATH, "default": "."}, "glob": _GLOB},
         "additionalProperties": False}, idempotent=True),
    "search_files": ToolSpec(
        "search_files", f"Search the workspace's text files for a Python regular expression, line by "
        f"line; gives path:line:text, at most {MAX_SEARCH_MATCHES} matches.",
        {"type": "object", "properties": {
            "pattern": {"type": "string", "description": "a Python regular expression"},
            "path": {**_PATH, "default": "."}, "glob": _GLOB},
         "required": ["pattern"], "additionalProperties": False}, idempotent=True),
    "write_file": ToolSpec(
        "write_file", "Create or replace a file of the workspace with `content` (UTF-8 text).",
        {"type": "object", "properties": {"path": _PATH, "content": {"type": "string"}},
         "required": ["path", "content"], "additionalProperties": False}, idempotent=True, writes=True),
    "edit_file": ToolSpec(
        "edit_file", "Replace the one occurrence of `old` in a file with `new`; fails if `old` occurs "
        "zero times or more than once (add surrounding lines to make it unique).",
        {"type": "object", "properties": {"path": _PATH, "old": {"type": "string", "minLength": 1},
                                          "new": {"type": "string"}},
         "required": ["path", "old", "new"], "additionalProperties": False}, writes=True),
}


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class ToolFailure(Exception):
    """A tool's failure, caught at `call` and given to the model as its error."""


class WorkspaceTools:
    """The built-in tools over one workspace, for one attempt of an agent state."""

    def __init__(self, root: Path | str, *, writable: bool = False, writable_globs: Iterable[str] = (),
                 read_ignored: bool = False, paths: Iterable[str] = (),
                 output_limit: int = DEFAULT_TOOL_OUTPUT_LIMIT,
                 redactor: Callable[[str], str] | None = None, tools: Iterable[str] | None = None) -> None:
        """`writable` only for a worktree; `writable_globs` the protected paths the agent
        listed in `writable`; `paths` an agent's narrowing (`src/**`); `tools` the names to
        offer (default: all the tools this workspace allows); `redactor` hides the run's
        secrets in what the model reads (before the output cap)."""
        self.root = ConfinedRoot(root)
        self.writable = writable
        self.writable_globs = tuple(writable_globs)
        self.read_ignored = read_ignored
        self.paths = tuple(paths)
        self.output_limit = output_limit
        self.redact = redactor or (lambda text: text)  # a runtime.redaction.Redactor is callable
        names = tuple(tools) if tools is not None else READ_TOOLS + (WRITE_TOOLS if writable else ())
        unknown = [n for n in names if n not in SPECS]
        if unknown:
            raise ValueError(f"not built-in tools: {unknown}")
        self.names = names
        # Started now, at the attempt's start, and collected before any tool of it runs (so
        # before one can edit a `.gitignore`): `_collect_listing`, first thing of every call.
        self._listing = None if read_ignored else StartListing(self.root, timeout=30.0)
        self._ignored: frozenset[str] = frozenset()
        self._tracked: frozenset[str] = frozenset()  # read without asking git (a tracked file is not ignored)
        self._git_problem: GitUnusable | None = None  # reported by every call that needs git

    async def ready(self) -> None:
        """Waits for git's listing taken at the start: an agent calls this before the first
        call of any of its tools, so none (a shell tool, say) can change a `.gitignore`
        before git has read it."""
        if self._listing is not None and not self._listing.done():
            await asyncio.to_thread(self._listing.result)  # waits off the event loop (a hung git)
        self._collect_listing()

    def _collect_listing(self) -> None:
        if self._listing is None:
            return
        try:
            self._ignored, self._tracked = self._listing.result()
        except GitUnusable as exc:
            self._git_problem = exc
        self._listing = None

    def specs(self) -> Sequence[ToolSpec]:
        return [SPECS[name] for name in self.names]

    async def call(self, name: str, args: Mapping[str, Any], *, call_id: str, timeout: float) -> ToolOutcome:
        started = time.monotonic()
        if self._quick(name, args):
            outcome = self.call_sync(name, args, timeout)
        else:  # git processes, directory walks, big files: off the event loop
            outcome = await asyncio.to_thread(self.call_sync, name, args, timeout)
        outcome.duration_s = time.monotonic() - started
        return outcome

    def _quick(self, name: str, args: Mapping[str, Any]) -> bool:
        """A read_file of a small regular file tracked at the start: no git process to wait
        for, one short read. The lstat is only where to run it; `call_sync` checks everything."""
        if name != "read_file" or not isinstance(args, Mapping):
            return False
        if self._listing is not None:
            if not self._listing.done():  # git still lists: wait for it in the thread
                return False
            self._collect_listing()
        path = args.get("path")
        if not isinstance(path, str) or path not in self._tracked:
            return False
        try:
            found = os.stat(path, dir_fd=self.root.fd, follow_symlinks=False)
        except (OSError, ValueError):
            return False
        return stat.S_ISREG(found.st_mode) and found.st_size <= INLINE_READ_BYTES

    def call_sync(self, name: str, args: Mapping[str, Any], timeout: float) -> ToolOutcome:
        """The call itself (blocking); `call` runs it in a thread."""
        self._collect_listing()
        try:
            if name not in self.names:
                raise ToolFailure(f"unknown tool {name!r}; this agent has: {', '.join(self.names)}")
            if not isinstance(args, Mapping):
                raise ToolFailure("arguments must be a JSON object")
            unknown = sorted(map(str, set(args) - set(SPECS[name].parameters["properties"])))
            if unknown:
                raise ToolFailure(f"unknown argument(s) {', '.join(unknown)} for {name}")
            result, extra = getattr(self, "_" + name)(args, time.monotonic() + timeout)
        except (ToolFailure, PathRefused, GitUnusable) as exc:
            return self._failed(str(exc))
        except OSError as exc:  # the file system said no (full disk, permissions): data too
            return self._failed(f"{name} failed: {exc.strerror or exc}")
        except Exception as exc:  # noqa: BLE001 - a tool's failure never crashes the run
            return self._failed(f"{name} failed: {type(exc).__name__}: {exc}")
        if isinstance(result, str):
            text, truncated = safe_output(result, limit=self.output_limit, redact=self.redact)
            return ToolOutcome(ok=True, result=text, truncated=truncated, extra=extra)
        shown = {k: self.redact(v) if isinstance(v, str) else v for k, v in result.items()}
        return ToolOutcome(ok=True, result=shown, extra=extra)

    async def aclose(self) -> None:
        if self._listing is not None:  # no tool was called: git's listing is not waited for
            self._listing.close()
        self.root.close()

    def _failed(self, message: str) -> ToolOutcome:
        text, _ = safe_output(message, limit=min(self.output_limit, 4096), redact=self.redact)
        return ToolOutcome.failure(text)

    # -- argument and path rules -------------------------------------------------------

    def _resolve(self, args: Mapping[str, Any], key: str = "path", *, default: str | None = None,
                 writing: bool = False) -> tuple[str, tuple[str, ...]]:
        raw = args.get(key, default)
        parts = split_path(raw, allow_root=default is not None)
        rel = "/".join(parts)
        # A directory to list or search is not narrowed here: its entries are, one by one.
        if self.paths and default is None and not any_glob(self.paths, rel):
            raise PathRefused(f"{rel!r} is outside the paths this agent may use ({', '.join(self.paths)})")
        if writing:
            if not self.writable:
                raise ToolFailure("writing tools need `workspace: {worktree: true}`; this workspace is read-only")
            if any_glob(PROTECTED_WRITE_GLOBS, rel) and not any_glob(self.writable_globs, rel):
                raise PathRefused(f"{rel!r} is protected (CI, git or tool configuration); "
                                  "the agent must list it in `writable` to change it")
        return rel, parts

    def _check_readable(self, rel: str, deadline: float) -> None:
        if self.read_ignored:
            return
        if self._git_problem:
            raise self._git_problem
        if rel in self._tracked:  # tracked at the start (before any tool of this attempt ran)
            return
        if was_ignored(self._ignored, rel) or is_ignored(
                self.root, rel, timeout=max(deadline - time.monotonic(), 1.0)):
            raise PathRefused(f"{rel!r} is ignored by git (it may hold credentials); "
                              "reading ignored files needs `read_ignored: true`")

    def _keep(self, prefix: str, glob: str | None) -> Callable[[str], bool]:
        ignored = self._ignored

        def keep(name: str) -> bool:
            if prefix and name != prefix and not name.startswith(prefix + "/"):
                return False
            if glob is not None and not glob_match(glob, name, basename_if_no_slash=True):
                return False
            if self.paths and not any_glob(self.paths, name):
                return False
            return not ignored or not was_ignored(ignored, name)
        return keep

    def _names(self, deadline: float) -> list[str]:
        if self._git_problem:
            raise self._git_problem
        return candidate_files(self.root, ignored=self.read_ignored,
                               timeout=max(deadline - time.monotonic(), 1.0))

    # -- the tools: each returns (result, extra) -----------------------------------------

    def _read_file(self, args: Mapping[str, Any], deadline: float) -> tuple[Any, dict[str, Any]]:
        rel, parts = self._resolve(args)
        offset = _positive_int(args, "offset", 1)
        limit = _positive_int(args, "limit", DEFAULT_READ_LINES)
        data, size = self.root.read_bytes(parts, max_bytes=MAX_FILE_BYTES)  # confinement first
        self._check_readable(rel, deadline)
        if is_binary(data):
            return {"path": rel, "binary": True, "size": size, "sha256": sha256_hex(data)}, {}
        lines = data.decode("utf-8").splitlines(keepends=True)
        chosen = lines[offset - 1:offset - 1 + limit]
        text = "".join(chosen)
        if offset > 1 or offset - 1 + limit < len(lines):
            last = offset - 1 + len(chosen)
            more = f"; read on with offset={last + 1}" if last < len(lines) else ""
            text += f"{'' if text.endswith(chr(10)) or not text else chr(10)}[lines {offset}-{last} of {len(lines)}{more}]"
        return text, {}

    def _list_files(self, args: Mapping[str, Any], deadline: float) -> tuple[Any, dict[str, Any]]:
        rel, parts = self._resolve(args, default=".")
        glob = _optional_str(args, "glob")
        self.root.kind(parts)  # a missing directory or a nested repository is an error, not "no files"
        listing = confined_files(self.root, self._names(deadline), self._keep(rel, glob), MAX_LIST_ENTRIES)
        if not listing.entries:
            return "(no files)", {}
        note = f"\n[first {MAX_LIST_ENTRIES} entries; narrow with path or glob]" if listing.more else ""
        return "\n".join(listing.entries) + note, {}

    def _search_files(self, args: Mapping[str, Any], deadline: float) -> tuple[Any, dict[str, Any]]:
        import regex  # the engine whose matching takes a timeout (as for JSON Schema patterns)

        pattern = args.get("pattern")
        if not isinstance(pattern, str) or not pattern:
            raise ToolFailure("pattern must be a non-empty string")
        if problem := pattern_too_big(pattern):
            raise ToolFailure(problem)
        rel, parts = self._resolve(args, default=".")
        glob = _optional_str(args, "glob")
        try:
            compiled = regex.compile(pattern, regex.VERSION0)
        except (regex.error, OverflowError, RecursionError, ValueError) as exc:
            raise ToolFailure(f"invalid regular expression: {exc}") from None
        self.root.kind(parts)
        deadline = min(deadline, time.monotonic() + SEARCH_TIME_LIMIT_S)
        found = search_files(self.root, self._names(deadline), self._keep(rel, glob), compiled, deadline=deadline)
        if found.timed_out and not found.matches:
            raise ToolFailure("the search ran past its time limit (a pattern that backtracks without end?); "
                              "simplify the pattern or narrow path/glob")
        lines = found.matches or ["(no matches)"]
        if found.more:
            lines.append(f"[first {MAX_SEARCH_MATCHES} matches; narrow with path or glob]")
        if found.timed_out:
            lines.append("[search stopped at its time limit; results are partial]")
        return "\n".join(lines), {}

    def _write_file(self, args: Mapping[str, Any], deadline: float) -> tuple[Any, dict[str, Any]]:
        rel, parts = self._resolve(args, writing=True)
        content = args.get("content")
        if not isinstance(content, str):
            raise ToolFailure("content must be a string")
        data = _utf8(content)
        self.root.write_bytes(parts, data)
        digest = sha256_hex(data)
        return {"path": rel, "bytes": len(data), "sha256": digest}, {"path": rel, "sha256": digest}

    def _edit_file(self, args: Mapping[str, Any], deadline: float) -> tuple[Any, dict[str, Any]]:
        rel, parts = self._resolve(args, writing=True)
        before, after = self._edited(rel, parts, args, deadline)
        self.root.write_bytes(parts, after, must_exist=True)
        digest = sha256_hex(after)
        return ({"path": rel, "sha256": digest},
                {"path": rel, "sha256": digest, "sha256_before": sha256_hex(before)})

    def _edited(self, rel: str, parts: tuple[str, ...], args: Mapping[str, Any],
                deadline: float) -> tuple[bytes, bytes]:
        old, new = args.get("old"), args.get("new")
        if not isinstance(old, str) or not old or not isinstance(new, str):
            raise ToolFailure("old must be a non-empty string and new a string")
        data, _ = self.root.read_bytes(parts, max_bytes=MAX_FILE_BYTES)  # confinement first
        self._check_readable(rel, deadline)
        if is_binary(data):
            raise ToolFailure(f"{rel!r} is a binary file; edit_file changes text files")
        text = data.decode("utf-8")
        first = text.find(old)
        if first < 0:
            raise ToolFailure(f"old text not found in {rel!r}; read the file and copy the text exactly")
        if text.find(old, first + 1) >= 0:
            raise ToolFailure(f"old text occurs more than once in {rel!r}; include more surrounding lines")
        return data, _utf8(text[:first] + new + text[first + len(old):])

    # -- crash and resume ----------------------------------------------------------------

    def planned_edit(self, args: Mapping[str, Any]) -> str | None:
        """The sha256 the file will have once this edit_file call is done (None if it would
        fail): recorded before the call so a resume can tell whether it happened."""
        self._collect_listing()
        try:
            rel, parts = self._resolve(args, writing=True)
            return sha256_hex(self._edited(rel, parts, args, time.monotonic() + 30.0)[1])
        except (ToolFailure, PathRefused, OSError, UnicodeError):
            return None

    def edit_done(self, path: str, sha256: str) -> bool:
        return edit_done(self.root, path, sha256)


def edit_done(root: ConfinedRoot | Path | str, path: str, sha256: str) -> bool:
    """An edit_file call cut off by a crash is done when its file has the recorded
    post-edit hash (then it is not run again; otherwise it is, or a person decides)."""
    confined = root if isinstance(root, ConfinedRoot) else ConfinedRoot(root)
    try:
        data, _ = confined.read_bytes(split_path(path), max_bytes=MAX_FILE_BYTES)
        return sha256_hex(data) == sha256
    except (PathRefused, OSError):
        return False
    finally:
        if confined is not root:
            confined.close()


def _positive_int(args: Mapping[str, Any], key: str, default: int) -> int:
    value = args.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ToolFailure(f"{key} must be a positive integer")
    return value


def _optional_str(args: Mapping[str, Any], key: str) -> str | None:
    value = args.get(key)
    if value is not None and not isinstance(value, str):
        raise ToolFailure(f"{key} must be a string")
    return value or None


def _utf8(text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise ToolFailure("content is not valid Unicode (a lone surrogate)") from None
