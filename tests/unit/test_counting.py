"""Exact counting (``count_fire_times``) and the last occurrences (``recent_fire_times``).

The oracle is plain enumeration: ``fire_times``, which steps through croniter one occurrence at
a time and applies the DST rules wall time by wall time. The counting under test never steps
through occurrences (it reads day bitmasks and time-of-day sets), so the two are independent
paths to the same numbers. Tables pin the numbers that matter by hand: DST days in half-hour
zones, ``L``, ``W`` (``LW``), ``#`` (``FRIL``), and Celery's AND of the day fields.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from functools import cache
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from schedapp import cronmath, schedules
from schedapp.exceptions import ScheduleError
from schedapp.schedules import (
    count_fire_times,
    fire_times,
    next_fire_time,
    parse_cron,
    recent_fire_times,
)
from tests import examples

SECOND = timedelta(seconds=1)
MINUTE = timedelta(minutes=1)
HOUR = timedelta(hours=1)
DAY = timedelta(days=1)
EPSILON = timedelta(microseconds=1)
ZONES = (
    "UTC",
    "Europe/Paris",
    "America/New_York",
    "Australia/Lord_Howe",
    "Pacific/Chatham",
    "Asia/Kolkata",
)


def at(iso: str) -> datetime:
    value = datetime.fromisoformat(iso)
    assert value.tzinfo is not None, iso
    return value


def local_day(day: str, zone: str) -> tuple[datetime, datetime]:
    """The first and last microsecond of a local calendar day, as UTC instants."""
    tz = ZoneInfo(zone)
    first = date.fromisoformat(day)
    start = datetime.combine(first, datetime.min.time(), tz).astimezone(UTC)
    end = datetime.combine(first + DAY, datetime.min.time(), tz).astimezone(UTC) - EPSILON
    return start, end


def enumerate_fires(cron, start: datetime, end: datetime) -> list[datetime]:
    return list(fire_times(cron, start.astimezone(UTC) - EPSILON, end))  # [start, end]


# --- tables ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "zone", "day", "expected"),
    [
        # Wildcard hour: elapsed time. A 23-hour day loses an hour of fires, a 25-hour day
        # gains one; Lord Howe shifts by 30 minutes, Chatham by an hour at 02:45.
        ("*/30 * * * *", "Europe/Paris", "2026-03-29", 46),
        ("*/30 * * * *", "Europe/Paris", "2026-10-25", 50),
        ("* * * * *", "America/New_York", "2026-03-08", 1380),
        ("* * * * *", "America/New_York", "2026-11-01", 1500),
        ("* * * * *", "Australia/Lord_Howe", "2026-10-04", 1410),
        ("* * * * *", "Australia/Lord_Howe", "2026-04-05", 1470),
        ("*/15 * * * *", "Pacific/Chatham", "2026-09-27", 92),
        ("*/15 * * * *", "Pacific/Chatham", "2026-04-05", 100),
        ("* * * * * *", "Europe/Paris", "2026-03-29", 82_800),
        ("* * * * *", "Asia/Kolkata", "2026-03-29", 1440),
        # Fixed hour: once a day whatever the clocks do (the gap's time runs at its end).
        ("30 2 * * *", "Europe/Paris", "2026-03-29", 1),
        ("30 2 * * *", "Europe/Paris", "2026-10-25", 1),
        ("15 2 * * *", "Australia/Lord_Howe", "2026-10-04", 1),
        ("45 1 * * *", "Australia/Lord_Howe", "2026-04-05", 1),
        ("0 3 * * *", "Pacific/Chatham", "2026-09-27", 1),
        ("0 3 * * *", "Pacific/Chatham", "2026-04-05", 1),
        # Every minute of hour 2 on the day it does not exist: all of it runs once, at 03:00.
        ("* 2 * * *", "Europe/Paris", "2026-03-29", 1),
        ("* * 2 * * *", "Europe/Paris", "2026-03-29", 1),
        # ... and the repeated hour runs once, in summer time.
        ("* 2 * * *", "Europe/Paris", "2026-10-25", 60),
        # Hours 2 and 3: the gap's fires fall on 03:00, which fires anyway: one instant.
        ("0 2,3 * * *", "Europe/Paris", "2026-03-29", 1),
        ("0 2-4 * * *", "Europe/Paris", "2026-03-29", 2),
        # Lord Howe's gap is 02:00-02:30: the 02:15 fire runs at 02:30, which is its own.
        ("15,30 2 * * *", "Australia/Lord_Howe", "2026-10-04", 1),
        ("15,45 2 * * *", "Australia/Lord_Howe", "2026-10-04", 2),
    ],
)
def test_given_a_dst_day_when_counting_then_the_count_is_the_enumerated_one(
    expr, zone, day, expected
):
    cron = parse_cron(expr, zone)
    start, end = local_day(day, zone)
    assert count_fire_times(cron, start, end) == expected
    if expected <= 2000:
        assert len(enumerate_fires(cron, start, end)) == expected


@pytest.mark.parametrize(
    ("expr", "day_or", "expected"),
    [
        ("0 0 L * *", True, 12),  # last day of each month
        ("0 0 1,L * *", True, 24),
        ("0 0 15W * *", True, 12),  # the weekday nearest the 15th
        ("0 0 1W * *", True, 12),
        ("0 0 * * 5#3", True, 12),  # third Friday
        ("0 0 * * fri#5", True, 4),  # fifth Friday: Jan 30, May 29, Jul 31, Oct 30 2026
        ("0 0 * * L5", True, 12),  # last Friday
        ("0 0 * * mon-fri#1", True, 60),
        ("0 0 * * 1-5", True, 261),
        # Both day fields restricted: croniter ORs them, Celery ANDs them.
        ("0 0 1-7 * 0", True, 7 * 12 + 52 - 12),
        ("0 0 1-7 * 0", False, 12),
        ("0 0 13 * fri", True, 12 + 52 - 3),  # 2026 has three Friday the 13ths
        ("0 0 13 * fri", False, 3),
        # "#" and "W" stay an intersection on each side of croniter's OR.
        ("0 0 */2 * 1#1", True, 12),
        ("0 0 15W * 1", True, 12),
        # One day field restricted: AND and OR are the same.
        ("0 0 * * 0", False, 52),
        ("0 0 1 * *", False, 12),
    ],
)
def test_given_day_field_constructs_when_counting_2026_then_days_match_like_croniter(
    expr, day_or, expected
):
    cron = parse_cron(expr, "UTC", day_or=day_or)
    start, end = at("2026-01-01T00:00+00:00"), at("2026-12-31T23:59:59+00:00")
    fires = enumerate_fires(cron, start, end)
    assert len(fires) == expected
    assert count_fire_times(cron, start, end) == expected


def test_given_celery_first_sunday_when_enumerating_2026_then_twelve_sundays_in_days_1_to_7():
    cron = parse_cron("0 0 1-7 * sun", "Europe/Paris", day_or=False)
    tz = ZoneInfo("Europe/Paris")
    start, end = at("2026-01-01T00:00+01:00"), at("2027-01-01T00:00+01:00") - EPSILON
    fires = [t.astimezone(tz) for t in enumerate_fires(cron, start, end)]
    assert len(fires) == 12
    assert {t.month for t in fires} == set(range(1, 13))
    assert all(t.isoweekday() == 7 and t.day <= 7 and t.hour == 0 for t in fires)
    assert count_fire_times(cron, start, end) == 12


@pytest.mark.parametrize(
    ("expr", "zone", "years"),
    [
        ("* * * * * *", "Europe/Paris", 10),
        ("* * * * * *", "Australia/Lord_Howe", 10),
        ("*/7 * * * * *", "America/New_York", 30),
        ("0 0 29 2 *", "UTC", 100),
    ],
)
def test_given_a_long_range_when_counting_then_no_occurrence_is_enumerated(
    monkeypatch, expr, zone, years
):
    cron = parse_cron(expr, zone)
    start = at("2000-01-01T00:00+00:00")
    end = start + years * 365 * DAY

    def no_stepping(*args):
        raise AssertionError("count_fire_times stepped through occurrences")

    monkeypatch.setattr(schedules, "_next_cron", no_stepping)
    monkeypatch.setattr(cronmath, "instants", no_stepping)
    total = count_fire_times(cron, start, end)
    assert total > 0


def test_given_ten_years_of_seconds_then_the_count_is_the_seconds_elapsed():
    # Wildcard hour: the hours lost in spring come back in autumn, the count is elapsed time.
    cron = parse_cron("* * * * * *", "Europe/Paris")
    start, end = at("2016-01-01T00:00+00:00"), at("2026-01-01T00:00+00:00")
    assert count_fire_times(cron, start, end) == (end - start) // SECOND + 1


def test_given_a_long_outage_when_listing_recent_times_then_the_walk_follows_count(monkeypatch):
    cron = parse_cron("* * * * * *", "Europe/Paris")
    since, until = at("2016-01-01T00:00+00:00"), at("2026-10-25T01:00:30+00:00")  # just after
    calls = []
    real = cronmath.instants

    def counted(*args):
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(cronmath, "instants", counted)
    got = recent_fire_times(cron, until, since, 5)
    assert got == [until - k * SECOND for k in range(4, -1, -1)]
    # The repeated hour doubles the wall times that may hold the newest: at most an hour's.
    assert len(calls) <= 5 + 3600 + 2


@pytest.mark.parametrize(
    ("expr", "zone", "until", "count", "expected"),
    [
        # Fixed hour: the repeated 02:xx wall times fired in summer time only.
        (
            "*/20 2 * * *",
            "Europe/Paris",
            "2026-10-25T02:30+01:00",
            4,
            [
                "2026-10-24T02:40+02:00",
                "2026-10-25T02:00+02:00",
                "2026-10-25T02:20+02:00",
                "2026-10-25T02:40+02:00",
            ],
        ),
        # Wildcard hour: both passes, the second pass last.
        (
            "*/20 * * * *",
            "Europe/Paris",
            "2026-10-25T02:30+01:00",
            5,
            [
                "2026-10-25T02:00+02:00",
                "2026-10-25T02:20+02:00",
                "2026-10-25T02:40+02:00",
                "2026-10-25T02:00+01:00",
                "2026-10-25T02:20+01:00",
            ],
        ),
        # Fixed hour in the spring gap: one run at 03:00, after the day before's.
        (
            "*/20 2 * * *",
            "Europe/Paris",
            "2026-03-29T03:10+02:00",
            2,
            ["2026-03-28T02:40+01:00", "2026-03-29T03:00+02:00"],
        ),
        # Wildcard hour across the gap: 01:40 is followed by 03:00.
        (
            "*/20 * * * *",
            "Europe/Paris",
            "2026-03-29T03:10+02:00",
            3,
            ["2026-03-29T01:20+01:00", "2026-03-29T01:40+01:00", "2026-03-29T03:00+02:00"],
        ),
        # Lord Howe's half-hour repeat, wildcard hour.
        (
            "*/15 * * * *",
            "Australia/Lord_Howe",
            "2026-04-05T01:40+10:30",
            4,
            [
                "2026-04-05T01:15+11:00",
                "2026-04-05T01:30+11:00",
                "2026-04-05T01:45+11:00",
                "2026-04-05T01:30+10:30",
            ],
        ),
        # A sparse cron: cheap however far back ``since`` is.
        (
            "0 0 29 2 *",
            "UTC",
            "2026-06-01T00:00+00:00",
            2,
            ["2020-02-29T00:00+00:00", "2024-02-29T00:00+00:00"],
        ),
    ],
)
def test_given_dst_changes_when_listing_recent_times_then_they_are_the_enumerated_ones(
    expr, zone, until, count, expected
):
    cron = parse_cron(expr, zone)
    tz = ZoneInfo(zone)
    got = recent_fire_times(cron, at(until), at("2000-01-01T00:00+00:00"), count)
    assert [t.astimezone(tz).isoformat(timespec="minutes") for t in got] == expected
    assert got == enumerate_fires(cron, got[0] - 2 * DAY, at(until))[-count:]


# --- properties: counting equals enumeration --------------------------------------------------


def _numbers(lo: int, hi: int) -> st.SearchStrategy[str]:
    single = st.integers(lo, hi).map(str)
    pair = st.tuples(st.integers(lo, hi), st.integers(lo, hi)).map(sorted)
    span = pair.map(lambda ab: f"{ab[0]}-{ab[1]}")
    step = st.integers(2, hi - lo).map(lambda k: f"*/{k}")
    span_step = st.tuples(pair, st.integers(1, 9)).map(lambda p: f"{p[0][0]}-{p[0][1]}/{p[1]}")
    listed = st.lists(single | span, min_size=2, max_size=3).map(",".join)
    return st.one_of(st.just("*"), single, span, step, span_step, listed)


WEEKDAY_NAMES = ["sun", "mon", "tue", "wed", "thu", "fri", "sat", "Friday", "MONDAY", "sunday"]
DOM = st.one_of(
    _numbers(1, 31),
    st.sampled_from(["?", "L", "1,L", "15,L", "L,28", "1W", "15W", "31W", "W6", "30W", "LW"]),
)
MONTH = _numbers(1, 12) | st.sampled_from(["jan", "feb-apr", "oct,nov", "March", "*/3"])
DOW = st.one_of(
    _numbers(0, 7),
    st.sampled_from(WEEKDAY_NAMES),
    st.sampled_from(["?", "mon-fri", "sat,sun", "1#1", "5#3", "0#5", "fri#2", "L5", "L0"]),
    st.sampled_from(["5L", "FRIL", "sundayL", "7L", "1L,3#2"]),
    st.sampled_from(["mon-fri#2", "1#2,1#4", "6#1,L6", "sun-sat#3"]),
)


@st.composite
def crons(draw) -> tuple[str, bool]:
    """Any 5- or 6-field cron, with day-of-month and day-of-week specials, and a day_or."""
    second = draw(st.none() | _numbers(0, 59))
    minute, hour = draw(_numbers(0, 59)), draw(_numbers(0, 23) | st.just("*/1"))
    rarely = st.integers(0, 3).map(lambda n: n == 0)
    dom = draw(DOM) if draw(rarely) else "*"
    month = draw(MONTH) if draw(rarely) else "*"
    dow = draw(DOW) if draw(rarely) else "*"
    fields = [minute, hour, dom, month, dow]
    if second is not None:
        fields.insert(0, second)
    return " ".join(fields), draw(st.booleans())


@cache
def changes_2026(zone: str) -> tuple[datetime, ...]:
    tz = ZoneInfo(zone)
    start = cronmath.utc_seconds(at("2026-01-01T00:00+00:00"))
    return tuple(
        cronmath.instant_at(t)
        for year in (2026,)
        for t, _, _ in cronmath._changes_in_year(tz.key, year)
        if t >= start
    )


@st.composite
def windows(draw, zone: str, fires_per_day: int) -> tuple[datetime, datetime]:
    """[start, end] of up to four days, often around one of the zone's 2026 changes, and short
    enough that enumeration stays under about 800 steps."""
    changes = changes_2026(zone)
    if changes and draw(st.booleans()):
        base = draw(st.sampled_from(changes)) + draw(st.integers(-36 * 60, 36 * 60)) * MINUTE
    else:
        base = at("2026-01-01T00:00+00:00") + draw(st.integers(0, 364 * 1440)) * MINUTE
    start = base + draw(st.integers(0, 59_999_999)) * timedelta(microseconds=1)
    longest = min(4 * DAY, DAY * 800 / max(1, fires_per_day))
    length = draw(st.floats(0, 1)) * longest
    return start, start + length


PROPERTY = settings(
    max_examples=examples(150),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


def check_against_enumeration(cron, start: datetime, end: datetime, count: int) -> None:
    everything = enumerate_fires(cron, start, end)
    where = f"{cron.expr!r} day_or={cron.day_or} in {cron.timezone} over [{start}, {end}]"
    assert count_fire_times(cron, start, end) == len(everything), where
    assert recent_fire_times(cron, end, start, count) == everything[-count:], where


def parsed(expr: str, zone: str, day_or: bool):
    try:
        return parse_cron(expr, zone, day_or=day_or)
    except ScheduleError:  # never fires, or a combination croniter refuses ("1,5#3")
        assume(False)


@PROPERTY
@given(spec=crons(), zone=st.sampled_from(ZONES), data=st.data())
def test_property_count_and_recent_equal_enumeration(spec, zone, data):
    """Any cron, zone and window (often across one of 2026's DST changes)."""
    cron = parsed(spec[0], zone, spec[1])
    sets = cronmath.cron_sets(cron.expr, cron.has_seconds, cron.day_or)
    start, end = data.draw(windows(zone, sets.per_day))
    shown_in = data.draw(st.sampled_from([UTC, ZoneInfo(zone), ZoneInfo("Asia/Kolkata")]))
    check_against_enumeration(
        cron, start.astimezone(shown_in), end.astimezone(shown_in), data.draw(st.integers(1, 30))
    )


@PROPERTY
@given(
    dom=DOM,
    month=MONTH | st.just("*"),
    dow=DOW,
    day_or=st.booleans(),
    first=st.integers(0, 20 * 366),
    days=st.integers(1, 400),
    count=st.integers(1, 20),
)
def test_property_day_matching_equals_croniter_over_a_year(
    dom, month, dow, day_or, first, days, count
):
    """One fire a day, so windows can be long: L, W, #, names, OR and AND, across years."""
    cron = parsed(f"0 12 {dom} {month} {dow}", "UTC", day_or)
    start = at("2020-01-01T00:00+00:00") + first * DAY
    check_against_enumeration(cron, start, start + days * DAY, count)


W_DAYS = st.sampled_from(["1W", "2W", "15W", "28W", "29W", "30W", "31W", "W1", "W31", "LW"])
L_DAYS = st.sampled_from(["L", "1,L", "L,15", "30,L", "29-31,L"])
NTH_DAYS = st.sampled_from(
    ["1#1", "5#3", "0#5", "6#1", "fri#2", "L5", "L0", "L6", "mon-fri#1", "1#2,1#4", "6#1,L6"]
) | st.sampled_from(["5L", "FRIL", "7L", "6#1,6L"])


@settings(
    max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.filter_too_much]
)
@given(
    dom=W_DAYS | L_DAYS | _numbers(1, 31),
    dow=NTH_DAYS | st.sampled_from(["*", "1", "mon-fri", "0,6", "Saturday"]),
    day_or=st.booleans(),
    first=st.integers(0, 20 * 366),
    days=st.integers(28, 1000),
    count=st.integers(1, 20),
)
def test_property_w_l_and_nth_days_equal_croniter_over_years(dom, dow, day_or, first, days, count):
    """``W``, ``L`` and ``#`` next to every kind of other day field, over months that start
    and end on every weekday, leap years included."""
    cron = parsed(f"0 12 {dom} * {dow}", "UTC", day_or)
    start = at("2020-01-01T00:00+00:00") + first * DAY
    check_against_enumeration(cron, start, start + days * DAY, count)


HOURS_NEAR_CHANGES = st.sampled_from(["1", "2", "3", "1-3", "2,3", "2-4", "0-23", "*/2", "1,2"])
MINUTES_NEAR_CHANGES = st.sampled_from(["0", "30", "45", "*/15", "0,30", "15,45", "*/20", "59"])


@PROPERTY
@given(
    second=st.none() | st.sampled_from(["0", "30", "*/20"]),
    minute=MINUTES_NEAR_CHANGES | _numbers(0, 59),
    hour=HOURS_NEAR_CHANGES | st.sampled_from(["*", "*/1"]),
    zone=st.sampled_from(ZONES[1:5]),
    data=st.data(),
)
def test_property_dst_changes_equal_enumeration(second, minute, hour, zone, data):
    """Fixed and wildcard hours whose times fall in the gaps and repeats of 2026's changes."""
    expr = f"{minute} {hour} * * *" if second is None else f"{second} {minute} {hour} * * *"
    cron = parsed(expr, zone, True)
    sets = cronmath.cron_sets(cron.expr, cron.has_seconds, cron.day_or)
    end = data.draw(st.sampled_from(changes_2026(zone)))
    end += data.draw(st.integers(-4 * 3600, 4 * 3600)) * SECOND
    longest = min(2 * DAY, DAY * 800 / sets.per_day)
    start = end - data.draw(st.floats(0, 1)) * longest
    check_against_enumeration(cron, start, end, data.draw(st.integers(1, 40)))


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=crons(), zone=st.sampled_from(ZONES), data=st.data())
def test_property_count_splits_additively(spec, zone, data):
    """Counts of adjacent ranges add up, over ranges far too long to enumerate."""
    cron = parsed(spec[0], zone, spec[1])
    start = at("2020-01-01T00:00+00:00") + data.draw(st.integers(0, 10 * 365 * 86400)) * SECOND
    cut = start + data.draw(st.integers(0, 3 * 365 * 86400)) * SECOND
    end = cut + data.draw(st.integers(0, 3 * 365 * 86400)) * SECOND
    whole = count_fire_times(cron, start, end)
    assert whole == count_fire_times(cron, start, cut) + count_fire_times(cron, cut + SECOND, end)
    nxt = next_fire_time(cron, end)
    assert nxt is None or count_fire_times(cron, start, nxt) == whole + 1


def test_given_the_ends_of_datetime_when_counting_then_years_3_to_9999_are_counted():
    cron = parse_cron("0 0 1 1 *", "Europe/Paris")
    first, last = datetime.min.replace(tzinfo=UTC), datetime.max.replace(tzinfo=UTC)
    assert count_fire_times(cron, first, at("0010-01-01T00:00+00:00")) == 7  # years 3 to 9
    assert count_fire_times(cron, at("9990-01-01T00:00+00:00"), last) == 9  # 9991 to 9999
    assert recent_fire_times(cron, last, first, 1) == [at("9999-01-01T00:00+01:00")]
