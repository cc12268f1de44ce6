"""Cron over wall-clock time, by arithmetic: pure, no clock, no enumeration of occurrences.

``schedules.next_fire_time`` walks a cron with croniter, one occurrence at a time. Counting a
long outage that way costs one step per missed occurrence, inside the beat's claim transaction
(DESIGN.md, lesson 18), so this module reads the same expression as sets instead:

* the days a cron matches, per month, as a bitmask computed from croniter's own expansion of
  the fields and following its rules for ``L``, ``W``, ``#`` and the day-of-month /
  day-of-week combination (``day_or``);
* the times of day it matches as the product of the hour, minute and second sets, counted in a
  range (or the last one at or before a time) by bisection;
* the zone's UTC offset as constant pieces between its changes, found by comparing offsets a
  day apart and bisecting (cached per zone and year).

Time here is integer seconds from 0001-01-01 00:00 (``ordinal * 86400 + second of day``):
instants on the UTC clock, wall times on the zone's clock, ``wall = instant + offset``.
Every fire time is a whole second, so nothing is lost.

The DST rules (``DstRule``, ``instants``) are those of the ``schedules`` module docstring, with
a job's DST policy (``dst_policy``) choosing among them.
"""

from __future__ import annotations

import calendar
from bisect import bisect_left, bisect_right
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo

from croniter import croniter

from . import cronsyntax

DAY = 86_400
_EPSILON = timedelta(microseconds=1)
# A repeated or skipped stretch of wall time is shorter than this, and two offset changes are
# further apart than a day (true of every zone in tzdata since 1970; the largest change,
# Kwajalein's in 1993, is a day).
_LOOKBACK = 2 * DAY
_FIVE_WEEKS = sum(1 << (7 * week) for week in range(5))  # a week's bits, copied five times
_MAX_MASKS = 50_000  # months of day bitmasks kept per cron
# Counting is clamped to years 3..9999, so that the look-back and a zone's offsets (up to a
# day either way) stay within what datetime represents.
_FIRST_YEAR = 3
_FIRST = date(_FIRST_YEAR, 1, 1).toordinal() * DAY
_LAST = date(9999, 12, 30).toordinal() * DAY


# --- integer seconds ------------------------------------------------------------------------


def to_seconds(value: datetime) -> int:
    """Whole seconds of a naive datetime (or of an aware one's own clock), rounding down."""
    return value.toordinal() * DAY + value.hour * 3600 + value.minute * 60 + value.second


def utc_seconds(value: datetime, *, up: bool = False) -> int:
    """An aware instant as UTC seconds; ``up`` rounds a fraction of a second up."""
    value = value.astimezone(UTC)
    return to_seconds(value) + (1 if up and value.microsecond else 0)


def naive_at(seconds: int) -> datetime:
    days, rest = divmod(seconds, DAY)
    return datetime.fromordinal(days) + timedelta(seconds=rest)


def instant_at(seconds: int) -> datetime:
    return naive_at(seconds).replace(tzinfo=UTC)


def offset_at(tz: ZoneInfo, seconds: int) -> int:
    """The zone's UTC offset, in seconds, at the UTC instant ``seconds``."""
    offset = instant_at(seconds).astimezone(tz).utcoffset()
    assert offset is not None
    return offset.days * DAY + offset.seconds


# --- the days and times a cron matches ------------------------------------------------------


class CronSets:
    """A cron expression's matching days and times of day, read from croniter's expansion."""

    def __init__(self, expr: str, has_seconds: bool, day_or: bool) -> None:
        engine = cronsyntax.engine_expr(expr)  # FRIL as L5, LW as 31W: croniter's spellings
        it = croniter(engine, datetime(2001, 1, 1), day_or=day_or, second_at_beginning=has_seconds)
        fields = it.expanded  # minute, hour, day, month, weekday[, second]
        self.minutes = _values(fields[0], range(60))
        self.hours = _values(fields[1], range(24))
        self.seconds = _values(fields[5], range(60)) if len(fields) > 5 else (0,)
        self.per_day = len(self.seconds) * len(self.minutes) * len(self.hours)
        self._hour_set, self._minute_set = frozenset(self.hours), frozenset(self.minutes)
        self._months = frozenset(_values(fields[3], range(1, 13)))
        day, weekday = fields[2], fields[4]
        self._day_star = day[0] == "*"
        self._weekday_star = weekday[0] == "*"
        self._days = frozenset(d for d in day if isinstance(d, int))
        self._last_day = "l" in day
        self._weekdays = frozenset(w for w in weekday if isinstance(w, int))
        nth: dict[int, set[int | str]] = {}
        for key, which in it.nth_weekday_of_month.items():  # {weekday or "*": {1..5, "l"}}
            for wd in range(7) if key == "*" else (int(key),):
                nth.setdefault(wd, set()).update(which)
        self._nth = {wd: frozenset(which) for wd, which in nth.items()}
        self._nearest = frozenset(it.nearest_weekday)  # "15W": the weekday nearest the 15th
        # croniter ORs the day fields only when both are restricted; "#" and "W" are not
        # carried by those fields, so each side of the OR keeps them (an intersection).
        self._ored = day_or and not self._day_star and not self._weekday_star
        self._masks: dict[tuple[int, int], int] = {}

    # days

    def month_mask(self, year: int, month: int) -> int:
        """Bit ``d - 1`` set when day ``d`` of the month matches the day and month fields."""
        key = (year, month)
        mask = self._masks.get(key)
        if mask is None:
            if len(self._masks) >= _MAX_MASKS:
                self._masks.clear()
            mask = self._masks[key] = self._compute_mask(year, month)
        return mask

    def _compute_mask(self, year: int, month: int) -> int:
        if month not in self._months:
            return 0
        first, last = calendar.monthrange(year, month)  # first: Monday is 0
        first = (first + 1) % 7  # cron's weekday numbers: Sunday is 0
        every = (1 << last) - 1
        if self._nearest:
            dom = _bits(_nearest_weekday(year, month, d, last) for d in self._nearest)
        elif self._day_star:
            dom = every
        else:
            dom = _bits(d for d in self._days if d <= last) | (_bits([last]) * self._last_day)
        if self._nth:
            dow = _bits(_nth_days(first, last, self._nth))
        elif self._weekday_star:
            dow = every
        else:
            week = _bits(i + 1 for i in range(7) if (first + i) % 7 in self._weekdays)
            dow = week * _FIVE_WEEKS & every
        if self._ored:
            dom_side = dom & (dow if self._nth else every)
            dow_side = dow & (dom if self._nearest else every)
            return dom_side | dow_side
        return dom & dow

    def day_matches(self, ordinal: int) -> bool:
        day = date.fromordinal(ordinal)
        return bool(self.month_mask(day.year, day.month) >> (day.day - 1) & 1)

    def matching_days(self, first: int, last: int) -> int:
        """How many days in the ordinals [first, last] match: one step per month."""
        if last < first:
            return 0
        lo, hi = date.fromordinal(first), date.fromordinal(last)
        year, month, total = lo.year, lo.month, 0
        while (year, month) <= (hi.year, hi.month):
            mask = self.month_mask(year, month)
            if mask:
                if (year, month) == (hi.year, hi.month):
                    mask &= (1 << hi.day) - 1
                if (year, month) == (lo.year, lo.month):
                    mask &= ~((1 << (lo.day - 1)) - 1)
                total += mask.bit_count()
            year, month = (year + 1, 1) if month == 12 else (year, month + 1)
        return total

    def last_day_at_or_before(self, ordinal: int, floor: int) -> int | None:
        """The last matching day in [floor, ordinal]: one step per month."""
        day = date.fromordinal(ordinal)
        year, month, mask_to = day.year, day.month, (1 << day.day) - 1
        while True:
            mask = self.month_mask(year, month) & mask_to
            if mask:
                found = date(year, month, mask.bit_length()).toordinal()
                return found if found >= floor else None
            if date(year, month, 1).toordinal() <= floor:
                return None
            year, month = (year - 1, 12) if month == 1 else (year, month - 1)
            mask_to = -1

    # times of day

    def times_up_to(self, second_of_day: int) -> int:
        """How many matching times of day are at or before ``second_of_day`` (-1 .. 86399)."""
        if second_of_day < 0:
            return 0
        hour, rest = divmod(second_of_day, 3600)
        minute, second = divmod(rest, 60)
        count = bisect_left(self.hours, hour) * len(self.minutes) * len(self.seconds)
        if hour in self._hour_set:
            count += bisect_left(self.minutes, minute) * len(self.seconds)
            if minute in self._minute_set:
                count += bisect_right(self.seconds, second)
        return count

    def last_time_at_or_before(self, second_of_day: int) -> int | None:
        hour, rest = divmod(second_of_day, 3600)
        minute, second = divmod(rest, 60)
        if hour in self._hour_set:
            if minute in self._minute_set:
                i = bisect_right(self.seconds, second)
                if i:
                    return hour * 3600 + minute * 60 + self.seconds[i - 1]
            i = bisect_left(self.minutes, minute)
            if i:
                return hour * 3600 + self.minutes[i - 1] * 60 + self.seconds[-1]
        i = bisect_left(self.hours, hour)
        if i:
            return self.hours[i - 1] * 3600 + self.minutes[-1] * 60 + self.seconds[-1]
        return None

    # wall times

    def count_walls(self, lo: int, hi: int) -> int:
        """How many matching wall times are in [lo, hi] (wall seconds)."""
        if hi < lo:
            return 0
        first, start = divmod(lo, DAY)
        last, end = divmod(hi, DAY)
        if first == last:
            if not self.day_matches(first):
                return 0
            return self.times_up_to(end) - self.times_up_to(start - 1)
        count = self.per_day * self.matching_days(first + 1, last - 1)
        if self.day_matches(first):
            count += self.per_day - self.times_up_to(start - 1)
        if self.day_matches(last):
            count += self.times_up_to(end)
        return count

    def wall_matches(self, wall: int) -> bool:
        return self.count_walls(wall, wall) == 1

    def last_wall_at_or_before(self, wall: int, floor: int) -> int | None:
        """The last matching wall time in [floor, wall], or None."""
        day, second = divmod(wall, DAY)
        if self.day_matches(day):
            time = self.last_time_at_or_before(second)
            if time is not None:
                found = day * DAY + time
                return found if found >= floor else None
        earlier = self.last_day_at_or_before(day - 1, floor // DAY)
        if earlier is None:
            return None
        found = earlier * DAY + self.last_time_at_or_before(DAY - 1)  # type: ignore[operator]
        return found if found >= floor else None


@lru_cache(maxsize=1024)
def cron_sets(expr: str, has_seconds: bool, day_or: bool) -> CronSets:
    return CronSets(expr, has_seconds, day_or)


def _values(field: list[int | str], full: range) -> tuple[int, ...]:
    return tuple(full) if field[0] == "*" else tuple(sorted(int(v) for v in field))


def _bits(days: Iterable[int]) -> int:
    mask = 0
    for day in days:
        mask |= 1 << (day - 1)
    return mask


def _nearest_weekday(year: int, month: int, day: int, last: int) -> int:
    """croniter's ``W``: the weekday nearest ``day`` (capped at the month's end), in the month."""
    day = min(day, last)
    weekday = calendar.weekday(year, month, day)  # Monday is 0
    if weekday == 5:  # Saturday: the Friday before, or the Monday after on the 1st
        return day - 1 if day > 1 else day + 2
    if weekday == 6:  # Sunday: the Monday after, or the Friday before on the last day
        return day + 1 if day < last else day - 2
    return day


def _nth_days(first: int, last: int, nth: dict[int, frozenset[int | str]]) -> Iterable[int]:
    """croniter's ``wd#n`` (the n-th such weekday) and ``Lwd`` (the last one) of a month."""
    for weekday, which in nth.items():
        day_one = 1 + (weekday - first) % 7
        for n in which:
            day = day_one + 7 * ((last - day_one) // 7) if n == "l" else day_one + 7 * (int(n) - 1)
            if day <= last:
                yield day


# --- the zone's offsets ---------------------------------------------------------------------


@lru_cache(maxsize=4096)
def _changes_in_year(zone: str, year: int) -> tuple[tuple[int, int, int], ...]:
    """(instant, offset before, offset after) of each offset change in a UTC calendar year."""
    tz = ZoneInfo(zone)
    start = date(year, 1, 1).toordinal() * DAY
    stop = min((date(year, 12, 31).toordinal() + 1) * DAY - 1, _LAST + DAY)
    found = []
    x, offset = start - 1, offset_at(tz, start - 1)
    while x < stop:
        y = min(x + DAY, stop)
        new = offset_at(tz, y)
        if new == offset:
            x = y
            continue
        lo, hi = x, y  # offset(lo) == offset != offset(hi): bisect for the first second after
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if offset_at(tz, mid) == offset:
                lo = mid
            else:
                hi = mid
        after = offset_at(tz, hi)
        found.append((hi, offset, after))
        x, offset = hi, after
    return tuple(found)


def repeated_stretch(naive: datetime, zone: str) -> tuple[datetime, datetime] | None:
    """The wall times [first, end) around ``naive`` that happen twice because the clocks went
    back over them, or None when ``naive`` happens once: read off the zone's offset changes
    (``_changes_in_year``), a change at UTC second T from ``before`` to a smaller ``after``
    repeating the wall times [T + after, T + before)."""
    wall = to_seconds(naive)
    for year in range(max(naive.year - 1, _FIRST_YEAR), min(naive.year + 1, 9999) + 1):
        for at, before, after in _changes_in_year(zone, year):
            if before > after and at + after <= wall < at + before:
                return naive_at(at + after), naive_at(at + before)
    return None

def offset_pieces(zone: str, lo: int, hi: int) -> list[tuple[int, int, int | None]]:
    """The UTC seconds [lo, hi] as pieces of constant offset: (start, offset, offset before).

    A piece starts at an offset change (with the offset before it), or at ``lo`` minus the
    look-back (offset before: None). Cost: one step per year, plus a day-by-day scan of each
    year the first time a zone's year is used (cached).
    """
    tz = ZoneInfo(zone)
    first = lo - _LOOKBACK
    pieces: list[tuple[int, int, int | None]] = [(first, offset_at(tz, first), None)]
    for year in range(naive_at(first).year, naive_at(hi).year + 1):
        for at, before, after in _changes_in_year(zone, year):
            if first < at <= hi:
                pieces.append((at, after, before))
    return pieces


# --- the DST rules --------------------------------------------------------------------------

# A job's DST policy (``Job.dst_policy``): what a fixed-hour cron does with a wall time the
# clocks skip (``gap_end``: once, when the gap ends; ``skip``: not at all) and with one they
# repeat (``first``, ``second`` or ``both`` of its two instants), written "gap+fold"; or
# ``celery``, Celery beat's own reading (``DstRule``). The default is the rule documented before
# there was a choice, so a row without a policy means what it always meant.
GAP_RULES = ("gap_end", "skip")
FOLD_RULES = ("first", "second", "both")
DEFAULT_DST_POLICY = "gap_end+first"
CELERY_DST_POLICY = "celery"
DST_POLICIES = (
    *(f"{gap}+{fold}" for gap in GAP_RULES for fold in FOLD_RULES),
    CELERY_DST_POLICY,
)


@dataclass(frozen=True)
class DstRule:
    """How one cron's wall times become instants across DST changes: the one rule that
    ``instants``, ``count_fires`` and ``last_fires`` (and so next, count and recent) follow.

    gap: ``gap_end`` (a skipped wall time fires once, at the gap's end), ``skip`` (never), or
    ``celery``: the first matching wall time of the gap fires at the instant the offset before
    the change names it (02:30 in Paris on 2026-03-29 at 03:30+02:00), and no other matching
    wall time before that instant fires (Celery steps from that send: ``crontab.remaining_delta``
    replaces the fields of its last run, and the new wall time keeps the old offset).
    fold: which of a repeated wall time's two instants fire (Celery's is ``first``).
    """

    gap: str
    fold: str


def dst_rule(policy: str, wildcard_hour: bool) -> DstRule:
    """The rule a cron follows under a job's policy. A cron whose hour field is ``*`` follows
    elapsed time (skipped wall times do not exist, repeated ones fire twice) under every
    policy but ``celery``: the gap and fold choices are about fixed-hour times."""
    if policy == CELERY_DST_POLICY:
        return DstRule("celery", "first")
    gap, _, fold = policy.partition("+")
    if gap not in GAP_RULES or fold not in FOLD_RULES:  # a row written behind the API's back
        raise ValueError(f"unknown DST policy {policy!r}; use one of {', '.join(DST_POLICIES)}.")
    return DstRule("skip", "both") if wildcard_hour else DstRule(gap, fold)


def instants(
    naive: datetime, tz: ZoneInfo, rule: DstRule | bool, sets: CronSets | None = None
) -> list[datetime]:
    """The UTC instants at which a wall-clock time fires, by ``rule`` (a bool: today's default
    rule for a cron whose hour is, or is not, a wildcard). ``sets`` (the cron's) is needed by
    Celery's gap rule only, which depends on the other wall times of the gap."""
    if isinstance(rule, bool):
        rule = dst_rule(DEFAULT_DST_POLICY, rule)
    found: list[datetime] = []
    for fold in (0, 1):
        instant = naive.replace(tzinfo=tz, fold=fold).astimezone(UTC)
        if instant.astimezone(tz).replace(tzinfo=None) == naive and instant not in found:
            found.append(instant)
    found.sort()
    if len(found) == 2:  # a repeated wall time
        return found if rule.fold == "both" else found[1:] if rule.fold == "second" else found[:1]
    if rule.gap == "celery":
        assert sets is not None, "Celery's gap rule reads the cron's other wall times"
        if not found:  # the gap's first matching wall time fires, at the offset before it
            wall = to_seconds(naive)
            change = _spring_change(tz.key, wall, wall=True)
            first = change and first_wall_in(sets, change[0] + change[1], change[0] + change[2] - 1)
            return [instant_at(wall - change[1])] if change and first == wall else []
        send = celery_gap_send(sets, tz.key, utc_seconds(found[0]))
        if send is not None and utc_seconds(found[0]) < send:
            return []  # after the gap, before Celery's send for it: Celery steps from that send
        return found
    if not found and rule.gap == "gap_end":
        return [end_of_gap(naive, tz)]  # skipped hour: a fixed-time job runs after the gap
    return found


def _spring_change(zone: str, at: int, *, wall: bool) -> tuple[int, int, int] | None:
    """The spring-forward change (UTC second, offset before, offset after) whose gap holds the
    wall time ``at`` (``wall=True``), or in whose first gap's length the UTC second ``at`` is."""
    year = naive_at(at).year
    for y in range(max(year - 1, _FIRST_YEAR), min(year + 1, 9999) + 1):
        for change, before, after in _changes_in_year(zone, y):
            if after > before and (
                change + before <= at < change + after
                if wall
                else change <= at < change + after - before
            ):
                return change, before, after
    return None


def celery_gap_send(sets: CronSets, zone: str, at: int) -> int | None:
    """Celery's send for the spring-forward gap whose length after the change holds the UTC
    second ``at``: the gap's first matching wall time read at the offset before the change
    (UTC seconds); None when there is no such gap or it holds no matching wall time."""
    change = _spring_change(zone, at, wall=False)
    if change is None:
        return None
    at_change, before, after = change
    first = first_wall_in(sets, at_change + before, at_change + after - 1)
    return None if first is None else first - before


def first_wall_in(sets: CronSets, lo: int, hi: int) -> int | None:
    """The first matching wall time in [lo, hi] (wall seconds, at most a day apart), by
    bisection on ``count_walls``."""
    if sets.count_walls(lo, hi) == 0:
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if sets.count_walls(lo, mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def end_of_gap(naive: datetime, tz: ZoneInfo) -> datetime:
    """The instant the clocks jumped over ``naive``: the first valid instant after it."""
    lo = naive.replace(tzinfo=tz, fold=1).astimezone(UTC)  # read with the later offset
    hi = naive.replace(tzinfo=tz, fold=0).astimezone(UTC)  # read with the earlier offset
    lo, hi = min(lo, hi), max(lo, hi)
    before = lo.astimezone(tz).utcoffset()
    while hi - lo > _EPSILON:  # bisect for the first instant with the new offset
        mid = lo + (hi - lo) / 2
        if mid.astimezone(tz).utcoffset() == before:
            lo = mid
        else:
            hi = mid
    return hi.replace(microsecond=0) if hi.microsecond else hi


# --- counting and walking back --------------------------------------------------------------


def count_fires(sets: CronSets, zone: str, rule: DstRule | bool, lo: int, hi: int) -> int:
    """How many fire times are in the UTC seconds [lo, hi], by the rules of ``instants``.

    Within a piece of constant offset an instant fires iff its wall time matches. At a
    fall-back change the repeated wall times show in both pieces around it: fold ``first``
    skips them in the piece after it, ``second`` in the piece before it (looking past ``hi``
    for that change), ``both`` in neither. At a spring-forward change: ``gap_end`` fires once
    at the change when a skipped wall time matches (unless the first wall time after the gap
    matches too: the same instant), ``skip`` adds nothing (skipped wall times have no
    instant), ``celery`` fires once at the gap's first matching wall time read at the old
    offset and skips the wall times after the gap up to that send's.
    """
    if isinstance(rule, bool):
        rule = dst_rule(DEFAULT_DST_POLICY, rule)
    lo, hi = max(lo, _FIRST), min(hi, _LAST)
    if hi < lo:
        return 0
    pieces = offset_pieces(zone, lo, hi)
    total = 0
    for i, (start, offset, before) in enumerate(pieces):
        stop = pieces[i + 1][0] - 1 if i + 1 < len(pieces) else hi
        first, last = max(start, lo), min(stop, hi)
        spring = before is not None and offset > before
        send = None
        if spring and rule.gap == "celery":
            found = first_wall_in(sets, start + before, start + offset - 1)  # type: ignore[operator]
            send = None if found is None else found - before  # type: ignore[operator]
        if first <= last:
            wall_lo, wall_hi = first + offset, last + offset
            if rule.fold == "first" and before is not None and before > offset:
                wall_lo = max(wall_lo, start + before)  # past the repeated wall times
            if rule.fold == "second":
                later = _next_change(zone, pieces, i, hi)
                if later is not None and later[1] > later[2]:  # the first pass of a repeat
                    wall_hi = min(wall_hi, later[0] + later[2] - 1)
            if send is not None:
                wall_lo = max(wall_lo, send + offset + 1)  # Celery steps from its send
            total += sets.count_walls(wall_lo, wall_hi)
        if send is not None and lo <= send <= hi:
            total += 1
        if (
            rule.gap == "gap_end"
            and spring
            and lo <= start <= hi
            and sets.count_walls(start + before, start + offset - 1)  # type: ignore[operator]
            and not sets.wall_matches(start + offset)
        ):
            total += 1
    return total


def _next_change(
    zone: str, pieces: list[tuple[int, int, int | None]], i: int, hi: int
) -> tuple[int, int, int] | None:
    """The offset change that ends piece ``i`` (UTC second, offset before, offset after),
    looking past ``hi`` for the last piece; None if none comes within two days."""
    if i + 1 < len(pieces):
        at, after, before = pieces[i + 1]
        return at, before, after  # type: ignore[return-value]
    year = naive_at(hi).year
    for y in (year, min(year + 1, 9999)):
        for at, before, after in _changes_in_year(zone, y):
            if hi < at <= hi + _LOOKBACK:
                return at, before, after
    return None


def last_fires(
    sets: CronSets, zone: str, rule: DstRule | bool, since: datetime, until: datetime, count: int
) -> list[datetime]:
    """The last ``count`` fire times in [since, until], oldest first.

    Walks matching wall times backwards from ``until``'s (month bitmasks skip the days that do
    not match) and maps each to its instants. The earliest and the latest instant of a wall
    time never decrease as the wall time grows, so the walk stops as soon as a wall time's
    latest instant is older than the ``count``-th newest found. Cost: about ``count`` wall
    times, plus those of one DST change when ``until`` is just after it; never the gap.
    """
    if isinstance(rule, bool):
        rule = dst_rule(DEFAULT_DST_POLICY, rule)
    tz = ZoneInfo(zone)
    lo, hi = max(utc_seconds(since, up=True), _FIRST), min(utc_seconds(until), _LAST)
    if hi < lo or count <= 0:
        return []
    local = instant_at(hi).astimezone(tz)
    wall = to_seconds(local.replace(tzinfo=None))
    if local.fold == 1:  # second pass of a repeated hour: later wall times fired before it
        first_pass = local.replace(fold=0).utcoffset()
        wall += max(0, int((first_pass - local.utcoffset()).total_seconds()))  # type: ignore[operator]
    floor = lo + offset_at(tz, lo) - _LOOKBACK  # older wall times fire before ``since``
    found: set[datetime] = set()
    newest: list[datetime] = []  # the ``count`` newest found, kept sorted
    current = sets.last_wall_at_or_before(wall, floor)
    while current is not None:
        naive = naive_at(current)
        times = instants(naive, tz, rule, sets)
        if times:
            if utc_seconds(times[-1]) < lo or (len(newest) == count and times[-1] < newest[0]):
                break
            for t in times:
                if lo <= utc_seconds(t) <= hi and t not in found:
                    found.add(t)
                    newest.insert(bisect_left(newest, t), t)
                    if len(newest) > count:
                        newest.pop(0)
        exists = _exists(naive, tz)
        if exists and (times or rule.gap != "celery"):
            current = sets.last_wall_at_or_before(current - 1, floor)
        elif exists:  # after a gap, before Celery's send for it: on to the gap's wall times
            spring = _spring_change(zone, utc_seconds(naive.replace(tzinfo=tz)), wall=False)
            assert spring is not None
            current = sets.last_wall_at_or_before(spring[0] + spring[2] - 1, floor)
        else:  # inside a gap: the other skipped wall times fire at the same instant, or never
            change = utc_seconds(end_of_gap(naive, tz))
            before = offset_at(tz, change - 1)
            first = first_wall_in(sets, change + before, current) if rule.gap == "celery" else None
            if first is not None and first < current:  # Celery's one send is for the first
                current = first
            else:
                current = sets.last_wall_at_or_before(change - 1 + before, floor)
    return newest


def exists(naive: datetime, tz: ZoneInfo) -> bool:
    """Whether a wall time happens (is not in a gap)."""
    return _exists(naive, tz)


def _exists(naive: datetime, tz: ZoneInfo) -> bool:
    local = naive.replace(tzinfo=tz)
    return local.astimezone(UTC).astimezone(tz).replace(tzinfo=None) == naive
