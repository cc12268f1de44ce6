"""A job under a calendar with a real beat and a real worker (issue 31 item 2): a schedule every
five seconds and a calendar that excludes three ten-second windows of every minute. The job
runs only at the seconds the calendar allows, and every occurrence between its first run and
its last is accounted for once: it ran, or the ledger records it excluded by the calendar."""

from __future__ import annotations

from datetime import timedelta

import pytest

from project.models import Execution
from schedapp import api
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
    wait_until(lambda: len(finished(job)) >= RUNS, timeout=90)
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
