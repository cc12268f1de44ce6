"""Deadlines with real beats and workers: a run waiting for a stopped worker is late, then
recovered when a worker comes back; a run past its max runtime is overrunning and revoked
(terminated) when its job asks; failed attempts in a row make a job failing, a success
recovers it. Each signal is received once (the demo project's receiver records each one as
a SignalReceived row, ``signal:<name>:<kind>``)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from project.models import Execution, SignalReceived
from schedapp import api
from schedapp.db import db_now
from schedapp.models import Breach, Job, JobRun, JobState, Occurrence, RunStatus
from schedapp.testing.processes import wait_until

pytestmark = [pytest.mark.e2e]


def signals_of(job: Job) -> list[str]:
    return list(
        SignalReceived.objects.filter(job_id=job.pk)
        .order_by("id")
        .values_list("label", flat=True)
    )


def breaches_of(job: Job) -> list[tuple[str, bool]]:
    rows = Breach.objects.filter(job=job).order_by("id")
    return [(b.kind, b.cleared_at is not None) for b in rows]


def test_a_run_waiting_for_a_stopped_worker_is_late_then_recovers_when_it_comes_back(fleet):
    # Given a beat, and the only worker stopped
    fleet.beat()
    fleet.worker(concurrency=1).stop()
    # When a job with a 2 s start deadline comes due (its lease long enough to wait)
    job = api.schedule(
        "project.tasks.record",
        kwargs={"label": "late"},
        run_at=db_now(),
        start_deadline=2,
        lease_seconds=60,
        name="late",
    )
    # Then it is claimed and dispatched, and found late once
    wait_until(lambda: signals_of(job) == ["signal:late:late"], timeout=30, message="late")
    assert JobRun.objects.get(job=job).status == RunStatus.DISPATCHED
    # When a worker comes back, the run starts, and the breach recovers
    fleet.worker(concurrency=1)
    wait_until(
        lambda: signals_of(job) == ["signal:late:late", "signal:recovered:late"],
        timeout=40,
        message="recovered",
    )
    assert breaches_of(job) == [("late", True)]
    assert Breach.objects.get(job=job).cleared_detail == "started"
    wait_until(lambda: Job.objects.get(pk=job.pk).state == JobState.SUCCEEDED, timeout=20)


def test_a_run_dispatched_in_time_but_delivered_late_is_refused_under_skip_late(fleet):
    # Given a beat, and the only worker stopped
    fleet.beat()
    fleet.worker(concurrency=1).stop()
    # When an hourly job skipping late occurrences (4 s start deadline) comes due
    # (an interval's occurrences fall an interval apart from its anchor: the next in a second)
    anchor = db_now() - timedelta(seconds=3599)
    job = api.schedule(
        "project.tasks.record",
        kwargs={"label": "late-door"},
        interval=3600,
        interval_anchor=anchor,
        start_deadline=4,
        skip_late=True,
        lease_seconds=60,
        name="late-door",
    )
    # Then it is claimed and dispatched in time, and found late while no worker consumes
    wait_until(lambda: signals_of(job) == ["signal:late:late"], timeout=30, message="late")
    (run,) = JobRun.objects.filter(job=job)
    assert run.status == RunStatus.DISPATCHED
    # When a worker comes back after the deadline, the door refuses the run as late: the
    # task body never runs, the occurrence is recorded late, the job waits for its next one
    fleet.worker(concurrency=1)
    wait_until(
        lambda: JobRun.objects.get(pk=run.pk).status == RunStatus.SKIPPED,
        timeout=40,
        message="refused at the door",
    )
    wait_until(
        lambda: Job.objects.get(pk=job.pk).scheduled_for > run.scheduled_for,
        timeout=30,
        message="moved on to its next occurrence",
    )
    [record] = Occurrence.objects.filter(job=job)
    assert (record.fate, record.scheduled_for) == ("late", run.scheduled_for)
    assert "start deadline" in JobRun.objects.get(pk=run.pk).error
    job.refresh_from_db()
    assert (job.state, job.retry_count) == (JobState.SCHEDULED, 0)
    assert JobRun.objects.filter(job=job).count() == 1
    assert not Execution.objects.filter(job_id=job.pk).exists()


def test_an_overrunning_run_is_revoked_when_its_job_asks(fleet):
    fleet.beat()
    fleet.worker(concurrency=1, pool="prefork")
    # Given a 30 s task with a 2 s max runtime, to be revoked when it overruns
    job = api.schedule(
        "project.tasks.record",
        kwargs={"label": "long", "sleep": 30},
        run_at=db_now(),
        max_runtime=2,
        revoke_overrun=True,
        max_retries=0,
        name="overrun",
    )
    # Then it is overrunning once, terminated, closed with the reason, and recovered
    wait_until(
        lambda: signals_of(job)[:1] == ["signal:overrunning:overrunning"],
        timeout=30,
        message="overrunning",
    )
    wait_until(
        lambda: "signal:recovered:overrunning" in signals_of(job), timeout=30, message="ended"
    )
    (run,) = JobRun.objects.filter(job=job)
    assert run.status == RunStatus.CANCELLED, (run.status, run.error)
    assert "ran past its max_runtime" in run.error
    assert signals_of(job).count("signal:overrunning:overrunning") == 1
    assert not Execution.objects.filter(job_id=job.pk, label="long", finished_at__isnull=False)


def test_failures_in_a_row_make_a_job_failing_and_a_success_recovers_it(fleet):
    fleet.beat()
    fleet.worker(concurrency=1)
    # Given a job failing every 2 s, going on to its next occurrence, failing after 3
    job = api.schedule(
        "project.tasks.fail",
        kwargs={"label": "f"},
        interval=2,
        max_retries=0,
        when_retries_exhausted="next_occurrence",
        alert_after_failures=3,
        name="failing",
    )
    wait_until(lambda: "signal:failing:failing" in signals_of(job), timeout=40, message="failing")
    failed = JobRun.objects.filter(job=job, status=RunStatus.FAILED).count()
    assert failed >= 3
    # When its task is fixed, the next success recovers it; failing was sent once
    api.update(job, task="project.tasks.record")
    wait_until(
        lambda: "signal:recovered:failing" in signals_of(job), timeout=40, message="recovered"
    )
    api.pause(job)
    assert signals_of(job) == ["signal:failing:failing", "signal:recovered:failing"]
    assert breaches_of(job) == [("failing", True)]
