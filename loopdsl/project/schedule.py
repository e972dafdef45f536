"""`loopdsl schedule`: next run times from `schedule.cron`, and cron expressions in UTC.

croniter evaluates the expression in the loop's time zone (a timezone-aware start time
makes it follow daylight-saving changes). GitHub Actions runs cron in UTC only, so
`to_utc_cron` rewrites an expression for UTC when that is exact, and says why when not.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone, tzinfo

from ..language.errors import LoopdslError
from ..language.model import Loop
from ..language.schedules import cron_problem, time_zone

WINDOW_DAYS = 30
# Runs in a 30-day window for `--cadence` (a fixed count: no calendar quirks).
CADENCE_RUNS = {"hourly": 24 * 30, "daily": 30, "weekly": 30 / 7}


class ScheduleError(LoopdslError):
    """A missing or wrong schedule; exit 2."""


def require_schedule(loop: Loop) -> tuple[str, tzinfo]:
    where = loop.source.name if loop.source else loop.name
    if loop.schedule is None:
        raise ScheduleError(f"{where} has no `schedule`",
                            'add e.g. `schedule: {cron: "0 9 * * 1-5", timezone: UTC}` to the loop')
    problem = cron_problem(loop.schedule.cron)
    if problem is not None:
        raise ScheduleError(f"{where}: schedule.cron {loop.schedule.cron!r} {problem[0]}", problem[1])
    tz = time_zone(loop.schedule.timezone)
    if tz is None:
        raise ScheduleError(f"{where}: schedule.timezone {loop.schedule.timezone!r} is not a known time zone",
                            "use an IANA name such as UTC, Europe/Paris or America/New_York")
    return loop.schedule.cron, tz


def next_runs(cron: str, tz: tzinfo, count: int, after: datetime | None = None) -> list[datetime]:
    from croniter import croniter

    try:
        start = (after or datetime.now(timezone.utc)).astimezone(tz)
        it = croniter(cron, start)
        return [it.get_next(datetime) for _ in range(count)]
    except OverflowError:
        raise _past_the_calendar(after) from None


def runs_in_window(cron: str, tz: tzinfo, start: datetime | None = None, days: int = WINDOW_DAYS) -> int:
    """How many times `cron` fires in the `days` after `start` (default: now)."""
    from croniter import croniter

    try:
        begin = (start or datetime.now(timezone.utc)).astimezone(tz)
        end = begin + timedelta(days=days)
        it = croniter(cron, begin)
        count = 0
        while it.get_next(datetime) <= end:
            count += 1
            if count > 60 * 24 * days:  # every minute: the most a cron can fire
                break
        return count
    except OverflowError:
        raise _past_the_calendar(start) from None


def _past_the_calendar(start: datetime | None) -> ScheduleError:
    """Python's dates end with the year 9999: runs counted or listed from `start` pass it."""
    shown = start.isoformat() if start else "now"
    return ScheduleError(f"the schedule's runs after {shown} go past the year 9999, the last date there is",
                         "give an earlier start (--after, --window-start), or fewer runs (-n)")


# ---------------------------------------------------------------- UTC conversion


@dataclass
class UtcCron:
    cron: str
    exact: bool
    notes: list[str] = field(default_factory=list)


_FULL = (range(60), range(24), range(1, 32), range(1, 13), range(7))


def _field_values(cron: str) -> list[list[int]]:
    """Each of the five fields as its list of values (croniter writes a wildcard as '*')."""
    from croniter import croniter

    out = []
    for values, full in zip(croniter(cron).expanded, _FULL):
        out.append(list(full) if "*" in values else sorted({int(v) % 7 if full == _FULL[4] else int(v) for v in values}))
    return out


def _compact(values: list[int], full: range) -> str:
    values = sorted(set(values))
    if values == list(full):
        return "*"
    # Runs of consecutive values become ranges: 1,2,3,4,5 -> 1-5.
    parts: list[str] = []
    start = prev = values[0]
    for v in values[1:] + [None]:  # type: ignore[list-item]
        if v is not None and v == prev + 1:
            prev = v
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if v is not None:
            start = prev = v
    return ",".join(parts)


def _offsets(tz: tzinfo, year: int) -> set[timedelta]:
    seen = set()
    for month in range(1, 13):
        offset = datetime(year, month, 1, 12, tzinfo=tz).utcoffset()
        if offset is not None:
            seen.add(offset)
    return seen


def to_utc_cron(cron: str, tz: tzinfo, now: datetime | None = None) -> UtcCron:
    """The expression for a scheduler that runs in UTC, exact when possible."""
    if tz is timezone.utc or datetime(2024, 1, 1, tzinfo=tz).utcoffset() == timedelta(0) == datetime(2024, 7, 1, tzinfo=tz).utcoffset():
        return UtcCron(cron, True)
    reference = (now or datetime.now(timezone.utc)).astimezone(tz)
    offset = reference.utcoffset() or timedelta(0)
    notes: list[str] = []
    exact = True
    if len(_offsets(tz, reference.year)) > 1:
        exact = False
        notes.append(f"{tz} changes its UTC offset during the year (daylight saving); this UTC schedule uses the "
                     f"current offset ({_fmt_offset(offset)}) and runs one hour off for part of the year")
    fields = cron.split()
    minutes, hours, days, months, weekdays = _field_values(cron)[:5]
    shift = int(offset.total_seconds() // 60)
    shifted: dict[int, set[tuple[int, int]]] = {}
    for h in hours:
        for m in minutes:
            total = h * 60 + m - shift
            day_shift, rest = divmod(total, 24 * 60)
            shifted.setdefault(day_shift, set()).add((rest // 60, rest % 60))
    if len(shifted) > 1 and fields[2:] == ["*", "*", "*"]:
        # Every day alike: which day a time falls on after the shift does not matter.
        shifted = {0: set().union(*shifted.values())}
    if len(shifted) != 1:
        notes.append("the times cross midnight differently when moved to UTC; kept as written (it runs in UTC)")
        return UtcCron(cron, False, notes)
    (day_shift, pairs), = shifted.items()
    new_hours = sorted({h for h, _ in pairs})
    new_minutes = sorted({m for _, m in pairs})
    if {(h, m) for h in new_hours for m in new_minutes} != pairs:
        notes.append("the UTC times are not a grid of hours and minutes; kept as written (it runs in UTC)")
        return UtcCron(cron, False, notes)
    new_days, new_weekdays = fields[2], fields[4]
    if day_shift:
        if fields[2] != "*" or fields[3] != "*":
            notes.append("a day-of-month or month restriction cannot move across midnight; kept as written (it runs in UTC)")
            return UtcCron(cron, False, notes)
        if fields[4] != "*":
            days_of_week = sorted({(d + day_shift) % 7 for d in weekdays})
            new_weekdays = _compact(days_of_week, range(7))
    utc = " ".join([_compact(new_minutes, range(60)), _compact(new_hours, range(24)), new_days, fields[3], new_weekdays])
    return UtcCron(utc, exact, notes)


def _fmt_offset(offset: timedelta) -> str:
    minutes = int(offset.total_seconds() // 60)
    sign = "+" if minutes >= 0 else "-"
    return f"UTC{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"
