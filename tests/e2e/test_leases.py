"""Leases that hold, with real beats and workers: heartbeats, crashes, fencing, retries."""

from __future__ import annotations

import itertools
import signal

import pytest

from project.models import Execution
from schedapp import api
from schedapp.db import db_now
from schedapp.models import Job, JobRun, JobState, RunStatus
from schedapp.testing.processes import wait_until
from tests.e2e import renewed_past_its_lease

pytestmark = [pytest.mark.e2e]


def runs_of(job: Job) -> list[JobRun]:
    return list(JobRun.objects.filter(job=job).order_by("id"))


def test_a_job_four_times_longer_than_its_lease_runs_exactly_once(fleet):
    # Given two beats polling and a worker renewing leases every heartbeat (1 s)
    fleet.beat()
    fleet.beat()
    fleet.worker(concurrency=2, heartbeat=1)
    # When a job with a 3 s lease runs for 12 s
    job = api.schedule(
        "project.tasks.record",
        kwargs={"label": "long", "sleep": 12},
        run_at=db_now(),
        lease_seconds=3,
        name="long",
    )
    wait_until(
        lambda: Job.objects.get(pk=job.pk).state == JobState.SUCCEEDED,
        timeout=40,
        message="the long job finished",
    )
    # Then it ran exactly once, for four leases, its lease renewed
    (run,) = runs_of(job)
    assert run.status == RunStatus.SUCCEEDED and not run.stale
    assert renewed_past_its_lease(run, 3), (run.started_at, run.finished_at, run.heartbeats)
    assert Execution.objects.filter(job_id=job.pk).count() == 1


def test_a_worker_killed_mid_task_is_replaced_after_the_lease_expires(fleet):
    fleet.beat()
    first = fleet.worker(concurrency=1, heartbeat=1)
    job = api.schedule(
        "project.tasks.record",
        kwargs={"label": "killed", "sleep": 6},
        run_at=db_now(),
        lease_seconds=3,
        retry_backoff=0,
        max_retries=3,
        name="killed",
    )
    wait_until(
        lambda: Execution.objects.filter(job_id=job.pk).exists(),
        timeout=20,
        message="the task started",
    )
    # When the worker is SIGKILLed in the middle of the task (no cleanup of any kind)
    first.kill()
    second = fleet.worker(concurrency=1, heartbeat=1)
    wait_until(
        lambda: Job.objects.get(pk=job.pk).state == JobState.SUCCEEDED,
        timeout=40,
        message="the job ran again and finished",
    )
    # Then the first run is lost, the second succeeded on the other worker
    runs = runs_of(job)
    lost, done = [r for r in runs if r.started_at is not None]
    # (on a slow machine the other worker may still be starting when the occurrence is sent
    # again: a copy no door admitted within its lease is sent once more, never executed)
    assert all(r.status in (RunStatus.LOST, RunStatus.SKIPPED) for r in runs if not r.started_at)
    assert lost.status == RunStatus.LOST and lost.worker.startswith("worker2@")
    assert done.status == RunStatus.SUCCEEDED and done.worker.startswith("worker3@")
    assert done.scheduled_for == lost.scheduled_for and done.token > lost.token
    # ... and that occurrence executed twice in all, no more
    executions = list(Execution.objects.filter(job_id=job.pk).order_by("id"))
    assert len(executions) == 2
    assert executions[0].finished_at is None and executions[1].finished_at is not None
    assert second.alive()


def test_a_stale_completion_does_not_change_the_job(fleet):
    # Given a recurring job whose first run is in progress on one of two workers
    fleet.beat()
    workers = {
        w.name: w
        for w in (
            fleet.worker(concurrency=1, heartbeat=1),
            fleet.worker(concurrency=1, heartbeat=1),
        )
    }
    job = api.schedule(
        "project.tasks.record",
        kwargs={"label": "stale", "sleep": 8},
        interval=3600,
        lease_seconds=3,
        retry_backoff=0,
        name="stale",
    )
    planned = job.next_run_at  # its first regular occurrence, an hour away
    api.run_now(job)
    wait_until(lambda: JobRun.objects.filter(job=job, status="running").exists(), timeout=20)
    # When that worker's main process stalls (SIGSTOP: no heartbeats, the task goes on)
    holder = workers[runs_of(job)[0].worker.split("@")[0]]
    holder.signal_main(signal.SIGSTOP)
    try:
        # ... its lease expires and the other worker runs the job again
        wait_until(
            lambda: JobRun.objects.filter(job=job).count() == 2,
            timeout=20,
            message="the job was reclaimed",
        )
        # Then the first run's late success is recorded on its run only, flagged stale
        wait_until(
            lambda: runs_of(job)[0].status == RunStatus.SUCCEEDED,
            timeout=20,
            message="the first run finished late",
        )
    finally:
        holder.signal_main(signal.SIGCONT)
    first = runs_of(job)[0]
    assert first.status == RunStatus.SUCCEEDED and first.stale
    job.refresh_from_db()
    assert job.state == JobState.RUNNING  # still the second claim's
    assert job.token == runs_of(job)[1].token
    # ... and the second claim's completion is the one applied
    wait_until(lambda: runs_of(job)[1].status == RunStatus.SUCCEEDED, timeout=20)
    second = runs_of(job)[1]
    assert second.status == RunStatus.SUCCEEDED and not second.stale
    job.refresh_from_db()
    assert job.state == JobState.SCHEDULED and job.token == second.token
    # (run now added a run and left the schedule where it was)
    assert job.scheduled_for == planned
    assert job.retry_count == 0


def test_a_failing_task_backs_off_exponentially_then_dies_and_requeue_revives_it(fleet):
    fleet.beat()
    fleet.worker(concurrency=2, heartbeat=1)
    job = api.schedule(
        "project.tasks.fail",
        kwargs={"label": "fails"},
        run_at=db_now(),
        max_retries=3,
        retry_backoff=1,
        retry_backoff_max=60,
        name="fails",
    )
    wait_until(
        lambda: Job.objects.get(pk=job.pk).state == JobState.DEAD,
        timeout=40,
        message="the job was dead-lettered",
    )
    runs = runs_of(job)
    assert [r.attempt for r in runs] == [1, 2, 3, 4]
    assert all(r.status == RunStatus.FAILED for r in runs)
    assert Execution.objects.filter(job_id=job.pk).count() == 4
    # gaps between a failure and the next start follow min(base * 2**n, cap)
    for n, (failed, retried) in enumerate(itertools.pairwise(runs)):
        gap = (retried.started_at - failed.finished_at).total_seconds()
        expected = 1.0 * 2**n
        assert expected - 0.05 <= gap <= expected + 1.0, (n, gap)
    job.refresh_from_db()
    assert "RuntimeError: fails failed on purpose" in job.last_error
    assert "Traceback" in runs[-1].traceback
    # Nothing runs a dead job ...
    assert not JobRun.objects.filter(job=job, id__gt=runs[-1].id).exists()
    # ... until it is requeued
    api.requeue(job)
    wait_until(
        lambda: JobRun.objects.filter(job=job).count() >= 5,
        timeout=20,
        message="the requeued job ran",
    )
    assert runs_of(job)[4].attempt == 1


def test_a_task_calling_self_retry_is_retried_by_schedapp_not_by_celery(fleet):
    fleet.beat()
    worker = fleet.worker(concurrency=2, heartbeat=1)
    job = api.schedule(
        "project.tasks.retry_self",
        kwargs={"label": "selfretry", "countdown": 1},
        run_at=db_now(),
        max_retries=2,
        retry_backoff=30,
        name="selfretry",
    )
    wait_until(
        lambda: Job.objects.get(pk=job.pk).state == JobState.DEAD,
        timeout=30,
        message="retries were exhausted",
    )
    runs = runs_of(job)
    # The requested countdown (1 s), not the job's 30 s backoff, spaced the attempts
    assert [r.attempt for r in runs] == [1, 2, 3]
    assert all("retry requested" in r.error for r in runs)
    assert (runs[1].started_at - runs[0].finished_at).total_seconds() < 5
    # Celery's own retry messages arrived and were refused at the door
    wait_until(lambda: worker.log().count("delivered but not executed") >= 3, timeout=10)
    assert Execution.objects.filter(job_id=job.pk).count() == 3


def test_a_task_calling_self_retry_without_throwing_is_retried_as_under_celery(fleet):
    """``self.retry(throw=False)`` sends Celery's retry message and returns; the task then
    returns normally. Under Celery beat and a plain worker the retry message runs the task
    again after the countdown. Before, schedapp recorded a success (the job ended
    ``succeeded`` after one execution) and refused the retry message: it never ran."""
    fleet.beat()
    worker = fleet.worker(concurrency=2, heartbeat=1)
    job = api.schedule(
        "project.tasks.retry_quietly",
        kwargs={"label": "quiet", "countdown": 1, "times": 2},
        run_at=db_now(),
        max_retries=3,
        retry_backoff=30,
        name="quiet",
    )
    wait_until(
        lambda: Job.objects.get(pk=job.pk).state in (JobState.SUCCEEDED, JobState.DEAD),
        timeout=60,
        message="the job ended",
    )
    # Then it ran three times, as Celery would have: two retries asked for, then done
    labels = sorted(Execution.objects.filter(job_id=job.pk).values_list("label", flat=True))
    assert labels == ["quiet:0", "quiet:1", "quiet:2"]
    runs = runs_of(job)
    assert [(r.attempt, r.status) for r in runs] == [
        (1, RunStatus.FAILED),
        (2, RunStatus.FAILED),
        (3, RunStatus.SUCCEEDED),
    ]
    assert all("retry requested: RuntimeError" in r.error for r in runs[:2])
    assert Job.objects.get(pk=job.pk).state == JobState.SUCCEEDED
    # spaced by the requested countdown (1 s), not the job's 30 s backoff
    assert (runs[1].started_at - runs[0].finished_at).total_seconds() < 10
    # and Celery's own retry messages were refused at the door
    wait_until(lambda: worker.log().count("delivered but not executed") >= 2, timeout=15)


def test_a_worker_stopped_with_sigterm_renews_its_leases_until_its_task_finishes(fleet):
    # Given a task running three leases long (a 2 s lease, a 6 s task) on a worker
    fleet.beat()
    worker = fleet.worker(concurrency=1, settings={"SCHEDAPP_LEASE_HEARTBEAT": 0.2})
    job = api.schedule(
        "project.tasks.record",
        kwargs={"label": "warm", "sleep": 6},
        run_at=db_now(),
        lease_seconds=2,
        name="warm",
    )
    wait_until(lambda: JobRun.objects.filter(job=job, status="running").exists(), timeout=20)
    # When the worker is stopped as Kubernetes or systemd stops it (SIGTERM: warm shutdown)
    worker.signal_main(signal.SIGTERM)
    wait_until(lambda: not worker.alive(), timeout=30, message="the worker exited")
    # Then it kept renewing the lease until the task finished: one run, succeeded, not lost
    (run,) = runs_of(job)
    assert (run.status, run.stale) == (RunStatus.SUCCEEDED, False)
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED
    assert Execution.objects.filter(label="warm").count() == 1
