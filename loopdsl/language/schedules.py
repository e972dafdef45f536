"""Whether a loop's `schedule:` means something: the one check lint, audit, `schedule`,
export and the run date all use, so they cannot disagree about a cron or a time zone."""
from __future__ import annotations

from datetime import datetime, timezone, tzinfo

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


FIVE_FIELDS = 'five fields: minute hour day-of-month month day-of-week, e.g. "0 9 * * 1-5" (09:00 on weekdays)'


def cron_problem(cron: str) -> tuple[str, str] | None:
    """What is wrong with `cron`, as (what follows the expression in a message, how to fix it);
    None when it is a five-field expression croniter can evaluate and it fires at all."""
    from croniter import CroniterBadDateError, croniter  # deferred: only scheduled loops pay for it

    # croniter also takes seconds and year fields and @daily-style names, which neither a
    # crontab line nor a GitHub Actions schedule can carry: the language has five fields.
    # One line of fields and single spaces: a tab or a line break passed the check and then
    # split the crontab line it was written into.
    if len(cron.split()) != 5 or any(c.isspace() and c != " " for c in cron) or not croniter.is_valid(cron):
        return "is not a valid cron expression", FIVE_FIELDS + '; "@daily" is "0 0 * * *"'
    try:  # croniter looks decades ahead before it gives up (about a millisecond)
        croniter(cron, datetime(2000, 1, 1, tzinfo=timezone.utc)).get_next(datetime)
    except CroniterBadDateError:
        return ("never fires: no date has that day in those months (such as February 30)",
                "use a day each named month has: February has 29 at most; April, June, September "
                "and November 30")
    return None
