"""Unit and property tests for ``schedapp.policies`` (pure: time and randomness are passed in)."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedapp.policies import (
    BUFFER_FULL,
    MISFIRE_POLICIES,
    MISFIRED,
    NEXT_OCCURRENCE,
    OUTSIDE_WINDOW,
    OVERLAPPED,
    RUN_ALL,
    RUN_ONCE,
    RUN_RECENT,
    SKIP,
    AfterRun,
    Catchup,
    JobFacts,
    MissedRange,
    compute_backoff,
    compute_jitter,
    misfire_after,
    plan_after_failure,
    plan_after_success,
    plan_misfire,
)
from schedapp.schedules import Interval, Once, fire_times, next_fire_time, parse_cron, with_window
from tests import examples

SECOND = timedelta(seconds=1)
ZERO = timedelta(0)
MINUTE = timedelta(minutes=1)
HOUR = timedelta(hours=1)
DAY = timedelta(days=1)
YEAR = timedelta(days=365)


def at(iso: str) -> datetime:
    value = datetime.fromisoformat(iso)
    assert value.tzinfo is not None, iso
    return value


def utc(hh_mm_ss: str) -> datetime:
    """A time of day on 2026-01-01, UTC."""
    return at(f"2026-01-01T{hh_mm_ss}+00:00")


def fixed_rng(value: float):
    return lambda: value


def rng_must_not_be_called() -> float:
    raise AssertionError("no jitter configured: the rng must not be drawn")


# --- compute_backoff -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("retry_count", "base", "cap", "expected"),
    [
        (0, 10 * SECOND, HOUR, 10 * SECOND),
        (1, 10 * SECOND, HOUR, 20 * SECOND),
        (2, 10 * SECOND, HOUR, 40 * SECOND),
        (8, 10 * SECOND, HOUR, 2560 * SECOND),
        (9, 10 * SECOND, HOUR, HOUR),  # 5120 s, capped
        (0, 2 * HOUR, HOUR, HOUR),  # a base above the cap is capped too
        (0, timedelta(0), HOUR, timedelta(0)),
        (63, SECOND, YEAR, YEAR),  # 2**63 s overflows timedelta: the cap applies
        (64, SECOND, HOUR, HOUR),
        (1000, timedelta(microseconds=1), HOUR, HOUR),
        (10**18, SECOND, HOUR, HOUR),
        # A zero base means "retry at once", however many retries there have been.
        (64, timedelta(0), HOUR, timedelta(0)),
        (10**18, timedelta(0), HOUR, timedelta(0)),
    ],
)
def test_given_retry_count_when_computing_backoff_then_it_is_capped_exponential(
    retry_count, base, cap, expected
):
    assert compute_backoff(retry_count, base, cap) == expected


durations = st.integers(0, YEAR // timedelta(microseconds=1)).map(
    lambda us: timedelta(microseconds=us)
)


@settings(max_examples=examples(300), deadline=None)
@given(retry_count=st.integers(0, 300), base=durations, extra=durations)
def test_property_backoff_equals_min_of_base_times_two_to_the_n_and_cap(retry_count, base, extra):
    cap = min(base + extra, YEAR)  # validation: base <= cap <= a year
    base_us, cap_us = base // timedelta(microseconds=1), cap // timedelta(microseconds=1)
    expected = timedelta(microseconds=min(base_us * 2**retry_count, cap_us))
    got = compute_backoff(retry_count, base, cap)
    assert got == expected
    assert got <= cap
    assert got <= compute_backoff(retry_count + 1, base, cap)  # monotone non-decreasing


@settings(max_examples=examples(100), deadline=None)
@given(retry_count=st.integers(64, 10**30), base=durations, extra=durations)
def test_property_backoff_for_huge_retry_counts_is_the_cap_or_zero(retry_count, base, extra):
    cap = min(base + extra, YEAR)
    expected = cap if base > timedelta(0) else timedelta(0)
    assert compute_backoff(retry_count, base, cap) == expected


# --- compute_jitter --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("jitter", "draw", "expected"),
    [
        (10, 0.0, timedelta(0)),
        (10, 0.5, 5 * SECOND),
        (10, 0.25, 2.5 * SECOND),
        (10, 0.999999, timedelta(seconds=9.99999)),
        (7 * 86400, 0.5, timedelta(days=3.5)),
    ],
)
def test_given_jitter_when_drawn_then_offset_scales_the_draw(jitter, draw, expected):
    assert compute_jitter(jitter, fixed_rng(draw)) == expected


@pytest.mark.parametrize("jitter", [0, -1, -86400])
def test_given_no_jitter_when_drawn_then_offset_is_zero_without_drawing(jitter):
    assert compute_jitter(jitter, rng_must_not_be_called) == timedelta(0)


@settings(max_examples=examples(200), deadline=None)
@given(jitter=st.integers(1, 7 * 86400), draw=st.floats(0, 1, exclude_max=True, allow_nan=False))
def test_property_jitter_is_within_zero_and_jitter(jitter, draw):
    got = compute_jitter(jitter, fixed_rng(draw))
    assert timedelta(0) <= got <= timedelta(seconds=jitter)
    assert abs(got - timedelta(seconds=draw * jitter)) <= timedelta(microseconds=1)


def test_given_the_default_rng_when_drawing_jitter_then_offsets_stay_in_range():
    draws = [compute_jitter(30) for _ in range(500)]
    assert all(timedelta(0) <= d <= 30 * SECOND for d in draws)
    assert len(set(draws)) > 1  # it is random


def test_given_a_seeded_rng_when_drawing_jitter_then_the_draw_is_reproducible():
    assert compute_jitter(60, random.Random(7).random) == compute_jitter(
        60, random.Random(7).random
    )


# --- plan_misfire ----------------------------------------------------------------------------

EVERY_MINUTE = parse_cron("* * * * *", "UTC")


@pytest.mark.parametrize("schedule", [EVERY_MINUTE, Interval(MINUTE)], ids=["cron", "interval"])
@pytest.mark.parametrize(
    ("policy", "max_catchup", "expected"),
    [
        pytest.param(SKIP, 3, Catchup(None, utc("10:06:00"), 6), id="skip-runs-nothing"),
        pytest.param(RUN_ONCE, 3, Catchup(utc("10:05:00"), None, 5), id="run-once-latest"),
        pytest.param(RUN_ALL, 3, Catchup(utc("10:03:00"), None, 3), id="run-all-last-3"),
        pytest.param(RUN_ALL, 6, Catchup(utc("10:00:00"), None, 0), id="run-all-exactly-all"),
        pytest.param(RUN_ALL, 100, Catchup(utc("10:00:00"), None, 0), id="run-all-under-bound"),
        pytest.param(RUN_ALL, 0, Catchup(utc("10:05:00"), None, 5), id="run-all-at-least-one"),
    ],
)
def test_given_due_at_10_and_now_10_05_30_when_planning_misfire_then_policy_decides(
    schedule, policy, max_catchup, expected
):
    # Occurrences 10:00, 10:01, ..., 10:05 were all missed: six of them.
    assert plan_misfire(schedule, utc("10:00:00"), utc("10:05:30"), policy, max_catchup) == expected


@pytest.mark.parametrize(
    ("policy", "max_catchup", "expected"),
    [
        # Occurrences 10:00, 10:07, 10:14, 10:21, 10:28; the next is 10:35.
        (SKIP, 1, Catchup(None, utc("10:35:00"), 5)),
        (RUN_ONCE, 1, Catchup(utc("10:28:00"), None, 4)),
        (RUN_ALL, 2, Catchup(utc("10:21:00"), None, 3)),
    ],
)
def test_given_seven_minute_interval_when_planning_misfire_then_the_interval_keeps_its_phase(
    policy, max_catchup, expected
):
    every = Interval(7 * MINUTE)
    assert plan_misfire(every, utc("10:00:00"), utc("10:30:00"), policy, max_catchup) == expected


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        (SKIP, Catchup(None, utc("11:00:00"), 1)),
        (RUN_ONCE, Catchup(utc("10:00:00"), None, 0)),
        (RUN_ALL, Catchup(utc("10:00:00"), None, 0)),
    ],
)
def test_given_only_the_due_occurrence_was_missed_when_planning_misfire_then_one_counts(
    policy, expected
):
    assert plan_misfire(Interval(HOUR), utc("10:00:00"), utc("10:59:00"), policy, 5) == expected


@pytest.mark.parametrize(
    ("policy", "max_catchup", "expected"),
    [
        # Weekdays at 09:00: Fri 2, Mon 5 and Tue 6 January were missed; next is Wed 7.
        (SKIP, 1, Catchup(None, at("2026-01-07T09:00+00:00"), 3)),
        (RUN_ONCE, 1, Catchup(at("2026-01-06T09:00+00:00"), None, 2)),
        (RUN_ALL, 2, Catchup(at("2026-01-05T09:00+00:00"), None, 1)),
    ],
)
def test_given_weekday_cron_missed_over_a_weekend_when_planning_misfire_then_counts_weekdays(
    policy, max_catchup, expected
):
    cron = parse_cron("0 9 * * 1-5", "UTC")
    due, now = at("2026-01-02T09:00+00:00"), at("2026-01-06T12:00+00:00")
    assert plan_misfire(cron, due, now, policy, max_catchup) == expected


@pytest.mark.parametrize(
    ("expr", "due", "now", "policy", "max_catchup", "expected"),
    [
        # Daily 02:30 across the fall-back: 10-24, 10-25 (once, +02:00) and 10-26 were missed.
        (
            "30 2 * * *",
            "2026-10-24T02:30+02:00",
            "2026-10-26T12:00+01:00",
            SKIP,
            1,
            Catchup(None, at("2026-10-27T02:30+01:00"), 3),
        ),
        (
            "30 2 * * *",
            "2026-10-24T02:30+02:00",
            "2026-10-26T12:00+01:00",
            RUN_ONCE,
            1,
            Catchup(at("2026-10-26T02:30+01:00"), None, 2),
        ),
        (
            "30 2 * * *",
            "2026-10-24T02:30+02:00",
            "2026-10-26T12:00+01:00",
            RUN_ALL,
            10,
            Catchup(at("2026-10-24T02:30+02:00"), None, 0),
        ),
        # Daily 02:30 across the spring-forward: 03-28 and 03-29 (at 03:00+02:00) were missed.
        (
            "30 2 * * *",
            "2026-03-28T02:30+01:00",
            "2026-03-29T12:00+02:00",
            RUN_ONCE,
            1,
            Catchup(at("2026-03-29T03:00+02:00"), None, 1),
        ),
        # Every 30 min across the fall-back: 01:30, 02:00, 02:30 (+02:00), then 02:00, 02:30,
        # 03:00 (+01:00): six occurrences missed.
        (
            "*/30 * * * *",
            "2026-10-25T01:30+02:00",
            "2026-10-25T03:10+01:00",
            SKIP,
            1,
            Catchup(None, at("2026-10-25T03:30+01:00"), 6),
        ),
        (
            "*/30 * * * *",
            "2026-10-25T01:30+02:00",
            "2026-10-25T03:10+01:00",
            RUN_ALL,
            4,
            Catchup(at("2026-10-25T02:30+02:00"), None, 2),
        ),
        (
            "*/30 * * * *",
            "2026-10-25T01:30+02:00",
            "2026-10-25T03:10+01:00",
            RUN_ONCE,
            1,
            Catchup(at("2026-10-25T03:00+01:00"), None, 5),
        ),
    ],
)
def test_given_cron_missed_across_dst_when_planning_misfire_then_counts_real_occurrences(
    expr, due, now, policy, max_catchup, expected
):
    cron = parse_cron(expr, "Europe/Paris")
    assert plan_misfire(cron, at(due), at(now), policy, max_catchup) == expected


def z(wall: str | None) -> datetime | None:
    """``2022-12-05T07:30`` in UTC (None stays None)."""
    return None if wall is None else at(f"{wall}+00:00")


@pytest.mark.parametrize(
    ("expr", "grace", "due", "now", "run_for", "next_due", "missed"),
    [
        # Celery's own cases (t/unit/app/test_schedules.py), a one-hour deadline: daily 07:30,
        # last sent 12-04 10:30, so 12-05 07:30 is due. At 10:30 it is 3 h old: not sent.
        ("30 7 * * *", HOUR, "2022-12-05T07:30", "2022-12-05T10:30", None, "2022-12-06T07:30", 1),
        # At 08:00, 30 min old: sent once.
        ("30 7 * * *", HOUR, "2022-12-05T07:30", "2022-12-05T08:00", "2022-12-05T07:30", None, 0),
        # Last sent 12-03: 12-04 is older than the deadline, but 12-05 is the latest and runs.
        ("30 7 * * *", HOUR, "2022-12-04T07:30", "2022-12-05T08:00", "2022-12-05T07:30", None, 1),
        ("30 7 * * *", HOUR, "2022-12-04T07:30", "2022-12-05T11:00", None, "2022-12-06T07:30", 2),
        # Minutes 0 and 45, last sent 08:45: 09:00, 09:45 and 10:00 were missed; at 10:20 the
        # latest (10:00) is within a 30-minute deadline and runs.
        (
            "0,45 * * * *",
            30 * MINUTE,
            "2022-12-05T09:00",
            "2022-12-05T10:20",
            "2022-12-05T10:00",
            None,
            2,
        ),
    ],
)
def test_run_recent_runs_the_latest_missed_occurrence_only_within_the_grace(
    expr, grace, due, now, run_for, next_due, missed
):
    plan = plan_misfire(parse_cron(expr, "UTC"), z(due), z(now), RUN_RECENT, 1, grace)
    assert plan == Catchup(z(run_for), z(next_due), missed)


def test_run_recent_runs_an_extra_occurrence_within_the_grace_and_skips_it_beyond():
    """run now's occurrence is no fire time of the schedule: it is the latest missed one."""
    daily = parse_cron("30 7 * * *", "UTC")
    asked = utc("10:00:00")
    assert plan_misfire(daily, asked, utc("10:00:30"), RUN_RECENT, 1, MINUTE) == Catchup(
        asked, None, 0
    )
    assert plan_misfire(daily, asked, utc("10:05:00"), RUN_RECENT, 1, MINUTE) == Catchup(
        None, next_fire_time(daily, utc("10:05:00")), 0
    )


def test_run_recent_counts_as_late_after_a_second_or_its_grace_if_shorter():
    assert misfire_after(RUN_RECENT, HOUR) == SECOND
    assert misfire_after(RUN_RECENT, timedelta(0)) == timedelta(0)
    assert misfire_after(RUN_ONCE, HOUR) == misfire_after(SKIP, HOUR) == HOUR


@pytest.mark.parametrize("policy", MISFIRE_POLICIES)
def test_given_one_off_when_planning_misfire_then_it_always_runs(policy):
    once = Once(utc("10:00:00"))
    assert plan_misfire(once, once.at, utc("23:00:00"), policy, 1) == Catchup(once.at, None, 0)


@pytest.mark.parametrize("policy", [RUN_ONCE, RUN_ALL])
def test_given_due_still_in_the_future_when_planning_misfire_then_nothing_is_missed(policy):
    plan = plan_misfire(EVERY_MINUTE, utc("10:05:00"), utc("10:04:30"), policy, 3)
    assert plan == Catchup(utc("10:05:00"), None, 0)


# 00:00:00 .. 12:00:00 every second, both ends included: 43,201 occurrences were missed.
@pytest.mark.parametrize(
    "schedule",
    [Interval(SECOND), parse_cron("* * * * * *", "UTC"), parse_cron("* * * * * *", "Europe/Paris")],
    ids=["interval", "cron-utc", "cron-paris"],
)
@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        (SKIP, Catchup(None, utc("12:00:01"), 43_201)),
        (RUN_ONCE, Catchup(utc("12:00:00"), None, 43_200)),
        (RUN_ALL, Catchup(utc("11:59:58"), None, 43_198)),
    ],
)
def test_given_a_long_outage_of_an_every_second_job_then_missed_count_is_exact(
    schedule, policy, expected
):
    plan = plan_misfire(schedule, utc("00:00:00"), utc("12:00:00"), policy, 3)
    assert plan == expected


@pytest.mark.parametrize(
    ("expr", "zone", "late", "occurrences", "latest"),
    [
        # Ten years of minutes (2016-11-30 .. 2026-11-30 holds two leap days): in Paris the hour
        # lost each spring is given back each autumn, so the count is the same as in UTC.
        ("* * * * *", "UTC", 3652 * DAY, 3652 * 1440, "2026-11-30T12:00+00:00"),
        ("* * * * *", "Europe/Paris", 3652 * DAY, 3652 * 1440, "2026-11-30T12:00+00:00"),
        # Eight days of seconds, both ends included.
        ("* * * * * *", "UTC", 8 * DAY, 8 * 86400 + 1, "2026-11-30T12:00:30+00:00"),
        # Weekdays at 09:00 in New York: 52 weeks from Monday 2025-12-01 to Friday 2026-11-27
        # (now is 07:00 there on Monday 2026-11-30).
        ("0 9 * * 1-5", "America/New_York", 364 * DAY, 52 * 5, "2026-11-27T09:00-05:00"),
    ],
)
def test_given_a_very_long_outage_when_planning_run_once_then_every_missed_one_is_counted(
    expr, zone, late, occurrences, latest
):
    now = at("2026-11-30T12:00:30+00:00")
    cron = parse_cron(expr, zone)
    due = next_fire_time(cron, now - late - SECOND)
    plan = plan_misfire(cron, due, now, RUN_ONCE, 1)
    assert plan == Catchup(at(latest), None, occurrences - 1)  # all but the one that runs


# Each schedule with about how often it fires, to scale the outage.
SCHEDULES = [
    (Interval(MINUTE), MINUTE),
    (Interval(7 * MINUTE + 30 * SECOND), 7 * MINUTE),
    (Interval(HOUR), HOUR),
    (parse_cron("* * * * *", "UTC"), MINUTE),
    (parse_cron("*/7 * * * *", "America/New_York"), 7 * MINUTE),
    (parse_cron("*/20 * * * * *", "Asia/Kolkata"), 20 * SECOND),
    (parse_cron("0 * * * *", "Australia/Lord_Howe"), HOUR),
    (parse_cron("*/30 * * * *", "Europe/Paris"), 30 * MINUTE),
    (parse_cron("30 2 * * *", "Europe/Paris"), DAY),
]


@settings(max_examples=examples(200), deadline=None)
@given(
    schedule_and_step=st.sampled_from(SCHEDULES),
    start=st.datetimes(
        min_value=datetime(2000, 1, 1), max_value=datetime(2040, 12, 31), timezones=st.just(UTC)
    )
    | st.sampled_from(
        [at("2026-10-25T00:00+00:00"), at("2026-03-29T00:00+00:00"), at("2026-04-04T14:00+00:00")]
    ),
    periods=st.floats(0, 40),
    policy=st.sampled_from(MISFIRE_POLICIES),
    max_catchup=st.integers(0, 50),
    grace_periods=st.floats(0, 3),
)
def test_property_plan_misfire_agrees_with_enumerated_occurrences(
    schedule_and_step, start, periods, policy, max_catchup, grace_periods
):
    schedule, step = schedule_and_step
    due = next_fire_time(schedule, start)  # the missed occurrence the job was waiting for
    now = due + periods * step
    missed = [due, *fire_times(schedule, due, now)]  # every occurrence in [due, now]
    following = next_fire_time(schedule, missed[-1])  # the first occurrence after now
    assert following > now
    grace = grace_periods * step

    plan = plan_misfire(schedule, due, now, policy, max_catchup, grace)

    if policy == RUN_RECENT:
        recent = now - missed[-1] <= grace
        expected = (
            Catchup(missed[-1], None, len(missed) - 1)
            if recent
            else Catchup(None, following, len(missed))
        )
        assert plan == expected
    elif policy == SKIP:
        assert plan == Catchup(None, following, len(missed))
    elif policy == RUN_ONCE:
        assert plan == Catchup(missed[-1], None, len(missed) - 1)
    else:
        kept = max(1, max_catchup)
        assert plan == Catchup(missed[-min(kept, len(missed))], None, max(0, len(missed) - kept))
    assert_ranges_are_the_unrun(plan, missed)


def assert_ranges_are_the_unrun(plan: Catchup, occurrences: list[datetime]) -> None:
    """The ledger's ranges hold exactly the occurrences the plan does not run, each once,
    oldest first, each range's ends being occurrences and its count exact."""
    unrun = [o for o in occurrences if plan.run_for is None or o < plan.run_for]
    covered = []
    for r in plan.ranges:
        inside = [o for o in occurrences if r.first <= o <= r.last]
        assert inside and inside[0] == r.first and inside[-1] == r.last, r
        assert r.count == len(inside), r
        covered.extend(inside)
    assert covered == unrun
    assert sum(r.count for r in plan.ranges) == plan.missed


@settings(max_examples=examples(200), deadline=None)
@given(
    schedule_and_step=st.sampled_from(SCHEDULES),
    start=st.datetimes(
        min_value=datetime(2000, 1, 1), max_value=datetime(2040, 12, 31), timezones=st.just(UTC)
    ),
    periods=st.floats(0, 40),
    policy=st.sampled_from(MISFIRE_POLICIES),
    max_catchup=st.integers(0, 50),
    grace_periods=st.floats(0, 3),
    window_periods=st.floats(0, 45),
)
def test_property_a_catch_up_window_misses_what_is_older_and_the_policy_decides_the_rest(
    schedule_and_step, start, periods, policy, max_catchup, grace_periods, window_periods
):
    schedule, step = schedule_and_step
    due = next_fire_time(schedule, start)
    now = due + periods * step
    grace = grace_periods * step
    window = max(grace, window_periods * step, SECOND)  # the API refuses one under the grace
    occurrences = [due, *fire_times(schedule, due, now)]

    plan = plan_misfire(schedule, due, now, policy, max_catchup, grace, window)

    # Then what is older than the window is missed as such, and never runs
    old = [o for o in occurrences if o < now - window]
    outside = [r for r in plan.ranges if r.fate == OUTSIDE_WINDOW]
    assert sum(r.count for r in outside) == len(old)
    assert plan.run_for is None or plan.run_for >= now - window
    # And the rest is what the policy decides with the first occurrence inside the window
    rest = [o for o in occurrences if o >= now - window]
    if rest:
        alone = plan_misfire(schedule, rest[0], now, policy, max_catchup, grace)
        assert (plan.run_for, plan.next_due) == (alone.run_for, alone.next_due)
        assert plan.missed == alone.missed + len(old)
    else:
        assert plan.run_for is None and plan.next_due == next_fire_time(schedule, occurrences[-1])
    assert_ranges_are_the_unrun(plan, occurrences)


def test_a_job_back_after_a_year_of_minutes_records_one_range_per_reason():
    # Given an every-minute job away a year, with a one-day catch-up window
    due, now = utc("10:00:00"), utc("10:00:00") + 365 * DAY + 30 * SECOND
    plan = plan_misfire(EVERY_MINUTE, due, now, RUN_ONCE, 1, MINUTE, DAY)
    # Then two records say it all, with exact counts
    assert [(r.fate, r.count) for r in plan.ranges] == [
        (OUTSIDE_WINDOW, 364 * 24 * 60 + 1),  # due to due + 364 days, both included
        (MISFIRED, 24 * 60 - 1),
    ]
    assert plan.run_for == now - 30 * SECOND
    folded = f"folded into {plan.run_for.isoformat()} (misfire policy run_once)"
    assert plan.ranges[1].detail == folded


# --- plan_after_success / plan_after_failure -------------------------------------------------

TEN = utc("10:00:00")


def facts(**changes) -> JobFacts:
    base = JobFacts(
        schedule=Interval(HOUR),
        state="running",
        scheduled_for=TEN,
        retry_count=0,
        max_retries=3,
        retry_backoff=10 * SECOND,
        retry_backoff_max=HOUR,
        jitter=0,
    )
    return replace(base, **changes)


ONE_OFF = Once(TEN)


@pytest.mark.parametrize(
    ("state", "expected_state"),
    [("running", "succeeded"), ("cancelled", "cancelled"), ("paused", "succeeded")],
)
def test_given_one_off_when_it_succeeds_then_it_is_done(state, expected_state):
    # A pause of a one-off is moot once it has run: nothing is left to resume (resuming would
    # run it a second time). A cancel made during the run stands.
    job = facts(schedule=ONE_OFF, state=state, retry_count=2, jitter=30)
    assert plan_after_success(job, rng_must_not_be_called) == AfterRun(
        expected_state, TEN, None, None, 0
    )


@pytest.mark.parametrize(
    ("state", "expected_state"),
    [("running", "scheduled"), ("paused", "paused"), ("cancelled", "cancelled")],
)
def test_given_recurring_job_when_it_succeeds_then_it_waits_for_the_next_occurrence(
    state, expected_state
):
    job = facts(state=state, retry_count=2, jitter=10)
    plan = plan_after_success(job, fixed_rng(0.5))
    # The next occurrence follows the one that ran (10:00), not the moment it finished.
    assert plan == AfterRun(expected_state, utc("11:00:00"), utc("11:00:05"), None, 0)
    assert not plan.dead


@pytest.mark.parametrize(
    ("expr", "ran_for", "expected_next"),
    [
        ("30 2 * * *", "2026-10-25T02:30+02:00", "2026-10-26T02:30+01:00"),
        ("30 2 * * *", "2026-03-28T02:30+01:00", "2026-03-29T03:00+02:00"),
        ("*/30 * * * *", "2026-10-25T02:30+02:00", "2026-10-25T02:00+01:00"),
        ("*/30 * * * *", "2026-03-29T01:30+01:00", "2026-03-29T03:00+02:00"),
    ],
)
def test_given_cron_job_when_it_succeeds_across_dst_then_next_occurrence_follows_the_rules(
    expr, ran_for, expected_next
):
    job = facts(schedule=parse_cron(expr, "Europe/Paris"), scheduled_for=at(ran_for))
    plan = plan_after_success(job, rng_must_not_be_called)
    assert (plan.state, plan.scheduled_for, plan.next_run_at) == (
        "scheduled",
        at(expected_next),
        at(expected_next),
    )


def test_given_job_scheduled_for_a_non_utc_instant_when_it_succeeds_then_interval_is_elapsed():
    paris = ZoneInfo("Europe/Paris")
    job = facts(schedule=Interval(DAY), scheduled_for=datetime(2026, 3, 28, 12, tzinfo=paris))
    plan = plan_after_success(job, rng_must_not_be_called)
    assert plan.scheduled_for == at("2026-03-29T11:00+00:00")  # 24 elapsed hours later


@pytest.mark.parametrize(
    ("retry_count", "expected_delay"),
    [(0, 10 * SECOND), (1, 20 * SECOND), (2, 40 * SECOND), (8, 2560 * SECOND), (9, HOUR)],
)
def test_given_failure_with_retries_left_when_planning_then_retry_same_occurrence_after_backoff(
    retry_count, expected_delay
):
    job = facts(retry_count=retry_count, max_retries=10)
    plan = plan_after_failure(job, rng=rng_must_not_be_called)
    assert plan == AfterRun("scheduled", TEN, None, expected_delay, retry_count + 1)


def test_given_failure_with_jitter_when_planning_then_jitter_is_added_to_the_backoff():
    plan = plan_after_failure(facts(retry_count=1, jitter=8), rng=fixed_rng(0.25))
    assert plan.delay == 20 * SECOND + 2 * SECOND


@pytest.mark.parametrize("delay", [timedelta(0), 7 * SECOND, 2 * HOUR])
def test_given_explicit_delay_when_planning_failure_then_it_replaces_the_backoff(delay):
    plan = plan_after_failure(facts(retry_count=2, jitter=4), delay=delay, rng=fixed_rng(0.5))
    assert plan == AfterRun("scheduled", TEN, None, delay + 2 * SECOND, 3)


@pytest.mark.parametrize(
    ("state", "expected_state"),
    [("running", "scheduled"), ("paused", "paused"), ("cancelled", "cancelled")],
)
def test_given_operator_changed_state_during_run_when_it_fails_then_that_state_stands(
    state, expected_state
):
    plan = plan_after_failure(facts(state=state), rng=rng_must_not_be_called)
    assert plan == AfterRun(expected_state, TEN, None, 10 * SECOND, 1)


@pytest.mark.parametrize(
    ("state", "expected_state"),
    [
        ("running", "dead"),
        ("cancelled", "cancelled"),
        # Dead is terminal like succeeded: it wins over a pause so that a person requeues it.
        ("paused", "dead"),
    ],
)
@pytest.mark.parametrize("schedule", [ONE_OFF, Interval(HOUR)], ids=["one-off", "recurring"])
def test_given_retries_spent_when_it_fails_then_job_is_dead_lettered(
    schedule, state, expected_state
):
    job = facts(schedule=schedule, state=state, retry_count=3, max_retries=3, jitter=30)
    plan = plan_after_failure(job, delay=5 * SECOND, rng=rng_must_not_be_called)
    assert plan == AfterRun(expected_state, TEN, None, None, 3, dead=True, failed_occurrence=True)


def test_given_no_retries_allowed_when_it_fails_then_it_is_dead_at_once():
    plan = plan_after_failure(facts(max_retries=0), rng=rng_must_not_be_called)
    assert plan == AfterRun("dead", TEN, None, None, 0, dead=True, failed_occurrence=True)


def test_given_one_off_with_retries_left_when_it_fails_then_it_is_retried():
    plan = plan_after_failure(facts(schedule=ONE_OFF, retry_count=1), rng=rng_must_not_be_called)
    assert plan == AfterRun("scheduled", TEN, None, 20 * SECOND, 2)


def test_given_last_retry_when_it_succeeds_then_retry_budget_resets_for_the_next_occurrence():
    job = facts(schedule=EVERY_MINUTE, retry_count=3, max_retries=3)
    plan = plan_after_success(job, rng_must_not_be_called)
    assert plan == AfterRun("scheduled", utc("10:01:00"), utc("10:01:00"), None, 0)


@settings(max_examples=examples(200), deadline=None)
@given(
    retry_count=st.integers(0, 200),
    max_retries=st.integers(0, 200),
    base=st.integers(0, 3600).map(lambda s: s * SECOND),
    extra=st.integers(0, 86400).map(lambda s: s * SECOND),
    jitter=st.integers(0, 600),
    draw=st.floats(0, 1, exclude_max=True),
    state=st.sampled_from(["running", "paused", "cancelled", "scheduled"]),
    schedule=st.sampled_from([ONE_OFF, Interval(HOUR), EVERY_MINUTE]),
)
def test_property_plan_after_failure_retries_with_backoff_until_the_budget_is_spent(
    retry_count, max_retries, base, extra, jitter, draw, state, schedule
):
    job = facts(
        schedule=schedule,
        state=state,
        retry_count=retry_count,
        max_retries=max_retries,
        retry_backoff=base,
        retry_backoff_max=base + extra,
        jitter=jitter,
    )
    plan = plan_after_failure(job, rng=fixed_rng(draw))
    assert plan.scheduled_for == TEN  # a retry is for the same occurrence
    assert plan.next_run_at is None
    if retry_count >= max_retries:
        expected_state = "cancelled" if state == "cancelled" else "dead"
        assert plan == AfterRun(
            expected_state, TEN, None, None, retry_count, dead=True, failed_occurrence=True
        )
    else:
        backoff = compute_backoff(retry_count, base, base + extra)
        assert plan.delay == backoff + compute_jitter(jitter, fixed_rng(draw))
        assert backoff <= plan.delay <= base + extra + timedelta(seconds=jitter)
        assert plan.retry_count == retry_count + 1
        assert plan.state == (state if state in ("paused", "cancelled") else "scheduled")
        assert not plan.dead


# --- when_retries_exhausted="next_occurrence": Celery beat's "the next one comes anyway" -------


@pytest.mark.parametrize(
    ("state", "expected_state"),
    [("running", "scheduled"), ("paused", "paused"), ("cancelled", "cancelled")],
)
@pytest.mark.parametrize(("retry_count", "max_retries"), [(0, 0), (3, 3), (5, 3)])
def test_given_carry_on_policy_when_retries_spent_then_the_job_waits_for_its_next_occurrence(
    retry_count, max_retries, state, expected_state
):
    # "charge cards every minute", imported from Celery beat: a failed occurrence is followed
    # by the next one, it is not retried (max_retries=0) and the job never goes dead.
    job = facts(
        schedule=EVERY_MINUTE,
        state=state,
        retry_count=retry_count,
        max_retries=max_retries,
        jitter=10,
        when_retries_exhausted=NEXT_OCCURRENCE,
    )
    plan = plan_after_failure(job, rng=fixed_rng(0.5))
    assert plan == AfterRun(
        expected_state,
        utc("10:01:00"),
        utc("10:01:05"),
        None,
        0,  # the next occurrence has its whole retry budget
        dead=False,
        failed_occurrence=True,
    )


@pytest.mark.parametrize("retry_count", [0, 3, 7])
def test_given_carry_on_policy_when_the_task_asks_for_a_retry_then_it_is_retried_as_celery_would(
    retry_count,
):
    # An imported job (max_retries=0) whose task uses autoretry_for / self.retry: Celery's
    # Task.retry checked the task's own max_retries before asking, and Celery's worker would
    # run the retry message; the job's budget is for schedapp's own retries of a failure.
    job = facts(
        schedule=EVERY_MINUTE,
        retry_count=retry_count,
        max_retries=0,
        jitter=4,
        when_retries_exhausted=NEXT_OCCURRENCE,
    )
    plan = plan_after_failure(job, delay=5 * SECOND, rng=fixed_rng(0.5))
    assert plan == AfterRun("scheduled", TEN, None, 7 * SECOND, retry_count + 1)
    # a plain failure (Celery raised it past the task's own max_retries) goes on
    plan = plan_after_failure(job, rng=fixed_rng(0.5))
    assert (plan.scheduled_for, plan.retry_count, plan.failed_occurrence) == (
        utc("10:01:00"),
        0,
        True,
    )


def test_given_dead_policy_when_the_task_asks_for_a_retry_past_the_budget_then_the_job_is_dead():
    job = facts(retry_count=3, max_retries=3)
    plan = plan_after_failure(job, delay=5 * SECOND, rng=rng_must_not_be_called)
    assert plan.dead and plan.state == "dead"


def test_given_carry_on_policy_with_retries_left_when_it_fails_then_it_retries_first():
    job = facts(retry_count=1, max_retries=3, when_retries_exhausted=NEXT_OCCURRENCE)
    plan = plan_after_failure(job, rng=rng_must_not_be_called)
    assert plan == AfterRun("scheduled", TEN, None, 20 * SECOND, 2)


def test_given_carry_on_policy_and_a_rescheduled_job_when_retries_spent_then_new_schedule_goes_on():
    new_first = utc("12:00:00")
    job = facts(
        scheduled_for=new_first,
        next_run_at=new_first,
        ran_for=TEN,
        max_retries=0,
        when_retries_exhausted=NEXT_OCCURRENCE,
    )
    plan = plan_after_failure(job, rng=rng_must_not_be_called)
    assert plan == AfterRun("scheduled", new_first, new_first, None, 0, failed_occurrence=True)


@pytest.mark.parametrize(
    "schedule",
    [ONE_OFF, with_window(Interval(HOUR), None, utc("10:30:00"))],
    ids=["one-off", "recurring-past-its-expires"],
)
def test_given_carry_on_policy_and_no_next_occurrence_when_retries_spent_then_the_job_is_dead(
    schedule,
):
    # Nothing to go on with: the failure is left for a person (the dead letters), not ended
    # as "succeeded" nor dropped without a trace.
    job = facts(schedule=schedule, max_retries=0, when_retries_exhausted=NEXT_OCCURRENCE)
    plan = plan_after_failure(job, rng=rng_must_not_be_called)
    assert plan == AfterRun("dead", TEN, None, None, 0, dead=True, failed_occurrence=True)


@settings(max_examples=examples(200), deadline=None)
@given(
    retry_count=st.integers(0, 20),
    max_retries=st.integers(0, 20),
    jitter=st.integers(0, 600),
    draw=st.floats(0, 1, exclude_max=True),
    schedule=st.sampled_from([Interval(HOUR), EVERY_MINUTE, parse_cron("0 9 * * 1-5", "UTC")]),
)
def test_property_carry_on_policy_never_kills_a_recurring_job(
    retry_count, max_retries, jitter, draw, schedule
):
    job = facts(
        schedule=schedule,
        retry_count=retry_count,
        max_retries=max_retries,
        jitter=jitter,
        when_retries_exhausted=NEXT_OCCURRENCE,
    )
    plan = plan_after_failure(job, rng=fixed_rng(draw))
    assert not plan.dead
    assert plan.state == "scheduled"
    if retry_count < max_retries:  # a retry of the same occurrence, as under "dead"
        assert plan == plan_after_failure(
            replace(job, when_retries_exhausted="dead"), rng=fixed_rng(draw)
        )
    else:  # the next occurrence, exactly as after a success, the failure recorded
        assert plan == replace(plan_after_success(job, fixed_rng(draw)), failed_occurrence=True)
        assert plan.scheduled_for == next_fire_time(schedule, TEN)


def test_a_window_longer_than_time_itself_catches_everything_up():
    """A window written behind the API's back (a million years): ``now - window`` would
    overflow; a window longer than the lateness is no window."""
    due, now = utc("10:00:00"), utc("10:05:30")
    plan = plan_misfire(EVERY_MINUTE, due, now, RUN_ONCE, 1, MINUTE, timedelta(days=365_000_000))
    assert plan == Catchup(utc("10:05:00"), None, 5)
    assert [r.fate for r in plan.ranges] == [MISFIRED]


# --- overlap policies and fixed delay (decided when a run ends) ------------------------------

OVERLAP_SCHEDULES = [
    Interval(5 * MINUTE, anchor=utc("00:02:30")),
    parse_cron("*/5 * * * *", "UTC"),
    parse_cron("*/15 1-3 * * *", "Europe/Paris"),  # hour-restricted: gaps between runs
    parse_cron("30 2 * * *", "Europe/Paris"),  # daily, across both DST changes of 2026
]


@settings(max_examples=examples(300), deadline=None)
@given(
    schedule=st.sampled_from(OVERLAP_SCHEDULES),
    start=st.datetimes(
        min_value=datetime(2026, 3, 25), max_value=datetime(2026, 11, 1), timezones=st.just(UTC)
    ),
    ran_for=st.timedeltas(min_value=timedelta(0), max_value=3 * DAY),
    overlap=st.sampled_from(["skip", "buffer_one", "buffer_all", "cancel_other"]),
    max_buffer=st.integers(1, 12),
)
def test_property_every_occurrence_that_came_due_during_a_run_has_one_fate(
    schedule, start, ran_for, overlap, max_buffer
):
    occurrence = next_fire_time(schedule, start)
    now = occurrence + ran_for  # the run ends; ``now`` is the database's clock then
    job = facts(
        schedule=schedule, scheduled_for=occurrence, now=now, overlap=overlap, max_buffer=max_buffer
    )
    plan = plan_after_success(
        job, rng_must_not_be_called if overlap == "buffer_all" else random.random
    )
    # Independently: the occurrences after the one that ran, up to the run's end, one by one.
    came_due = list(fire_times(schedule, occurrence, now))
    recorded = [
        t
        for r in plan.ranges
        for t in fire_times(schedule, r.first - timedelta(microseconds=1), r.last)
    ]
    assert sum(r.count for r in plan.ranges) == len(recorded)  # exact counts
    if overlap == "buffer_one" or not came_due:  # the next one waits, as before overlaps
        assert plan.ranges == ()
        assert plan.scheduled_for == next_fire_time(schedule, occurrence)
        return
    if overlap == "cancel_other":  # the latest runs now; those before it are recorded
        assert plan.scheduled_for == came_due[-1] and plan.delay == timedelta(0)
        assert recorded == came_due[:-1]
        assert all(r.fate == OVERLAPPED for r in plan.ranges)
        return
    if overlap == "skip":
        assert recorded == came_due and {r.fate for r in plan.ranges} == {OVERLAPPED}
        assert plan.scheduled_for == next_fire_time(schedule, now)  # the first after the run
        assert plan.scheduled_for > now and plan.delay is None
        return
    kept = came_due[-max_buffer:]
    assert plan.scheduled_for == kept[0] and plan.delay == timedelta(0)  # due at once
    assert recorded == came_due[: len(came_due) - len(kept)]
    assert all(r.fate == BUFFER_FULL for r in plan.ranges)
    # The next run ends later: the rest of the buffer (and what came due meanwhile) is there.
    later = replace(job, scheduled_for=kept[0], now=now + MINUTE)
    then = plan_after_success(later, rng_must_not_be_called)
    assert then.ranges == () or then.ranges[0].first > kept[0]
    if len(kept) > 1:
        assert then.scheduled_for == kept[1]


def test_a_skipped_overlap_is_one_range_with_its_count_and_why():
    job = facts(schedule=Interval(MINUTE), scheduled_for=TEN, now=utc("10:03:30"), overlap="skip")
    plan = plan_after_success(job, fixed_rng(0.5))
    assert plan.ranges == (
        MissedRange(
            utc("10:01:00"),
            utc("10:03:00"),
            3,
            OVERLAPPED,
            f"came due while the run for {TEN.isoformat()} was in flight (overlap policy skip)",
        ),
    )
    assert (plan.state, plan.scheduled_for, plan.next_run_at) == (
        "scheduled",
        utc("10:04:00"),
        utc("10:04:00"),
    )


def test_a_skip_past_the_jobs_end_finishes_it():
    schedule = Interval(MINUTE, expires=utc("10:02:00"))
    job = facts(schedule=schedule, scheduled_for=TEN, now=utc("10:05:00"), overlap="skip")
    plan = plan_after_success(job, rng_must_not_be_called)
    assert plan.state == "succeeded" and plan.next_run_at is None
    assert [(r.first, r.count) for r in plan.ranges] == [(utc("10:01:00"), 2)]


@pytest.mark.parametrize("overlap", ["skip", "buffer_one", "buffer_all"])
def test_a_fixed_delay_counts_the_interval_from_the_end_of_the_run(overlap):
    job = facts(
        scheduled_for=TEN, now=utc("12:30:00"), fixed_delay=True, overlap=overlap, jitter=10
    )
    plan = plan_after_success(job, fixed_rng(0.5))
    assert plan == AfterRun(
        "scheduled", utc("13:30:00"), utc("13:30:05"), None, 0, interval_anchor=utc("12:30:00")
    )


def test_without_the_databases_clock_a_success_plans_as_before_overlaps():
    job = facts(scheduled_for=TEN, overlap="skip", fixed_delay=True)
    assert plan_after_success(job, rng_must_not_be_called) == AfterRun(
        "scheduled", utc("11:00:00"), utc("11:00:00"), None, 0
    )


@pytest.mark.parametrize("overlap", ["cancel_other", "terminate_other"])
def test_a_superseded_run_that_failed_is_not_retried_the_latest_occurrence_runs(overlap):
    # A run for 10:00 (every hour) cancelled when 11:00 came due, reported failed at 12:30
    job = facts(scheduled_for=TEN, now=utc("12:30:00"), overlap=overlap, superseded=True)
    plan = plan_after_failure(job, rng=rng_must_not_be_called)
    assert (plan.scheduled_for, plan.delay, plan.retry_count) == (utc("12:00:00"), ZERO, 0)
    assert not plan.dead and not plan.failed_occurrence
    assert [(r.first, r.count, r.fate) for r in plan.ranges] == [(utc("11:00:00"), 1, OVERLAPPED)]
    # Not superseded (it failed before the next came due): retried as any failure
    assert plan_after_failure(replace(job, superseded=False), rng=fixed_rng(0)).retry_count == 1
