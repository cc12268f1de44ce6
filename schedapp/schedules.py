"""Schedule math, pure: parse and validate schedules, and compute fire times.

No database, no Celery, no clock: every function takes the time it reasons about as an
argument, so hypothesis can test it in milliseconds.

Cron semantics (documented in the README):

* 5 fields (minute hour day-of-month month day-of-week), or 6 with a leading seconds field
  (``*/10 * * * * *`` = every ten seconds), or an alias (``@hourly``, ``@daily`` ...); weekday
  and month names in full or in three letters, any case.
* When both day fields are restricted, a day matching either fires (croniter's OR,
  ``day_or=True``) or only one matching both (Celery's crontab, ``day_or=False``).
* Cron follows wall-clock time in the job's IANA time zone; we walk naive wall-clock times with
  croniter (which never sees a time zone, so none of its DST bugs apply) and resolve each wall
  time to instants ourselves:

  - a fixed-hour job (hour field not ``*``) whose time falls in a spring-forward gap runs once,
    at the first valid instant after the gap (02:30 in Paris on 2026-03-29 runs at 03:00+02:00);
    one whose time is repeated in the autumn hour runs once, at its first (summer-time) instant;
  - a job whose hour field is ``*`` follows elapsed time, like Vixie cron: wall times inside the
    gap do not exist and are skipped, and wall times in the repeated hour fire in both offsets.
  - that is the default DST policy (``gap_end+first``); a job's ``dst_policy`` may instead skip
    a fixed-hour time in the gap, run a repeated one at its second offset or both, or follow
    Celery beat (``celery``): the rule is ``cronmath.DstRule``, in one place.

* Intervals are absolute durations, independent of time zones.
* Solar schedules are Celery's astronomical events (``solar.py``), in whole UTC seconds.
* The next occurrence is computed from the previous *occurrence*, never from "now": no drift.
* Counting occurrences and listing the last ones never step through every occurrence
  (``cronmath.py``): the beat does both inside its claim transaction.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from copy import copy
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from croniter import CroniterBadCronError, CroniterBadDateError, CroniterError, croniter

from . import cronmath, cronsyntax, solar
from .cronmath import DEFAULT_DST_POLICY, DST_POLICIES, DstRule
from .cronmath import instants as _instants
from .exceptions import ScheduleError

ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
# A cron expression must fire at least once in this many years (Feb 29 needs four, or eight
# across 2100); one that never does, such as "0 0 30 2 *", is rejected.
MAX_YEARS_BETWEEN_FIRES = 8
# How far one search for the next fire looks. Longer than the rule above: when both day fields
# are restricted and one holds "#" or "W", croniter searches each side of the OR alone and
# gives up on the whole expression when one side has no match within this many years
# ("0 12 L * 1#2,1#4": a last day that is a 2nd or 4th Monday comes every 6 to 11 years), so a
# short horizon would end such a job although its other side fires every month. Fifty years
# is croniter's default and covers the longest such gap (40 years, Feb 29 on a weekday).
SEARCH_YEARS = 50
_FIELD_CHARS = re.compile(r"^[0-9A-Za-z*/,\-#?L]+$")
# croniter reads an equal range ("1-1", "jan-jan/2") as the whole field; cron means the one value.
_EQUAL_RANGE = re.compile(r"^([0-9A-Za-z]+)-([0-9A-Za-z]+)(?:/[0-9]+)?$")
_EPSILON = timedelta(microseconds=1)
# The instants a job may hold: a year inside each end of what datetime represents, so that
# one read in any zone (offsets are under a day) or pushed by a jitter (at most a week) still is.
EARLIEST = datetime(2, 1, 1, tzinfo=UTC)
LATEST = datetime(9998, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)
OUT_OF_RANGE = "is out of the supported range: 0002-01-01 to 9998-12-31 (UTC)."
# Celery's crontab takes full names; croniter only the three-letter forms.
_FULL_NAMES = {
    name.lower(): name[:3].lower()
    for name in (
        "Sunday Monday Tuesday Wednesday Thursday Friday Saturday "
        "January February March April May June July August September October November December"
    ).split()
}
_FULL_NAME = re.compile(rf"\b(?:{'|'.join(_FULL_NAMES)})\b", re.IGNORECASE)
# croniter's "R" field picks a random value each time an expression is read: no fixed schedule.
_RANDOM_FIELD = re.compile(r"^[Rr](/[0-9]+)?$")
# Each cron field's name and range, as croniter accepts them (a weekday of 7 is Sunday).
_SECOND_FIELD = ("second", 0, 59)
_CRON_FIELDS = (
    ("minute", 0, 59),
    ("hour", 0, 23),
    ("day of month", 1, 31),
    ("month", 1, 12),
    ("day of week", 0, 7),
)
_NUMBER = re.compile(r"[0-9]+")


@dataclass(frozen=True)
class Cron:
    expr: str  # normalised: single spaces, aliases expanded, full names shortened
    timezone: str
    has_seconds: bool
    hour_is_wildcard: bool
    # Both day fields restricted: True fires on either (croniter, Vixie cron), False only on
    # days matching both (Celery's crontab: day_of_week=0, day_of_month="1-7" = first Sunday).
    day_or: bool = True
    # django-celery-beat's start_time/expires: no occurrence before / after these instants.
    not_before: datetime | None = None
    expires: datetime | None = None
    # What a wall time the clocks skip or repeat does (``cronmath.DST_POLICIES``).
    dst_policy: str = DEFAULT_DST_POLICY

    @property
    def tz(self) -> ZoneInfo:
        return get_zone(self.timezone)

    @property
    def rule(self) -> DstRule:
        return cronmath.dst_rule(self.dst_policy, self.hour_is_wildcard)

    @property
    def sets(self) -> cronmath.CronSets:
        return cronmath.cron_sets(self.expr, self.has_seconds, self.day_or)


@dataclass(frozen=True)
class Interval:
    every: timedelta
    # Any one occurrence: occurrences fall at anchor + k * every, so an extra run (run now) or
    # a retry never moves them. Without one, the next occurrence is counted from the previous.
    anchor: datetime | None = None
    not_before: datetime | None = None
    expires: datetime | None = None


@dataclass(frozen=True)
class Once:
    at: datetime


@dataclass(frozen=True)
class Solar:
    """Celery's ``solar(event, lat, lon)``: an astronomical event at a place (needs ephem)."""

    event: str
    latitude: float
    longitude: float
    not_before: datetime | None = None
    expires: datetime | None = None


Schedule = Cron | Interval | Once | Solar
Recurring = Cron | Interval | Solar


@lru_cache(maxsize=1024)
def get_zone(name: str) -> ZoneInfo:
    return ZoneInfo(name)


def parse_timezone(name: object, field: str = "timezone") -> str:
    """Return a valid IANA zone name, or raise naming the field."""
    if not isinstance(name, str) or not name.strip():
        raise ScheduleError(field, "must be an IANA time zone name such as 'Europe/Paris'.")
    name = name.strip()
    if name in HOST_ZONES:
        raise ScheduleError(
            field,
            f"{name!r} is no place's time zone but each host's own setup, so each beat and "
            "worker would read its fire times differently; name the zone, e.g. 'Europe/Paris'.",
        )
    if name not in zone_names():
        raise ScheduleError(field, f"unknown time zone {name!r}.")
    try:
        get_zone(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ScheduleError(field, f"unknown time zone {name!r}.") from exc
    return name


# Files of the zone database that name no place's time: ``localtime`` is the host's own
# /etc/localtime, ``posixrules`` the host's rules for POSIX TZ strings, ``Factory`` a zone for
# "not set up yet" ("-00"). A job in one of them would fire by each host's configuration.
HOST_ZONES = frozenset({"localtime", "posixrules", "Factory"})


@lru_cache(maxsize=1)
def zone_names() -> frozenset[str]:
    """Every zone a job may name: the host's IANA zones, without ``HOST_ZONES``."""
    return (frozenset(available_timezones()) - HOST_ZONES) | {"UTC"}


def parse_cron(
    expr: object,
    timezone: str,
    field: str = "cron",
    *,
    day_or: bool = True,
    dst_policy: str = DEFAULT_DST_POLICY,
) -> Cron:
    """Validate a cron expression; it must be well formed and fire at least once.

    ``day_or=False`` gives Celery's crontab semantics: when both day fields are restricted a
    day must match both. Full weekday and month names (any case) are accepted, as Celery does.
    ``dst_policy`` (``parse_dst_policy``) says what a wall time the clocks skip or repeat does.
    """
    if not isinstance(expr, str) or not expr.strip():  # before the cache: a list is unhashable
        raise ScheduleError(field, "must be a cron expression such as '*/5 * * * *'.")
    cron = _parse_cron(expr, timezone, field, bool(day_or))
    return cron if dst_policy == DEFAULT_DST_POLICY else replace(cron, dst_policy=dst_policy)


def parse_dst_policy(value: object, field: str = "dst_policy") -> str:
    """A job's DST policy: "gap+fold" (gap: gap_end or skip; fold: first, second or both) or
    "celery"; None or "" is the default (today's rule, ``gap_end+first``)."""
    if value is None or value == "":
        return DEFAULT_DST_POLICY
    if not isinstance(value, str) or value.strip().lower() not in DST_POLICIES:
        raise ScheduleError(
            field,
            f"unknown DST policy {value!r}; use one of {', '.join(DST_POLICIES)} "
            "(gap: gap_end or skip; fold: first, second or both).",
        )
    return value.strip().lower()


@lru_cache(maxsize=4096)
def _parse_cron(expr: str, timezone: str, field: str, day_or: bool) -> Cron:
    text = " ".join(expr.split())
    text = ALIASES.get(text.lower(), text)
    if text.startswith("@"):
        raise ScheduleError(field, f"unsupported alias {text!r}; use one of {sorted(ALIASES)}.")
    parts = text.split(" ")
    if len(parts) not in (5, 6):
        raise ScheduleError(
            field,
            f"{expr!r} has {len(parts)} fields; expected 5 (minute hour day month weekday) "
            "or 6 (second minute hour day month weekday).",
        )
    if not all(_FIELD_CHARS.match(p) for p in parts):
        raise ScheduleError(field, f"{expr!r} contains characters cron does not allow.")
    if any(_RANDOM_FIELD.match(p) for p in parts):
        raise ScheduleError(field, f"{expr!r}: a random field ('R') is not a schedule.")
    parts = [_FULL_NAME.sub(lambda m: _FULL_NAMES[m[0].lower()], p) for p in parts]
    parts = [",".join(_single_value(item) for item in p.split(",")) for p in parts]
    parts = cronsyntax.spelled(parts)
    text = " ".join(parts)
    has_seconds = len(parts) == 6
    # Before croniter, which reads a day of month "1-0" as a schedule and names no field.
    problems = cronsyntax.problems(parts, has_seconds) + _out_of_range(parts, has_seconds)
    if problems:
        raise ScheduleError(
            field, f"{expr!r} is not a valid cron expression: {'; '.join(problems)}."
        )
    if not _croniter_reads(text, has_seconds):
        refused = _refused_fields(parts, has_seconds)
        raise ScheduleError(
            field, f"{expr!r} is not a valid cron expression{': ' if refused else ''}{refused}."
        )
    hour = parts[2] if has_seconds else parts[1]
    cron = Cron(text, timezone, has_seconds, hour in ("*", "*/1"), day_or)
    try:
        _naive_iter(cron, datetime(2001, 1, 1), MAX_YEARS_BETWEEN_FIRES).__next__()
    except (
        CroniterBadDateError,
        CroniterBadCronError,
        CroniterError,
        ValueError,
        OverflowError,
        KeyError,
        IndexError,
        TypeError,
    ) as exc:
        raise ScheduleError(field, f"{expr!r} never fires (no matching date).") from exc
    cronmath.cron_sets(text, has_seconds, day_or)  # read once here; counting reuses it
    return cron


def _out_of_range(parts: list[str], has_seconds: bool) -> list[str]:
    """Each value outside its cron field's range, named by the field ("minute 61 is out of
    range (0-59)"): croniter only says the whole expression is invalid, which leaves a person
    with "61 25 * * *" to find both mistakes alone. Steps and names are croniter's to judge."""
    positions = (_SECOND_FIELD, *_CRON_FIELDS) if has_seconds else _CRON_FIELDS
    found = []
    for (name, low, high), part in zip(positions, parts, strict=True):
        seen: list[int] = []
        for item in part.split(","):
            base = item.partition("/")[0].partition("#")[0]  # "5#3": the weekday is 5
            for number in map(int, _NUMBER.findall(base)):  # a value, a range's bounds, "15W"
                if not low <= number <= high and number not in seen:
                    seen.append(number)
                    found.append(f"{name} {number} is out of range ({low}-{high})")
    return found


def _croniter_reads(text: str, has_seconds: bool) -> bool:
    try:
        return croniter.is_valid(cronsyntax.engine_expr(text), second_at_beginning=has_seconds)
    except (CroniterError, ValueError, TypeError, IndexError, KeyError):
        return False


def _refused_fields(parts: list[str], has_seconds: bool) -> str:
    """The fields croniter refuses each on its own (the others ``*``), named: croniter says
    only that the whole expression is invalid."""
    found = []
    for i, name in enumerate(cronsyntax.field_names(has_seconds)):
        alone = ["*"] * len(parts)
        alone[i] = parts[i]
        if not _croniter_reads(" ".join(alone), has_seconds):
            hint = cronsyntax.hint(name, parts[i])
            found.append(f"{name} field: {parts[i]!r} is not valid{hint}")
    return "; ".join(found)


def _single_value(item: str) -> str:
    match = _EQUAL_RANGE.match(item)
    if match and _bound(match[1]) == _bound(match[2]):
        return match[1]
    return item


def _bound(text: str) -> int | str:
    return int(text) if text.isdigit() else text.lower()


def parse_interval(value: object, field: str = "interval") -> Interval:
    """Accept a timedelta or a number of seconds; it must be at least one second."""
    if isinstance(value, bool) or not isinstance(value, timedelta | int | float):
        raise ScheduleError(field, "must be a duration (timedelta or seconds).")
    every = value if isinstance(value, timedelta) else _seconds(value, field)
    if every < timedelta(seconds=1):
        raise ScheduleError(field, "must be at least one second.")
    if every > timedelta(days=366 * 100):
        raise ScheduleError(field, "must be shorter than a hundred years.")
    return Interval(every)


def _seconds(value: float, field: str) -> timedelta:
    try:
        return timedelta(seconds=value)
    except (OverflowError, ValueError) as exc:
        raise ScheduleError(field, f"{value!r} is out of range.") from exc


def parse_run_at(value: object, field: str = "run_at") -> Once:
    if not isinstance(value, datetime):
        raise ScheduleError(field, "must be a datetime.")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ScheduleError(field, "must be timezone-aware (naive datetimes are ambiguous).")
    try:
        at = value.astimezone(UTC)
    except OverflowError:  # year 1 east of UTC, or year 9999 west of it
        at = None
    if at is None or not EARLIEST <= at <= LATEST:
        raise ScheduleError(field, f"{value.isoformat()} {OUT_OF_RANGE}")
    return Once(at)


def parse_solar(event: object, latitude: object, longitude: object) -> Solar:
    """Validate Celery's ``solar`` arguments; the event must happen at that place.

    Errors name the field: ``event``, ``latitude``, ``longitude``, or ``solar`` when the
    optional ``ephem`` package is missing.
    """
    if not isinstance(event, str) or event.strip() not in solar.EVENTS:
        raise ScheduleError(
            "event", f"unknown solar event {event!r}; use one of {', '.join(solar.EVENTS)}."
        )
    lat = _degrees(latitude, "latitude", 90)
    lon = _degrees(longitude, "longitude", 180)
    try:
        solar.load_ephem()
    except solar.EphemMissing as exc:
        raise ScheduleError(
            "solar", "solar schedules need the ephem package: pip install 'schedapp[solar]'."
        ) from exc
    schedule = Solar(event.strip(), lat, lon)
    if not solar.ever_happens(schedule.event, lat, lon):
        raise ScheduleError(
            "latitude", f"the sun never reaches {schedule.event} at latitude {lat}: it never fires."
        )
    return schedule


def _degrees(value: object, field: str, limit: int) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ScheduleError(field, f"must be a number of degrees, not {value!r}.")
    degrees = float(value)
    if not math.isfinite(degrees) or not -limit <= degrees <= limit:
        raise ScheduleError(field, f"must be between -{limit} and {limit} degrees, not {value!r}.")
    return degrees


def with_window(
    schedule: Schedule, not_before: datetime | None, expires: datetime | None
) -> Schedule:
    """``schedule`` limited to occurrences in [not_before, expires] (a one-off unchanged).

    django-celery-beat's ``start_time`` and ``expires``: a job never fires before the one and
    stops after the other. An interval without an anchor starts at ``not_before``.
    """
    if isinstance(schedule, Once) or (not_before is None and expires is None):
        return schedule
    start = not_before.astimezone(UTC) if not_before is not None else None
    end = expires.astimezone(UTC) if expires is not None else None
    if isinstance(schedule, Interval) and schedule.anchor is None and start is not None:
        return replace(schedule, anchor=start, not_before=start, expires=end)
    return replace(schedule, not_before=start, expires=end)


def next_fire_time(schedule: Schedule, after: datetime) -> datetime | None:
    """The first occurrence strictly after ``after`` (aware, UTC), or None if there is none."""
    after = after.astimezone(UTC)  # arithmetic on a zone's datetime is wall-clock arithmetic
    if isinstance(schedule, Once):
        return schedule.at if schedule.at > after else None
    start = schedule.not_before
    if start is not None and after < start:
        if isinstance(schedule, Interval) and schedule.anchor is None:
            nxt: datetime | None = start
        else:
            nxt = _next_unbounded(schedule, start - _EPSILON)
    else:
        nxt = _next_unbounded(schedule, after)
    if nxt is not None and schedule.expires is not None and nxt > schedule.expires:
        return None
    return nxt


def _next_unbounded(schedule: Recurring, after: datetime) -> datetime | None:
    if isinstance(schedule, Interval):
        if schedule.anchor is None:
            return (after + schedule.every).astimezone(UTC)
        steps = (after - schedule.anchor) // schedule.every + 1
        return (schedule.anchor + steps * schedule.every).astimezone(UTC)
    if isinstance(schedule, Solar):
        return solar.next_event(schedule.event, schedule.latitude, schedule.longitude, after)
    return _next_cron(schedule, after)


def first_fire_time(schedule: Schedule, now: datetime) -> datetime:
    """When a newly created job is first due. A one-off in the past is due now; a schedule
    whose ``expires`` leaves no occurrence after ``now`` raises ScheduleError."""
    if isinstance(schedule, Once):
        return schedule.at
    try:
        nxt = next_fire_time(schedule, now)
    except (OverflowError, CroniterError, ValueError) as exc:  # walked off the end of datetime
        raise ScheduleError(_kind_field(schedule), f"its first occurrence {OUT_OF_RANGE}") from exc
    if nxt is None:
        raise no_occurrence_error(schedule, now) or ScheduleError(
            "expires_at", "has passed: the schedule has no occurrence left."
        )
    if nxt > LATEST:  # a start late in the range: the job would run where jitter overflows
        raise ScheduleError(
            _kind_field(schedule), f"its first occurrence, {nxt.isoformat()}, {OUT_OF_RANGE}"
        )
    return nxt


def no_occurrence_error(schedule: Recurring, after: datetime) -> ScheduleError | None:
    """Why a schedule has no occurrence after ``after`` when its ``expires`` is not the
    reason (a solar event that does not happen within a year there), naming the schedule's
    field; None when its ``expires`` ends it, the one way a valid schedule ends."""
    if next_fire_time(replace(schedule, expires=None), after) is not None:
        return None
    return ScheduleError(
        _kind_field(schedule), f"{describe(schedule)} has no occurrence after {after.isoformat()}."
    )


def _kind_field(schedule: Recurring) -> str:
    if isinstance(schedule, Interval):
        return "interval"
    return "solar_event" if isinstance(schedule, Solar) else "cron"


def fire_times(
    schedule: Schedule, after: datetime, until: datetime | None = None, limit: int | None = None
) -> Iterator[datetime]:
    """Successive occurrences in (after, until], at most ``limit`` of them."""
    count = 0
    current = after
    while limit is None or count < limit:
        nxt = next_fire_time(schedule, current)
        if nxt is None or (until is not None and nxt > until):
            return
        yield nxt
        count += 1
        current = nxt


def count_fire_times(schedule: Schedule, start: datetime, end: datetime) -> int:
    """The exact number of occurrences in [start, end] (both ends included).

    Never one step per occurrence, since the beat calls it inside its claim transaction for
    however long a job was away: intervals by division, cron by arithmetic over wall-clock days
    (``cronmath.count_fires``: a step per month and per DST change of the range, plus a scan of
    each year of the zone the first time it is used), solar events one per day at most.
    """
    start, end = start.astimezone(UTC), end.astimezone(UTC)
    if isinstance(schedule, Once):
        return int(start <= schedule.at <= end)
    if schedule.not_before is not None and start < schedule.not_before:
        start = schedule.not_before
        if isinstance(schedule, Interval) and schedule.anchor is None:
            schedule = replace(schedule, anchor=start)
    if schedule.expires is not None:
        end = min(end, schedule.expires)
    if end < start:
        return 0
    if isinstance(schedule, Interval):
        if schedule.anchor is None:  # occurrences are start + k*every when start is one
            return 1 + int((end - start) / schedule.every)
        first = schedule.anchor + -((schedule.anchor - start) // schedule.every) * schedule.every
        return 0 if first > end else 1 + (end - first) // schedule.every
    if isinstance(schedule, Solar):  # a few events a day: enumerating costs a step per day
        return sum(1 for _ in fire_times(schedule, start - _EPSILON, end))
    lo, hi = cronmath.utc_seconds(start, up=True), cronmath.utc_seconds(end)
    return cronmath.count_fires(schedule.sets, schedule.timezone, schedule.rule, lo, hi)


def recent_fire_times(
    schedule: Schedule, until: datetime, since: datetime, count: int
) -> list[datetime]:
    """The last ``count`` occurrences in [since, until], oldest first.

    Its cost follows ``count``, not how long ago ``since`` is: intervals by arithmetic, cron by
    walking matching wall times backwards from ``until`` (``cronmath.last_fires``), solar by
    enumerating a window of about ``count`` days before ``until``, doubled until it holds them.
    """
    until, since = until.astimezone(UTC), since.astimezone(UTC)
    if isinstance(schedule, Once):
        return [schedule.at] if since <= schedule.at <= until and count > 0 else []
    if schedule.not_before is not None and since < schedule.not_before:
        since = schedule.not_before
        if isinstance(schedule, Interval) and schedule.anchor is None:
            schedule = replace(schedule, anchor=since)
    if schedule.expires is not None:
        until = min(until, schedule.expires)
    if until < since or count <= 0:
        return []
    if isinstance(schedule, Interval):
        every, base = schedule.every, schedule.anchor
        if base is None:  # ``since`` is an occurrence
            base = since
        last = base + ((until - base) // every) * every  # the latest occurrence <= until
        times = []
        while len(times) < count and last >= since:
            times.append(last.astimezone(UTC))
            last -= every
        return times[::-1]
    if isinstance(schedule, Solar):
        window = timedelta(days=count + 1)
        while True:
            lo = max(since - _EPSILON, until - window)
            times = list(fire_times(schedule, lo, until))
            if len(times) >= count or lo <= since - _EPSILON:
                return times[-count:]
            window *= 2
    return cronmath.last_fires(
        schedule.sets, schedule.timezone, schedule.rule, since, until, count
    )


# --- cron over wall-clock time ---------------------------------------------------------------


@lru_cache(maxsize=4096)
def _cron_template(expr: str, has_seconds: bool, years: int, day_or: bool) -> croniter:
    """A croniter with the expression expanded, to copy: expanding it is most of the cost of
    a new croniter (a backfill of 100,000 minutes, or a burst of cron jobs claimed, asks for
    one per occurrence), and the expansion does not depend on the start."""
    return croniter(
        expr,
        datetime(2001, 1, 1),
        second_at_beginning=has_seconds,
        max_years_between_matches=years,
        day_or=day_or,
    )


def _naive_iter(cron: Cron, start: datetime, years: int = SEARCH_YEARS) -> Iterator[datetime]:
    expr = cronsyntax.engine_expr(cron.expr)
    template = _cron_template(expr, cron.has_seconds, years, cron.day_or)
    it = copy(template)
    # What croniter changes as it goes gets a copy of its own, as a new croniter would have
    # (its search updates the sets of nth_weekday_of_month in place).
    it.expanded = [list(field) for field in template.expanded]
    it.nth_weekday_of_month = {k: set(v) for k, v in template.nth_weekday_of_month.items()}
    it.set_current(start, force=True)
    while True:
        yield it.get_next(datetime)


def _next_cron(cron: Cron, after: datetime) -> datetime | None:
    """The first fire strictly after ``after``: the first wall time after ``after``'s that names
    an instant after it, or, when ``after`` is in the first pass of a repeated hour, a wall
    time at or before its own that comes round again in the second pass, whichever is first.
    A skipped or repeated hour is jumped over, never walked second by second (a per-second
    cron would look at 3,600 wall times a call)."""
    tz, rule = cron.tz, cron.rule
    local = after.astimezone(tz)
    naive = local.replace(tzinfo=None)
    try:
        best = _first_after(cron, naive, after)
        if local.fold == 0 and rule.fold != "first" and _repeated(naive, tz):
            stretch = cronmath.repeated_stretch(naive, cron.timezone)
            again = _second_pass_from(cron, stretch[0], naive) if stretch else None
            if again is not None and again > after and (best is None or again < best):
                best = again
        if rule.gap == "celery":  # ``after`` between a gap's end and Celery's send for it
            send = cronmath.celery_gap_send(
                cron.sets, cron.timezone, cronmath.utc_seconds(after, up=True)
            )
            at = cronmath.instant_at(send) if send is not None else None
            if at is not None and at > after and (best is None or at < best):
                best = at
    except CroniterBadDateError:
        return None
    return best


def _first_after(cron: Cron, naive: datetime, after: datetime) -> datetime | None:
    """The earliest instant after ``after`` of the first wall time after ``naive`` that names
    one: later wall times name later instants. A skipped hour (its wall times name none) and
    the rest of a repeated hour whose instants are all behind (``after`` in its second pass, a
    fixed-hour cron firing in the first) are jumped over."""
    tz, rule = cron.tz, cron.rule
    sets = cron.sets if rule.gap == "celery" else None
    start = naive
    while True:
        for candidate in _naive_iter(cron, start):
            instants = _instants(candidate, tz, rule, sets)
            later = [instant for instant in instants if instant > after]
            if later:
                return later[0]
            if not instants and sets is not None and cronmath.exists(candidate, tz):
                # after a gap, before Celery's send for it (which ``_next_cron`` weighs):
                # go on from the send's wall time
                send = cronmath.celery_gap_send(
                    sets, cron.timezone, cronmath.utc_seconds(candidate.replace(tzinfo=tz))
                )
                assert send is not None
                wall = cronmath.instant_at(send).astimezone(tz).replace(tzinfo=None)
                start = max(wall, candidate)
                break
            if not instants:  # in a skipped hour: go on from its end
                end = cronmath.end_of_gap(candidate, tz).astimezone(tz).replace(tzinfo=None)
                start = max(end - timedelta(seconds=1), candidate)
                break
            stretch = cronmath.repeated_stretch(candidate, cron.timezone)
            if stretch is not None:  # its instants are behind: go on after the repeat
                start = max(stretch[1] - timedelta(seconds=1), candidate)
                break
        else:
            return None


def _second_pass_from(cron: Cron, first: datetime, last: datetime) -> datetime | None:
    """The second-pass instant of the first wall time in [first, last] the cron names."""
    for candidate in _naive_iter(cron, first - timedelta(seconds=1)):
        if candidate > last:
            return None
        if candidate >= first:
            return candidate.replace(tzinfo=cron.tz, fold=1).astimezone(UTC)
    return None


def _repeated(naive: datetime, tz: ZoneInfo) -> bool:
    """Whether a wall time happens twice (the hour the clocks go back)."""
    return naive.replace(tzinfo=tz).utcoffset() != naive.replace(tzinfo=tz, fold=1).utcoffset()


def describe(schedule: Schedule) -> str:
    """A short plain description, used in logs; the admin uses cron-descriptor."""
    if isinstance(schedule, Once):
        return f"once at {schedule.at.isoformat()}"
    if isinstance(schedule, Interval):
        return f"every {schedule.every}"
    if isinstance(schedule, Solar):
        return f"solar {schedule.event} at ({schedule.latitude}, {schedule.longitude})"
    days = "" if schedule.day_or else ", days must match both day fields"
    return f"cron {schedule.expr!r} ({schedule.timezone}{days})"
