"""Celery's crontab semantics in the cron parser: ``day_or=False`` and full day/month names.

The oracle for the property is Celery's own ``crontab`` (the thing schedapp imports): the
next run it computes after a moment must be schedapp's ``next_fire_time`` for the same fields
parsed with ``day_or=False``, in UTC (Celery's crontab has no DST rules of its own).
"""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from celery import Celery
from celery.schedules import crontab
from croniter import croniter
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from schedapp.exceptions import ScheduleError
from schedapp.schedules import (
    Cron,
    count_fire_times,
    describe,
    fire_times,
    next_fire_time,
    parse_cron,
)
from tests import examples
from tests.celery_sim import celery_oracle

DAY = timedelta(days=1)


def at(iso: str) -> datetime:
    value = datetime.fromisoformat(iso)
    assert value.tzinfo is not None, iso
    return value


def days(cron: Cron, start: str, n: int) -> list[str]:
    return [t.strftime("%a %Y-%m-%d") for t in fire_times(cron, at(start), limit=n)]


# --- day_or ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "day_or", "expected"),
    [
        # Celery's crontab(day_of_week=0, day_of_month="1-7"): the first Sunday of the month.
        ("0 0 1-7 * 0", False, ["Sun 2026-01-04", "Sun 2026-02-01", "Sun 2026-03-01"]),
        ("0 0 1-7 * 0", True, ["Thu 2026-01-01", "Fri 2026-01-02", "Sat 2026-01-03"]),
        # Friday the 13th, against the 13th or any Friday.
        ("0 0 13 * fri", False, ["Fri 2026-02-13", "Fri 2026-03-13", "Fri 2026-11-13"]),
        ("0 0 13 * fri", True, ["Fri 2026-01-02", "Fri 2026-01-09", "Tue 2026-01-13"]),
        # A stepped day field is restricted for croniter, so it is ANDed too.
        ("0 0 */10 * 1", False, ["Mon 2026-05-11", "Mon 2026-06-01", "Mon 2026-08-31"]),
        # One restricted field: the same either way.
        ("0 0 * * 1", False, ["Mon 2026-01-05", "Mon 2026-01-12", "Mon 2026-01-19"]),
        ("0 0 15 * *", False, ["Thu 2026-01-15", "Sun 2026-02-15", "Sun 2026-03-15"]),
    ],
)
def test_given_both_day_fields_when_day_or_is_false_then_a_day_must_match_both(
    expr, day_or, expected
):
    cron = parse_cron(expr, "UTC", day_or=day_or)
    assert cron.day_or is day_or
    assert days(cron, "2025-12-31T23:59+00:00", len(expected)) == expected


def test_given_day_or_when_parsing_then_it_is_part_of_the_cache_key():
    ored, anded = parse_cron("0 0 1-7 * 0", "UTC"), parse_cron("0 0 1-7 * 0", "UTC", day_or=False)
    assert (ored.day_or, anded.day_or) == (True, False)
    assert parse_cron("0 0 1-7 * 0", "UTC") is ored  # cached, per day_or
    assert parse_cron("0 0 1-7 * 0", "UTC", day_or=False) is anded
    year = (at("2026-01-01T00:00+00:00"), at("2026-12-31T23:59+00:00"))
    assert (count_fire_times(ored, *year), count_fire_times(anded, *year)) == (124, 12)


def test_given_day_or_false_when_described_then_the_description_says_so():
    assert describe(parse_cron("0 0 1-7 * 0", "UTC")) == "cron '0 0 1-7 * 0' (UTC)"
    assert describe(parse_cron("0 0 1-7 * 0", "UTC", day_or=False)) == (
        "cron '0 0 1-7 * 0' (UTC, days must match both day fields)"
    )


def test_given_an_and_that_never_matches_when_parsing_then_it_is_rejected():
    # No 31st of February: ORed it is every Monday of February, ANDed it never fires.
    assert days(parse_cron("0 0 31 2 1", "UTC"), "2026-01-01T00:00+00:00", 2) == [
        "Mon 2026-02-02",
        "Mon 2026-02-09",
    ]
    with pytest.raises(ScheduleError, match="never fires"):
        parse_cron("0 0 31 2 1", "UTC", day_or=False)


def test_given_or_with_an_nth_side_that_never_holds_then_croniter_rejects_it_too():
    # A croniter quirk kept as is: "#" (and "W") stay on both sides of its OR, and the side
    # "8th to 14th AND first Monday" never holds, so croniter finds no date at all.
    for day_or in (True, False):
        with pytest.raises(ScheduleError, match="never fires"):
            parse_cron("0 0 8-14 * 1#1", "UTC", day_or=day_or)


def test_given_or_with_a_rarely_matching_nth_side_then_the_job_keeps_firing():
    # croniter searches each side of the OR alone; "last day AND 2nd or 4th Monday" next holds
    # in 2033, beyond croniter's search of 8 years, which made it give up on the whole cron.
    cron = parse_cron("0 12 L * 1#2,1#4", "UTC")
    assert next_fire_time(cron, at("2022-03-01T00:00+00:00")) == at("2022-03-14T12:00+00:00")


# --- names -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "normalised"),
    [
        ("0 9 * * sunday", "0 9 * * sun"),
        ("0 9 * * Monday-Friday", "0 9 * * mon-fri"),
        ("0 9 * * MONDAY,wednesday,Friday", "0 9 * * mon,wed,fri"),
        ("0 9 * * thursday#2", "0 9 * * thu#2"),
        ("0 9 * * saturday-sunday", "0 9 * * sat-sun"),
        ("0 9 1 january *", "0 9 1 jan *"),
        ("0 9 1 March-May *", "0 9 1 mar-may *"),
        ("0 9 1 SEPTEMBER,december *", "0 9 1 sep,dec *"),
        ("0 9 1 may *", "0 9 1 may *"),
        ("0 9 1 June-June *", "0 9 1 jun *"),  # an equal range is its one value
        ("0 0 9 1 february tuesday", "0 0 9 1 feb tue"),  # six fields
        # Three-letter forms keep their case, as before.
        ("0 9 * JAN Sun", "0 9 * JAN Sun"),
    ],
)
def test_given_full_names_when_parsing_then_they_become_three_letter_forms(expr, normalised):
    assert not croniter.is_valid(expr) or expr == normalised  # croniter alone refuses them
    cron = parse_cron(expr, "UTC")
    assert cron.expr == normalised
    start = at("2026-01-01T00:00+00:00")
    assert list(fire_times(cron, start, limit=5)) == list(
        fire_times(parse_cron(normalised, "UTC"), start, limit=5)
    )


@pytest.mark.parametrize(
    "expr",
    [
        "0 9 * * sundays",  # not a name
        "0 9 * * sundaymonday",
        "0 9 * * mond",
        "0 9 * * january",  # a month name in the weekday field is still wrong
        "0 9 * monday *",
        "0 9 monday * *",
    ],
)
def test_given_names_that_are_not_names_when_parsing_then_they_are_rejected(expr):
    with pytest.raises(ScheduleError):
        parse_cron(expr, "UTC")


@pytest.mark.parametrize("expr", ["R * * * *", "r * * * *", "0 R * * *", "R/5 * * * *"])
def test_given_croniter_random_field_when_parsing_then_it_is_rejected(expr):
    # croniter draws a new random value each time the expression is read: no fixed schedule.
    with pytest.raises(ScheduleError, match="random"):
        parse_cron(expr, "UTC")


# --- values out of a field's range name the field ---------------------------------------


@pytest.mark.parametrize(
    ("expr", "says"),
    [
        ("61 25 * * *", ["minute 61 is out of range (0-59)", "hour 25 is out of range (0-23)"]),
        ("0 9 32 * *", ["day of month 32 is out of range (1-31)"]),
        ("0 9 0 * *", ["day of month 0 is out of range (1-31)"]),
        ("0 9 * 13 *", ["month 13 is out of range (1-12)"]),
        ("0 9 * * 8", ["day of week 8 is out of range (0-7)"]),
        ("0 9 * * 1-9", ["day of week 9 is out of range (0-7)"]),
        ("0,75 9 * * *", ["minute 75 is out of range (0-59)"]),
        ("0 */24 * * *", []),  # a step past the range is croniter's to judge: not a value
        ("61 0 0 * * *", ["second 61 is out of range (0-59)"]),
        ("0 61 0 * * *", ["minute 61 is out of range (0-59)"]),
    ],
)
def test_given_a_value_out_of_range_when_parsing_then_the_error_names_the_cron_field(expr, says):
    try:
        parse_cron(expr, "UTC")
    except ScheduleError as exc:
        error = exc
    else:
        assert not says, f"{expr!r} was accepted"
        return
    assert error.field == "cron"
    for fragment in says:
        assert fragment in error.message, error.message


_RANGES = [("minute", 0, 59), ("hour", 0, 23), ("day of month", 1, 31), ("month", 1, 12)]
_RANGES.append(("day of week", 0, 7))


@settings(max_examples=examples(300), deadline=None)
@given(
    position=st.integers(0, 5),
    seconds=st.booleans(),
    bad=st.data(),
    shape=st.sampled_from(["{}", "1,{}", "{}-{}", "{}/5", "1-{}"]),
)
def test_property_any_out_of_range_value_names_cron_and_its_position(position, seconds, bad, shape):
    ranges = [("second", 0, 59), *_RANGES] if seconds else _RANGES
    position %= len(ranges)
    name, low, high = ranges[position]
    value = bad.draw(
        st.one_of(st.integers(high + 1, 10**6), st.integers(0, low - 1))
        if low
        else st.integers(high + 1, 10**6),
        label="value",
    )
    field = shape.format(value, value)
    parts = ["*"] * len(ranges)
    parts[position] = field
    expr = " ".join(parts)
    with pytest.raises(ScheduleError) as info:
        parse_cron(expr, "UTC")
    assert info.value.field == "cron"
    assert f"{name} {value} is out of range ({low}-{high})" in info.value.message, expr


# --- Celery's crontab as the oracle ----------------------------------------------------------

ORACLE_APP = Celery("crontab-oracle", set_as_current=False)
ORACLE_APP.conf.timezone = "UTC"
ORACLE_APP.conf.enable_utc = True

WEEKDAYS = ["sunday", "monday", "tuesday", "wednesday", "thursday", "friday", "saturday"]
MONTHS = [
    "january", "february", "march", "april", "may", "june", "july", "august", "september",
    "october", "november", "december",
]  # fmt: skip


def _spec(lo: int, hi: int, names: list[str] | None = None) -> st.SearchStrategy[str]:
    """Celery crontab field text: numbers, names (full or short, any case), ranges, steps."""
    number = st.integers(lo, hi).map(str)
    if names:
        shown = st.sampled_from(names).flatmap(
            lambda n: st.sampled_from([n, n[:3], n.upper(), n.capitalize()])
        )
        number = number | shown
    pair = st.tuples(st.integers(lo, hi), st.integers(lo, hi)).map(sorted)
    span = pair.map(lambda ab: f"{ab[0]}-{ab[1]}")
    if names:
        span = span | st.tuples(st.sampled_from(names), st.sampled_from(names)).map(
            lambda ab: f"{ab[0]}-{ab[1]}"
        )
    step = st.integers(2, hi - lo).map(lambda k: f"*/{k}")
    span_step = st.tuples(pair, st.integers(1, 5)).map(lambda p: f"{p[0][0]}-{p[0][1]}/{p[1]}")
    listed = st.lists(number | span, min_size=2, max_size=3).map(",".join)
    return st.one_of(st.just("*"), number, span, step, span_step, listed)


def _celery_names_in_order(text: str, names: list[str]) -> bool:
    """Celery wraps a name range such as friday-monday; keep ranges written low to high."""
    for item in text.split(","):
        if "-" in item and "/" not in item:
            a, b = item.split("-")
            if not a.isdigit() and not b.isdigit():
                if names.index(a.lower()) > names.index(b.lower()):
                    return False
    return True


@celery_oracle
@settings(
    max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.filter_too_much]
)
@given(
    minute=_spec(0, 59),
    hour=_spec(0, 23),
    day_of_month=_spec(1, 28) | st.sampled_from(["*", "1-7", "8-14", "13", "29-31", "31"]),
    month_of_year=_spec(1, 12, MONTHS),
    day_of_week=_spec(0, 6, WEEKDAYS),
    after=st.integers(0, 20 * 365 * 1440).map(
        lambda m: at("2020-01-01T00:00+00:00") + timedelta(minutes=m)
    ),
    seconds=st.integers(0, 59),
)
def test_property_day_or_false_fires_when_celery_crontab_would(
    minute, hour, day_of_month, month_of_year, day_of_week, after, seconds
):
    assume(_celery_names_in_order(month_of_year, MONTHS))
    assume(_celery_names_in_order(day_of_week, WEEKDAYS))
    expr = f"{minute} {hour} {day_of_month} {month_of_year} {day_of_week}"
    try:
        cron = parse_cron(expr, "UTC", day_or=False)
    except ScheduleError:
        assume(False)
    after += timedelta(seconds=seconds)
    ours = next_fire_time(cron, after)
    assume(ours is not None and ours - after < 400 * DAY)  # Celery searches about a year
    celery = crontab(
        minute=minute,
        hour=hour,
        day_of_month=day_of_month,
        month_of_year=month_of_year,
        day_of_week=day_of_week,
        nowfun=lambda: after,
        app=ORACLE_APP,
    )
    theirs = after + celery.remaining_estimate(after)
    assert ours == theirs, f"{expr!r} after {after.isoformat()}"
