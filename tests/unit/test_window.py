"""A schedule's [not_before, expires] window (django-celery-beat's start_time and expires):
no occurrence outside it, and counting agrees with enumeration inside it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from schedapp.schedules import (
    Interval,
    count_fire_times,
    fire_times,
    next_fire_time,
    parse_cron,
    recent_fire_times,
    with_window,
)
from tests import examples

BASE = datetime(2026, 3, 1, tzinfo=UTC)
SCHEDULES = st.sampled_from(
    [
        parse_cron("*/7 * * * *", "Europe/Paris"),
        parse_cron("0 9 1-7 * sun", "America/New_York", day_or=False),
        parse_cron("30 2 * * *", "Europe/Paris"),
        Interval(timedelta(minutes=13)),
        Interval(timedelta(hours=5), BASE + timedelta(minutes=3)),
    ]
)
OFFSETS = st.integers(0, 60 * 24 * 40).map(lambda m: BASE + timedelta(minutes=m))


@settings(max_examples=examples(200), deadline=None)
@given(SCHEDULES, OFFSETS, st.integers(1, 60 * 24 * 20), OFFSETS)
def test_no_occurrence_outside_the_window(schedule, start, minutes, after):
    end = start + timedelta(minutes=minutes)
    bounded = with_window(schedule, start, end)
    times = list(fire_times(bounded, after - timedelta(days=3), limit=500))
    assert all(start <= t <= end for t in times)
    assert next_fire_time(bounded, end) is None
    if after < start:  # the first occurrence is the schedule's first at or after the start
        first = next_fire_time(schedule, start - timedelta(microseconds=1))
        if isinstance(schedule, Interval) and schedule.anchor is None:
            first = start
        expected = first if first is not None and first <= end else None
        assert next_fire_time(bounded, after) == expected


@settings(max_examples=examples(100), deadline=None)
@given(SCHEDULES, OFFSETS, st.integers(1, 60 * 24 * 10), OFFSETS, st.integers(1, 60 * 24 * 10))
def test_counting_and_recent_agree_with_enumeration_inside_the_window(
    schedule, start, minutes, lo, span
):
    end = start + timedelta(minutes=minutes)
    bounded = with_window(schedule, start, end)
    hi = lo + timedelta(minutes=span)
    listed = [t for t in fire_times(bounded, start - timedelta(microseconds=1)) if lo <= t <= hi]
    assert count_fire_times(bounded, lo, hi) == len(listed)
    assert recent_fire_times(bounded, hi, lo, 3) == listed[-3:]
