"""Backoff between attempts: exponential, capped, with jitter; Retry-After wins when longer."""
from __future__ import annotations

from typing import Protocol

from ..language.model import RetryPolicy


class Draws(Protocol):
    """Where the jitter comes from: the engine's clock port (`Clock.uniform`), so that a
    test's clock makes retry waits deterministic."""

    def uniform(self, low: float, high: float) -> float: ...


MAX_PROVIDER_WAIT_S = 3600.0  # the longest Retry-After a provider is believed


def backoff_delay(policy: RetryPolicy, failed_attempt: int, retry_after: float | None, draws: Draws) -> float:
    """Seconds to wait after attempt number `failed_attempt` (1-based) failed.

    "Equal jitter": half the exponential delay is kept, the other half is random, so
    retries of many runs spread out without any of them retrying immediately.
    """
    b = policy.backoff
    delay = min(b.max, b.initial * (b.factor ** max(failed_attempt - 1, 0)))
    if b.jitter and delay > 0:
        delay = delay / 2 + draws.uniform(0, delay / 2)
    if retry_after is not None and retry_after > delay:
        # The provider said when it will take us again: asking earlier only burns an attempt.
        # Believed up to an hour: a hostile or broken header (1e9 s, a date in the year 9999)
        # made a run without `wall_time` sleep for good.
        delay = min(retry_after, MAX_PROVIDER_WAIT_S)
    return delay
