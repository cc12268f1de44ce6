"""A job under a calendar with a real beat and a real worker (issue 31 item 2): a schedule every
five seconds and a calendar that excludes three ten-second windows of every minute. The job
runs only at the seconds the calendar allows, and every occurrence between its first run and
its last is accounted for once: it ran, or the ledger records it excluded by the calendar."""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

import holidays
import pytest

from project.models import Execution
from schedapp import api
from schedapp.db import db_now
from schedapp.explain import explain
from schedapp.models import Job, JobRun, Occurrence, RunStatus
from schedapp.schedules import fire_times
from schedapp.testing.processes import wait_until

pytestmark = [pytest.mark.e2e]

RUNS = 4
EXCLUDED_SECONDS = {*range(0, 10), *range(20, 30), *range(40, 50)}


def finished(job: Job) -> list[Execution]:
    return list(
        Execution.objects.filter(job_id=job.pk, finished_at__isnull=False).order_by("started_at")
    )


def succeeded(job: Job, executions: list[Execution]) -> bool:
    """Whether these RUNS executions' runs are recorded as succeeded."""
    times = [e.scheduled_for for e in executions]
    done = JobRun.objects.filter(job=job, status=RunStatus.SUCCEEDED, scheduled_for__in=times)
    return len(times) == RUNS and done.count() == RUNS


def test_a_job_runs_only_where_its_calendar_allows_and_the_ledger_says_why_not(fleet):
    # Given a calendar excluding seconds 0-9, 20-29 and 40-49 of every minute, and a job every
    # five seconds following it (skip: an excluded occurrence does not run)
    api.save_calendar("quiet-thirds", {"cron": "0-9,20-29,40-49 * * * * *"})
    job = api.schedule(
        "project.tasks.record",
        name="every-five",
        cron="*/5 * * * * *",
        timezone="UTC",
        calendar="quiet-thirds",
        misfire_grace=60,
    )
    assert job.scheduled_for.second not in EXCLUDED_SECONDS
    # When a beat and a worker run it
    fleet.beat()
    fleet.worker(concurrency=2)
    # (until the first RUNS executions' successes are recorded too: a task's body ends before
    # its worker records the run succeeded, with its next door or a moment later; read
    # between the two, the last occurrence had neither a run nor a record, and CI failed)
    wait_until(lambda: succeeded(job, finished(job)[:RUNS]), timeout=90)
    # Then every run was at a second the calendar allows
    runs = list(JobRun.objects.filter(job=job).order_by("scheduled_for"))
    assert runs and all(r.scheduled_for.second not in EXCLUDED_SECONDS for r in runs), [
        r.scheduled_for for r in runs
    ]
    executed = finished(job)
    assert all(e.scheduled_for.second not in EXCLUDED_SECONDS for e in executed)
    # ... and every occurrence from the first run to the last finished one ran once or is
    # recorded excluded, under the calendar's name
    first, last = executed[0].scheduled_for, executed[RUNS - 1].scheduled_for
    said: dict = {t: [] for t in fire_times(job.schedule, first - timedelta(microseconds=1), last)}
    for run in runs:
        if run.scheduled_for in said and run.status == RunStatus.SUCCEEDED:
            said[run.scheduled_for].append("ran")
    records = list(Occurrence.objects.filter(job=job))
    for record in records:
        assert record.fate == "excluded" and "calendar 'quiet-thirds'" in record.detail
        for t in fire_times(
            job.schedule, record.scheduled_for - timedelta(microseconds=1), record.last
        ):
            if t in said:
                said[t].append(record.fate)
    assert all(len(f) == 1 for f in said.values()), said
    assert {f[0] for f in said.values()} == {"ran", "excluded"}
    for t, fate in said.items():
        assert (fate[0] == "excluded") == (t.second in EXCLUDED_SECONDS), (t, fate)


# --- a holiday calendar with a business-day roll, its past weeks worked through now ------------

ZONE = "Europe/Berlin"
WEEKS = 8  # about 28 occurrences and 20 runs: inside the CALENDAR_WALK bound (64)
# Countries looked at, in order, for one with a public holiday on a weekday the job's schedule
# fires on within the last WEEKS weeks (the test runs on any date; Bavaria first).
COUNTRIES = [
    ("DE", "BY"),
    ("US", None),
    ("FR", None),
    ("GB", None),
    ("JP", None),
    ("BR", None),
    ("IN", None),
    ("CA", None),
    ("IT", None),
    ("ES", None),
    ("MX", None),
    ("PL", None),
    ("KR", None),
    ("AU", None),
    ("CN", None),
]


def nine(day: date) -> datetime:
    return datetime.combine(day, time(9), ZoneInfo(ZONE)).astimezone(UTC)


def fires(day: date) -> bool:
    """The schedule ``0 9 */2 * *``: odd days of the month."""
    return day.day % 2 == 1


def test_a_holiday_calendar_with_a_business_day_roll_runs_on_business_days_and_says_why(fleet):
    # Given a calendar of a country's public holidays (from the holidays package) and weekends,
    # and a job at 09:00 Berlin time on odd days of the month rolled to the next business day
    # (an occurrence rolled onto another's day merges into that run; one rolled onto an even
    # day is a moved run)
    today = db_now().astimezone(ZoneInfo(ZONE)).date()
    start = today - timedelta(weeks=WEEKS)
    days = [start + timedelta(days=i) for i in range((today - start).days + 1)]
    for country, subdivision in COUNTRIES:
        found = holidays.country_holidays(
            country, subdiv=subdivision, years={start.year, today.year}
        )
        if any(d in found and d.weekday() < 5 and fires(d) for d in days[:-7]):
            break
    else:
        pytest.fail("no country with a weekday holiday in the window")
    closed = set(found) | {
        d for d in days + [today + timedelta(days=i) for i in range(30)] if d.weekday() >= 5
    }

    def business(d: date) -> date:
        while d in closed:
            d += timedelta(days=1)
        return d

    rule: dict = {"country": country}
    if subdivision:
        rule["subdivision"] = subdivision
    api.save_calendar("office", {"union": [{"holidays": rule}, {"weekdays": ["sat", "sun"]}]})
    job = api.schedule(
        "project.tasks.record",
        name="odd-days",
        cron="0 9 */2 * *",
        timezone=ZONE,
        calendar="office",
        calendar_roll="next_business_day",
        misfire_policy="run_all",
        misfire_max_catchup=64,
    )
    # ... whose row is due at its first business-day occurrence WEEKS weeks ago, as if the job
    # was created then and no beat has run since (its ledger starts empty)
    first = next(d for d in days if fires(d) and d not in closed)
    Job.objects.filter(pk=job.pk).update(scheduled_for=nine(first), next_run_at=nine(first))
    Occurrence.objects.filter(job=job).delete()
    now = db_now()
    # The runs the test expects, from the holidays package: each occurrence on its own day
    # when that is a business day, else on the next business day; one run per day
    occurrences = [nine(d) for d in days if d >= first and fires(d) and nine(d) <= now]
    run_of = {o: nine(business(o.astimezone(ZoneInfo(ZONE)).date())) for o in occurrences}
    expected = sorted({r for r in run_of.values() if r <= now})
    assert any(o != r for o, r in run_of.items()), "the window holds rolled occurrences"
    assert len(expected) < 64
    # When a beat and a worker run it: run_all works through the past runs one by one
    fleet.beat()
    fleet.worker(concurrency=1)
    wait_until(
        lambda: len({e.scheduled_for for e in finished(job)} & set(expected)) == len(expected),
        timeout=240,
        message="the job's past business-day runs",
    )
    # Then it ran exactly on the business days the holidays package gives, each once
    executed = [e.scheduled_for for e in finished(job) if e.scheduled_for <= now]
    assert sorted(executed) == expected, (country, executed, expected)
    # ... and every occurrence that did not run on its own day is explained: merged by the
    # calendar; the first rolled onto a day of no occurrence says where it was moved to, and
    # the run there where it was moved from
    for o, r in run_of.items():
        if r > now:
            continue
        answer = explain(job, o)
        if o == r:
            assert answer.entry is not None and answer.entry.fate == "ran", answer.text
            continue
        assert answer.entry is not None and answer.entry.fate == "merged", answer.text
        assert "calendar 'office' (exclude, roll next_business_day)" in answer.text, answer.text
        earliest = min(x for x, y in run_of.items() if y == r)
        if fires(r.astimezone(ZoneInfo(ZONE)).date()) or o != earliest:
            # merged into r's own run, or into the run the earliest of them was moved to
            assert "moved to" not in answer.text, answer.text
        else:
            assert f"moved to {local(r)}" in answer.text, answer.text
            moved = explain(job, r)
            assert moved.entry is not None and moved.entry.fate == "ran", moved.text
            assert f"moved here from {local(o)}" in moved.text, moved.text
    # ... each occurrence exactly once: a run or one ledger record
    records = list(Occurrence.objects.filter(job=job, scheduled_for__lte=now))
    for o in occurrences:
        covering = [x for x in records if x.scheduled_for <= o <= x.last]
        ran = JobRun.objects.filter(job=job, scheduled_for=o, status=RunStatus.SUCCEEDED)
        assert len(covering) + (1 if ran.exists() else 0) == 1, (o, covering)


def local(at: datetime) -> str:
    return at.astimezone(ZoneInfo(ZONE)).isoformat(sep=" ", timespec="seconds")
