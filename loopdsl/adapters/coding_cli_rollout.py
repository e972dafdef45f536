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
        sessions = self.root / "sessions"
        if not sessions.is_dir():
            return []
        found = sorted(p for p in sessions.glob("*/*/*/rollout-*.jsonl") if p.is_file() and not p.is_symlink())
        return found[:MAX_LOGS]

    def _new_lines(self, log: Path) -> Iterator[tuple[bytes, bool]]:
        done = self._read.get(log, 0)
        if done >= MAX_BYTES:
            return
        try:
            with log.open("rb") as handle:
                handle.seek(done)
                chunk = handle.read(MAX_BYTES - done)
        except OSError:
            return
        self._read[log] = done + len(chunk)
        # Only whole lines are taken: the splitter keeps a partly written last line for later.
        yield from self._splitters.setdefault(log, LineSplitter()).feed(chunk) if chunk else ()


def _total_usage(event: dict[str, Any]) -> dict[str, Any] | None:
    payload = event.get("payload")
    if event.get("type") != "event_msg" or not isinstance(payload, dict) or payload.get("type") != "token_count":
        return None
    info = payload.get("info")
    total = info.get("total_token_usage") if isinstance(info, dict) else None
    return total if isinstance(total, dict) else None
