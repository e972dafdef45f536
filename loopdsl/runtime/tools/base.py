"""What every tool kind shares: how it is offered to the model, what a call returns, and
how its output is made safe to show the model (redacted on the whole text, then capped).

A tool kind (shell tools, the built-in workspace tools, MCP servers, sub-loops) is a
`ToolBox`; the agent action only sees this protocol, so a crash-resume, a budget kill or a
test's stubbed result treats every kind the same way.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

DEFAULT_TOOL_OUTPUT_LIMIT = 16 * 1024  # bytes; `tool_output_limit` in the loop file
DEFAULT_TOOL_TIMEOUT_S = 120.0
CUT_MARKER = "[... {cut} bytes cut ...]"


@dataclass(frozen=True)
class ToolSpec:
    """One tool as the model is offered it."""

    name: str  # as the model calls it (an MCP tool: `<entry>__<tool>` or its `as` name)
    description: str
    parameters: Mapping[str, Any]  # JSON Schema of an object: the call's arguments
    idempotent: bool = False  # safe to run again after a crash cut it off
    writes: bool = False  # changes the workspace (needs a worktree)

    def definition(self) -> dict[str, Any]:
        """The provider-neutral (OpenAI function) form LiteLLM translates for each provider."""
        return {"type": "function",
                "function": {"name": self.name, "description": self.description,
                             "parameters": dict(self.parameters)}}


@dataclass
class ToolOutcome:
    """What one call produced. `result` is JSON-able and is what the model sees when `ok`;
    otherwise the model sees `{"error": error}`. Never raised: a tool's failure is data."""

    ok: bool
    result: Any = None
    error: str | None = None
    truncated: bool = False
    duration_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. the post-edit hash of edit_file

    @classmethod
    def failure(cls, error: str, duration_s: float = 0.0) -> "ToolOutcome":
        return cls(ok=False, error=error, duration_s=duration_s)

    def message_content(self) -> str:
        """The tool message's content, as the model reads it."""
        payload = self.result if self.ok else {"error": self.error}
        return payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)


class ToolBox(Protocol):
    """A set of tools of one kind, alive for one attempt of an agent state."""

    def specs(self) -> Sequence[ToolSpec]: ...

    async def call(self, name: str, args: Mapping[str, Any], *, call_id: str,
                   timeout: float) -> ToolOutcome: ...

    async def aclose(self) -> None: ...  # stops servers and kills process groups it started


def safe_output(text: str, *, limit: int, redact: Callable[[str], str]) -> tuple[str, bool]:
    """Redact first, on the whole text, so a secret split by the cut cannot survive as two
    halves; then keep the head quarter and the tail three quarters (errors and summaries
    come last) with a marker saying how many bytes were cut. Returns (text, truncated)."""
    text = redact(text)
    data = text.encode("utf-8", errors="replace")
    if len(data) <= limit:
        return text, False
    head = limit // 4
    tail = limit - head
    cut = len(data) - head - tail
    kept_head = data[:head].decode("utf-8", errors="ignore")
    kept_tail = data[len(data) - tail:].decode("utf-8", errors="ignore")
    return f"{kept_head}\n{CUT_MARKER.format(cut=cut)}\n{kept_tail}", True


def check_names(specs: Sequence[ToolSpec]) -> dict[str, ToolSpec]:
    """Index specs by name; two tools offered under one name are a loop author's mistake
    that lint reports, so here it is a programming error."""
    by_name: dict[str, ToolSpec] = {}
    for spec in specs:
        if spec.name in by_name:
            raise ValueError(f"tool {spec.name!r} offered twice")
        by_name[spec.name] = spec
    return by_name
