"""A fixed-delay interval under a calendar (``policies.plan_after_success`` with
``fixed_delay``): the next run is a whole delay after the run's end, then the calendar's rule
(exclusion or only, and the roll) applied. Whatever the end, the delay and the roll, the run
it plans is never inside an exclusion, never at or before the end, and what was passed is in
the ledger's ranges under the calendar's name."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedapp import calendars, policies
from schedapp.policies import JobFacts, OnCalendar, plan_after_success
from schedapp.schedules import Interval
from tests import examples

TZ = ZoneInfo("Europe/Berlin")
OFFICE = calendars.parse_calendar(
    "office",
    {
        "union": [
            {"weekdays": ["sat", "sun"]},
            {"dates": ["2026-12-24", "2026-12-25", "2026-12-26", "2026-12-31", "2027-01-01"]},
            {"time_range": {"start": "19:00", "end": "07:00"}},
        ]
    },
)
HOURS = calendars.parse_calendar(  # with mode "only": weekdays 08:00-18:00
    "hours",
    {
        "difference": [
            {"time_range": {"start": "08:00", "end": "18:00"}},
            {"weekdays": ["sat", "sun"]},
        ]
    },
)
MONDAYS = calendars.parse_calendar("mondays", {"weekdays": ["mon"]})
ROLLS = ["skip", "next_business_day", "previous_business_day", "defer"]


def facts(delay: timedelta, end: datetime, cal: OnCalendar) -> JobFacts:
    return JobFacts(
        schedule=Interval(delay, anchor=end - delay),
        state="running",
        scheduled_for=end - delay,
        retry_count=0,
        max_retries=0,
        retry_backoff=timedelta(seconds=10),
        retry_backoff_max=timedelta(hours=1),
        jitter=0,
        now=end,
        fixed_delay=True,
        calendar=cal,
    )


@settings(max_examples=examples(200), deadline=None)
@given(
    end=st.datetimes(
        min_value=datetime(2026, 12, 1), max_value=datetime(2027, 1, 31), timezones=st.just(UTC)
    ),
    delay=st.timedeltas(min_value=timedelta(minutes=1), max_value=timedelta(days=9)),
    roll=st.sampled_from(ROLLS),
    mode=st.sampled_from(["exclude", "only"]),
)
def test_no_fixed_delay_run_lands_inside_an_exclusion(end, delay, roll, mode):
    rule = OFFICE if mode == "exclude" else HOURS
    cal = OnCalendar(calendars.Attached(rule, mode, roll), TZ)
    plan = plan_after_success(facts(delay, end, cal))
    assert plan.interval_anchor == end
    assert plan.scheduled_for is not None and plan.scheduled_for > end
    assert plan.next_run_at == plan.scheduled_for
    assert not calendars.excludes(cal.attached.excluded, plan.scheduled_for.astimezone(TZ))
    if not calendars.excludes(cal.attached.excluded, (end + delay).astimezone(TZ)):
        assert plan.scheduled_for == end + delay  # allowed: a whole delay after the end
    else:
        assert plan.ranges, "an excluded delay's end is in the ledger"
    for r in plan.ranges:
        assert r.fate in ("excluded", "merged") and "calendar " in r.detail
        assert end < r.first <= r.last
        if roll != "previous_business_day":  # it runs before the occurrence it stands for
            assert r.last <= plan.scheduled_for  # defer: merged up to its run
        if r.fate == "excluded" and "multiples" not in r.detail:
            assert r.last < end + delay * (policies.CALENDAR_WALK + 1)


@pytest.mark.parametrize("roll", ["skip", "next_business_day"])
def test_a_delay_in_step_with_an_exclusion_runs_at_its_end_rather_than_never(roll):
    # A weekly delay from a run that ended on a Monday (it started on Sunday night) falls on a
    # Monday every time: no multiple is allowed, so it runs when Monday ends, recorded.
    end = datetime(2026, 12, 7, 8, tzinfo=UTC)  # Monday 09:00 Berlin
    cal = OnCalendar(calendars.Attached(MONDAYS, "exclude", roll), TZ)
    plan = plan_after_success(facts(timedelta(days=7), end, cal))
    if roll == "next_business_day":  # rolled to Tuesday, merged from the Monday
        assert plan.scheduled_for == datetime(2026, 12, 15, 8, tzinfo=UTC)
        return
    assert plan.scheduled_for == datetime(2026, 12, 14, 23, tzinfo=UTC)  # Tuesday 00:00 Berlin
    (record,) = plan.ranges
    assert record.first == end + timedelta(days=7) and record.fate == "excluded"
    assert "multiples of the fixed delay" in record.detail


def test_without_the_fixed_delay_the_interval_keeps_its_phase():
    end = datetime(2026, 12, 3, 12, 30, tzinfo=UTC)
    cal = OnCalendar(calendars.Attached(OFFICE, "exclude", "skip"), TZ)
    job = replace(facts(timedelta(hours=1), end, cal), fixed_delay=False, now=None)
    plan = plan_after_success(job)
    assert plan.interval_anchor is None and plan.scheduled_for == end
