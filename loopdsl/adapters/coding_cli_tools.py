"""A coding-agent CLI's tool uses, read from its event stream as loopdsl tool events, so that
progress lines, `show`, the transcript, the UI and the OTel spans show them as they show an
`agent` state's own tool calls.

What each CLI prints (see `coding_cli_events` for the rest of the stream):

- Claude Code: an `assistant` message's `content` holds `tool_use` blocks {`id`, `name`,
  `input`}; the next `user` message's `content` holds `tool_result` blocks {`tool_use_id`,
  `content` (a string or a list of `text` blocks), `is_error`}.
- Codex: `item.started` and `item.completed` with an `item` whose `type` is one of
  `command_execution` {`command`, `aggregated_output`, `exit_code`, `status`},
  `file_change` {`changes`: [{`path`, `kind`}], `status`}, `mcp_tool_call` {`server`,
  `tool`, `arguments`, `result`, `error`, `status`} or `web_search` {`query`}; other
  items (messages, reasoning, plans) are not tool uses.

Each use becomes a `tool_started` note and, once its result is read, a `tool_call` note
(`id`, `name`, `summary`, `ok`, `error`, `output`, `truncated`, `duration_s`). Every text
in them came from the CLI, so from the model and the workspace: each is redacted whole and
only then cut to a small bound, so no secret reaches the store and no huge tool output bloats
it. Fields of the wrong type are dropped, never raised on.
"""
from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

from ..runtime.redaction import Redactor
from ..runtime.tools.base import safe_output
from .coding_cli_events import CLAUDE

OUTPUT_LIMIT = 2000  # bytes of a tool's output kept in its event (head and tail)
ERROR_LIMIT = 500
SUMMARY_LIMIT = 60  # as for an agent's own tool calls (`tool read_file src/x.py ok`)
NAME_LIMIT = 100
_OPEN_LIMIT = 1000  # tool uses awaiting a result; a stream opening more is garbage
_SHELL_WRAPPED = re.compile(r"(?:/\S*/)?(?:ba|z)?sh -l?c '([^']*)'", re.DOTALL)
_CODEX_TOOLS = {"command_execution": "shell", "file_change": "edit", "web_search": "web_search"}


class ToolTracker:
    """Turns stream events into tool notes; `feed` returns the notes one event produced."""

    def __init__(self, kind: str, redactor: Redactor, clock: Callable[[], float] = time.monotonic) -> None:
        self.kind, self.redact, self.clock = kind, redactor, clock
        self.open: dict[str, tuple[str, str, float]] = {}  # id -> (name, summary, started at)
        self.turn = 0  # claude: assistant messages seen; codex: turns started

    def feed(self, event: Mapping[str, Any]) -> list[dict[str, Any]]:
        if self.kind == CLAUDE:
            return self._claude(event)
        return self._codex(event)

    def unfinished(self) -> list[dict[str, Any]]:
        """A failed `tool_call` for each use the CLI started but never reported on (it was
        killed, or it ended): every `tool_started` gets its end."""
        notes: list[dict[str, Any]] = []
        for call_id in list(self.open):
            notes += self._finished(call_id, ok=False, output="", error="the CLI ended before this tool use finished")
        return notes

    # ------------------------------------------------------------------ claude
    def _claude(self, event: Mapping[str, Any]) -> list[dict[str, Any]]:
        message = _obj(event.get("message"))
        blocks = [b for b in _list(message.get("content")) if isinstance(b, dict)]
        notes: list[dict[str, Any]] = []
        if event.get("type") == "assistant":
            for block in blocks:
                if block.get("type") == "tool_use":
                    notes += self._started(block.get("id"), _text(block.get("name")) or "tool",
                                           _first_string(block.get("input")))
        elif event.get("type") == "user":
            for block in blocks:
                if block.get("type") == "tool_result":
                    notes += self._finished(block.get("tool_use_id"), ok=block.get("is_error") is not True,
                                            output=_claude_output(block.get("content")))
        return notes

    # ------------------------------------------------------------------ codex
    def _codex(self, event: Mapping[str, Any]) -> list[dict[str, Any]]:
        kind = event.get("type")
        if kind == "turn.started":
            self.turn += 1
            return []
        item = _obj(event.get("item"))
        item_type = item.get("type", item.get("item_type"))
        if kind not in ("item.started", "item.completed") or not isinstance(item_type, str):
            return []
        if item_type == "mcp_tool_call":
            name = f"{_text(item.get('server')) or 'mcp'}.{_text(item.get('tool')) or 'tool'}"
        elif item_type in _CODEX_TOOLS:
            name = _CODEX_TOOLS[item_type]
        else:
            return []
        notes = self._started(item.get("id"), name, _codex_summary(item))
        if kind == "item.completed":
            ok, output, error = _codex_outcome(item)
            notes += self._finished(item.get("id"), ok=ok, output=output, error=error)
        return notes

    # ------------------------------------------------------------------ shared
    def _started(self, raw_id: Any, name: str, summary: str) -> list[dict[str, Any]]:
        call_id = _text(raw_id)
        if call_id is None or call_id[:200] in self.open or len(self.open) >= _OPEN_LIMIT:
            return []
        if self.kind == CLAUDE:
            self.turn = max(self.turn, 1)
        name = self.redact(name)[:NAME_LIMIT]
        shown = self.redact(summary)
        shown = shown if len(shown) <= SUMMARY_LIMIT else shown[: SUMMARY_LIMIT - 3] + "..."
        self.open[call_id[:200]] = (name, shown, self.clock())
        return [{"type": "tool_started", "id": self._shown_id(call_id), "name": name, "summary": shown, "turn": self.turn}]

    def _shown_id(self, call_id: str) -> str:
        """The id as stored: it came from the CLI too (kept whole for pairing, redacted to show)."""
        return self.redact(call_id)[:200]

    def _finished(self, raw_id: Any, *, ok: bool, output: str, error: str | None = None) -> list[dict[str, Any]]:
        call_id = _text(raw_id)
        opened = self.open.pop(call_id[:200], None) if call_id is not None else None
        if opened is None:  # a result for no use we saw (or a repeat): nothing to pair it with
            return []
        name, summary, started = opened
        kept, cut = safe_output(output, limit=OUTPUT_LIMIT, redact=self.redact)
        why = None
        if not ok:
            why, _ = safe_output(error or output or "failed", limit=ERROR_LIMIT, redact=self.redact)
        return [{"type": "tool_call", "id": self._shown_id(call_id), "name": name, "summary": summary, "ok": ok,  # type: ignore[index]
                 "error": why, "output": kept, "truncated": cut, "turn": self.turn,
                 "duration_s": round(max(self.clock() - started, 0.0), 3)}]


def _codex_summary(item: Mapping[str, Any]) -> str:
    command = _text(item.get("command"))
    if command is not None:
        # Codex runs each command as `/bin/bash -lc '<command>'`: the command is what was asked.
        wrapped = _SHELL_WRAPPED.fullmatch(command)
        return wrapped.group(1) if wrapped else command
    if isinstance(item.get("query"), str):
        return str(item["query"])
    paths = [_text(_obj(c).get("path")) for c in _list(item.get("changes"))]
    if any(paths):
        return ", ".join(p for p in paths if p)
    return _first_string(item.get("arguments"))


def _codex_outcome(item: Mapping[str, Any]) -> tuple[bool, str, str | None]:
    """(ok, output, error) of a completed codex item."""
    status = item.get("status")
    exit_code = item.get("exit_code")
    failed = status in ("failed", "declined") or (isinstance(exit_code, int) and exit_code != 0)
    error = _text(_obj(item.get("error")).get("message")) or _text(item.get("error"))
    output = _text(item.get("aggregated_output"))
    if output is None and item.get("result") is not None:
        output = _dump(item.get("result"))
    if output is None and isinstance(item.get("changes"), list):
        output = "\n".join(f"{_text(_obj(c).get('kind')) or 'change'} {_text(_obj(c).get('path')) or '?'}"
                           for c in item["changes"][:200])
    if failed and error is None:
        error = f"exit status {exit_code}" if isinstance(exit_code, int) else f"status {status}"
    return not failed and error is None, output or "", error


def _claude_output(content: Any) -> str:
    if isinstance(content, str):
        return content
    parts = [_text(_obj(b).get("text")) for b in _list(content)]
    return "\n".join(p for p in parts if p)


def _first_string(args: Any) -> str:
    """The first string argument, as an agent's own tool calls are summarised."""
    if isinstance(args, dict):
        for value in args.values():
            if isinstance(value, str):
                return value
    return ""


def _dump(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (ValueError, RecursionError):
        return ""


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _obj(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


__all__ = ["ToolTracker", "OUTPUT_LIMIT"]
