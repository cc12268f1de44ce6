"""A misfire under a calendar (``policies.plan_misfire(..., calendar=)``): the runs it walks are
bounded (``CALENDAR_WALK``), and every occurrence of the schedule from the due run up to the
run it keeps (or the next run it waits for) is accounted for exactly once: run, or in one of
the ledger's ranges (missed, excluded, merged), within the bound or past it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from schedapp import calendars, policies, schedules

TZ = ZoneInfo("Europe/Berlin")
OFFICE = calendars.parse_calendar(
    "office",
    {"union": [{"weekdays": ["sat", "sun"]}, {"time_range": {"start": "19:00", "end": "07:00"}}]},
)
TICK = timedelta(microseconds=1)


def on(roll: str) -> policies.OnCalendar:
    return policies.OnCalendar(calendars.Attached(OFFICE, "exclude", roll), TZ)


@pytest.mark.parametrize("roll", ["skip", "next_business_day", "defer"])
@pytest.mark.parametrize("policy", ["run_once", "skip", "run_all"])
@pytest.mark.parametrize(
    ("expr", "away"),
    [
        ("0 9 * * *", timedelta(days=20)),  # within the walk: 14 business days
        ("*/30 * * * *", timedelta(days=10)),  # past it: 24 runs a business day
    ],
)
def test_every_occurrence_is_run_or_recorded_once_and_runs_are_allowed(roll, policy, expr, away):
    schedule = schedules.parse_cron(expr, "Europe/Berlin")
    cal = on(roll)
    due, _ = policies.first_run(schedule, datetime(2026, 11, 2, 6, tzinfo=UTC), cal)
    now = due + away
    plan = policies.plan_misfire(
        schedule, due, now, policy, 3, timedelta(minutes=1), None, calendar=cal
    )
    end = plan.run_for if plan.run_for is not None else plan.next_due
    assert end is not None
    # the run kept, or waited for, is one the calendar allows
    assert not calendars.excludes(OFFICE.rule, end.astimezone(TZ))
    if plan.run_for is not None:
        assert plan.run_for <= now
        covered = plan.run_for - TICK  # the kept run itself is not in the ledger
    else:
        assert plan.next_due > now
        covered = plan.next_due - TICK
    recorded = sum(r.count for r in plan.ranges)
    # occurrences of the schedule's own in [due, covered] (a deferred run is at none)
    expected = schedules.count_fire_times(schedule, due, covered)
    # a missed run the calendar moved stands for the occurrence recorded "moved to" it: the
    # run's own record (misfired) is of the run, its occurrence is counted there
    moved_to = {
        r.detail.removeprefix("moved to ").split(" ")[0]
        for r in plan.ranges
        if r.detail.startswith("moved to ")
    }
    moved_runs = sum(
        1 for r in plan.ranges if r.fate == policies.MISFIRED and r.first.isoformat() in moved_to
    )
    assert recorded - moved_runs == expected, (recorded, moved_runs, expected)
    assert plan.missed == sum(r.count for r in plan.ranges if r.fate == policies.MISFIRED)
    firsts = [r.first for r in plan.ranges]
    assert len(firsts) == len(set(firsts)), "one record per first occurrence"


@pytest.mark.parametrize("window", [None, timedelta(days=30)])
def test_a_start_deadline_applies_under_a_calendar_and_its_misses_are_late(window):
    # Given a daily 09:00 job under the office calendar, away for 10 days, skipping late ones
    schedule = schedules.parse_cron("0 9 * * *", "Europe/Berlin")
    cal = on("skip")
    due, _ = policies.first_run(schedule, datetime(2026, 11, 2, 6, tzinfo=UTC), cal)
    now = due + timedelta(days=10, hours=1)
    deadline = timedelta(hours=2)
    plan = policies.plan_misfire(
        schedule, due, now, "run_once", 3, timedelta(minutes=1), window, calendar=cal,
        start_deadline=deadline,
    )
    # Then nothing older than the deadline runs, and the runs it passed are recorded late
    assert plan.run_for is None or now - plan.run_for <= deadline
    late = [r for r in plan.ranges if r.fate == policies.LATE]
    assert late and all(now - r.last > deadline for r in late)
    assert not [r for r in plan.ranges if r.fate == policies.OUTSIDE_WINDOW]
