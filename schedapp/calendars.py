"""Calendars, pure: the days and times a business does not run, and what an occurrence that
falls on one does.

No database: a calendar is read from its JSON definition (``parse_calendar``), and every
function takes the times it reasons about as arguments, so hypothesis tests it in
milliseconds. Storage (the ``Calendar`` model) resolves references to other calendars by name
and hands this module plain definitions.

A calendar is a set of *excluded* wall-clock times, evaluated in the job's time zone. Each rule
gives, for one local day, the parts of that day it excludes as half-open spans of seconds
``[start, end)``; combinations are set algebra over those spans, exactly:

* ``{"holidays": {"country": "DE", "subdivision": "BY"}}``: public holidays from the
  ``holidays`` package, whole days (years computed on demand, a bounded cache, never stored);
* ``{"dates": ["2026-12-24", ...]}``: explicit days;
* ``{"weekdays": ["sat", "sun"]}``: days of the week;
* ``{"time_range": {"start": "22:00", "end": "06:00", "weekdays": ["fri"]}}``: a daily window,
  crossing midnight when ``end`` <= ``start`` (the part after midnight belongs to the range
  that started the evening before); ``weekdays`` limits the days it *starts* on;
* ``{"cron": "* 0-5 * * mon-fri"}``: every minute (second, with six fields) the expression
  matches;
* ``{"ical": "BEGIN:VCALENDAR..."}`` (or ``{"ical": {"text": ..., "timezone": "Europe/Berlin"}}``):
  the events of an iCalendar document (RFC 5545), recurring ones expanded, each excluding
  exactly its own time (an all-day event its days); an event at a fixed instant is placed on
  the wall clock of the rule's ``timezone`` (years expanded on demand, a bounded cache);
* ``{"union": [rule, ...]}``, ``{"difference": [base, rule, ...]}`` (base minus the others),
  and ``{"calendar": "name"}``, another stored calendar (cycles are refused).

A job attaches a calendar as exclusions (``exclude``: never fire inside) or as the only allowed
windows (``only``: the complement is excluded), with a roll for an occurrence that falls in an
exclusion (``ROLLS``):

* ``skip``: the occurrence does not run;
* ``next_business_day`` / ``previous_business_day``: on a wholly excluded day, it runs at the
  same wall time on the nearest day in that direction that is not wholly excluded (a *business
  day*); one that falls in a blackout window of a business day, or whose moved time is in one,
  is skipped;
* ``defer``: it runs at the end of the exclusion (the first allowed instant after it).

Occurrences keep their order: a moved one that lands on or before the job's previous fire, or
after an allowed occurrence of the schedule's own, is merged into that run (Saturday's and
Sunday's 09:00 rolled forward are Monday's 09:00, once).

Bounds (the beat runs this inside its claim): the nearest business day or allowed instant is
looked for at most ``SEARCH_DAYS`` (two years) away, one step per day; one search for the next
fire crosses at most ``MAX_WINDOWS`` exclusion windows, each skipped in one step whatever its
length (a minutely job through a two-week holiday costs one step, not 20,000). Past either
bound there is no next fire (``None``); validation refuses a calendar, or a job, that has
none within the bound from the time it is saved.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime, time, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo

from . import cronmath, schedules
from .exceptions import ScheduleError

DAY = 86400
SEARCH_DAYS = 366 * 2
MAX_WINDOWS = 512
MAX_DEPTH = 16  # nesting of union / difference / references
MAX_DATES = 10_000
MAX_RULES = 1_000  # rules in one definition, references expanded: each costs every day read
MAX_ICAL_CHARS = 1_000_000  # one iCalendar document
MAX_ICAL_YEARLY = 10_000  # its occurrences in any one year, at most (counted statically)
MODES = ("exclude", "only")
ROLLS = ("skip", "next_business_day", "previous_business_day", "defer")
DAY_ROLLS = ("next_business_day", "previous_business_day")
DEFAULT_MODE = "exclude"
DEFAULT_ROLL = "skip"
WEEKDAY_NAMES = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")  # date.weekday() order
_TIME = re.compile(r"^([01]?[0-9]|2[0-4]):([0-5][0-9])(?::([0-5][0-9]))?$")
_EPSILON = timedelta(microseconds=1)

Span = tuple[int, int]  # seconds of a local day, [start, end)
Spans = tuple[Span, ...]  # sorted, disjoint, not touching
FULL: Spans = ((0, DAY),)
EMPTY: Spans = ()


# --- span algebra ---------------------------------------------------------------------------


def union_spans(*parts: Spans) -> Spans:
    merged: list[list[int]] = []
    for start, end in sorted(s for part in parts for s in part):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return tuple((a, b) for a, b in merged)


def complement_spans(spans: Spans) -> Spans:
    out, at = [], 0
    for start, end in spans:
        if start > at:
            out.append((at, start))
        at = end
    if at < DAY:
        out.append((at, DAY))
    return tuple(out)


def difference_spans(base: Spans, minus: Spans) -> Spans:
    if not base or not minus:
        return base
    keep = complement_spans(minus)
    out = []
    for a, b in base:
        for c, d in keep:
            lo, hi = max(a, c), min(b, d)
            if lo < hi:
                out.append((lo, hi))
    return union_spans(tuple(out))


def _in_spans(spans: Spans, second: int) -> Span | None:
    for start, end in spans:
        if start <= second < end:
            return (start, end)
        if start > second:
            return None
    return None


# --- rules ----------------------------------------------------------------------------------


class Rule:
    """A set of excluded wall times; ``spans(day)`` is its part of one local day."""

    def spans(self, day: date) -> Spans:
        raise NotImplementedError


@dataclass(frozen=True)
class Holidays(Rule):
    country: str
    subdivision: str | None = None

    def spans(self, day: date) -> Spans:
        return FULL if day in holiday_dates(self.country, self.subdivision, day.year) else EMPTY


@dataclass(frozen=True)
class Dates(Rule):
    days: frozenset[date]

    def spans(self, day: date) -> Spans:
        return FULL if day in self.days else EMPTY


@dataclass(frozen=True)
class Weekdays(Rule):
    days: frozenset[int]  # 0 = Monday

    def spans(self, day: date) -> Spans:
        return FULL if day.weekday() in self.days else EMPTY


@dataclass(frozen=True)
class TimeRange(Rule):
    start: int  # seconds of the day
    end: int  # <= start: crosses midnight
    days: frozenset[int] | None = None  # the days it starts on; None: every day

    def _starts_on(self, day: date) -> bool:
        return self.days is None or day.weekday() in self.days

    def spans(self, day: date) -> Spans:
        if self.start < self.end:
            return ((self.start, self.end),) if self._starts_on(day) else EMPTY
        parts: list[Span] = []
        if self.end > 0 and self._starts_on(day - timedelta(days=1)):
            parts.append((0, self.end))
        if self._starts_on(day):
            parts.append((self.start, DAY))
        return union_spans(tuple(parts))


@dataclass(frozen=True)
class CronRule(Rule):
    expr: str
    has_seconds: bool

    def spans(self, day: date) -> Spans:
        sets = cronmath.cron_sets(self.expr, self.has_seconds, True)
        if not sets.day_matches(day.toordinal()):
            return EMPTY
        return _cron_times(self.expr, self.has_seconds)


@dataclass(frozen=True)
class Union(Rule):
    parts: tuple[Rule, ...]

    def spans(self, day: date) -> Spans:
        return union_spans(*(p.spans(day) for p in self.parts))


@dataclass(frozen=True)
class Difference(Rule):
    base: Rule
    minus: tuple[Rule, ...]

    def spans(self, day: date) -> Spans:
        out = self.base.spans(day)
        for rule in self.minus:
            if not out:
                break
            out = difference_spans(out, rule.spans(day))
        return out


@dataclass(frozen=True)
class Complement(Rule):
    """Everything ``rule`` does not exclude: an ``only`` calendar's exclusions."""

    rule: Rule

    def spans(self, day: date) -> Spans:
        return complement_spans(self.rule.spans(day))


@dataclass(frozen=True)
class ICal(Rule):
    """The events of an iCalendar document; instants placed on the wall clock of ``zone``."""

    text: str = field(repr=False)
    zone: str = "UTC"

    def spans(self, day: date) -> Spans:
        return ical_year(self.text, self.zone, day.year).get(day, EMPTY)


@lru_cache(maxsize=128)
def ical_year(text: str, zone: str, year: int) -> dict[date, Spans]:
    """The excluded spans of each local day of ``year`` that the document's events touch,
    computed on demand (the cache holds at most 128 document-years, never stored)."""
    import recurring_ical_events

    tz = ZoneInfo(zone)
    first = datetime(year, 1, 1)
    last = datetime(year + 1, 1, 1) if year < date.max.year else datetime.max
    # Two days either side: an event of another zone can be on this year's wall clock.
    margin = timedelta(days=2)
    low = first - margin if year > 1 else first
    high = last + margin if year < date.max.year - 1 else datetime.max
    parts: dict[date, list[Span]] = {}
    try:
        events = recurring_ical_events.of(_ical_document(text), components=["VEVENT"]).between(
            low, high
        )
        walls = [
            _event_walls(event, tz)
            for event in events
            if str(event.get("STATUS", "")).upper() != "CANCELLED"
        ]
    except Exception as exc:  # the library's errors are of many kinds; none may reach a beat
        raise ScheduleError("definition.ical", f"cannot be expanded for {year}: {exc}") from exc
    for start, end in (piece for pieces in walls for piece in pieces):
        start, end = max(start, first), min(end, last)
        day = start.date()
        while datetime.combine(day, time()) < end:
            midnight = datetime.combine(day, time())
            lo = max(0, _ceil_seconds(start - midnight, floor=True))
            hi = min(DAY, _ceil_seconds(end - midnight))
            if lo < hi:
                parts.setdefault(day, []).append((lo, hi))
            if day == date.max:
                break
            day += timedelta(days=1)
    return {day: union_spans(tuple(spans)) for day, spans in parts.items()}


def _ceil_seconds(delta: timedelta, floor: bool = False) -> int:
    seconds = delta.days * DAY + delta.seconds
    return seconds + (1 if delta.microseconds and not floor else 0)


def _event_walls(event: object, tz: ZoneInfo) -> list[tuple[datetime, datetime]]:
    """An event's excluded wall-clock intervals ``[start, end)``: an all-day one's days, a
    floating one's times as written, a timed one's instants on ``tz``'s clock (``_on_clock``).
    A timed event with no end or duration takes no time (RFC 5545)."""
    start, end = event.start, event.end  # type: ignore[attr-defined]
    if not isinstance(start, datetime):
        first = datetime.combine(start, time())
        last = _wall(end, tz)
        return [(first, last if last > first else first + timedelta(days=1))]
    if start.tzinfo is None or not isinstance(end, datetime) or end.tzinfo is None:
        return [(_wall(start, tz), _wall(end, tz))]
    return _on_clock(start, end, tz)


_STEADY = timedelta(days=7)  # no zone changes its offset twice within a week


def _on_clock(start: datetime, end: datetime, tz: ZoneInfo) -> list[tuple[datetime, datetime]]:
    """The wall times of the instants ``[start, end)`` on ``tz``'s clock, exactly: cut where
    the offset changes (found to the second by bisection). Across an autumn change both
    passes through the repeated hour count; across a spring change the span is unbroken
    (the skipped wall times exist on no clock, as a time range over them)."""
    start, end = start.astimezone(UTC), end.astimezone(UTC)
    out: list[tuple[datetime, datetime]] = []
    at = start
    while at < end:
        until = end if end - at <= _STEADY else at + _STEADY
        offset = _offset(at, tz)
        if _offset(until, tz) != offset:
            low, high = at, until  # offset(low) == offset, offset(high) differs
            while high - low > timedelta(seconds=1):
                middle = low + (high - low) / 2
                if _offset(middle, tz) == offset:
                    low = middle
                else:
                    high = middle
            until = high.replace(microsecond=0) if high.microsecond else high
            if _offset(until, tz) == offset:  # bisection left it a fraction short
                until += timedelta(seconds=1)
        after = _offset(until, tz) if until < end else offset
        wall_end = until.replace(tzinfo=None) + max(offset, after)  # a gap is not a break
        out.append((at.replace(tzinfo=None) + offset, wall_end))
        at = until
    return out


def _offset(instant: datetime, tz: ZoneInfo) -> timedelta:
    return instant.astimezone(tz).utcoffset() or timedelta(0)


def _wall(value: date | datetime, tz: ZoneInfo) -> datetime:
    if not isinstance(value, datetime):
        return datetime.combine(value, time())
    if value.tzinfo is None:
        return value
    return value.astimezone(tz).replace(tzinfo=None)


@lru_cache(maxsize=16)
def _ical_document(text: str) -> object:
    import icalendar

    return icalendar.Calendar.from_ical(text)


@lru_cache(maxsize=64)
def _cron_times(expr: str, has_seconds: bool) -> Spans:
    sets = cronmath.cron_sets(expr, has_seconds, True)
    step = 1 if has_seconds else 60
    return union_spans(
        tuple(
            (h * 3600 + m * 60 + s, h * 3600 + m * 60 + s + step)
            for h in sets.hours
            for m in sets.minutes
            for s in (sets.seconds if has_seconds else (0,))
        )
    )


@lru_cache(maxsize=512)
def holiday_dates(country: str, subdivision: str | None, year: int) -> frozenset[date]:
    """One country's (and subdivision's) public holidays in one year, computed on demand by the
    ``holidays`` package; the cache holds at most 512 country-years."""
    import holidays

    return frozenset(holidays.country_holidays(country, subdiv=subdivision, years=year))


# --- a named calendar and how a job uses it ------------------------------------------------


@dataclass(frozen=True)
class Calendar:
    name: str
    rule: Rule


@dataclass(frozen=True)
class Attached:
    """A calendar as one job uses it: its mode and its roll."""

    calendar: Calendar
    mode: str = DEFAULT_MODE
    roll: str = DEFAULT_ROLL
    excluded: Rule = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        rule = self.calendar.rule
        object.__setattr__(self, "excluded", Complement(rule) if self.mode == "only" else rule)


def excludes(rule: Rule, wall: datetime) -> bool:
    """Whether the wall time ``wall`` (its date and time of day, any tzinfo ignored) is
    excluded."""
    second = wall.hour * 3600 + wall.minute * 60 + wall.second
    return _in_spans(rule.spans(wall.date()), second) is not None


def whole_day(rule: Rule, day: date) -> bool:
    return rule.spans(day) == FULL


def excluded_days(rule: Rule, first: date, last: date) -> list[date]:
    """The wholly excluded days in [first, last] (the admin's year ahead)."""
    out, day = [], first
    while day <= last:
        if whole_day(rule, day):
            out.append(day)
        day += timedelta(days=1)
    return out


def allowed_at_or_after(rule: Rule, wall: datetime) -> datetime | None:
    """The first wall time at or after ``wall`` that is not excluded (naive), looking at most
    ``SEARCH_DAYS`` days ahead: the end of the exclusion ``wall`` is in."""
    wall = wall.replace(tzinfo=None)
    day = wall.date()
    second = wall.hour * 3600 + wall.minute * 60 + wall.second
    span = _in_spans(rule.spans(day), second)
    if span is None:
        return wall
    if span[1] < DAY:
        return datetime.combine(day, time()) + timedelta(seconds=span[1])
    for _ in range(SEARCH_DAYS):
        if day == date.max:
            return None
        day += timedelta(days=1)
        spans = rule.spans(day)
        if not spans or spans[0][0] > 0:
            return datetime.combine(day, time())
        if spans[0][1] < DAY:
            return datetime.combine(day, time()) + timedelta(seconds=spans[0][1])
    return None


def business_day(rule: Rule, day: date, step: int) -> date | None:
    """The nearest day after (``step`` 1) or before (-1) ``day`` that is not wholly excluded,
    at most ``SEARCH_DAYS`` away."""
    for _ in range(SEARCH_DAYS):
        if day == (date.max if step > 0 else date.min):
            return None
        day += timedelta(days=step)
        if not whole_day(rule, day):
            return day
    return None


def next_business_day(rule: Rule, day: date) -> date | None:
    return business_day(rule, day, 1)


def previous_business_day(rule: Rule, day: date) -> date | None:
    return business_day(rule, day, -1)


# --- occurrences ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Skipped:
    """Occurrences of the schedule that did not run: ``count`` of them, ``first`` to ``last``."""

    first: datetime
    last: datetime
    count: int
    reason: str  # "excluded" (skip, or a day roll in a blackout window) or "merged"


@dataclass(frozen=True)
class Fire:
    """The next time a job with a calendar runs, and what the calendar did to get there."""

    at: datetime  # UTC
    occurrence: datetime  # the schedule's own occurrence this run stands for (== at unless moved)
    roll: str | None = None  # the roll that moved it, None when it runs as scheduled
    skipped: tuple[Skipped, ...] = ()

    @property
    def moved(self) -> bool:
        return self.at != self.occurrence


def to_instant(wall: datetime, tz: ZoneInfo, floor: datetime | None = None) -> datetime:
    """The instant of a wall time: a time in a spring-forward gap is the gap's end; a repeated
    one its first offset, or its second when the first is before ``floor``."""
    naive = wall.replace(tzinfo=None)
    if not cronmath.exists(naive, tz):
        return cronmath.end_of_gap(naive, tz).astimezone(UTC)
    first = naive.replace(tzinfo=tz, fold=0).astimezone(UTC)
    if floor is not None and first < floor:
        second = naive.replace(tzinfo=tz, fold=1).astimezone(UTC)
        if second >= floor:
            return second
    return first


def next_fire(
    schedule: schedules.Schedule, attached: Attached, after: datetime, tz: ZoneInfo
) -> Fire | None:
    """The job's first run strictly after ``after`` (its previous run) under its calendar, or
    None (no occurrence left, or none within the bounds in the module's docstring).

    Every occurrence of the schedule it passes is accounted for once: the one the run stands
    for (``Fire.occurrence``), or a range in ``Fire.skipped`` ("excluded": not run; "merged":
    covered by a run that a roll placed at or after it, or by the previous run)."""
    try:
        return _next_fire(schedule, attached, after.astimezone(UTC), tz)
    except OverflowError:  # a search that walked off the end of datetime: no run there
        return None


def _next_fire(
    schedule: schedules.Schedule, attached: Attached, after: datetime, tz: ZoneInfo
) -> Fire | None:
    rule, roll = attached.excluded, attached.roll
    skipped: list[Skipped] = []
    cursor = after
    # A previous-business-day run is at no occurrence of the schedule's own, and before the
    # occurrence it ran for: the next search meets that occurrence again (rolled onto
    # ``after``) and the ones before it, already accounted for: it passes them silently.
    ran_before = roll == "previous_business_day" and not _is_occurrence(schedule, after)
    for _ in range(MAX_WINDOWS):
        raw = schedules.next_fire_time(schedule, cursor)
        if raw is None:
            return None
        wall = raw.astimezone(tz).replace(tzinfo=None)
        if not excludes(rule, wall):
            return Fire(raw, raw, None, tuple(skipped))
        wholly = whole_day(rule, wall.date())
        if roll == "defer":
            end = allowed_at_or_after(rule, wall)
            if end is None:
                return None
            at = to_instant(end, tz, floor=raw)
            if excludes(rule, at.astimezone(tz)):  # a gap's end inside the next window
                end = allowed_at_or_after(rule, at.astimezone(tz))
                if end is None:
                    return None
                at = to_instant(end, tz, floor=at)
            return Fire(at, raw, roll, (*skipped, *_merged(schedule, raw, at)))
        if roll in DAY_ROLLS and wholly:
            moved = _day_roll(schedule, rule, roll, raw, wall, after, tz)
            if moved is None:
                return None
            if isinstance(moved, Fire):
                return Fire(moved.at, moved.occurrence, moved.roll, (*skipped, *moved.skipped))
            if moved.reason == "merged" and ran_before and _at(schedule, rule, raw, tz) == after:
                # The occurrence the previous run stood for: it and those before it were
                # accounted for by the search that found that run.
                ran_before = False
                skipped.clear()
            else:
                _add(skipped, moved)
            cursor = raw
            continue
        # skip (or a day roll in a blackout window): jump the whole exclusion in one step
        end = allowed_at_or_after(rule, wall)
        if end is None:
            return None
        resume = to_instant(end, tz, floor=raw)
        _add(skipped, _skipped_range(schedule, raw, resume - _EPSILON, "excluded"))
        cursor = resume - _EPSILON
    return None


def _add(skipped: list[Skipped], new: Skipped) -> None:
    """Record ``new``; one range with the last when the reason is the same (no occurrence of
    the schedule lies between them: the search went from one to the next), so a job that
    passes 270 one-minute windows in a day records one range, not 270."""
    if skipped and skipped[-1].reason == new.reason:
        last = skipped[-1]
        skipped[-1] = Skipped(last.first, new.last, last.count + new.count, new.reason)
    else:
        skipped.append(new)


def fires(
    schedule: schedules.Schedule, attached: Attached, after: datetime, tz: ZoneInfo, limit: int
) -> list[Fire]:
    """The next ``limit`` runs after ``after`` under the calendar (fewer when the schedule
    ends or a bound is reached): the preview."""
    out: list[Fire] = []
    while len(out) < limit:
        fire = next_fire(schedule, attached, after, tz)
        if fire is None:
            break
        out.append(fire)
        after = fire.at
    return out


def _is_occurrence(schedule: schedules.Schedule, at: datetime) -> bool:
    return schedules.recent_fire_times(schedule, at, at, 1) == [at]


def _at(schedule: schedules.Schedule, rule: Rule, raw: datetime, tz: ZoneInfo) -> datetime | None:
    """Where a previous-business-day roll puts ``raw``."""
    wall = raw.astimezone(tz).replace(tzinfo=None)
    day = business_day(rule, wall.date(), -1)
    return None if day is None else to_instant(datetime.combine(day, wall.time()), tz)


def _merged(schedule: schedules.Schedule, raw: datetime, at: datetime) -> tuple[Skipped, ...]:
    """The occurrences after ``raw`` up to ``at`` (included): covered by the run at ``at``."""
    count = schedules.count_fire_times(schedule, raw + _EPSILON, at)
    if count <= 0:
        return ()
    first = schedules.next_fire_time(schedule, raw)
    last = schedules.recent_fire_times(schedule, at, raw + _EPSILON, 1)
    assert first is not None and last
    return (Skipped(first, last[-1], count, "merged"),)


def _day_roll(
    schedule: schedules.Schedule,
    rule: Rule,
    roll: str,
    raw: datetime,
    wall: datetime,
    after: datetime,
    tz: ZoneInfo,
) -> Fire | Skipped | None:
    """A day roll of ``raw`` (on a wholly excluded day): the Fire it becomes, or a Skipped when
    it merges into the previous run or its moved time is excluded, or None when no business
    day is within reach."""
    step = 1 if roll == "next_business_day" else -1
    day = business_day(rule, wall.date(), step)
    if day is None:
        return None
    at = to_instant(datetime.combine(day, wall.time()), tz)
    if excludes(rule, at.astimezone(tz)):  # the moved time is in a window of that day
        return _skipped_range(schedule, raw, raw, "excluded")
    if at <= after:  # rolled back onto or before the previous run
        return _skipped_range(schedule, raw, raw, "merged")
    if step == 1:
        # An allowed occurrence of the schedule's own at or before the moved time runs
        # instead: this one and the excluded ones after it are merged into that run.
        own = next_fire(schedule, Attached(Calendar("", rule), "exclude", "skip"), raw, tz)
        if own is not None and own.at <= at:
            first = Skipped(raw, raw, 1, "merged")
            rest = tuple(replace(s, reason="merged") for s in own.skipped)
            return Fire(own.at, own.occurrence, None, (first, *rest))
        return Fire(at, raw, roll, _merged(schedule, raw, at))
    return Fire(at, raw, roll)


def _skipped_range(
    schedule: schedules.Schedule, first: datetime, last: datetime, reason: str
) -> Skipped:
    count = max(1, schedules.count_fire_times(schedule, first, last))
    newest = schedules.recent_fire_times(schedule, last, first, 1)
    return Skipped(first, max(newest[0], first) if newest else first, count, reason)


# --- reading a definition -------------------------------------------------------------------


Resolver = Callable[[str], object] | Mapping[str, object]


def parse_calendar(
    name: str, definition: object, resolve: Resolver | None = None, field: str = "definition"
) -> Calendar:
    """A calendar from its JSON definition; every error names the field it came from
    (``definition.union[1].holidays.country``). ``resolve`` gives another calendar's definition
    by name (``{"calendar": "name"}``); a reference to a calendar being read is a cycle."""
    count = [0]
    rule = _rule(definition, field, resolve, (name,), 0, count)
    if count[0] > MAX_RULES:
        raise ScheduleError(
            field, f"holds {count[0]} rules (references expanded); at most {MAX_RULES}."
        )
    return Calendar(name, rule)


def references(definition: object) -> set[str]:
    """The names of the calendars a definition refers to (directly)."""
    out: set[str] = set()
    if isinstance(definition, dict):
        for key, value in definition.items():
            if key == "calendar" and isinstance(value, str):
                out.add(value)
            elif key in ("union", "difference") and isinstance(value, list):
                for item in value:
                    out |= references(item)
    return out


def _rule(
    value: object,
    field: str,
    resolve: Resolver | None,
    stack: tuple[str, ...],
    depth: int,
    count: list[int],
) -> Rule:
    count[0] += 1
    if count[0] > MAX_RULES:
        return Dates(frozenset())  # refused whole by parse_calendar: stop reading here
    if depth > MAX_DEPTH:
        raise ScheduleError(field, f"nests deeper than {MAX_DEPTH} levels.")
    if not isinstance(value, dict) or len(value) != 1:
        raise ScheduleError(
            field,
            "must be an object with one key: holidays, dates, weekdays, time_range, cron, "
            "ical, union, difference or calendar.",
        )
    ((kind, body),) = value.items()
    here = f"{field}.{kind}"
    if kind == "holidays":
        return _holidays(body, here)
    if kind == "dates":
        return Dates(frozenset(_dates(body, here)))
    if kind == "weekdays":
        days = _weekdays(body, here)
        if not days:
            raise ScheduleError(here, "must name at least one day of the week.")
        return Weekdays(days)
    if kind == "time_range":
        return _time_range(body, here)
    if kind == "cron":
        cron = schedules.parse_cron(body, "UTC", here)
        return CronRule(cron.expr, cron.has_seconds)
    if kind == "ical":
        return _ical(body, here)
    if kind in ("union", "difference"):
        if not isinstance(body, list) or not body:
            raise ScheduleError(here, "must be a non-empty list of rules.")
        rules = tuple(
            _rule(item, f"{here}[{i}]", resolve, stack, depth + 1, count)
            for i, item in enumerate(body)
        )
        if kind == "union":
            return rules[0] if len(rules) == 1 else Union(rules)
        return Difference(rules[0], rules[1:])
    if kind == "calendar":
        if not isinstance(body, str) or not body.strip():
            raise ScheduleError(here, "must be the name of another calendar.")
        if body in stack:
            raise ScheduleError(
                here, f"refers back to {body!r}: a cycle ({' -> '.join((*stack, body))})."
            )
        target = _resolve(resolve, body)
        if target is None:
            raise ScheduleError(here, f"no calendar is named {body!r}.")
        return _rule(target, here, resolve, (*stack, body), depth + 1, count)
    raise ScheduleError(field, f"unknown rule {kind!r}.")


def _resolve(resolve: Resolver | None, name: str) -> object | None:
    if resolve is None:
        return None
    if isinstance(resolve, Mapping):
        return resolve.get(name)
    return resolve(name)


def _holidays(body: object, field: str) -> Holidays:
    if isinstance(body, str):
        body = {"country": body}
    if not isinstance(body, dict) or set(body) - {"country", "subdivision"}:
        raise ScheduleError(field, "must be {'country': 'DE'} with an optional 'subdivision'.")
    country, subdivision = body.get("country"), body.get("subdivision") or None
    supported = _supported_countries()
    if not isinstance(country, str) or country.upper() not in supported:
        raise ScheduleError(
            f"{field}.country", f"{country!r} is not a country code the holidays package knows."
        )
    country = country.upper()
    if subdivision is not None:
        subs = supported[country]
        match = [
            s for s in subs if isinstance(subdivision, str) and s.upper() == subdivision.upper()
        ]
        if not match:
            raise ScheduleError(
                f"{field}.subdivision",
                f"{subdivision!r} is not a subdivision of {country} "
                f"(one of {', '.join(subs[:20])}{'...' if len(subs) > 20 else ''}).",
            )
        subdivision = match[0]
    return Holidays(country, subdivision)


@lru_cache(maxsize=1)
def _supported_countries() -> dict[str, list[str]]:
    import holidays

    return {code: list(subs) for code, subs in holidays.list_supported_countries().items()}


_FINER_THAN_DAILY = ("SECONDLY", "MINUTELY", "HOURLY")


def _ical(body: object, field: str) -> ICal:
    """An ``ical`` rule: the document parsed, bounded (``MAX_ICAL_CHARS``; at most
    ``MAX_ICAL_YEARLY`` occurrences a year, counted from its rules: a recurrence at most once a
    day) and expanded once, so a document the libraries cannot read is refused here."""
    if isinstance(body, str):
        body = {"text": body}
    if not isinstance(body, dict) or "text" not in body or set(body) - {"text", "timezone"}:
        raise ScheduleError(
            field, "must be an iCalendar document, or {'text': ..., 'timezone': ...}."
        )
    text, zone = body["text"], body.get("timezone")
    if not isinstance(text, str) or not text.strip():
        raise ScheduleError(f"{field}.text", "must be an iCalendar document (BEGIN:VCALENDAR).")
    if len(text) > MAX_ICAL_CHARS:
        raise ScheduleError(
            f"{field}.text", f"holds {len(text)} characters; at most {MAX_ICAL_CHARS}."
        )
    import icalendar

    try:
        document = icalendar.Calendar.from_ical(text)
    except Exception as exc:  # icalendar raises ValueError, KeyError, IndexError...
        raise ScheduleError(f"{field}.text", f"is not an iCalendar document: {exc}") from exc
    if not isinstance(document, icalendar.Calendar) or document.name != "VCALENDAR":
        raise ScheduleError(f"{field}.text", "must be one VCALENDAR.")
    if zone is None:
        zone = str(document.get("X-WR-TIMEZONE", "") or "") or "UTC"
        zone_field = f"{field}.text"
    else:
        zone_field = f"{field}.timezone"
    if not _is_zone(zone):
        raise ScheduleError(zone_field, f"{zone!r} is not an IANA time zone.")
    events = list(document.walk("VEVENT"))
    yearly = 0
    for i, event in enumerate(events):
        if event.get("DTSTART") is None:
            raise ScheduleError(f"{field}.text", f"event {i + 1} has no DTSTART.")
        rules = event.get("RRULE")
        for rule in rules if isinstance(rules, list) else [rules] if rules is not None else []:
            freq = (rule.get("FREQ") or ["?"])[0]
            if str(freq).upper() in _FINER_THAN_DAILY or {"BYHOUR", "BYMINUTE", "BYSECOND"} & set(
                rule
            ):
                raise ScheduleError(
                    f"{field}.text",
                    f"event {i + 1} recurs more than once a day (FREQ={freq}); "
                    "a daily window is a time_range or cron rule.",
                )
            yearly += 366
        dates = event.get("RDATE")
        for rdate in dates if isinstance(dates, list) else [dates] if dates is not None else []:
            yearly += len(getattr(rdate, "dts", [rdate]))
        yearly += 1
    if yearly > MAX_ICAL_YEARLY:
        raise ScheduleError(
            f"{field}.text",
            f"may hold {yearly} occurrences a year (366 per recurrence rule, one per date); "
            f"at most {MAX_ICAL_YEARLY}.",
        )
    rule = ICal(text, zone)
    try:
        first = min((_wall(e.start, ZoneInfo(zone)).year for e in events), default=2000)
        rule.spans(date(first, 1, 1))
    except ScheduleError as exc:
        raise ScheduleError(f"{field}.text", exc.message) from exc
    except Exception as exc:  # an event whose start or end the library cannot read
        raise ScheduleError(f"{field}.text", f"cannot be expanded: {exc}") from exc
    return rule


def _is_zone(zone: object) -> bool:
    if not isinstance(zone, str) or not zone or zone.startswith("/") or "\x00" in zone:
        return False
    try:
        ZoneInfo(zone)
    except (ValueError, KeyError, OSError):
        return False
    return True


def _dates(body: object, field: str) -> Iterable[date]:
    if not isinstance(body, list) or not body:
        raise ScheduleError(field, "must be a non-empty list of dates (YYYY-MM-DD).")
    if len(body) > MAX_DATES:
        raise ScheduleError(field, f"holds more than {MAX_DATES} dates.")
    out = []
    for i, item in enumerate(body):
        try:
            out.append(date.fromisoformat(item) if isinstance(item, str) else None)
        except ValueError:
            out.append(None)
        if out[-1] is None:
            raise ScheduleError(f"{field}[{i}]", f"{item!r} is not a date (YYYY-MM-DD).")
    return out


def _weekdays(body: object, field: str) -> frozenset[int]:
    if not isinstance(body, list):
        raise ScheduleError(field, "must be a list of days of the week ('mon' .. 'sun').")
    out = set()
    for i, item in enumerate(body):
        key = item.strip().lower()[:3] if isinstance(item, str) else None
        if key not in WEEKDAY_NAMES or (len(item.strip()) > 3 and not _full_day(item)):
            raise ScheduleError(
                f"{field}[{i}]", f"{item!r} is not a day of the week ('mon' .. 'sun')."
            )
        out.add(WEEKDAY_NAMES.index(key))
    return frozenset(out)


def _full_day(text: str) -> bool:
    full = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
    return text.strip().lower() in full


def _time_range(body: object, field: str) -> TimeRange:
    if (
        not isinstance(body, dict)
        or not {"start", "end"} <= set(body)
        or set(body) - {"start", "end", "weekdays"}
    ):
        raise ScheduleError(
            field, "must be {'start': 'HH:MM', 'end': 'HH:MM'} with optional 'weekdays'."
        )
    start, end = _seconds(body["start"], f"{field}.start"), _seconds(body["end"], f"{field}.end")
    if start == DAY:
        raise ScheduleError(f"{field}.start", "must be before 24:00.")
    if start == end or (start == 0 and end == DAY):
        raise ScheduleError(
            f"{field}.end",
            "equals start: a range is a part of a day (a whole day is a weekdays or dates rule).",
        )
    days = None
    if "weekdays" in body:
        days = _weekdays(body["weekdays"], f"{field}.weekdays")
        if not days:
            raise ScheduleError(f"{field}.weekdays", "must name at least one day of the week.")
    return TimeRange(start, end % DAY if end == DAY and start > 0 else end, days)


def _seconds(value: object, field: str) -> int:
    match = _TIME.match(value) if isinstance(value, str) else None
    if match is None:
        raise ScheduleError(field, f"{value!r} is not a time of day (HH:MM or HH:MM:SS).")
    hours, minutes, seconds = int(match[1]), int(match[2]), int(match[3] or 0)
    total = hours * 3600 + minutes * 60 + seconds
    if total > DAY:
        raise ScheduleError(field, f"{value!r} is after 24:00.")
    return total


# --- validation -----------------------------------------------------------------------------


def check_allows_something(rule: Rule, start: date, field: str = "definition") -> None:
    """Refuse a calendar that excludes every moment of the ``SEARCH_DAYS`` days from
    ``start``: a job under it could never run (as a cron that never fires is refused)."""
    day = start
    for _ in range(SEARCH_DAYS):
        if rule.spans(day) != FULL:
            return
        day += timedelta(days=1)
    raise ScheduleError(
        field,
        f"excludes every day from {start.isoformat()} for {SEARCH_DAYS} days: nothing could run.",
    )


def parse_mode(value: object, field: str = "calendar_mode") -> str:
    if value is None or value == "":
        return DEFAULT_MODE
    if not isinstance(value, str) or value.strip().lower() not in MODES:
        raise ScheduleError(
            field, f"unknown calendar mode {value!r}; use one of {', '.join(MODES)}."
        )
    return value.strip().lower()


def parse_roll(value: object, field: str = "calendar_roll") -> str:
    if value is None or value == "":
        return DEFAULT_ROLL
    if not isinstance(value, str) or value.strip().lower() not in ROLLS:
        raise ScheduleError(
            field, f"unknown calendar roll {value!r}; use one of {', '.join(ROLLS)}."
        )
    return value.strip().lower()


def check_job(
    schedule: schedules.Schedule, attached: Attached, now: datetime, tz: ZoneInfo
) -> Fire:
    """A job's first run under its calendar; refuse (field ``calendar``) a job whose calendar
    leaves it no run within the bound, as a cron that never fires is refused."""
    check_allows_something(attached.excluded, now.astimezone(tz).date(), "calendar")
    fire = next_fire(schedule, attached, now, tz)
    if fire is None:
        raise ScheduleError(
            "calendar",
            f"{attached.calendar.name!r} ({attached.mode}, {attached.roll}) leaves "
            f"{schedules.describe(schedule)} no run after {now.isoformat()} "
            f"(looked {MAX_WINDOWS} exclusions and {SEARCH_DAYS} days ahead).",
        )
    return fire
