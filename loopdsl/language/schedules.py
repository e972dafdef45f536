"""Whether a loop's `schedule:` means something: the one check lint, audit, `schedule`,
export and the run date all use, so they cannot disagree about a cron or a time zone."""
from __future__ import annotations

from datetime import timezone, tzinfo

# UTC under the names people write; zoneinfo knows only some of them, and only when the
# system has a time-zone database (`Z` and `utc` are never in it).
UTC_NAMES = frozenset({"UTC", "Etc/UTC", "Etc/GMT", "GMT", "Z", "utc", "Universal", "Etc/Universal", "Zulu"})


def time_zone(name: str) -> tzinfo | None:
    """The time zone `name` stands for, or None when it is not one."""
    if name in UTC_NAMES:
        return timezone.utc
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError  # deferred: only scheduled loops pay for it

    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return None


def cron_is_valid(cron: str) -> bool:
    """Whether `cron` is a cron expression croniter can evaluate."""
    from croniter import croniter  # deferred: only scheduled loops pay for it

    return bool(croniter.is_valid(cron))
