"""Beats that never stall or die on one job, with real beat, worker, PostgreSQL and Redis
processes: rows corrupted behind the API's back, a claim made slow by a long absence, and a
broker that is down."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.db import IntegrityError, connection

from project.models import Execution
from schedapp import api, policies
from schedapp.db import db_now
from schedapp.models import Job, JobRun, JobState, RunStatus
from schedapp.testing.processes import wait_until

pytestmark = [pytest.mark.e2e]
TASK = "project.tasks.record"


def sql(statement: str, params: list) -> None:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)


def test_rows_corrupted_by_sql_are_quarantined_and_every_beat_goes_on(fleet):
    # Given a healthy job every second, and three jobs whose rows were changed behind the
    # API's back (a cron croniter refuses, a zone tzdata does not know, a task the allowlist
    # now denies), all due, the first two late enough for their misfire policy to run
    healthy = api.schedule(TASK, interval=1, name="healthy", kwargs={"label": "healthy"})
    bad_cron = api.schedule(TASK, cron="*/5 * * * *", name="bad-cron")
    bad_zone = api.schedule(TASK, cron="*/5 * * * *", name="bad-zone")
    denied = api.schedule(TASK, run_at=db_now(), name="denied")
    late = db_now() - timedelta(hours=2)
    sql(
        "UPDATE schedapp_job SET cron = '61 * * * *', next_run_at = %s, scheduled_for = %s "
        "WHERE id = %s",
        [late, late, bad_cron.pk],
    )
    sql(
        "UPDATE schedapp_job SET timezone = 'Mars/Olympus_Mons', next_run_at = %s, "
        "scheduled_for = %s WHERE id = %s",
        [late, late, bad_zone.pk],
    )
    sql("UPDATE schedapp_job SET task = 'celery.backend_cleanup' WHERE id = %s", [denied.pk])
    # When two beats and a worker run
    beats = [fleet.beat(), fleet.beat()]
    fleet.worker(concurrency=2)
    for job in (bad_cron, bad_zone, denied):
        wait_until(
            lambda job=job: Job.objects.get(pk=job.pk).state == JobState.DEAD,
            timeout=30,
            message=f"{job.name} was quarantined",
        )
    before = Execution.objects.filter(label="healthy").count()
    # Then both beats are alive and still dispatching the healthy job ...
    wait_until(
        lambda: Execution.objects.filter(label="healthy").count() >= before + 2,
        timeout=30,
        message="the healthy job ran twice more",
    )
    assert all(b.alive() for b in beats)
    # ... and each bad job is dead with the reason, never dispatched
    reasons = {j.name: j.last_error for j in Job.objects.filter(state=JobState.DEAD)}
    assert "61 * * * *" in reasons["bad-cron"] and "quarantined" in reasons["bad-cron"]
    assert "Mars/Olympus_Mons" in reasons["bad-zone"]
    assert "is not allowed" in reasons["denied"]
    assert not Execution.objects.filter(job_id__in=[bad_cron.pk, bad_zone.pk, denied.pk])
    logs = "".join(b.log() for b in beats)
    assert "quarantined (now dead)" in logs
    assert Job.objects.get(pk=healthy.pk).state != JobState.DEAD


def test_a_schedule_corrupted_while_its_run_executes_is_quarantined_by_the_worker(fleet):
    job = api.schedule(TASK, cron="0 0 1 1 *", name="corrupted", kwargs={"sleep": 2})
    api.run_now(job)
    fleet.beat()
    worker = fleet.worker(concurrency=1)
    wait_until(lambda: Execution.objects.filter(job_id=job.pk).exists(), timeout=20)
    sql("UPDATE schedapp_job SET timezone = 'Nowhere/Land' WHERE id = %s", [job.pk])
    wait_until(
        lambda: Job.objects.get(pk=job.pk).state == JobState.DEAD,
        timeout=20,
        message="the job was quarantined when its run finished",
    )
    job.refresh_from_db()
    assert "Nowhere/Land" in job.last_error
    assert JobRun.objects.get(job=job).status == RunStatus.SUCCEEDED
    assert worker.alive()


def test_jobs_away_for_eight_days_are_caught_up_once_under_unexpired_leases(fleet):
    # Given twelve every-minute jobs last run eight days ago (resumed after a long pause)
    jobs = [
        api.schedule(
            TASK,
            cron="* * * * *",
            name=f"away-{i}",
            kwargs={"label": f"away-{i}"},
            lease_seconds=5,
            misfire_policy="run_once",
        )
        for i in range(12)
    ]
    away = db_now().replace(second=0, microsecond=0) - timedelta(days=8)
    Job.objects.filter(pk__in=[j.pk for j in jobs]).update(
        scheduled_for=away, next_run_at=away
    )
    # When a beat claims them all at once
    fleet.worker(concurrency=4)
    fleet.beat()
    wait_until(
        lambda: Execution.objects.filter(label__startswith="away-").count() >= 12,
        timeout=60,
        message="each job ran its catch-up occurrence",
    )
    time.sleep(6)  # more than a lease: a run taken back before publishing would show now
    # Then each ran its one catch-up occurrence once; no lease expired under a slow claim
    assert not JobRun.objects.filter(status=RunStatus.LOST).exists()
    first_runs = [JobRun.objects.filter(job=j).order_by("id").first() for j in jobs]
    for job, run in zip(jobs, first_runs, strict=True):
        assert Execution.objects.filter(job_id=job.pk, scheduled_for=run.scheduled_for).count() == 1
        # run_once ran the latest missed occurrence; every one before it since the absence
        # began is counted as missed, exactly (no cap on the count)
        job.refresh_from_db()
        assert job.missed_runs == (run.scheduled_for - away) // timedelta(minutes=1)
        assert job.missed_runs >= 8 * 24 * 60


def test_while_the_broker_is_down_a_beat_does_not_claim_and_release_again_and_again(
    private_fleet, private_redis
):
    beat = private_fleet.beat()
    private_redis.stop()
    api.schedule_many(
        {"task": TASK, "run_at": db_now(), "name": f"waiting-{i}", "kwargs": {"label": "w"}}
        for i in range(50)
    )
    time.sleep(10)  # several backoff periods
    # At most the first batch was claimed, found unpublishable and released
    released = JobRun.objects.filter(status=RunStatus.LOST, error__startswith="not published")
    assert released.count() <= 50
    assert max(Job.objects.values_list("token", flat=True)) <= 2
    assert "broker still unavailable" in beat.log()
    # Once the broker is back, everything runs, once
    private_redis.start()
    private_fleet.worker(concurrency=2)
    wait_until(
        lambda: Job.objects.filter(state=JobState.SUCCEEDED).count() == 50,
        timeout=60,
        message="the jobs ran after the outage",
    )
    assert Execution.objects.filter(label="w").count() == 50
    assert beat.alive()


def test_each_dispatch_is_logged_as_celery_beat_logs_it(fleet):
    beat = fleet.beat()
    fleet.worker()
    api.schedule(TASK, run_at=db_now(), name="logged job")
    wait_until(lambda: Job.objects.filter(state=JobState.SUCCEEDED).exists(), timeout=20)
    assert "Scheduler: Sending due task logged job (project.tasks.record)" in beat.log()
    assert "LeaseScheduler, sharing the due jobs with every beat on postgresql://" in beat.log()


@pytest.mark.parametrize(
    ("process", "setting", "value", "says"),
    [
        # a beat that claims nothing each tick: before, it started and sat idle
        ("beat", "SCHEDAPP_BATCH_SIZE", 0, "SCHEDAPP_BATCH_SIZE must be a whole number"),
        # a worker whose heartbeat thread would renew leases in a busy loop
        ("worker", "SCHEDAPP_LEASE_HEARTBEAT", 0, "SCHEDAPP_LEASE_HEARTBEAT must be a number"),
    ],
)
def test_a_beat_or_worker_refuses_to_start_on_a_setting_it_cannot_work_with(
    fleet, process, setting, value, says
):
    api.schedule(TASK, run_at=db_now(), name="due")
    start = fleet.beat if process == "beat" else fleet.worker
    proc = start(settings={setting: value}, wait=False)
    assert wait_until(lambda: not proc.alive(), timeout=60), proc.log()[-3000:]
    assert proc.popen.returncode != 0
    assert says in proc.log()
    assert not JobRun.objects.exists()  # nothing claimed, nothing run


def test_rows_no_beat_could_go_on_from_are_quarantined_and_the_healthy_job_keeps_running(fleet):
    # Given a healthy job every second, and, changed behind the API's back: a failing job whose
    # backoff is a million years (its completion's write overflowed, then the reaper's, inside
    # every claim), a job whose args are valid jsonb nested 3,000 deep (building its message
    # raised RecursionError, taken for a broker failure: every batch given back), and a job
    # row restored from an older backup, its token behind a run it already has (the claim's
    # run row broke the run table's unique key, in every beat's claim)
    healthy = api.schedule(TASK, interval=1, name="healthy", kwargs={"label": "healthy"})
    forever = api.schedule(
        "project.tasks.fail", run_at=db_now(), name="forever", kwargs={"label": "forever"}
    )
    sql(
        "UPDATE schedapp_job SET retry_backoff = '1000000 years', "
        "retry_backoff_max = '1000000 years', max_retries = 3 WHERE id = %s",
        [forever.pk],
    )
    deep = api.schedule(TASK, interval=1, name="deep", kwargs={"label": "deep"})
    deep_args = "[" * 3000 + "]" * 3000
    sql("UPDATE schedapp_job SET args = %s::jsonb WHERE id = %s", [deep_args, deep.pk])
    restored = api.schedule(TASK, interval=1, name="restored", kwargs={"label": "restored"})
    JobRun.objects.create(
        job=restored,
        token=1,
        scheduled_for=db_now(),
        due_at=db_now(),
        dispatched_at=db_now(),
        task_id=f"schedapp:{restored.pk}:1",
        status=RunStatus.SUCCEEDED,
    )
    # When two beats and a worker run
    beats = [fleet.beat(), fleet.beat()]
    fleet.worker(concurrency=2)
    for job in (deep, restored):
        wait_until(
            lambda job=job: Job.objects.filter(pk=job.pk, state=JobState.DEAD).exists(),
            timeout=60,
            message=f"{job.name} was quarantined",
        )
    wait_until(
        lambda: Job.objects.filter(pk=forever.pk, retry_count=1).exists(),
        timeout=60,
        message="the failing job's failure was recorded",
    )
    # Then the healthy job keeps being dispatched and run, by live beats
    before = Execution.objects.filter(label="healthy").count()
    wait_until(
        lambda: Execution.objects.filter(label="healthy").count() >= before + 3,
        timeout=60,
        message="the healthy job ran on",
    )
    assert all(b.alive() for b in beats)
    assert Job.objects.get(pk=healthy.pk).state != JobState.DEAD
    # ... the failing job waits the longest retry delay schedapp has, no more
    waits = Job.objects.filter(pk=forever.pk).values_list("state", "next_run_at").get()
    assert waits[0] == JobState.SCHEDULED
    assert timedelta(days=364) < waits[1] - db_now() <= policies.MAX_DELAY
    # ... and the two others are dead with the reason, never executed
    reasons = dict(
        Job.objects.filter(pk__in=[deep.pk, restored.pk]).values_list("name", "last_error")
    )
    assert "nested too deep" in reasons["deep"]
    assert "the claim cannot take this row" in reasons["restored"]
    assert "schedapp_run_job_token" in reasons["restored"]
    assert not Execution.objects.filter(job_id__in=[deep.pk, restored.pk]).exists()
    assert JobRun.objects.filter(job=healthy, status=RunStatus.LOST).count() == 0
    # (a next_run_at without its occurrence, which failed every claim, is now refused outright)
    with pytest.raises(IntegrityError):
        sql("UPDATE schedapp_job SET scheduled_for = NULL WHERE id = %s", [healthy.pk])
