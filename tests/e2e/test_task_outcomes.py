"""What a run records when its task uses Celery's own failure and retry features (autoretry,
Ignore, Reject, time limits, no result backend), on a real beat and worker: one execution per
attempt, and no occurrence run again through an expired lease."""

from __future__ import annotations

import itertools
import time

import pytest

from project.models import Execution
from schedapp import api
from schedapp.db import db_now
from schedapp.models import Job, JobRun, JobState, RunStatus
from schedapp.testing.processes import wait_until

pytestmark = [pytest.mark.e2e]


def runs_of(job: Job) -> list[JobRun]:
    return list(JobRun.objects.filter(job=job).order_by("id"))


def state_of(job: Job) -> str:
    return Job.objects.get(pk=job.pk).state


def test_autoretry_with_retry_backoff_sees_the_occurrences_retries_as_under_celery(fleet):
    # Given @task(autoretry_for=(RuntimeError,), retry_backoff=1, retry_jitter=False), which
    # always fails, and a job allowing three retries
    fleet.beat()
    worker = fleet.worker(concurrency=2)
    job = api.schedule(
        "project.tasks.autoretry",
        kwargs={"label": "auto"},
        run_at=db_now(),
        max_retries=3,
        retry_backoff=30,
        name="auto",
    )
    wait_until(lambda: state_of(job) == JobState.DEAD, timeout=40, message="retries spent")
    runs = runs_of(job)
    assert [r.attempt for r in runs] == [1, 2, 3, 4]
    # Then each attempt's self.request.retries counts the retries before it, as under Celery
    labels = list(
        Execution.objects.filter(job_id=job.pk).order_by("id").values_list("label", flat=True)
    )
    assert labels == ["auto:0", "auto:1", "auto:2", "auto:3"]
    # ... so retry_backoff grows (1, 2, 4 s), not the job's 30 s backoff
    for n, (failed, retried) in enumerate(itertools.pairwise(runs)):
        gap = (retried.started_at - failed.finished_at).total_seconds()
        assert 2**n - 0.05 <= gap <= 2**n + 1.0, (n, gap)
    assert all("retry requested: RuntimeError" in r.error for r in runs[:3])
    # ... and past the task's max_retries (3) Celery raises the exception itself
    assert runs[3].error == "RuntimeError: auto fails on purpose"
    # Celery's own retry messages arrived and were refused at the door
    wait_until(lambda: worker.log().count("delivered but not executed") >= 3, timeout=10)
    assert Execution.objects.filter(job_id=job.pk).count() == 4


def test_a_task_raising_ignore_skips_its_occurrence_and_is_not_run_again(fleet):
    fleet.beat()
    fleet.worker(concurrency=2)
    # Given a job every 2 s whose task raises Celery's Ignore, with a 3 s lease
    job = api.schedule(
        "project.tasks.ignore_self",
        kwargs={"label": "ig"},
        interval=2,
        lease_seconds=3,
        name="ignores",
    )
    wait_until(lambda: JobRun.objects.filter(job=job).count() >= 4, timeout=30, message="four runs")
    api.pause(job)
    time.sleep(4)  # more than a lease: a run left open would be reaped as lost
    # Then each run is skipped with the reason, no attempt counted, and each occurrence ran
    # once: none was left running until its lease expired and run again
    runs = runs_of(job)
    assert {r.status for r in runs} == {RunStatus.SKIPPED}, [(r.status, r.error) for r in runs]
    assert all(r.error == "ignored by the task: Ignore: ig ignored" for r in runs)
    assert {r.attempt for r in runs} == {1}
    occurrences = [r.scheduled_for for r in runs]
    assert len(occurrences) == len(set(occurrences))
    assert Execution.objects.filter(job_id=job.pk).count() == len(runs)


@pytest.mark.parametrize("reject", ["drop", "requeue"])
def test_a_task_raising_reject_fails_its_attempt_and_follows_the_retry_policy(fleet, reject):
    fleet.beat()
    worker = fleet.worker(concurrency=2)
    # Given a one-off whose task raises Reject(requeue=False) or Reject(requeue=True)
    job = api.schedule(
        "project.tasks.ignore_self",
        kwargs={"label": "rj", "reject": reject},
        run_at=db_now(),
        lease_seconds=3,
        max_retries=1,
        retry_backoff=1,
        name=f"rejects-{reject}",
    )
    wait_until(lambda: state_of(job) == JobState.DEAD, timeout=40, message="retries spent")
    time.sleep(4)  # more than a lease: a requeued copy would have run by now
    # Then each attempt failed with the reason and ran once, at once (no lease expiry), and the
    # copy Reject(requeue=True) put back was refused at the door
    runs = runs_of(job)
    requeued = " (requeued)" if reject == "requeue" else ""
    assert [(r.attempt, r.status, r.error) for r in runs] == [
        (n, RunStatus.FAILED, f"rejected by the task{requeued}: rj rejected") for n in (1, 2)
    ]
    assert (runs[1].started_at - runs[0].finished_at).total_seconds() < 2.5
    assert Execution.objects.filter(job_id=job.pk).count() == 2
    if reject == "requeue":
        wait_until(lambda: worker.log().count("delivered but not executed") >= 2, timeout=10)


def test_time_limits_fail_the_attempt_and_run_it_once(fleet):
    fleet.beat()
    fleet.worker(concurrency=2)
    # Given @task(soft_time_limit=1, time_limit=2): one job's task lets the soft limit raise,
    # the other's sleeps on past it until the hard limit kills its pool process
    soft = api.schedule(
        "project.tasks.limited",
        kwargs={"label": "soft"},
        run_at=db_now(),
        max_retries=0,
        name="soft",
    )
    hard = api.schedule(
        "project.tasks.limited",
        kwargs={"label": "hard", "past_soft": True},
        run_at=db_now(),
        max_retries=1,
        retry_backoff=1,
        name="hard",
    )
    wait_until(
        lambda: state_of(soft) == state_of(hard) == JobState.DEAD, timeout=60, message="both dead"
    )
    time.sleep(3)
    # Then the soft limit is the task's exception: a failed attempt
    (run,) = runs_of(soft)
    assert (run.status, run.error.split(":")[0]) == (RunStatus.FAILED, "SoftTimeLimitExceeded")
    # ... and the hard limit fails the attempt when it kills the process (the worker's main
    # process records it): not lost, each attempt ran once, none finished
    runs = runs_of(hard)
    assert [(r.attempt, r.status) for r in runs] == [(1, RunStatus.FAILED), (2, RunStatus.FAILED)]
    assert all(r.error.startswith("TimeLimitExceeded") for r in runs), [r.error for r in runs]
    executions = Execution.objects.filter(job_id=hard.pk)
    assert executions.count() == 2 and not executions.exclude(finished_at=None).exists()


def test_an_imported_entrys_time_limits_stop_its_task_on_a_real_worker(fleet):
    """A beat_schedule entry's options time_limit / soft_time_limit, imported: the job's
    messages carry them (the task has none of its own), and a prefork worker enforces them.
    Before, the import dropped them and the task slept its full 10 s."""
    from io import StringIO

    from django.core.management import call_command
    from django.test import override_settings

    entries = {
        "crunch": {
            "task": "project.tasks.record",
            "schedule": 3600,
            "kwargs": {"label": "crunch", "sleep": 10},
            "options": {"time_limit": 3, "soft_time_limit": 1},
        }
    }
    with override_settings(CELERY_BEAT_SCHEDULE=entries):
        call_command("schedapp_import", "--strict", stdout=StringIO(), stderr=StringIO())
    job = Job.objects.get(name="crunch")
    api.update(job.pk, max_retries=0)
    fleet.beat()
    fleet.worker(concurrency=2)
    api.run_now(job.pk)
    # Then the soft limit interrupts the sleep: the attempt fails, the task never finishes
    wait_until(lambda: runs_of(job) and runs_of(job)[0].finished_at, timeout=60, message="done")
    (run,) = runs_of(job)
    assert (run.status, run.error.split(":")[0]) == (RunStatus.FAILED, "SoftTimeLimitExceeded")
    assert (run.finished_at - run.started_at).total_seconds() < 9
    execution = Execution.objects.get(job_id=job.pk)
    assert execution.finished_at is None


def test_outcomes_are_recorded_with_the_result_backend_disabled(fleet):
    # Given a worker with no result backend (Celery's DisabledBackend)
    fleet.beat()
    fleet.worker(concurrency=2, settings={"CELERY_RESULT_BACKEND": ""})
    ok = api.schedule("project.tasks.record", kwargs={"label": "ok"}, run_at=db_now(), name="ok")
    bad = api.schedule(
        "project.tasks.fail", kwargs={"label": "bad"}, run_at=db_now(), max_retries=0, name="bad"
    )
    # Then its successes and failures are recorded as with one
    wait_until(
        lambda: (state_of(ok), state_of(bad)) == (JobState.SUCCEEDED, JobState.DEAD),
        timeout=30,
        message="both outcomes recorded",
    )
    assert [r.status for r in runs_of(ok)] == [RunStatus.SUCCEEDED]
    assert [r.status for r in runs_of(bad)] == [RunStatus.FAILED]
