"""Reading a coding-agent CLI's event stream: what it spent, what it said, how it ended.

Both CLIs print one JSON object per line on stdout (NDJSON):

- Claude Code (`claude -p --output-format stream-json --verbose`): `system` (init),
  `assistant` events whose `message` has an `id`, `content` blocks and a `usage` with
  `input_tokens`, `output_tokens`, `cache_creation_input_tokens`, `cache_read_input_tokens`
  (one message may be printed several times, once per content block, with the same usage),
  `user` events (tool results), and last a `result` event: `subtype` (`success`,
  `error_max_turns`, `error_max_budget_usd`, `error_during_execution`), `is_error`,
  `num_turns`, `result` (the final text), `total_cost_usd` (cumulative) and `usage`.
- Codex (`codex exec --json`): `thread.started`, `turn.started`, `item.started|updated|
  completed` (an `item` with a `type`: `agent_message` has the reply's `text`),
  `turn.completed` with `usage` {`input_tokens` (cached ones included), `cached_input_tokens`,
  `cache_write_input_tokens`, `output_tokens`, `reasoning_output_tokens`}, `turn.failed`
  {`error`: {`message`}} and `error` {`message`}. Codex reports tokens only, never a cost:
  they are priced from the price table. `codex exec` runs one turn, so its stream reports
  usage only at the very end; the live spend comes from the `token_count` records codex
  writes to its session log after every model request (`coding_cli_rollout`).
  Verified against codex-cli 0.171.0 and Claude Code 2.1.332.

Every line is hostile input: a line that is not JSON, not an object, or has fields of the
wrong type is skipped field by field, never raised on. The `Meter` turns what was read into
money as it arrives: priced tokens and reported cumulative costs, whichever is higher, so the
amount charged never runs behind what the CLI itself says it spent.
"""
from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..language.bounded_json import without_lone_surrogates
from ..language.model import Price

CLAUDE = "claude-code"
CODEX = "codex"
KINDS = (CLAUDE, CODEX)

USAGE_CLASSES = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")
# No single CLI run reads or writes a billion tokens, nor reports a million dollars: a larger
# number is garbage, not spend.
_MAX_TOKENS = 10**9
_MAX_USD = 1e6
_TOKENS_PER_MTOK = 1_000_000

# Words with which the CLIs (and the APIs behind them) say a key is missing or refused.
_AUTH_MARKERS = (
    "invalid api key", "invalid x-api-key", "authentication", "unauthorized", "401",
    "not logged in", "please run /login", "api key", "missing bearer", "incorrect api key",
)


@dataclass(frozen=True)
class TokenPrices:
    """USD per million tokens for each class of usage a CLI reports."""

    input_per_mtok: float
    output_per_mtok: float
    cache_read_per_mtok: float
    cache_write_per_mtok: float

    @classmethod
    def from_entry(cls, entry: Mapping[str, Any]) -> TokenPrices | None:
        """From a LiteLLM price-table entry (`prices.model_info`); None without input and
        output prices. A missing cache price is the uncached input price (never less)."""
        per_input = _per_mtok(entry.get("input_cost_per_token"))
        per_output = _per_mtok(entry.get("output_cost_per_token"))
        if per_input is None or per_output is None:
            return None
        read = _per_mtok(entry.get("cache_read_input_token_cost"))
        write = _per_mtok(entry.get("cache_creation_input_token_cost"))
        return cls(per_input, per_output, per_input if read is None else read,
                   per_input if write is None else write)

    @classmethod
    def from_price(cls, price: Price) -> TokenPrices:
        """From an alias's `price:` (input and output only): cache tokens at the input rate,
        and the dearest tier, since a CLI does not say how large each call's prompt was."""
        per_input = max([price.input_per_mtok, *(t[1] for t in price.tiers)])
        per_output = max([price.output_per_mtok, *(t[2] for t in price.tiers)])
        return cls(per_input, per_output, per_input, per_input)

    def cost(self, usage: Mapping[str, int]) -> float:
        return (usage.get("input_tokens", 0) * self.input_per_mtok
                + usage.get("output_tokens", 0) * self.output_per_mtok
                + usage.get("cache_read_tokens", 0) * self.cache_read_per_mtok
                + usage.get("cache_write_tokens", 0) * self.cache_write_per_mtok) / _TOKENS_PER_MTOK


def _per_mtok(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        return None
    return float(value) * _TOKENS_PER_MTOK


def tokens(value: Any) -> int:
    """A reported token count, or 0 when it is not a plausible one."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_TOKENS:
        return 0
    return value


def usd(value: Any) -> float | None:
    """A reported cost in USD, or None when it is not a plausible one."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if not math.isfinite(value) or not 0 <= value <= _MAX_USD:
        return None
    return float(value)


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _obj(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def zero_usage() -> dict[str, int]:
    return dict.fromkeys(USAGE_CLASSES, 0)


@dataclass
class StreamState:
    """What one run's events said so far."""

    usage: dict[str, int] = field(default_factory=zero_usage)
    reported_cost_usd: float | None = None  # the CLI's own cumulative cost, when it gives one
    turns: int = 0
    text: str | None = None  # the final message (or the last one seen so far)
    finished: bool = False  # the stream's own end event arrived
    subtype: str | None = None  # claude's result subtype
    is_error: bool = False
    errors: list[str] = field(default_factory=list)
    hopeless: str | None = None  # why the run can only fail (the key was refused): stop it now


# Message ids whose repeats are recognised: a real attempt has a few hundred; a stream of
# millions (a hostile CLI) must not grow memory, nor the work of each event.
MAX_MESSAGE_IDS = 10_000


class ClaudeReader:
    """Folds Claude Code stream-json events into a `StreamState`."""

    def __init__(self) -> None:
        self.state = StreamState()
        self._by_message: dict[str, dict[str, int]] = {}  # usage per message id (max seen)
        self._live = zero_usage()  # the sum over messages, kept as they come (not re-summed per event)
        self._messages = 0  # messages seen: the turns so far
        self._result_usage = zero_usage()

    def feed(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        if kind == "assistant":
            self._assistant(_obj(event.get("message")))
        elif kind == "result":
            self._result(event)
        elif kind == "system" and event.get("subtype") == "api_retry":
            # Claude Code 2.1 retries a refused key (401/403) ten times with backoff, minutes
            # in all: the first refusal is the answer.
            status = event.get("error_status")
            if event.get("error") == "authentication_failed" or status in (401, 403):
                reason = f"the provider refused the API key (HTTP {status if isinstance(status, int) else '401'})"
                self.state.hopeless = reason
                self.state.errors.append(reason)

    def _assistant(self, message: Mapping[str, Any]) -> None:
        usage = _claude_usage(_obj(message.get("usage")))
        key = _text(message.get("id"))
        seen = self._by_message.get(key[:200]) if key is not None else None
        if seen is None and key is not None and len(self._by_message) < MAX_MESSAGE_IDS:
            seen = self._by_message[key[:200]] = zero_usage()
            self._messages += 1
        if seen is None:
            # No id, or past the ids kept: added whole, every time (a repeat is counted
            # again, which can only raise the spend).
            self._messages += key is not None
            for name in USAGE_CLASSES:
                self._live[name] += usage[name]
        else:
            # The same message is printed once per content block, each time with its usage.
            for name in USAGE_CLASSES:
                if usage[name] > seen[name]:
                    self._live[name] += usage[name] - seen[name]
                    seen[name] = usage[name]
        texts = [_text(b.get("text")) for b in message.get("content") or () if isinstance(b, dict)
                 and b.get("type") == "text"] if isinstance(message.get("content"), list) else []
        said = "".join(t for t in texts if t)
        if said:
            self.state.text = said
        self._settle()

    def _result(self, event: Mapping[str, Any]) -> None:
        state = self.state
        state.finished = True
        state.subtype = _text(event.get("subtype"))
        state.is_error = event.get("is_error") is True
        text = _text(event.get("result"))
        if text is not None:
            state.text = text
        if state.is_error and text:
            state.errors.append(text)
        # An error result (`error_max_budget_usd`, ...) has no `result`; it says why in `errors`.
        errors = event.get("errors")
        state.errors += [e[:4000] for e in errors[:20] if isinstance(e, str)] if isinstance(errors, list) else []
        cost = usd(event.get("total_cost_usd"))
        if cost is not None:
            state.reported_cost_usd = max(cost, state.reported_cost_usd or 0.0)
        # Claude Code 2.1 reports a zeroed `usage` on an error result (a budget stop); the
        # per-model totals in `modelUsage` still hold what was used. The larger reading wins.
        usage, per_model = _claude_usage(_obj(event.get("usage"))), _model_usage(_obj(event.get("modelUsage")))
        self._result_usage = {n: max(usage[n], per_model[n]) for n in USAGE_CLASSES}
        turns = event.get("num_turns")
        if isinstance(turns, int) and not isinstance(turns, bool) and 0 <= turns <= _MAX_TOKENS:
            state.turns = max(state.turns, turns)
        self._settle()

    def _settle(self) -> None:
        # The result's usage is the run's total; the per-message sum is what was seen live.
        self.state.usage = {n: max(self._live[n], self._result_usage[n]) for n in USAGE_CLASSES}
        self.state.turns = max(self.state.turns, self._messages)


def _claude_usage(raw: Mapping[str, Any]) -> dict[str, int]:
    return {"input_tokens": tokens(raw.get("input_tokens")),
            "output_tokens": tokens(raw.get("output_tokens")),
            "cache_read_tokens": tokens(raw.get("cache_read_input_tokens")),
            "cache_write_tokens": tokens(raw.get("cache_creation_input_tokens"))}


def _model_usage(models: Mapping[str, Any]) -> dict[str, int]:
    """The sum over `modelUsage` (model name -> camelCase token counts) of a result event."""
    total = zero_usage()
    names = {"input_tokens": "inputTokens", "output_tokens": "outputTokens",
             "cache_read_tokens": "cacheReadInputTokens", "cache_write_tokens": "cacheCreationInputTokens"}
    for entry in list(models.values())[:50]:
        for name, key in names.items():
            total[name] = min(total[name] + tokens(_obj(entry).get(key)), _MAX_TOKENS)
    return total


class CodexReader:
    """Folds `codex exec --json` events into a `StreamState`."""

    def __init__(self) -> None:
        self.state = StreamState()
        self._turns_usage = zero_usage()  # summed over turn.completed / turn.failed
        self._live_usage = zero_usage()  # the session log's cumulative total (`live_total`)

    def live_total(self, total: Mapping[str, Any]) -> None:
        """A cumulative `total_token_usage` from codex's session log, written after every model
        request (its `--json` stream reports usage only when the whole turn ends)."""
        for name, count in codex_usage(total).items():
            self._live_usage[name] = max(self._live_usage[name], count)
        self._settle()

    def _settle(self) -> None:
        # Both count the same requests: the larger reading of each class is the spend so far.
        self.state.usage = {n: max(self._turns_usage[n], self._live_usage[n]) for n in USAGE_CLASSES}

    def feed(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        state = self.state
        if kind in ("turn.completed", "turn.failed"):
            for name, count in codex_usage(_obj(event.get("usage"))).items():
                self._turns_usage[name] += count
            self._settle()
            state.turns += 1
            if kind == "turn.completed":
                state.finished = True
            else:
                state.is_error = True
                self._error(_obj(event.get("error")).get("message"))
        elif kind == "error":
            self._error(event.get("message"))
        elif kind == "item.completed":
            item = _obj(event.get("item"))
            item_type = item.get("type", item.get("item_type"))
            text = _text(item.get("text"))
            if item_type in ("agent_message", "assistant_message") and text is not None:
                state.text = text

    def _error(self, message: Any) -> None:
        text = _text(message)
        if text:
            self.state.errors.append(text[:4000])


def codex_usage(raw: Mapping[str, Any]) -> dict[str, int]:
    """Codex token counts by class. As in the OpenAI API, `input_tokens` includes the cached
    (`cached_input_tokens`) and cache-written (`cache_write_input_tokens`) ones, and
    `output_tokens` includes `reasoning_output_tokens`. Parts larger than the whole are
    garbage: the input is then taken as all uncached (the dearer reading)."""
    given = tokens(raw.get("input_tokens"))
    cached, written = tokens(raw.get("cached_input_tokens")), tokens(raw.get("cache_write_input_tokens"))
    if cached + written > given:
        cached = written = 0
    return {"input_tokens": given - cached - written, "output_tokens": tokens(raw.get("output_tokens")),
            "cache_read_tokens": cached, "cache_write_tokens": written}


def reader_for(kind: str) -> ClaudeReader | CodexReader:
    if kind == CLAUDE:
        return ClaudeReader()
    if kind == CODEX:
        return CodexReader()
    raise ValueError(f"unknown coding-agent CLI {kind!r}; expected one of {', '.join(KINDS)}")


def parse_line(line: bytes) -> dict[str, Any] | None:
    """One stdout line as an event object, or None (blank, not JSON, not an object)."""
    line = line.strip()
    if not line.startswith(b"{"):
        return None
    try:
        event = json.loads(line)
        if isinstance(event, dict) and (b"\\u" in line or b"\xed" in line):  # may hold a lone surrogate
            event = without_lone_surrogates(event)
    except (ValueError, RecursionError):
        return None
    return event if isinstance(event, dict) else None


class Meter:
    """Money spent as the events say: priced tokens or the reported cumulative cost,
    whichever is higher, so a CLI under-reporting either way is still charged in full."""

    def __init__(self, prices: TokenPrices) -> None:
        self.prices = prices
        self.charged_usd = 0.0

    def spent(self, state: StreamState) -> float:
        return max(self.prices.cost(state.usage), state.reported_cost_usd or 0.0)

    def take_delta(self, state: StreamState) -> float:
        """The amount not yet charged (0 when nothing new was spent); marks it charged."""
        delta = self.spent(state) - self.charged_usd
        if delta <= 0:
            return 0.0
        self.charged_usd += delta
        return delta


def looks_like_auth(texts: list[str]) -> bool:
    folded = " ".join(texts).lower()
    return any(marker in folded for marker in _AUTH_MARKERS)
