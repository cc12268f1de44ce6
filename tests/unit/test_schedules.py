"""Unit and property tests for ``schedapp.schedules`` (pure: no database, no clock).

The cron rules under test are the ones in the module docstring:

* cron follows wall-clock time in the job's zone;
* a fixed-hour job (hour field not ``*``) whose wall time falls in a spring-forward gap runs
  once, at the first valid instant after the gap; one whose wall time is repeated in the autumn
  runs once, at its first instant;
* a job whose hour field is ``*`` follows elapsed time: wall times inside the gap are skipped,
  wall times in the repeated hour fire in both offsets.

The property tests compare ``next_fire_time`` and friends with an independent reference that
never calls croniter: it walks a UTC minute grid, reads each instant's wall time with zoneinfo
and applies the rules above to field sets the strategies built themselves.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from datetime import UTC, date, datetime, timedelta, timezone, tzinfo
from functools import cache
from zoneinfo import ZoneInfo, available_timezones

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from schedapp import display, schedules
from schedapp.exceptions import ScheduleError
from schedapp.schedules import (
    ALIASES,
    Cron,
    Interval,
    Once,
    count_fire_times,
    describe,
    fire_times,
    first_fire_time,
    next_fire_time,
    parse_cron,
    parse_interval,
    parse_run_at,
    parse_timezone,
    recent_fire_times,
)
from tests import examples

SECOND = timedelta(seconds=1)
MINUTE = timedelta(minutes=1)
HOUR = timedelta(hours=1)
DAY = timedelta(days=1)
EPSILON = timedelta(microseconds=1)

# The zones the brief names, plus a few with unusual transitions: midnight gaps (Sao Paulo,
# Tehran), a two-hour shift (Troll), a skipped calendar day (Apia, 2011-12-30), a -03:30 zone
# whose changes were at 00:01 (St Johns), Ramadan suspensions (Casablanca), negative DST (Dublin).
ZONES = (
    "UTC",
    "Europe/Paris",
    "America/New_York",
    "Asia/Kolkata",
    "Australia/Lord_Howe",
    "Pacific/Chatham",
    "America/Sao_Paulo",
    "Asia/Tehran",
    "Antarctica/Troll",
    "Pacific/Apia",
    "America/St_Johns",
    "Africa/Casablanca",
    "Europe/Dublin",
)
YEAR_2000 = datetime(2000, 1, 1, tzinfo=UTC)
YEAR_2041 = datetime(2041, 1, 1, tzinfo=UTC)


# --- helpers for the table tests ------------------------------------------------------------


def at(iso: str) -> datetime:
    """An aware instant from an ISO string that carries its offset."""
    value = datetime.fromisoformat(iso)
    assert value.tzinfo is not None, iso
    return value


def local_fires(expr: str, zone: str, start: str, end: str) -> list[str]:
    """Fire times in (start, end] as local ISO strings (the offset shows which pass fired)."""
    tz = ZoneInfo(zone)
    cron = parse_cron(expr, zone)
    return [t.astimezone(tz).isoformat() for t in fire_times(cron, at(start), at(end))]


def elapsed_steps(instants: list[str]) -> set[timedelta]:
    times = [at(s) for s in instants]
    return {b - a for a, b in itertools.pairwise(times)}


def just_before_local_midnight(day: date, tz: ZoneInfo) -> datetime:
    # In UTC: subtracting from a zoned datetime is wall-clock arithmetic.
    return datetime.combine(day, datetime.min.time(), tz).astimezone(UTC) - EPSILON


def fires_per_local_date(expr: str, zone: str, first: date, days: int) -> Counter[date]:
    tz = ZoneInfo(zone)
    start = just_before_local_midnight(first, tz)
    end = just_before_local_midnight(first + timedelta(days=days), tz)
    return Counter(t.astimezone(tz).date() for t in fire_times(parse_cron(expr, zone), start, end))


# --- DST: the cases of DESIGN.md lesson 8 ---------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "zone", "start", "end", "expected"),
    [
        pytest.param(
            "30 2 * * *",
            "Europe/Paris",
            "2026-03-28T00:00+01:00",
            "2026-03-31T00:00+02:00",
            ["2026-03-28T02:30:00+01:00", "2026-03-29T03:00:00+02:00", "2026-03-30T02:30:00+02:00"],
            id="paris-daily-0230-spring-forward-runs-at-end-of-gap",
        ),
        pytest.param(
            "30 2 * * *",
            "Europe/Paris",
            "2026-10-24T00:00+02:00",
            "2026-10-27T00:00+01:00",
            ["2026-10-24T02:30:00+02:00", "2026-10-25T02:30:00+02:00", "2026-10-26T02:30:00+01:00"],
            id="paris-daily-0230-fall-back-runs-once-in-summer-time",
        ),
        pytest.param(
            "0 2 * * *",
            "Europe/Paris",
            "2026-03-29T00:00+01:00",
            "2026-03-29T23:00+02:00",
            ["2026-03-29T03:00:00+02:00"],
            id="paris-daily-0200-start-of-gap",
        ),
        pytest.param(
            "30 2 * * *",
            "America/New_York",
            "2026-03-07T00:00-05:00",
            "2026-03-10T00:00-04:00",
            ["2026-03-07T02:30:00-05:00", "2026-03-08T03:00:00-04:00", "2026-03-09T02:30:00-04:00"],
            id="new-york-daily-0230-spring-forward-runs-at-end-of-gap",
        ),
        pytest.param(
            "30 2 * * *",
            "America/New_York",
            "2026-10-31T00:00-04:00",
            "2026-11-03T00:00-05:00",
            ["2026-10-31T02:30:00-04:00", "2026-11-01T02:30:00-05:00", "2026-11-02T02:30:00-05:00"],
            id="new-york-daily-0230-fall-back-is-not-ambiguous",
        ),
        pytest.param(
            "30 1 * * *",
            "America/New_York",
            "2026-10-31T00:00-04:00",
            "2026-11-03T00:00-05:00",
            ["2026-10-31T01:30:00-04:00", "2026-11-01T01:30:00-04:00", "2026-11-02T01:30:00-05:00"],
            id="new-york-daily-0130-fall-back-runs-once-in-summer-time",
        ),
        pytest.param(
            "30 1 * * *",
            "America/New_York",
            "2026-03-07T00:00-05:00",
            "2026-03-10T00:00-04:00",
            ["2026-03-07T01:30:00-05:00", "2026-03-08T01:30:00-05:00", "2026-03-09T01:30:00-04:00"],
            id="new-york-daily-0130-spring-forward-is-before-the-gap",
        ),
        pytest.param(
            "15 2 * * *",
            "Australia/Lord_Howe",
            "2026-10-03T00:00+10:30",
            "2026-10-06T00:00+11:00",
            ["2026-10-03T02:15:00+10:30", "2026-10-04T02:30:00+11:00", "2026-10-05T02:15:00+11:00"],
            id="lord-howe-half-hour-gap",
        ),
        pytest.param(
            "45 1 * * *",
            "Australia/Lord_Howe",
            "2026-04-04T00:00+11:00",
            "2026-04-07T00:00+10:30",
            ["2026-04-04T01:45:00+11:00", "2026-04-05T01:45:00+11:00", "2026-04-06T01:45:00+10:30"],
            id="lord-howe-half-hour-repeat",
        ),
        pytest.param(
            "0 3 * * *",
            "Pacific/Chatham",
            "2026-09-26T00:00+12:45",
            "2026-09-29T00:00+13:45",
            ["2026-09-26T03:00:00+12:45", "2026-09-27T03:45:00+13:45", "2026-09-28T03:00:00+13:45"],
            id="chatham-gap-0245-to-0345",
        ),
        pytest.param(
            "0 3 * * *",
            "Pacific/Chatham",
            "2026-04-04T00:00+13:45",
            "2026-04-07T00:00+12:45",
            ["2026-04-04T03:00:00+13:45", "2026-04-05T03:00:00+13:45", "2026-04-06T03:00:00+12:45"],
            id="chatham-repeat-0245-to-0345",
        ),
        pytest.param(
            "0 0 * * *",
            "America/Sao_Paulo",
            "2018-11-03T00:00-03:00",
            "2018-11-06T00:00-02:00",
            ["2018-11-04T01:00:00-02:00", "2018-11-05T00:00:00-02:00", "2018-11-06T00:00:00-02:00"],
            id="sao-paulo-midnight-does-not-exist",
        ),
    ],
)
def test_given_fixed_hour_cron_when_dst_changes_then_it_fires_once_per_day(
    expr, zone, start, end, expected
):
    assert local_fires(expr, zone, start, end) == expected


@pytest.mark.parametrize(
    ("expr", "zone", "first"),
    [
        ("30 2 * * *", "Europe/Paris", date(2026, 3, 28)),
        ("30 2 * * *", "Europe/Paris", date(2026, 10, 24)),
        ("30 2 * * *", "America/New_York", date(2026, 3, 7)),
        ("30 1 * * *", "America/New_York", date(2026, 10, 31)),
        ("30 1 * * *", "America/New_York", date(2026, 3, 7)),
        ("15 2 * * *", "Australia/Lord_Howe", date(2026, 10, 3)),
        ("45 1 * * *", "Australia/Lord_Howe", date(2026, 4, 4)),
        ("0 3 * * *", "Pacific/Chatham", date(2026, 9, 26)),
        ("0 3 * * *", "Pacific/Chatham", date(2026, 4, 4)),
        ("@daily", "America/Sao_Paulo", date(2018, 11, 3)),
    ],
)
def test_given_daily_cron_when_three_days_around_a_dst_change_then_one_fire_per_local_date(
    expr, zone, first
):
    counts = fires_per_local_date(expr, zone, first, 3)
    assert counts == {first + timedelta(days=i): 1 for i in range(3)}


def test_given_every_30_min_in_paris_when_clocks_fall_back_then_repeated_hour_fires_twice():
    fires = local_fires(
        "*/30 * * * *", "Europe/Paris", "2026-10-25T00:45+02:00", "2026-10-25T03:45+01:00"
    )
    assert fires == [
        "2026-10-25T01:00:00+02:00",
        "2026-10-25T01:30:00+02:00",
        "2026-10-25T02:00:00+02:00",
        "2026-10-25T02:30:00+02:00",
        "2026-10-25T02:00:00+01:00",
        "2026-10-25T02:30:00+01:00",
        "2026-10-25T03:00:00+01:00",
        "2026-10-25T03:30:00+01:00",
    ]
    assert elapsed_steps(fires) == {timedelta(minutes=30)}


def test_given_every_30_min_in_paris_when_clocks_spring_forward_then_gap_is_skipped():
    fires = local_fires(
        "*/30 * * * *", "Europe/Paris", "2026-03-29T00:45+01:00", "2026-03-29T04:15+02:00"
    )
    assert fires == [
        "2026-03-29T01:00:00+01:00",
        "2026-03-29T01:30:00+01:00",
        "2026-03-29T03:00:00+02:00",
        "2026-03-29T03:30:00+02:00",
        "2026-03-29T04:00:00+02:00",
    ]
    assert elapsed_steps(fires) == {timedelta(minutes=30)}


def test_given_every_30_min_in_new_york_when_clocks_fall_back_then_repeated_hour_fires_twice():
    fires = local_fires(
        "*/30 * * * *", "America/New_York", "2026-11-01T00:45-04:00", "2026-11-01T02:15-05:00"
    )
    assert fires == [
        "2026-11-01T01:00:00-04:00",
        "2026-11-01T01:30:00-04:00",
        "2026-11-01T01:00:00-05:00",
        "2026-11-01T01:30:00-05:00",
        "2026-11-01T02:00:00-05:00",
    ]
    assert elapsed_steps(fires) == {timedelta(minutes=30)}


@pytest.mark.parametrize(
    ("zone", "day", "expected_count"),
    [
        ("America/New_York", date(2026, 11, 1), 25),
        ("America/New_York", date(2026, 3, 8), 23),
        ("America/New_York", date(2026, 7, 1), 24),
        ("Europe/Paris", date(2026, 10, 25), 25),
        ("Europe/Paris", date(2026, 3, 29), 23),
        ("Asia/Kolkata", date(2026, 3, 29), 24),
        ("UTC", date(2026, 10, 25), 24),
    ],
)
def test_given_hourly_cron_when_a_local_day_passes_then_it_fires_every_elapsed_hour(
    zone, day, expected_count
):
    tz = ZoneInfo(zone)
    start = just_before_local_midnight(day, tz)
    end = just_before_local_midnight(day + DAY, tz)
    fires = list(fire_times(parse_cron("0 * * * *", zone), start, end))
    assert len(fires) == expected_count
    assert {b - a for a, b in itertools.pairwise(fires)} == {HOUR}


def test_given_hourly_cron_in_new_york_when_dst_changes_then_offsets_show_the_elapsed_hours():
    fall = local_fires(
        "0 * * * *", "America/New_York", "2026-11-01T00:30-04:00", "2026-11-01T02:30-05:00"
    )
    spring = local_fires(
        "0 * * * *", "America/New_York", "2026-03-08T00:30-05:00", "2026-03-08T04:30-04:00"
    )
    assert fall == [
        "2026-11-01T01:00:00-04:00",
        "2026-11-01T01:00:00-05:00",
        "2026-11-01T02:00:00-05:00",
    ]
    assert spring == [
        "2026-03-08T01:00:00-05:00",
        "2026-03-08T03:00:00-04:00",
        "2026-03-08T04:00:00-04:00",
    ]


@pytest.mark.parametrize(
    ("zone", "start", "end", "expected_count", "expected_first", "expected_last"),
    [
        # Paris 02:00-03:00 on 2026-10-25 is repeated: a fixed-hour job sees only the first pass.
        (
            "Europe/Paris",
            "2026-10-25T00:00+02:00",
            "2026-10-25T12:00+01:00",
            60,
            "2026-10-25T02:00:00+02:00",
            "2026-10-25T02:59:00+02:00",
        ),
        # Paris 02:00-03:00 on 2026-03-29 does not exist: sixty wall times, one run.
        (
            "Europe/Paris",
            "2026-03-29T00:00+01:00",
            "2026-03-29T12:00+02:00",
            1,
            "2026-03-29T03:00:00+02:00",
            "2026-03-29T03:00:00+02:00",
        ),
        (
            "America/New_York",
            "2026-03-08T00:00-05:00",
            "2026-03-08T12:00-04:00",
            1,
            "2026-03-08T03:00:00-04:00",
            "2026-03-08T03:00:00-04:00",
        ),
    ],
)
def test_given_every_minute_of_a_fixed_hour_when_dst_changes_then_no_minute_runs_twice(
    zone, start, end, expected_count, expected_first, expected_last
):
    fires = local_fires("* 2 * * *", zone, start, end)
    assert len(fires) == expected_count
    assert (fires[0], fires[-1]) == (expected_first, expected_last)
    assert len(set(fires)) == len(fires)


def test_given_every_minute_of_hour_1_in_new_york_when_clocks_fall_back_then_first_pass_only():
    fires = local_fires(
        "* 1 * * *", "America/New_York", "2026-11-01T00:00-04:00", "2026-11-01T12:00-05:00"
    )
    assert len(fires) == 60
    assert all(f.endswith("-04:00") for f in fires)


@pytest.mark.parametrize(
    ("expr", "zone", "start", "end", "expected"),
    [
        pytest.param(
            "*/15 * * * *",
            "Australia/Lord_Howe",
            "2026-10-04T01:30+10:30",
            "2026-10-04T03:00+11:00",
            [
                "2026-10-04T01:45:00+10:30",
                "2026-10-04T02:30:00+11:00",
                "2026-10-04T02:45:00+11:00",
                "2026-10-04T03:00:00+11:00",
            ],
            id="lord-howe-spring",
        ),
        pytest.param(
            "*/15 * * * *",
            "Australia/Lord_Howe",
            "2026-04-05T01:00+11:00",
            "2026-04-05T02:30+10:30",
            [
                "2026-04-05T01:15:00+11:00",
                "2026-04-05T01:30:00+11:00",
                "2026-04-05T01:45:00+11:00",
                "2026-04-05T01:30:00+10:30",
                "2026-04-05T01:45:00+10:30",
                "2026-04-05T02:00:00+10:30",
                "2026-04-05T02:15:00+10:30",
                "2026-04-05T02:30:00+10:30",
            ],
            id="lord-howe-fall",
        ),
        pytest.param(
            "*/15 * * * *",
            "Pacific/Chatham",
            "2026-09-27T02:15+12:45",
            "2026-09-27T04:00+13:45",
            ["2026-09-27T02:30:00+12:45", "2026-09-27T03:45:00+13:45", "2026-09-27T04:00:00+13:45"],
            id="chatham-spring",
        ),
    ],
)
def test_given_wildcard_hour_in_half_hour_dst_zones_then_fires_follow_elapsed_time(
    expr, zone, start, end, expected
):
    fires = local_fires(expr, zone, start, end)
    assert fires == expected
    assert elapsed_steps(fires) == {timedelta(minutes=15)}


def test_given_fall_back_when_after_is_in_the_second_pass_then_fixed_hour_waits_a_day():
    cron = parse_cron("30 2 * * *", "Europe/Paris")
    # 02:10+01:00 is after the 02:30+02:00 run: the 02:30+01:00 repeat must not fire.
    assert next_fire_time(cron, at("2026-10-25T02:10+01:00")) == at("2026-10-26T02:30+01:00")


def test_given_fall_back_when_after_is_late_in_the_first_pass_then_wildcard_fires_in_second():
    cron = parse_cron("*/30 * * * *", "Europe/Paris")
    # 02:40+02:00: the next half hour is 02:00+01:00, twenty minutes of elapsed time later.
    assert next_fire_time(cron, at("2026-10-25T02:40+02:00")) == at("2026-10-25T02:00+01:00")


def test_given_spring_forward_when_after_is_the_end_of_gap_run_then_it_is_not_repeated():
    cron = parse_cron("30 2 * * *", "Europe/Paris")
    assert next_fire_time(cron, at("2026-03-29T03:00+02:00")) == at("2026-03-30T02:30+02:00")


# --- cron syntax and zones ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "zone", "start", "expected"),
    [
        pytest.param(
            "*/10 * * * * *",
            "UTC",
            "2026-01-01T00:00:00+00:00",
            ["00:00:10", "00:00:20", "00:00:30", "00:00:40", "00:00:50", "00:01:00"],
            id="six-fields-every-ten-seconds",
        ),
        pytest.param(
            "*/10 * * * * *",
            "UTC",
            "2026-01-01T00:00:05.5+00:00",
            ["00:00:10", "00:00:20", "00:00:30", "00:00:40", "00:00:50", "00:01:00"],
            id="six-fields-from-a-fractional-second",
        ),
        pytest.param(
            "15 30 9 * * *",
            "UTC",
            "2026-01-01T00:00+00:00",
            ["2026-01-01T09:30:15", "2026-01-02T09:30:15", "2026-01-03T09:30:15"],
            id="six-fields-seconds-come-first",
        ),
        pytest.param(
            "0 0 * * * *",
            "UTC",
            "2026-01-01T00:00+00:00",
            ["01:00:00", "02:00:00", "03:00:00"],
            id="six-fields-hourly",
        ),
        pytest.param(
            "*/5 * * * *",
            "UTC",
            "2026-01-01T00:02+00:00",
            ["00:05:00", "00:10:00", "00:15:00"],
            id="five-fields-every-five-minutes",
        ),
        pytest.param(
            "0 9 * * 1-5",
            "UTC",
            "2026-01-02T10:00+00:00",  # a Friday, after 09:00
            ["2026-01-05T09:00:00", "2026-01-06T09:00:00", "2026-01-07T09:00:00"],
            id="five-fields-weekdays",
        ),
        pytest.param(
            "0 0 1 * *",
            "UTC",
            "2026-01-01T00:00+00:00",
            ["2026-02-01T00:00:00", "2026-03-01T00:00:00", "2026-04-01T00:00:00"],
            id="five-fields-first-of-month",
        ),
        pytest.param(
            "0 0 29 2 *",
            "UTC",
            "2097-03-01T00:00+00:00",
            ["2104-02-29T00:00:00", "2108-02-29T00:00:00"],
            id="leap-day-skips-2100",
        ),
        pytest.param(
            "0 0 L * *",
            "UTC",
            "2026-01-01T00:00+00:00",
            ["2026-01-31T00:00:00", "2026-02-28T00:00:00", "2026-03-31T00:00:00"],
            id="last-day-of-month",
        ),
        # An equal range is its one value, as cron and cron-descriptor read it (croniter alone
        # would read "1-1" as the whole field and run a monthly job every day).
        pytest.param(
            "0 9 1-1 * *",
            "UTC",
            "2026-01-01T10:00+00:00",
            ["2026-02-01T09:00:00", "2026-03-01T09:00:00"],
            id="equal-range-day",
        ),
        pytest.param(
            "1-1 * * * *",
            "UTC",
            "2026-01-01T00:00+00:00",
            ["00:01:00", "01:01:00", "02:01:00"],
            id="equal-range-minute",
        ),
        pytest.param(
            "0 0 1 jan-jan *",
            "UTC",
            "2026-01-01T00:00+00:00",
            ["2027-01-01T00:00:00", "2028-01-01T00:00:00"],
            id="equal-range-month-name",
        ),
        pytest.param(
            "5-5/10 * * * * *",
            "UTC",
            "2026-01-01T00:00+00:00",
            ["00:00:05", "00:01:05", "00:02:05"],
            id="equal-range-with-step",
        ),
        pytest.param(
            "30 9 * * *",
            "Asia/Kolkata",
            "2026-01-01T00:00+05:30",
            ["2026-01-01T09:30:00", "2026-01-02T09:30:00"],
            id="kolkata-plus-0530",
        ),
    ],
)
def test_given_cron_syntax_when_iterating_then_fires_at_the_expected_wall_times(
    expr, zone, start, expected
):
    tz = ZoneInfo(zone)
    wall_format = "%Y-%m-%dT%H:%M:%S" if "T" in expected[0] else "%H:%M:%S"
    fires = fire_times(parse_cron(expr, zone), at(start), limit=len(expected))
    assert [t.astimezone(tz).strftime(wall_format) for t in fires] == expected


def test_given_kolkata_cron_then_instants_are_offset_by_five_and_a_half_hours():
    cron = parse_cron("30 9 * * *", "Asia/Kolkata")
    assert next_fire_time(cron, at("2026-01-01T00:00+00:00")) == at("2026-01-01T04:00+00:00")


@pytest.mark.parametrize(
    ("zone", "expected_utc"),
    [
        ("UTC", "2026-07-01T12:00+00:00"),
        ("Europe/Paris", "2026-07-01T10:00+00:00"),
        ("America/New_York", "2026-07-01T16:00+00:00"),
        ("Asia/Kolkata", "2026-07-01T06:30+00:00"),
        ("Australia/Lord_Howe", "2026-07-01T01:30+00:00"),
        ("Pacific/Chatham", "2026-06-30T23:15+00:00"),
    ],
)
def test_given_noon_cron_in_each_zone_then_it_fires_at_local_noon(zone, expected_utc):
    tz = ZoneInfo(zone)
    after = datetime(2026, 7, 1, 6, tzinfo=tz)
    got = next_fire_time(parse_cron("0 12 * * *", zone), after)
    assert got == at(expected_utc)
    assert got.astimezone(tz).strftime("%Y-%m-%d %H:%M") == "2026-07-01 12:00"


@pytest.mark.parametrize(
    ("alias", "first_three"),
    [
        ("@hourly", ["2026-06-01T01:00", "2026-06-01T02:00", "2026-06-01T03:00"]),
        ("@daily", ["2026-06-02T00:00", "2026-06-03T00:00", "2026-06-04T00:00"]),
        ("@midnight", ["2026-06-02T00:00", "2026-06-03T00:00", "2026-06-04T00:00"]),
        ("@weekly", ["2026-06-07T00:00", "2026-06-14T00:00", "2026-06-21T00:00"]),  # Sundays
        ("@monthly", ["2026-07-01T00:00", "2026-08-01T00:00", "2026-09-01T00:00"]),
        ("@yearly", ["2027-01-01T00:00", "2028-01-01T00:00", "2029-01-01T00:00"]),
        ("@annually", ["2027-01-01T00:00", "2028-01-01T00:00", "2029-01-01T00:00"]),
        ("@HOURLY", ["2026-06-01T01:00", "2026-06-01T02:00", "2026-06-01T03:00"]),
    ],
)
def test_given_alias_when_parsed_then_it_expands_and_fires_like_its_expansion(alias, first_three):
    cron = parse_cron(alias, "Europe/Paris")
    assert cron.expr == ALIASES[alias.lower()]
    assert not cron.has_seconds
    tz = ZoneInfo("Europe/Paris")
    start = datetime(2026, 6, 1, tzinfo=tz)
    fires = list(fire_times(cron, start, limit=3))
    assert [t.astimezone(tz).strftime("%Y-%m-%dT%H:%M") for t in fires] == first_three
    expansion = parse_cron(ALIASES[alias.lower()], "Europe/Paris")
    assert fires == list(fire_times(expansion, start, limit=3))


@pytest.mark.parametrize(
    ("expr", "expected_days"),
    [
        # Both day fields restricted: croniter ORs them (every 13th, and every Friday).
        ("0 0 13 * 5", ["Fri 02", "Fri 09", "Tue 13", "Fri 16", "Fri 23", "Fri 30"]),
        ("0 0 1-3 * 1", ["Fri 02", "Sat 03", "Mon 05", "Mon 12", "Mon 19", "Mon 26"]),
        # croniter counts a stepped day field such as */2 as restricted (Vixie cron does not).
        ("0 0 */10 * 1", ["Mon 05", "Sun 11", "Mon 12", "Mon 19", "Wed 21", "Mon 26"]),
        # A day-of-week field listing every day counts as "*" next to a "*" day field ...
        ("0 0 */2 * 0-6", ["Sat 03", "Mon 05", "Wed 07", "Fri 09", "Sun 11", "Tue 13"]),
        # ... and as restricted next to a plain one: the OR makes it every day.
        ("0 0 1 * 0-6", ["Fri 02", "Sat 03", "Sun 04", "Mon 05", "Tue 06", "Wed 07"]),
        # One day field restricted: only it matters.
        ("0 0 13 * *", ["Tue 13", "Fri 13", "Fri 13", "Mon 13", "Wed 13", "Sat 13"]),
        ("0 0 * * 5", ["Fri 02", "Fri 09", "Fri 16", "Fri 23", "Fri 30", "Fri 06"]),
        ("0 0 ? * 5", ["Fri 02", "Fri 09", "Fri 16", "Fri 23", "Fri 30", "Fri 06"]),
        # Sunday is 0 or 7, and names work.
        ("0 0 * * 0", ["Sun 04", "Sun 11", "Sun 18", "Sun 25", "Sun 01", "Sun 08"]),
        ("0 0 * * 7", ["Sun 04", "Sun 11", "Sun 18", "Sun 25", "Sun 01", "Sun 08"]),
        ("0 0 * * sun", ["Sun 04", "Sun 11", "Sun 18", "Sun 25", "Sun 01", "Sun 08"]),
        (
            "0 0 1 jan,feb *",
            ["Sun 01", "Fri 01", "Mon 01", "Sat 01", "Tue 01", "Mon 01"],
        ),  # 2026-2029
    ],
)
def test_given_day_fields_then_croniter_day_of_month_or_day_of_week_semantics_apply(
    expr, expected_days
):
    fires = fire_times(parse_cron(expr, "UTC"), at("2026-01-01T00:00+00:00"), limit=6)
    assert [t.strftime("%a %d") for t in fires] == expected_days


def test_given_cron_with_extra_whitespace_when_parsed_then_expression_is_normalised():
    cron = parse_cron("  */5\t *  * * *  ", "UTC")
    assert cron == Cron("*/5 * * * *", "UTC", has_seconds=False, hour_is_wildcard=True)


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("0 9 1-1 * *", "0 9 1 * *"),
        ("0 0-0 * * *", "0 0 * * *"),
        ("0 0 * JAN-jan sun-SUN", "0 0 * JAN sun"),
        ("1-1/5,3-3,4-6 * * * *", "1,3,4-6 * * * *"),
        ("0 0 1-2 * *", "0 0 1-2 * *"),
        ("0 0 01-1 * *", "0 0 01 * *"),
    ],
)
def test_given_equal_ranges_when_parsed_then_they_become_single_values(expr, expected):
    cron = parse_cron(expr, "UTC")
    assert cron.expr == expected


@pytest.mark.parametrize(
    ("expr", "has_seconds", "hour_is_wildcard"),
    [
        ("* * * * *", False, True),
        ("0 */1 * * *", False, True),
        ("0 0-23 * * *", False, False),
        ("0 */2 * * *", False, False),
        ("0 0 * * * *", True, True),
        ("0 0 9 * * *", True, False),
    ],
)
def test_given_cron_when_parsed_then_seconds_and_wildcard_hour_are_detected(
    expr, has_seconds, hour_is_wildcard
):
    cron = parse_cron(expr, "UTC")
    assert (cron.has_seconds, cron.hour_is_wildcard) == (has_seconds, hour_is_wildcard)


def test_given_after_in_any_zone_when_computing_next_then_result_is_the_same_utc_instant():
    cron = parse_cron("30 2 * * *", "Europe/Paris")
    instant = at("2026-03-28T12:00+00:00")
    results = {
        next_fire_time(cron, instant.astimezone(tz))
        for tz in (UTC, ZoneInfo("Asia/Kolkata"), ZoneInfo("America/New_York"))
    }
    assert results == {at("2026-03-29T03:00+02:00")}
    (result,) = results
    assert result.utcoffset() == timedelta(0)


def test_given_after_exactly_on_a_fire_time_then_next_is_strictly_later():
    cron = parse_cron("*/10 * * * * *", "UTC")
    assert next_fire_time(cron, at("2026-01-01T00:00:10+00:00")) == at("2026-01-01T00:00:20+00:00")
    assert next_fire_time(cron, at("2026-01-01T00:00:09.999999+00:00")) == at(
        "2026-01-01T00:00:10+00:00"
    )


# --- one-off and interval schedules ----------------------------------------------------------


def test_given_one_off_when_asked_before_and_after_then_it_fires_once():
    once = parse_run_at(at("2026-05-01T12:00+02:00"))
    assert next_fire_time(once, at("2026-05-01T09:59+00:00")) == at("2026-05-01T10:00+00:00")
    assert next_fire_time(once, at("2026-05-01T10:00+00:00")) is None
    assert next_fire_time(once, at("2026-05-02T00:00+00:00")) is None
    assert list(fire_times(once, at("2026-01-01T00:00+00:00"))) == [at("2026-05-01T10:00+00:00")]


def test_given_one_off_in_the_past_when_created_then_it_is_due_at_its_time():
    once = Once(at("2020-01-01T00:00+00:00"))
    assert first_fire_time(once, at("2026-01-01T00:00+00:00")) == once.at


def test_given_recurring_schedule_when_created_then_first_fire_is_the_next_occurrence():
    now = at("2026-01-01T00:00:30+00:00")
    assert first_fire_time(parse_cron("* * * * *", "UTC"), now) == at("2026-01-01T00:01+00:00")
    assert first_fire_time(Interval(timedelta(minutes=5)), now) == now + timedelta(minutes=5)


def test_given_daily_interval_when_clocks_spring_forward_then_it_is_24_elapsed_hours():
    tz = ZoneInfo("Europe/Paris")
    fires = fire_times(Interval(DAY), at("2026-03-28T12:00+01:00"), limit=2)
    assert [t.astimezone(tz).isoformat() for t in fires] == [
        "2026-03-29T13:00:00+02:00",
        "2026-03-30T13:00:00+02:00",
    ]


PARIS = ZoneInfo("Europe/Paris")


def test_given_after_in_a_dst_zone_when_adding_an_interval_then_it_is_elapsed_time():
    # Python adds a timedelta to a zoned datetime on the wall clock (12:00 -> 12:00 next day,
    # 23 hours across the change); an interval is an absolute duration.
    after = datetime(2026, 3, 28, 12, tzinfo=PARIS)
    assert next_fire_time(Interval(DAY), after) == at("2026-03-29T11:00+00:00")


def test_given_bounds_in_a_dst_zone_when_counting_then_elapsed_time_is_used():
    # 01:00+02:00 to 03:00+01:00 on 2026-10-25 is three hours: four hourly occurrences.
    start = datetime(2026, 10, 25, 1, tzinfo=PARIS)
    end = datetime(2026, 10, 25, 3, tzinfo=PARIS)
    hourly = Interval(HOUR)
    expected = [at("2026-10-24T23:00+00:00") + k * HOUR for k in range(4)]
    assert count_fire_times(hourly, start, end) == 4
    assert recent_fire_times(hourly, end, start, 10) == expected
    # The second 02:00 (+01:00): one every-minute occurrence in [02:00, 02:00], not 61.
    second_two = datetime(2026, 10, 25, 2, fold=1, tzinfo=PARIS)
    every_minute = parse_cron("* * * * *", "Europe/Paris")
    assert count_fire_times(every_minute, second_two, second_two) == 1
    assert recent_fire_times(every_minute, second_two, second_two, 5) == [
        at("2026-10-25T01:00+00:00")
    ]


def test_given_fire_times_with_until_and_limit_then_bounds_are_respected():
    cron = parse_cron("* * * * *", "UTC")
    start = at("2026-01-01T00:00+00:00")
    until = at("2026-01-01T00:05+00:00")
    assert len(list(fire_times(cron, start, until))) == 5  # (start, until]: until included
    assert len(list(fire_times(cron, start, until, limit=2))) == 2
    assert list(fire_times(cron, start, until, limit=0)) == []
    assert list(fire_times(cron, until, start)) == []


def test_given_counts_and_recent_times_on_an_every_minute_cron_then_they_match_a_hand_count():
    cron = parse_cron("* * * * *", "UTC")
    ten = at("2026-01-01T10:00+00:00")
    now = at("2026-01-01T10:05:30+00:00")
    assert count_fire_times(cron, ten, now) == 6  # 10:00 .. 10:05, both ends included
    assert count_fire_times(cron, now, ten) == 0
    assert recent_fire_times(cron, now, ten, 3) == [
        ten + 3 * MINUTE,
        ten + 4 * MINUTE,
        ten + 5 * MINUTE,
    ]
    assert recent_fire_times(cron, now, ten, 100) == [ten + k * MINUTE for k in range(6)]
    assert recent_fire_times(cron, ten, now, 3) == []
    assert recent_fire_times(cron, now, ten, 0) == []


def test_given_a_long_outage_of_an_every_second_cron_then_recent_times_stay_cheap_and_exact():
    cron = parse_cron("* * * * * *", "UTC")
    since = at("2026-01-01T00:00+00:00")
    until = at("2026-01-08T00:00+00:00")
    assert recent_fire_times(cron, until, since, 3) == [until - 2 * SECOND, until - SECOND, until]


def test_given_interval_counts_then_they_start_at_the_first_occurrence():
    every = Interval(timedelta(minutes=1))
    ten = at("2026-01-01T10:00+00:00")
    now = at("2026-01-01T10:05:30+00:00")
    assert count_fire_times(every, ten, now) == 6
    assert recent_fire_times(every, now, ten, 2) == [ten + 4 * MINUTE, ten + 5 * MINUTE]


@pytest.mark.parametrize(
    ("schedule", "expected"),
    [
        (Once(at("2026-01-01T00:00+00:00")), "once at 2026-01-01T00:00:00+00:00"),
        (Interval(timedelta(minutes=5)), "every 0:05:00"),
        (Cron("0 * * * *", "Europe/Paris", False, True), "cron '0 * * * *' (Europe/Paris)"),
    ],
)
def test_given_schedule_when_described_then_description_names_it(schedule, expected):
    assert describe(schedule) == expected


# --- validation ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "expr",
    [
        pytest.param("* * * *", id="4-fields"),
        pytest.param("* * * * * * *", id="7-fields"),
        pytest.param("0 0 1 1 * 2030", id="year-field-as-6th"),
        pytest.param("61 * * * *", id="minute-61"),
        pytest.param("60 * * * *", id="minute-60"),
        pytest.param("* 25 * * *", id="hour-25"),
        pytest.param("* 24 * * *", id="hour-24"),
        pytest.param("* * 32 * *", id="day-32"),
        pytest.param("* * 0 * *", id="day-0"),
        pytest.param("* * * 13 *", id="month-13"),
        pytest.param("* * * 0 *", id="month-0"),
        pytest.param("* * * * 8", id="weekday-8"),
        pytest.param("60 * * * * *", id="second-60"),
        pytest.param("*/0 * * * *", id="step-0"),
        pytest.param("1,,2 * * * *", id="empty-list-item"),
        pytest.param("a b c d e", id="garbage-words"),
        pytest.param("every minute", id="english"),
        pytest.param("* * * * $", id="bad-character"),
        pytest.param("'; drop table --", id="injection"),
        pytest.param("", id="empty"),
        pytest.param("   ", id="blank"),
        pytest.param("0 0 30 2 *", id="never-fires-feb-30"),
        pytest.param("0 0 31 4 *", id="never-fires-apr-31"),
        pytest.param("0 0 31 2,4,6,9,11 *", id="never-fires-31st-of-short-months"),
        pytest.param("@reboot", id="alias-reboot"),
        pytest.param("@every 5m", id="alias-every"),
        pytest.param("@", id="bare-at"),
    ],
)
def test_given_invalid_cron_when_parsed_then_schedule_error_names_cron(expr):
    with pytest.raises(ScheduleError) as excinfo:
        parse_cron(expr, "UTC")
    assert excinfo.value.field == "cron"
    assert str(excinfo.value).startswith("cron: ")


@pytest.mark.parametrize(
    "value",
    [None, 5, 1.5, b"* * * * *", ["*", "*", "*", "*", "*"], {"minute": "*"}, ("*",) * 5],
    ids=["none", "int", "float", "bytes", "list", "dict", "tuple"],
)
def test_given_non_string_cron_when_parsed_then_schedule_error_names_cron(value):
    with pytest.raises(ScheduleError) as excinfo:
        parse_cron(value, "UTC")
    assert excinfo.value.field == "cron"


def test_given_custom_field_name_when_cron_is_invalid_then_error_uses_it():
    with pytest.raises(ScheduleError) as excinfo:
        parse_cron("nope", "UTC", field="schedule")
    assert excinfo.value.field == "schedule"


@pytest.mark.parametrize(
    "expr", ["0 0 29 2 *", "0 0 31 * *", "0 0 31 4 1", "0 0 * * 0#5", "0 0 L 2 *"]
)
def test_given_rare_but_possible_cron_when_parsed_then_it_is_accepted(expr):
    cron = parse_cron(expr, "UTC")
    assert next_fire_time(cron, at("2030-01-01T00:00+00:00")) is not None


@pytest.mark.parametrize(
    "name", ["Mars/Olympus_Mons", "Europe/Pariss", "", "   ", "+02:00", "../../etc/passwd"]
)
def test_given_unknown_zone_when_parsed_then_schedule_error_names_timezone(name):
    with pytest.raises(ScheduleError) as excinfo:
        parse_timezone(name)
    assert excinfo.value.field == "timezone"


@pytest.mark.parametrize("name", sorted(schedules.HOST_ZONES & available_timezones()))
def test_given_a_host_dependent_zone_of_this_host_when_parsed_then_it_is_refused(name):
    with pytest.raises(ScheduleError) as excinfo:
        parse_timezone(name)
    assert excinfo.value.field == "timezone"


@pytest.mark.parametrize("name", ["localtime", "posixrules", "Factory", " localtime "])
def test_given_a_host_dependent_zone_name_when_parsed_then_it_is_refused(name, monkeypatch):
    # The host's zone list decides what is "known": this one has all three files, as a
    # tzdata directory may (CPython drops posixrules from its list, not every host does).
    host_zones = {"Europe/Paris", "localtime", "posixrules", "Factory"}
    monkeypatch.setattr(schedules, "available_timezones", lambda: host_zones)
    schedules.zone_names.cache_clear()
    try:
        with pytest.raises(ScheduleError) as excinfo:
            parse_timezone(name)
        assert excinfo.value.field == "timezone"
        assert "each host" in excinfo.value.message
        assert display.timezone_names.__wrapped__() == ["Europe/Paris", "UTC"]
    finally:
        schedules.zone_names.cache_clear()


def test_given_this_host_then_no_host_dependent_zone_is_offered_or_accepted():
    offered = set(display.timezone_names())
    assert "Europe/Paris" in offered and not offered & schedules.HOST_ZONES
    assert all(parse_timezone(name) == name for name in offered)


@pytest.mark.parametrize("value", [None, 1, 2.0, b"UTC", ["UTC"], ZoneInfo("UTC")])
def test_given_non_string_zone_when_parsed_then_schedule_error_names_timezone(value):
    with pytest.raises(ScheduleError) as excinfo:
        parse_timezone(value)
    assert excinfo.value.field == "timezone"


@pytest.mark.parametrize(
    ("name", "expected"), [(zone, zone) for zone in ZONES] + [("  Europe/Paris ", "Europe/Paris")]
)
def test_given_known_zone_when_parsed_then_its_name_is_returned(name, expected):
    assert parse_timezone(name) == expected


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(0, id="zero"),
        pytest.param(0.999, id="under-a-second"),
        pytest.param(-1, id="negative-int"),
        pytest.param(-60.0, id="negative-float"),
        pytest.param(timedelta(0), id="zero-timedelta"),
        pytest.param(timedelta(microseconds=999_999), id="timedelta-under-a-second"),
        pytest.param(timedelta(seconds=-5), id="negative-timedelta"),
        pytest.param(True, id="true"),
        pytest.param(False, id="false"),
        pytest.param("60", id="numeric-string"),
        pytest.param("1 minute", id="string"),
        pytest.param(None, id="none"),
        pytest.param(float("nan"), id="nan"),
        pytest.param(float("inf"), id="inf"),
        pytest.param(1e300, id="huge"),
        pytest.param(timedelta(days=366 * 100 + 1), id="over-a-hundred-years"),
    ],
)
def test_given_invalid_interval_when_parsed_then_schedule_error_names_interval(value):
    with pytest.raises(ScheduleError) as excinfo:
        parse_interval(value)
    assert excinfo.value.field == "interval"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1, SECOND),
        (1.5, timedelta(seconds=1.5)),
        (3600, HOUR),
        (timedelta(minutes=5), timedelta(minutes=5)),
        (timedelta(seconds=1), SECOND),
    ],
)
def test_given_valid_interval_when_parsed_then_duration_is_kept(value, expected):
    assert parse_interval(value) == Interval(expected)


class _NoOffset(tzinfo):
    def utcoffset(self, dt):
        return None


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(datetime(2026, 1, 1, 12), id="naive"),
        pytest.param(datetime(2026, 1, 1, 12, tzinfo=_NoOffset()), id="tzinfo-without-offset"),
        pytest.param(date(2026, 1, 1), id="date"),
        pytest.param("2026-01-01T12:00:00+00:00", id="iso-string"),
        pytest.param(1767268800, id="epoch"),
        pytest.param(None, id="none"),
    ],
)
def test_given_invalid_run_at_when_parsed_then_schedule_error_names_run_at(value):
    with pytest.raises(ScheduleError) as excinfo:
        parse_run_at(value)
    assert excinfo.value.field == "run_at"


def test_given_aware_run_at_when_parsed_then_it_is_the_same_instant_in_utc():
    once = parse_run_at(datetime(2026, 10, 25, 2, 30, fold=1, tzinfo=ZoneInfo("Europe/Paris")))
    assert once.at == at("2026-10-25T01:30+00:00")
    assert once.at.tzinfo is UTC
    assert parse_run_at(at("2026-01-01T05:30+05:30")).at == at("2026-01-01T00:00+00:00")
    assert parse_run_at(datetime(2026, 1, 1, tzinfo=timezone(-HOUR))).at.hour == 1


# --- an independent reference for the property tests ----------------------------------------


@dataclass(frozen=True)
class Field:
    text: str
    values: frozenset[int] = dataclass_field(repr=False)


@dataclass(frozen=True)
class CronSpec:
    """A cron built from known field values, with its own (croniter-free) matching rules."""

    second: Field | None
    minute: Field
    hour: Field
    dom: Field
    month: Field
    dow: Field

    @property
    def text(self) -> str:
        fields = [self.minute, self.hour, self.dom, self.month, self.dow]
        if self.second is not None:
            fields.insert(0, self.second)
        return " ".join(f.text for f in fields)

    def __repr__(self) -> str:
        return f"CronSpec({self.text!r})"

    def _repr_pretty_(self, printer, cycle) -> None:  # how hypothesis shows a failing example
        printer.text(repr(self))

    @property
    def seconds(self) -> list[int]:
        return [0] if self.second is None else sorted(self.second.values)

    @property
    def follows_elapsed_time(self) -> bool:
        return self.hour.text in ("*", "*/1")

    @property
    def days_are_ored(self) -> bool:
        """croniter ORs the two day fields when both are restricted. A field is unrestricted
        when it is ``*``, or when it lists every value and the other field's text holds a
        ``*`` (croniter then reads it as ``*``, so "*/2 * 0-6" is the odd days, as in Vixie
        cron, while "1 * 0-6" is every day)."""
        dom_any = self.dom.text == "*" or (len(self.dom.values) == 31 and "*" in self.dow.text)
        dow_any = self.dow.text == "*" or (len(self.dow.values) == 7 and "*" in self.dom.text)
        return not dom_any and not dow_any

    def day_matches(self, day: date) -> bool:
        if day.month not in self.month.values:
            return False
        dom_ok = day.day in self.dom.values
        dow_ok = day.isoweekday() % 7 in self.dow.values
        return (dom_ok or dow_ok) if self.days_are_ored else (dom_ok and dow_ok)

    def minute_matches(self, wall: datetime) -> bool:
        return (
            wall.minute in self.minute.values
            and wall.hour in self.hour.values
            and self.day_matches(wall.date())
        )

    def can_fire(self) -> bool:
        """Whether some date matches (Feb 29 counts): parse_cron must accept exactly these."""
        if self.days_are_ored:
            return True  # any matching weekday will do
        return any(_day_exists(m, d) for m in self.month.values for d in self.dom.values)


def _day_exists(month: int, day: int) -> bool:
    return day <= (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)[month - 1]


def reference_fires_in_minute(spec: CronSpec, tz: ZoneInfo, t: datetime) -> list[datetime]:
    """The instants in the UTC minute starting at ``t`` at which ``spec`` fires, by the rules
    of the module docstring, read off zoneinfo (fold=1 marks an instant in the second pass)."""
    here = t.astimezone(tz)
    before = (t - MINUTE).astimezone(tz)
    wall = here.replace(tzinfo=None)
    fires: set[datetime] = set()
    if spec.minute_matches(wall) and (spec.follows_elapsed_time or here.fold == 0):
        fires.update(t + timedelta(seconds=s) for s in spec.seconds)
    jump = here.utcoffset() - before.utcoffset()
    if jump > timedelta(0) and not spec.follows_elapsed_time:
        # ``t`` ends a gap: a fixed-hour job due at a skipped wall time runs now.
        skipped = wall - jump
        while skipped < wall:
            if spec.minute_matches(skipped):
                fires.add(t)
                break
            skipped += MINUTE
    return sorted(fires)


def _floor_minute(t: datetime) -> datetime:
    t = t.astimezone(UTC)
    return t.replace(second=0, microsecond=0)


def reference_fires(
    spec: CronSpec, zone: str, start: datetime, end: datetime, limit: int | None = None
) -> list[datetime]:
    """The firing instants in (start, end] (the first ``limit``), walking every UTC minute."""
    tz = ZoneInfo(zone)
    found: list[datetime] = []
    t = _floor_minute(start)
    while t <= end and (limit is None or len(found) < limit):
        found.extend(f for f in reference_fires_in_minute(spec, tz, t) if start < f <= end)
        t += MINUTE
    return found[:limit]


def reference_next(
    spec: CronSpec, zone: str, after: datetime, horizon: timedelta
) -> datetime | None:
    """The first firing instant in (after, after + horizon], or None."""
    tz = ZoneInfo(zone)
    t = _floor_minute(after)
    end = after.astimezone(UTC) + horizon  # elapsed time: not wall-clock arithmetic
    while t <= end:
        for f in reference_fires_in_minute(spec, tz, t):
            if after < f <= end:
                return f
        t += MINUTE
    return None


def reference_fires_at(spec: CronSpec, zone: str, instant: datetime) -> bool:
    fires = reference_fires_in_minute(spec, ZoneInfo(zone), _floor_minute(instant))
    return instant in fires


@cache
def transitions(zone: str) -> tuple[datetime, ...]:
    """The instants in 2000-2040 at which ``zone`` changes its UTC offset."""
    tz = ZoneInfo(zone)
    found = []
    t = YEAR_2000
    offset = t.astimezone(tz).utcoffset()
    while t < YEAR_2041:
        nxt = t + DAY
        new = nxt.astimezone(tz).utcoffset()
        if new != offset:
            lo, hi = int(t.timestamp()), int(nxt.timestamp())
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if datetime.fromtimestamp(mid, tz).utcoffset() == offset:
                    lo = mid
                else:
                    hi = mid
            found.append(datetime.fromtimestamp(hi, UTC))
        t, offset = nxt, new
    # The reference walks a minute grid: check that every change is on a minute boundary.
    assert all(x.second == 0 for x in found), zone
    return tuple(found)


def test_reference_agrees_with_the_documented_examples():
    spec = CronSpec(
        None,
        Field("30", frozenset({30})),
        Field("2", frozenset({2})),
        Field("*", frozenset(range(1, 32))),
        Field("*", frozenset(range(1, 13))),
        Field("*", frozenset(range(7))),
    )
    fires = reference_fires(
        spec, "Europe/Paris", at("2026-03-28T00:00+01:00"), at("2026-03-31T00:00+02:00")
    )
    assert fires == [
        at("2026-03-28T02:30+01:00"),
        at("2026-03-29T03:00+02:00"),
        at("2026-03-30T02:30+02:00"),
    ]
    fires = reference_fires(
        spec, "Europe/Paris", at("2026-10-24T00:00+02:00"), at("2026-10-27T00:00+01:00")
    )
    assert fires == [
        at("2026-10-24T02:30+02:00"),
        at("2026-10-25T02:30+02:00"),
        at("2026-10-26T02:30+01:00"),
    ]
    paris = transitions("Europe/Paris")
    assert at("2026-03-29T01:00+00:00") in paris and at("2026-10-25T01:00+00:00") in paris


# --- strategies ------------------------------------------------------------------------------


def _field(lo: int, hi: int, extra_single: tuple[int, ...] = ()) -> st.SearchStrategy[Field]:
    single = st.integers(lo, hi).map(lambda v: Field(str(v), frozenset({v})))
    if extra_single:  # day of week 7 is Sunday (0)
        single |= st.sampled_from(extra_single).map(lambda v: Field(str(v), frozenset({v % 7})))
    pair = st.tuples(st.integers(lo, hi), st.integers(lo, hi)).map(sorted)
    span = pair.map(lambda ab: Field(f"{ab[0]}-{ab[1]}", frozenset(range(ab[0], ab[1] + 1))))
    step = st.integers(1, hi - lo).map(lambda k: Field(f"*/{k}", frozenset(range(lo, hi + 1, k))))
    span_step = st.tuples(pair, st.integers(1, hi - lo)).map(
        lambda p: Field(f"{p[0][0]}-{p[0][1]}/{p[1]}", frozenset(range(p[0][0], p[0][1] + 1, p[1])))
    )
    items = st.lists(single | span, min_size=2, max_size=4)
    listed = items.map(
        lambda fs: Field(",".join(f.text for f in fs), frozenset().union(*(f.values for f in fs)))
    )
    star = st.just(Field("*", frozenset(range(lo, hi + 1))))
    return st.one_of(star, single, span, step, span_step, listed)


def _star(lo: int, hi: int) -> Field:
    return Field("*", frozenset(range(lo, hi + 1)))


SECONDS = _field(0, 59)
MINUTES = _field(0, 59)
HOURS = _field(0, 23) | st.just(Field("*/1", frozenset(range(24))))
DOMS = _field(1, 31)
MONTHS = _field(1, 12)
DOWS = _field(0, 6, extra_single=(7,))


@st.composite
def any_cron(draw) -> CronSpec:
    """Any valid 5- or 6-field cron made of numbers, ranges, steps and lists."""
    second = draw(st.none() | SECONDS)
    return CronSpec(second, draw(MINUTES), draw(HOURS), draw(DOMS), draw(MONTHS), draw(DOWS))


@st.composite
def frequent_cron(draw) -> CronSpec:
    """A cron that usually fires within a day or two, so a minute-by-minute scan can check it."""
    second = draw(st.none() | SECONDS)
    rarely = st.integers(0, 9).map(lambda n: n == 0)
    dom = draw(DOMS) if draw(rarely) else _star(1, 31)
    month = draw(MONTHS) if draw(rarely) else _star(1, 12)
    dow = draw(DOWS) if draw(st.integers(0, 4).map(lambda n: n == 0)) else _star(0, 6)
    spec = CronSpec(second, draw(MINUTES), draw(HOURS), dom, month, dow)
    assume(spec.can_fire())
    return spec


@st.composite
def zone_and_instant(draw) -> tuple[str, datetime]:
    """A zone, and an aware instant in 2000-2040, often close to one of the zone's changes."""
    zone = draw(st.sampled_from(ZONES))
    changes = transitions(zone)
    if changes and draw(st.booleans()):
        near = draw(st.integers(-3 * 60, 3 * 60) | st.integers(-27 * 60, 27 * 60))
        base = draw(st.sampled_from(changes)) + near * MINUTE
    else:
        total = int((YEAR_2041 - YEAR_2000) / MINUTE) - 1
        base = YEAR_2000 + draw(st.integers(0, total)) * MINUTE
    fraction = draw(
        st.sampled_from([0, 59_999_999, 1])
        | st.integers(0, 59).map(lambda s: s * 1_000_000)
        | st.integers(0, 59_999_999)
    )
    instant = base + timedelta(microseconds=fraction)
    shown_in = draw(st.sampled_from([UTC, ZoneInfo(zone), ZoneInfo("Asia/Kolkata")]))
    return zone, instant.astimezone(shown_in)


PROPERTY = settings(
    max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


# --- properties ------------------------------------------------------------------------------


@PROPERTY
@given(spec=any_cron())
def test_property_parse_cron_accepts_a_built_cron_iff_it_can_ever_fire(spec):
    if spec.can_fire():
        cron = parse_cron(spec.text, "UTC")
        assert len(cron.expr.split()) == len(spec.text.split())
        assert cron.has_seconds == (spec.second is not None)
        assert cron.hour_is_wildcard == spec.follows_elapsed_time
    else:
        with pytest.raises(ScheduleError) as excinfo:
            parse_cron(spec.text, "UTC")
        assert excinfo.value.field == "cron"


@PROPERTY
@given(spec=any_cron(), where=zone_and_instant())
def test_property_next_fire_time_is_later_and_matches_the_cron_fields(spec, where):
    assume(spec.can_fire())
    zone, after = where
    cron = parse_cron(spec.text, zone)
    got = next_fire_time(cron, after)
    assert got is not None
    assert got > after
    assert got.utcoffset() == timedelta(0)
    # Its wall time matches the fields (first pass only, for a fixed hour), or it is the end of
    # a gap that swallowed a matching wall time of a fixed-hour cron.
    assert reference_fires_at(spec, zone, got), got.astimezone(ZoneInfo(zone)).isoformat()
    # Starting just before it finds it again: the set of fire times does not depend on where
    # the search starts.
    assert next_fire_time(cron, got - EPSILON) == got
    # And nothing fires in the two days before it (or since ``after``).
    window_start = max(after, got - 2 * DAY)
    assert reference_fires(spec, zone, window_start, got - EPSILON) == []


HORIZON = timedelta(days=3)


@PROPERTY
@given(spec=frequent_cron(), where=zone_and_instant())
def test_property_next_fire_time_equals_a_minute_by_minute_reference(spec, where):
    zone, after = where
    cron = parse_cron(spec.text, zone)
    got = next_fire_time(cron, after)
    expected = reference_next(spec, zone, after, HORIZON)
    if expected is None:
        assert got is not None and got > after.astimezone(UTC) + HORIZON
        assert reference_fires_at(spec, zone, got)
    else:
        assert got == expected, (
            f"{spec.text!r} in {zone} after {after.astimezone(ZoneInfo(zone)).isoformat()}: "
            f"got {got.astimezone(ZoneInfo(zone)).isoformat()}, "
            f"expected {expected.astimezone(ZoneInfo(zone)).isoformat()}"
        )


@PROPERTY
@given(spec=frequent_cron(), where=zone_and_instant(), hours=st.integers(1, 8))
def test_property_fire_times_are_strictly_increasing_and_complete(spec, where, hours):
    zone, after = where
    cron = parse_cron(spec.text, zone)
    until = after.astimezone(UTC) + hours * HOUR
    got = list(fire_times(cron, after, until, limit=300))
    assert all(a < b for a, b in itertools.pairwise(got))
    assert all(after < t <= until for t in got)
    expected = reference_fires(spec, zone, after, until, limit=300)
    assert got == expected


@PROPERTY
@given(
    spec=frequent_cron(),
    where=zone_and_instant(),
    minutes=st.integers(0, 240),
    count=st.integers(1, 40),
)
def test_property_count_and_recent_fire_times_agree_with_enumeration(spec, where, minutes, count):
    zone, start = where
    cron = parse_cron(spec.text, zone)
    # ``start`` may carry the job's zone: the module must not do wall-clock arithmetic on it,
    # and neither may the test (03:00+02:00 minus 1 us is no 02:59:59.999999 on a gap day).
    start_utc = start.astimezone(UTC)
    if spec.second is not None:
        minutes //= 8  # at most half an hour of a per-second cron
    end = start_utc + minutes * MINUTE
    everything = reference_fires(spec, zone, start_utc - EPSILON, end)  # [start, end]
    assert everything == list(fire_times(cron, start_utc - EPSILON, end))
    assert count_fire_times(cron, start, end) == len(everything)
    assert recent_fire_times(cron, end, start, count) == everything[-count:]


@PROPERTY
@given(
    every=st.timedeltas(min_value=SECOND, max_value=timedelta(days=400)),
    t0=st.datetimes(
        min_value=datetime(2000, 1, 1), max_value=datetime(2040, 12, 31), timezones=st.just(UTC)
    ),
    k=st.integers(1, 200),
    zone=st.sampled_from(ZONES),
)
def test_property_interval_has_no_drift(every, t0, k, zone):
    interval = parse_interval(every)
    start = t0.astimezone(ZoneInfo(zone))
    fires = list(fire_times(interval, start, limit=k))
    assert fires == [t0 + i * every for i in range(1, k + 1)]
    assert all(f.utcoffset() == timedelta(0) for f in fires)


@PROPERTY
@given(
    every=st.timedeltas(min_value=SECOND, max_value=timedelta(days=30)),
    t0=st.datetimes(
        min_value=datetime(2000, 1, 1), max_value=datetime(2040, 12, 31), timezones=st.just(UTC)
    ),
    periods=st.integers(-3, 300),
    extra=st.floats(0, 0.999),
    count=st.integers(0, 40),
)
def test_property_interval_count_and_recent_agree_with_enumeration(
    every, t0, periods, extra, count
):
    interval = Interval(every)
    end = t0 + (periods + extra) * every
    # The occurrences in [t0, end] when t0 is one: t0 itself, then every fire after it.
    everything = [t0, *fire_times(interval, t0, end)] if end >= t0 else []
    assert count_fire_times(interval, t0, end) == len(everything)
    expected_recent = everything[-count:] if count > 0 else []
    assert recent_fire_times(interval, end, t0, count) == expected_recent


@settings(max_examples=examples(300), deadline=None)
@given(
    text=st.text(max_size=40)
    | st.lists(
        st.text(alphabet="0123456789*/,-#?LW@abcdefhjlmnorstuwy ", min_size=1, max_size=8),
        min_size=1,
        max_size=8,
    ).map(" ".join)
)
def test_property_parse_cron_on_arbitrary_text_returns_cron_or_raises_schedule_error(text):
    try:
        cron = parse_cron(text, "UTC")
    except ScheduleError as exc:
        assert exc.field == "cron"
    else:
        assert isinstance(cron, Cron)
        assert next_fire_time(cron, at("2026-01-01T00:00+00:00")) is not None


@settings(max_examples=examples(100), deadline=None)
@given(
    value=st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.binary()
    | st.lists(st.text(max_size=3), max_size=6)
    | st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=3)
    | st.sets(st.integers(), max_size=3)
)
def test_property_parse_cron_on_any_non_string_raises_schedule_error(value):
    with pytest.raises(ScheduleError) as excinfo:
        parse_cron(value, "UTC")
    assert excinfo.value.field == "cron"


# --- intervals with a phase ------------------------------------------------------------------

ANCHORS = st.datetimes(
    min_value=datetime(2020, 1, 1), max_value=datetime(2030, 1, 1), timezones=st.just(UTC)
)
EVERY = st.integers(min_value=1, max_value=7 * 86400).map(lambda s: timedelta(seconds=s))


def grid(anchor: datetime, every: timedelta, lo: datetime, hi: datetime) -> list[datetime]:
    """The occurrences anchor + k*every in [lo, hi], by stepping (the oracle). The walk to lo
    first leaps in steps of 4,096 intervals (an anchor years from lo at one-second intervals
    is 10^8 single steps), then goes one interval at a time."""
    t = anchor
    leap = every * 4096
    while t - leap > lo:
        t -= leap
    while t + leap < lo:
        t += leap
    while t > lo:
        t -= every
    out = []
    while t <= hi:
        if t >= lo:
            out.append(t)
        t += every
    return out


@settings(max_examples=examples(300), deadline=None)
@given(ANCHORS, EVERY, ANCHORS, st.integers(min_value=0, max_value=40))
def test_property_an_anchored_interval_keeps_its_phase(anchor, every, after, span):
    schedule = Interval(every, anchor)
    nxt = next_fire_time(schedule, after)
    assert nxt > after and nxt - after <= every
    assert (nxt - anchor) % every == timedelta(0)
    end = after + span * every / 3
    expected = grid(anchor, every, after, end)
    assert count_fire_times(schedule, after, end) == len(expected)
    assert recent_fire_times(schedule, end, after, 5) == expected[-5:]
    assert list(fire_times(schedule, after - timedelta(microseconds=1), end)) == expected


def test_an_extra_run_does_not_move_an_anchored_interval():
    anchor = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
    every = Interval(timedelta(minutes=10), anchor)
    # run now at 12:03 (an extra occurrence): the next regular one is still 12:10
    assert next_fire_time(every, datetime(2026, 1, 1, 12, 3, tzinfo=UTC)) == anchor + timedelta(
        minutes=10
    )
    # without a phase, the next is counted from the run that happened
    assert next_fire_time(
        Interval(timedelta(minutes=10)), datetime(2026, 1, 1, 12, 3, tzinfo=UTC)
    ) == (datetime(2026, 1, 1, 12, 13, tzinfo=UTC))


# --- the cost of a DST change: a few candidates, not an hour of them ----------------------------
# A per-second cron walked every wall-clock second of a repeated or skipped hour to find its
# next fire (3,600 candidates, ~0.2 s a call here): in the autumn's repeated hour a beat paid
# that for every fire of such a job. Counted in candidates, not seconds: the suite times nothing.


def _counting_candidates(monkeypatch) -> list[int]:
    seen = [0]
    walk = schedules._naive_iter

    def counted(*args, **kwargs):
        for candidate in walk(*args, **kwargs):
            seen[0] += 1
            yield candidate

    monkeypatch.setattr(schedules, "_naive_iter", counted)
    return seen


@pytest.mark.parametrize(
    "expr, after, expected",
    [
        # Dublin's repeated hour, 2003-10-26: 01:00-02:00 local twice, 00:00-02:00 UTC
        ("* * */1 * * *", "2003-10-26T00:02:00+00:00", "2003-10-26T00:02:01+00:00"),  # 1st pass
        ("* * */1 * * *", "2003-10-26T01:02:00+00:00", "2003-10-26T01:02:01+00:00"),  # 2nd pass
        ("* * */1 * * *", "2003-10-26T00:59:59+00:00", "2003-10-26T01:00:00+00:00"),  # between
        ("0 * * * *", "2003-10-26T00:30:00+00:00", "2003-10-26T01:00:00+00:00"),  # 01:00 again
        ("*/1 * 1 * * *", "2003-10-26T01:30:00+00:00", "2003-10-27T01:00:00+00:00"),  # fixed hour
        # Dublin's skipped hour, 2003-03-30: 01:00-02:00 local never happens
        ("* * */1 * * *", "2003-03-30T00:59:59+00:00", "2003-03-30T01:00:00+00:00"),
        ("* * * * *", "2003-03-30T00:59:00+00:00", "2003-03-30T01:00:00+00:00"),
    ],
)
def test_next_fire_time_across_a_dst_change_looks_at_a_few_candidates(
    monkeypatch, expr, after, expected
):
    schedule = parse_cron(expr, "Europe/Dublin")
    seen = _counting_candidates(monkeypatch)
    assert next_fire_time(schedule, datetime.fromisoformat(after)) == datetime.fromisoformat(
        expected
    )
    assert seen[0] <= 8, f"{seen[0]} wall-clock candidates looked at"


def _next_by_walking(cron: Cron, after: datetime) -> datetime | None:
    """The oracle: every wall time from two hours before ``after``'s (any earlier one that
    comes round again later is among them), each read at every instant it names, the earliest
    after ``after`` kept; it stops once a wall time's earliest instant is not before the best,
    since that never decreases as wall time goes on."""
    start = after.astimezone(cron.tz).replace(tzinfo=None) - timedelta(hours=2)
    best = None
    for candidate in schedules._naive_iter(cron, start):
        instants = schedules._instants(candidate, cron.tz, cron.hour_is_wildcard)
        for instant in instants:
            if instant > after and (best is None or instant < best):
                best = instant
        if best is not None and instants and instants[0] >= best:
            return best
    return best


DST_ZONES = ("Europe/Dublin", "America/New_York", "Australia/Lord_Howe", "Europe/Paris")
DST_CHANGES = {
    "Europe/Dublin": ("2026-03-29T01:00:00+00:00", "2026-10-25T01:00:00+00:00"),
    "America/New_York": ("2026-03-08T07:00:00+00:00", "2026-11-01T06:00:00+00:00"),
    "Australia/Lord_Howe": ("2026-04-04T15:00:00+00:00", "2026-10-03T15:30:00+00:00"),
    "Europe/Paris": ("2026-03-29T01:00:00+00:00", "2026-10-25T01:00:00+00:00"),
}


@settings(max_examples=examples(60), deadline=None)
@given(
    expr=st.sampled_from(
        [
            "* * */1 * * *",
            "*/7 * * * * *",
            "0 * * * *",
            "15,45 * * * *",
            "30 1 * * *",
            "30 2 * * *",
            "*/5 1-2 * * *",
            "0 0-3 * * *",
            "10 */1 1 * * *",
        ]
    ),
    zone=st.sampled_from(DST_ZONES),
    change=st.sampled_from((0, 1)),
    offset=st.integers(min_value=-2 * 3600, max_value=3 * 3600),
    micro=st.sampled_from((0, 1, 500_000)),
)
def test_property_next_fire_time_across_dst_changes_equals_walking_every_wall_time(
    expr, zone, change, offset, micro
):
    cron = parse_cron(expr, zone)
    after = datetime.fromisoformat(DST_CHANGES[zone][change]) + timedelta(
        seconds=offset, microseconds=micro
    )
    assert next_fire_time(cron, after) == _next_by_walking(cron, after)
