"""The scripted provider: answers LLM calls and checkpoint decisions from a script.

For offline runs and tests, and without LiteLLM (whose import alone takes seconds):
replies are `LlmResponse`s built here, errors are the `ProviderError`s a real provider's
would become (`providers.provider_error`, with the same wording and HTTP status).
Tokens are counted the way dry runs and `loopdsl cost` estimate them, at 3 UTF-8 bytes
a token (`budget.conservative_tokens`), for the reservation and the usage alike, so a
scripted reply's usage never exceeds what was reserved for it; costs come from the same
price table LiteLLM uses (`prices`). `providers` re-exports the public names of this module.

A reply may call tools (`{tool_calls: [{name, args}], text?, usage?}`, for agent states):
`args` is sent as its JSON, or verbatim when it is a string (malformed JSON included),
and the calls get the ids `call_<turn>_<i>`, turn = 1 + the assistant messages of the
request, i from 1, so a script's ids are known in advance.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..runtime.budget import conservative_tokens, cost_for
from ..language.prices import model_price
from ..language.files import read_capped
from ..runtime.model_port import LlmRequest, LlmResponse, ProviderError, ToolCall
from .litellm import provider_error
from ..runtime.errors import ScriptError, ScriptExhausted

SCRIPTED_ERROR_KINDS = ("rate_limit", "timeout", "server_error", "context_window", "connection", "auth")
# The HTTP status a provider answers each kind with (none: no response arrived).
_SCRIPTED_STATUS = {"rate_limit": 429, "server_error": 500, "context_window": 400, "auth": 401}
# Chat formats wrap each message in a few tokens of their own (OpenAI's: 3 or 4).
MESSAGE_FRAME_TOKENS = 4


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
    tool_calls: tuple[tuple[str, str], ...] = ()  # (name, arguments as sent)


def _arguments(args: Any) -> str:
    return args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)


def _entry(raw: Any) -> _Entry:
    """One entry of a script that passed schemas/replies.schema.json."""
    if isinstance(raw, str):
        return _Entry("reply", text=raw)
    if "text" in raw or "tool_calls" in raw:
        usage = raw.get("usage")
        counts = (usage["prompt_tokens"], usage["completion_tokens"]) if usage is not None else None
        calls = tuple((str(c["name"]), _arguments(c.get("args", {}))) for c in raw.get("tool_calls") or ())
        return _Entry("reply", text=str(raw.get("text") or ""), usage=counts, tool_calls=calls)
    if "error" in raw:
        retry_after = raw.get("retry_after")
        return _Entry("error", error=raw["error"], message=str(raw.get("message", f"scripted {raw['error']}")),
                      retry_after=None if retry_after is None else float(retry_after))
    return _Entry("decision", decision=raw["decision"], comment=str(raw.get("comment", "") or ""))


def _message_text(message: Mapping[str, Any]) -> str:
    content = message.get("content") or ""
    text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
    if message.get("tool_calls"):  # an assistant tool turn: its calls are prompt too
        text += json.dumps(message["tool_calls"], ensure_ascii=False)
    return text


def scripted_prompt_tokens(messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] = ()) -> int:
    """A prompt's tokens at 3 bytes a token, plus each message's framing and the tool definitions."""
    counted = sum(conservative_tokens(_message_text(m)) + MESSAGE_FRAME_TOKENS for m in messages)
    if tools:
        counted += conservative_tokens(json.dumps(list(tools), ensure_ascii=False))
    return counted


def conversation_turn(messages: Sequence[Mapping[str, Any]]) -> int:
    """Which turn of an agent conversation a request is: 1 + the assistant messages in it."""
    return 1 + sum(1 for m in messages if m.get("role") == "assistant")


def _scripted_error(entry: _Entry, model: str) -> ProviderError:
    # Charged like the real thing: a timeout or a dropped connection may have been paid.
    return provider_error(entry.error, model, entry.message, status=_SCRIPTED_STATUS.get(entry.error),
                          retry_after=entry.retry_after if entry.error == "rate_limit" else None,
                          billed=entry.error in ("timeout", "connection"))


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
        from ..language.loader import Document
        from ..language.schema import check

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
                data = json.loads(read_capped(file).decode("utf-8"))
            except OSError as exc:
                raise ScriptError(f"{file}: cannot read the script: {exc.strerror or exc}") from None
            except ValueError as exc:
                raise ScriptError(f"{file}: not valid JSON: {exc}") from None
            return cls.from_data(data, str(file))
        from ..language.checked_files import describe, load_checked

        doc, problems = load_checked(file, "replies")
        if problems or doc is None:
            raise ScriptError(describe(problems))
        return cls._parsed(doc.data, str(file))

    def _next(self, state: str, want: str, where: str = "") -> _Entry | None:
        """The state's next entry; `where` (" (attempt 2, turn 3)") places a reply that is missing."""
        entries = self._entries.get(state)
        if entries is None:
            if want == "decision":
                return None
            known = ", ".join(sorted(self._entries)) or "none"
            raise ScriptExhausted(
                f"{self._source}: no scripted reply for state '{state}'{where} (the script has entries for: "
                f"{known}); add `{state}: [...]` to the script"
            )
        used = self._used[state]
        if used >= len(entries):
            if want == "decision":
                return None
            raise ScriptExhausted(
                f"{self._source}: state '{state}'{where} asked for reply {used + 1} but the script has only "
                f"{len(entries)} for it; add more entries under `{state}:`"
            )
        entry = entries[used]
        if (entry.kind == "decision") != (want == "decision"):
            have = "a checkpoint decision" if entry.kind == "decision" else "an LLM reply"
            need = "a checkpoint decision" if want == "decision" else "an LLM reply"
            raise ScriptError(f"{self._source}: {state}[{used}] is {have}, but the state asked for {need}")
        self._used[state] = used + 1
        return entry

    async def complete(self, request: LlmRequest, *, state: str, attempt: int | None = None) -> LlmResponse:
        turn = conversation_turn(request.messages)
        place = ([f"attempt {attempt}"] if attempt is not None else []) + ([f"turn {turn}"] if request.tools else [])
        entry = self._next(state, "reply", f" ({', '.join(place)})" if place else "")
        assert entry is not None
        if entry.kind == "error":
            raise _scripted_error(entry, request.model)
        calls = tuple(ToolCall(id=f"call_{turn}_{i}", name=name, arguments=arguments)
                      for i, (name, arguments) in enumerate(entry.tool_calls, start=1))
        if entry.usage is not None:
            # The scripted prompt size is kept: prompt_tokens_to_reserve reserved for it.
            prompt, completion = entry.usage
        else:
            # Counted as reserved, so budgets behave offline as they would online.
            said = entry.text + "".join(call.name + call.arguments for call in calls)
            prompt, completion = scripted_prompt_tokens(request.messages, request.tools), conservative_tokens(said)
        # A real provider stops at max_tokens; so does a scripted completion.
        completion = min(completion, request.max_tokens)
        price = model_price(request.model)
        return LlmResponse(
            text=entry.text,
            prompt_tokens=prompt,
            completion_tokens=completion,
            cost_usd=None if price is None else cost_for(price, prompt, completion),  # unknown is never $0
            model=request.model,
            tool_calls=calls,
            finish_reason="tool_calls" if calls else "stop",
        )

    def count_tokens(self, model: str, messages: Sequence[Mapping[str, Any]],
                     tools: Sequence[Mapping[str, Any]] = ()) -> int:
        return scripted_prompt_tokens(messages, tools)

    def prompt_tokens_to_reserve(self, model: str, messages: Sequence[Mapping[str, Any]], state: str,
                                 tools: Sequence[Mapping[str, Any]] = ()) -> int:
        """The real count, or the next scripted reply's `usage.prompt_tokens` when larger,
        so that scripted usage never bills more than was reserved (caps hold offline too).
        The engine uses this hook, when a provider has it, instead of `count_tokens`."""
        counted = self.count_tokens(model, messages, tools)
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

    def states(self) -> list[str]:
        """The states the script gives entries for."""
        return list(self._entries)

    def unused(self) -> dict[str, int]:
        """States with scripted entries never consumed, and how many (typos show up here)."""
        return {state: len(entries) - self._used[state]
                for state, entries in self._entries.items() if self._used[state] < len(entries)}

    def unknown_states(self, state_names: Iterable[str]) -> list[str]:
        known = set(state_names)
        return sorted(state for state in self._entries if state not in known)
