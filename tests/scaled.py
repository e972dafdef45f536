"""How many generated cases a fuzz test runs under the loaded hypothesis profile."""
from __future__ import annotations

from hypothesis import settings


def scaled(count: int) -> int:
    """`count` is the number for the `thorough` profile (hypothesis' default of 100 examples);
    other profiles scale it by their max_examples (the default `ci` profile runs half)."""
    return max(1, count * settings.default.max_examples // 100)
