"""Codex's live spend, read from its session log.

`codex exec --json` reports token usage only in `turn.completed`, and one `codex exec` is
one turn: a run that keeps calling the model would be seen spending nothing until it ends.
Codex also appends every event of the session to `$CODEX_HOME/sessions/YYYY/MM/DD/
rollout-*.jsonl`, among them, after each model request, an `event_msg` whose payload is
`{"type": "token_count", "info": {"total_token_usage": {...}}}` (cumulative for the
session). The config home is a fresh directory of this attempt, so every such log under it
is this run's: `RolloutTail` reads what was appended since the last look.

The log is written by the CLI (which, at `permissions: full`, could write anything): lines
are parsed as hostile input, each log is read at most `MAX_BYTES` in all, and a number
found there can only raise the spend (the reader keeps the larger reading).
"""
from __future__ import annotations

import itertools
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .coding_cli_events import parse_line
from .coding_cli_stream import LineSplitter

MAX_BYTES = 64 * 1024 * 1024  # per log; past this the rest of it is not read
MAX_LOGS = 16  # one session per attempt; a few more tolerated (a forked thread)
POLL_S = 0.2


class RolloutTail:
    """Reads the `token_count` totals appended to the session logs under `root`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._read: dict[Path, int] = {}  # bytes already read per log
        self._splitters: dict[Path, LineSplitter] = {}

    def totals(self) -> Iterator[dict[str, Any]]:
        """Each `total_token_usage` object appended since the last call, in order."""
        for log in self._logs():
            for line, oversized in self._new_lines(log):
                event = None if oversized else parse_line(line)
                total = _total_usage(event) if event is not None else None
                if total is not None:
                    yield total

    def _logs(self) -> list[Path]:
        # The layout is the CLI's to make, or break: only real folders are walked (a
        # `sessions` linked to /proc or / would be walked every poll, and its entries vanish
        # mid-walk), at most MAX_LOGS entries a level, and a folder that goes away is skipped.
        levels = [self.root / "sessions"]
        for _ in range(3):  # YYYY/MM/DD
            levels = [entry for folder in levels for entry in _entries(folder) if entry.is_dir(follow_symlinks=False)]
        found = [Path(entry.path) for folder in levels for entry in _entries(folder)
                 if entry.name.startswith("rollout-") and entry.name.endswith(".jsonl")
                 and entry.is_file(follow_symlinks=False)]
        return sorted(found)[:MAX_LOGS]

    def _new_lines(self, log: Path) -> Iterator[tuple[bytes, bool]]:
        done = self._read.get(log, 0)
        if done >= MAX_BYTES:
            return
        try:
            # Not following a link, and not blocking: the log may have been swapped for a
            # FIFO since it was listed, whose open would wait for a writer forever.
            fd = os.open(log, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as handle:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    return
                handle.seek(done)
                chunk = handle.read(MAX_BYTES - done)
        except OSError:
            return
        self._read[log] = done + len(chunk)
        # Only whole lines are taken: the splitter keeps a partly written last line for later.
        yield from self._splitters.setdefault(log, LineSplitter()).feed(chunk) if chunk else ()


def _entries(folder: Any) -> list[os.DirEntry[str]]:
    """The first MAX_LOGS entries of a real folder, by name; none when it is not one (or is gone)."""
    path = folder.path if isinstance(folder, os.DirEntry) else folder
    try:
        if isinstance(folder, Path) and not stat.S_ISDIR(os.lstat(path).st_mode):
            return []
        with os.scandir(path) as scan:  # a folder of a million entries is not read whole
            return sorted(itertools.islice(scan, 4 * MAX_LOGS), key=lambda entry: entry.name)[:MAX_LOGS]
    except OSError:
        return []


def _total_usage(event: dict[str, Any]) -> dict[str, Any] | None:
    payload = event.get("payload")
    if event.get("type") != "event_msg" or not isinstance(payload, dict) or payload.get("type") != "token_count":
        return None
    info = payload.get("info")
    total = info.get("total_token_usage") if isinstance(info, dict) else None
    return total if isinstance(total, dict) else None
