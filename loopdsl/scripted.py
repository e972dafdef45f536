"""The scripted provider: answers LLM calls and checkpoint decisions from a script.

For offline runs and tests. It still goes through `litellm.acompletion(mock_response=...)`,
so its responses, usage, cost and exceptions are LiteLLM's own objects and take the same
path as real ones (see `providers`, which re-exports the public names of this module).
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .providers import (
    _FORCED,
    LlmRequest,
    LlmResponse,
    _acompletion,
    _response_to_llm,
    count_prompt_tokens,
    ensure_litellm,
)

SCRIPTED_ERROR_KINDS = ("rate_limit", "timeout", "server_error", "context_window", "connection", "auth")


class ScriptExhausted(Exception):
    """The script has no reply left for a state that asked for one."""


class ScriptError(ValueError):
    """The script file itself is wrong (where, what, how to fix)."""


@dataclass(frozen=True)
class _Entry:
    kind: str  # "reply" | "error" | "decision"
    text: str = ""
    usage: tuple[int, int] | None = None
    error: str = ""
    message: str = ""
    retry_after: float | None = None
    decision: str = ""
    comment: str = ""


def _entry(raw: Any) -> _Entry:
    """One entry of a script that passed schemas/replies.schema.json."""
    if isinstance(raw, str):
        return _Entry("reply", text=raw)
    if "text" in raw:
        usage = raw.get("usage")
        counts = (usage["prompt_tokens"], usage["completion_tokens"]) if usage is not None else None
        return _Entry("reply", text=raw["text"], usage=counts)
    if "error" in raw:
        retry_after = raw.get("retry_after")
        return _Entry("error", error=raw["error"], message=str(raw.get("message", f"scripted {raw['error']}")),
                      retry_after=None if retry_after is None else float(retry_after))
    return _Entry("decision", decision=raw["decision"], comment=str(raw.get("comment", "") or ""))


def _scripted_exception(litellm: Any, entry: _Entry, model: str) -> Exception:
    common = {"message": entry.message, "llm_provider": "scripted", "model": model}
    if entry.error == "rate_limit":
        headers = {"retry-after": f"{entry.retry_after:g}"} if entry.retry_after is not None else None
        return litellm.RateLimitError(**common, headers=headers)
    classes = {"timeout": "Timeout", "server_error": "InternalServerError", "context_window": "ContextWindowExceededError",
               "connection": "APIConnectionError", "auth": "AuthenticationError"}
    return getattr(litellm, classes[entry.error])(**common)


class ScriptedProvider:
    """Answers LLM calls and checkpoint decisions from a script, per state, in order."""

    def __init__(self, script: Mapping[str, Sequence[_Entry]], source: str = "<script>") -> None:
        self._source = source
        self._entries = {state: list(entries) for state, entries in script.items()}
        self._used = {state: 0 for state in script}

    @classmethod
    def from_data(cls, data: Any, source: str = "<script>") -> ScriptedProvider:
        """Replies given as data (inline in a test, or from Python), checked against
        schemas/replies.schema.json; ScriptError says what is wrong and where."""
        from .loader import Document
        from .schema import check

        problems = check(Document(path=source, text="", data=data), "replies")
        if problems:  # no line numbers here: the message names the place (`draft[0].error`)
            raise ScriptError("\n".join(f"{source}: {d.message}" + (f" (hint: {d.hint})" if d.hint else "")
                                         for d in problems))
        return cls._parsed(data, source)

    @classmethod
    def _parsed(cls, data: Mapping[str, Any], source: str) -> ScriptedProvider:
        parsed: dict[str, list[_Entry]] = {}
        for state, entries in data.items():
            items = entries if isinstance(entries, (list, tuple)) else [entries]
            parsed[str(state)] = [_entry(item) for item in items]
        return cls(parsed, source)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> ScriptedProvider:
        """A `*.replies.yaml` (or .json) file, checked against schemas/replies.schema.json with
        `file:line:col` for every problem."""
        file = Path(path)
        if file.suffix.lower() == ".json":
            try:
                data = json.loads(file.read_text(encoding="utf-8"))
            except OSError as exc:
                raise ScriptError(f"{file}: cannot read the script: {exc.strerror or exc}") from None
            except ValueError as exc:
                raise ScriptError(f"{file}: not valid JSON: {exc}") from None
            return cls.from_data(data, str(file))
        from .schema_files import describe, load_checked

        doc, problems = load_checked(file, "replies")
        if problems or doc is None:
            raise ScriptError(describe(problems))
        return cls._parsed(doc.data, str(file))

    def _next(self, state: str, want: str) -> _Entry | None:
        entries = self._entries.get(state)
        if entries is None:
            if want == "decision":
                return None
            known = ", ".join(sorted(self._entries)) or "none"
            raise ScriptExhausted(
                f"{self._source}: no scripted reply for state '{state}' (the script has entries for: {known}); "
                f"add `{state}: [...]` to the script"
            )
        used = self._used[state]
        if used >= len(entries):
            if want == "decision":
                return None
            raise ScriptExhausted(
                f"{self._source}: state '{state}' asked for reply {used + 1} but the script has only "
                f"{len(entries)} for it; add more entries under `{state}:`"
            )
        entry = entries[used]
        if (entry.kind == "decision") != (want == "decision"):
            have = "a checkpoint decision" if entry.kind == "decision" else "an LLM reply"
            need = "a checkpoint decision" if want == "decision" else "an LLM reply"
            raise ScriptError(f"{self._source}: {state}[{used}] is {have}, but the state asked for {need}")
        self._used[state] = used + 1
        return entry

    async def complete(self, request: LlmRequest, *, state: str) -> LlmResponse:
        entry = self._next(state, "reply")
        assert entry is not None
        litellm = ensure_litellm()
        messages = [dict(m) for m in request.messages]
        if entry.kind == "error":
            mock: Any = _scripted_exception(litellm, entry, request.model)
        else:
            if entry.usage is not None:
                # A real provider stops at max_tokens; so does a scripted completion. The
                # scripted prompt size is kept: count_tokens reserved for it (see there).
                prompt, completion = entry.usage
                completion = min(completion, request.max_tokens)
            else:
                # Realistic usage so budgets behave offline as they would online; a real
                # provider stops at max_tokens, so the completion count does too.
                prompt = int(litellm.token_counter(model=request.model, messages=messages))
                completion = min(request.max_tokens, int(litellm.token_counter(model=request.model, text=entry.text)))
            # A response mapping (not a bare string) so LiteLLM keeps this usage and prices it.
            mock = {
                "model": request.model,
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": entry.text}}],
                "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                          "total_tokens": prompt + completion},
            }
        kwargs = {"model": request.model, "messages": messages, "max_tokens": request.max_tokens,
                  "mock_response": mock, **_FORCED}
        response = await _acompletion(litellm, kwargs, request, ())
        return _response_to_llm(litellm, response, request)

    def count_tokens(self, model: str, messages: Sequence[Mapping[str, str]]) -> int:
        return count_prompt_tokens(model, messages)

    def prompt_tokens_to_reserve(self, model: str, messages: Sequence[Mapping[str, str]], state: str) -> int:
        """The real count, or the next scripted reply's `usage.prompt_tokens` when larger,
        so that scripted usage never bills more than was reserved (caps hold offline too).
        The engine uses this hook, when a provider has it, instead of `count_tokens`."""
        counted = self.count_tokens(model, messages)
        entries = self._entries.get(state) or []
        used = self._used.get(state, 0)
        usage = entries[used].usage if used < len(entries) else None
        if usage is not None:
            counted = max(counted, int(usage[0]))
        return counted

    def decision(self, state: str) -> dict[str, str] | None:
        entry = self._next(state, "decision")
        return None if entry is None else {"decision": entry.decision, "comment": entry.comment}

    def skip_used(self, counts: Mapping[str, int]) -> None:
        """Continue a resumed run's script where the killed process left it: `counts` is how
        many replies and decisions each state had already taken."""
        for state, count in counts.items():
            if state in self._entries:
                self._used[state] = min(int(count), len(self._entries[state]))

    def unused(self) -> dict[str, int]:
        """States with scripted entries never consumed, and how many (typos show up here)."""
        return {state: len(entries) - self._used[state]
                for state, entries in self._entries.items() if self._used[state] < len(entries)}

    def unknown_states(self, state_names: Iterable[str]) -> list[str]:
        known = set(state_names)
        return sorted(state for state in self._entries if state not in known)
