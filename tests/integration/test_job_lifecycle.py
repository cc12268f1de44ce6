"""Job lifecycle edges found by review (issue 10): paused jobs whose worker died, cancelled
runs and pruning, the allowlist at run time, schedules edited while a run is in flight, run
now on an interval, duplicates, and one lock order everywhere."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.db import transaction
from django.test import override_settings

from schedapp import api, lease
from schedapp.db import db_now
from schedapp.lease import admit_run, claim_due_jobs, complete_run
from schedapp.models import Job, JobRun, JobState, RunStatus
from schedapp.prune import prune_runs
from schedapp.schedules import Once
from tests.claiming import in_thread

pytestmark = pytest.mark.django_db(transaction=True)
TASK = "project.tasks.record"


def claim_one(beat: str = "beat-1") -> lease.ClaimedRun:
    (run,) = claim_due_jobs(beat, 10).runs
    return run


def due_recurring(**options) -> Job:
    job = api.schedule(TASK, name="recurring", **options)
    Job.objects.filter(pk=job.pk).update(next_run_at=db_now() - timedelta(seconds=1))
    return job


def test_a_paused_job_whose_worker_died_gets_its_run_closed_and_stays_paused():
    job = api.schedule(
        TASK, run_at=db_now(), name="p", lease_seconds=5, max_retries=2, retry_backoff=0
    )
    run = claim_one()
    admit_run(job.pk, run.token, "w1", "a1")
    api.pause(job)
    # the worker dies: nobody renews the lease
    Job.objects.filter(pk=job.pk).update(lease_expires_at=db_now() - timedelta(seconds=1))
    reaped = lease.reap_expired_leases(10)
    job.refresh_from_db()
    r = JobRun.objects.get(pk=run.run_id)
    assert reaped.expired == 1 and reaped.started == 1
    assert r.status == RunStatus.LOST and r.finished_at is not None
    # the attempt counts, the job stays paused, and nothing holds it any more
    assert (job.state, job.retry_count, job.lease_expires_at) == (JobState.PAUSED, 1, None)
    assert job.token > run.token
    # resume makes it claimable again
    api.resume(job)
    assert claim_one().job_id == job.pk


def test_a_cancelled_dispatched_run_is_finished_and_pruned_like_any_other():
    job = api.schedule(TASK, run_at=db_now(), name="c")
    run = claim_one()
    api.cancel(job)
    r = JobRun.objects.get(pk=run.run_id)
    assert r.status == RunStatus.CANCELLED and r.finished_at is not None
    time.sleep(0.05)
    assert prune_runs(timedelta(milliseconds=10)).deleted == 1
    assert not JobRun.objects.filter(pk=run.run_id).exists()


@pytest.mark.parametrize("operation", ["run_now", "requeue", "resume"])
def test_operations_that_set_a_job_going_refuse_a_task_no_longer_allowed(operation):
    job = api.schedule(TASK, run_at=db_now() + timedelta(hours=1), name="o")
    state = {"run_now": JobState.SCHEDULED, "requeue": JobState.DEAD, "resume": JobState.PAUSED}
    Job.objects.filter(pk=job.pk).update(state=state[operation], next_run_at=db_now())
    before = Job.objects.get(pk=job.pk)
    with override_settings(SCHEDAPP_ALLOWED_TASKS=["other.*"]):
        with pytest.raises(ValidationError) as raised:
            getattr(api, operation)(job)
    assert "is not allowed" in raised.value.message_dict["task"][0]
    after = Job.objects.get(pk=job.pk)
    assert (after.state, after.next_run_at) == (before.state, before.next_run_at)


def test_a_running_recurring_job_changed_to_a_one_off_fires_the_one_off():
    job = due_recurring(interval=60)
    run = claim_one()
    admit_run(job.pk, run.token, "w1", "a1")
    at = db_now() + timedelta(seconds=30)
    api.update(job, run_at=at)  # while its run is in flight
    assert complete_run(job.pk, run.token, lease.SUCCEEDED).applied
    job.refresh_from_db()
    # the one-off is waiting for its time, not marked succeeded by the recurring run
    assert (job.state, job.scheduled_for, job.next_run_at) == (JobState.SCHEDULED, at, at)
    assert isinstance(lease.job_schedule(job), Once)


def test_editing_a_paused_job_with_a_run_in_flight_keeps_the_new_first_occurrence():
    job = due_recurring(interval=60)
    run = claim_one()
    admit_run(job.pk, run.token, "w1", "a1")
    api.pause(job)
    edited = api.update(job, interval=3600)
    first = edited.scheduled_for
    assert first > db_now() + timedelta(minutes=59)
    assert complete_run(job.pk, run.token, lease.SUCCEEDED).applied
    job.refresh_from_db()
    assert (job.state, job.scheduled_for) == (JobState.PAUSED, first)


def test_a_failure_of_a_run_from_before_an_edit_counts_and_follows_the_new_schedule():
    job = due_recurring(interval=60, max_retries=3)
    run = claim_one()
    admit_run(job.pk, run.token, "w1", "a1")
    edited = api.update(job, interval=3600)
    complete_run(job.pk, run.token, lease.FAILED, error="boom")
    job.refresh_from_db()
    assert (job.retry_count, job.scheduled_for) == (1, edited.scheduled_for)


def test_run_now_on_an_interval_job_adds_one_run_and_leaves_the_schedule_alone():
    job = api.schedule(TASK, interval=600, name="i")
    regular = job.scheduled_for  # the next regular occurrence, ten minutes away
    api.run_now(job)
    run = claim_one()
    admit_run(job.pk, run.token, "w1", "a1")
    assert complete_run(job.pk, run.token, lease.SUCCEEDED, headers=headers_of(run)).applied
    job.refresh_from_db()
    assert job.scheduled_for == regular
    # and the occurrence after that keeps the phase too
    Job.objects.filter(pk=job.pk).update(next_run_at=db_now() - timedelta(seconds=1))
    again = claim_one()
    assert again.scheduled_for == regular
    admit_run(job.pk, again.token, "w1", "a2")
    complete_run(job.pk, again.token, lease.SUCCEEDED)
    job.refresh_from_db()
    assert job.scheduled_for == regular + timedelta(seconds=600)


def headers_of(run: lease.ClaimedRun):
    from schedapp.dispatch import message_headers
    from schedapp.message import RunHeaders

    return RunHeaders.read(message_headers(run, "test"))


def test_a_duplicate_is_created_paused():
    job = api.schedule(TASK, interval=60, name="d")
    copy = api.duplicate(job)
    assert copy.state == JobState.PAUSED
    assert Job.objects.get(pk=copy.pk).state == JobState.PAUSED
    assert [r.job_id for r in claim_due_jobs("b", 10).runs] == []


def test_releasing_claims_takes_the_job_row_before_the_run_row():
    # Given a completion holding a job's row lock, about to write its run row ...
    job = api.schedule(TASK, run_at=db_now(), name="l")
    run = claim_one()
    holding = threading.Event()
    go_on = threading.Event()

    def completion_like():
        with transaction.atomic():
            Job.objects.select_for_update().filter(pk=job.pk).first()
            holding.set()
            go_on.wait(10)
            JobRun.objects.filter(pk=run.run_id).update(error="written by the completion")

    a, out_a = in_thread(completion_like)
    assert holding.wait(10)
    # ... when a beat releases that claim at the same moment
    b, out_b = in_thread(lambda: lease.release_claims([(job.pk, run.token)], "broker down"))
    time.sleep(0.5)
    go_on.set()
    a.join(15)
    b.join(15)
    # Then neither deadlocked: both took the job row first
    assert "error" not in out_a and "error" not in out_b, (out_a, out_b)


@pytest.mark.parametrize(
    ("policy", "runs", "runs_at_minute", "dropped"),
    [
        ("run_once", 1, 10, 10),  # the latest missed occurrence; the ten before it dropped
        ("skip", 0, None, 11),  # nothing: the job waits for its next occurrence
        ("run_all", 1, 0, 0),  # each in turn, oldest first (one run in flight at a time)
    ],
)
def test_resuming_a_job_paused_past_occurrences_follows_its_misfire_policy(
    policy, runs, runs_at_minute, dropped
):
    # Given an every-minute job paused ten and a half minutes ago: eleven occurrences (minutes
    # 0 to 10 of its pause) passed while it was paused
    job = api.schedule(TASK, interval=60, name="paused", misfire_policy=policy)
    api.pause(job)
    now = db_now()
    due = now - timedelta(minutes=10, seconds=30)
    Job.objects.filter(pk=job.pk).update(next_run_at=due, scheduled_for=due, interval_anchor=due)
    # When a person resumes it and a beat looks
    api.resume(job)
    claimed = claim_due_jobs("beat-1", 10).runs
    # Then no burst of old occurrences fires: what runs is what its misfire policy says
    assert len(claimed) == runs
    job.refresh_from_db()
    assert job.missed_runs == dropped
    if runs_at_minute is None:
        assert job.state == JobState.SCHEDULED and job.next_run_at > now
    else:
        assert claimed[0].scheduled_for == due + timedelta(minutes=runs_at_minute)


# (misfire policy, grace in seconds, whether the occurrence that passed runs next, the path of
# the success: a worker's fast success with the run's headers, or the ORM's completion)
IN_FLIGHT_CASES = [
    # within the grace: it runs as soon as the first run ends (the worker's fast success and
    # the ORM's completion alike)
    ("run_once", 60, True, "worker"),
    ("run_once", 60, True, "orm"),
    ("skip", 1, False, "worker"),  # beyond the grace: the misfire policy decides (none)
    ("run_once", 1, True, "worker"),  # beyond it, run_once: the latest missed one runs
]


def test_an_occurrence_that_passes_while_a_run_is_in_flight_runs_once_it_ends():
    # Given a job every 2 s per case, claimed and executing (the cases side by side: one wait
    # of 3.5 s for them all, each job's claims and rows its own)
    jobs = [
        api.schedule(
            TASK, interval=2, name=f"overlap-{n}", misfire_policy=policy, misfire_grace=grace
        )
        for n, (policy, grace, _runs_next, _path) in enumerate(IN_FLIGHT_CASES)
    ]
    due = db_now() - timedelta(milliseconds=100)
    Job.objects.filter(pk__in=[j.pk for j in jobs]).update(
        next_run_at=due, scheduled_for=due, interval_anchor=due
    )
    runs = {r.job_id: r for r in claim_due_jobs("beat-1", 10).runs}
    assert sorted(runs) == sorted(j.pk for j in jobs)
    for job in jobs:
        assert admit_run(job.pk, runs[job.pk].token, "w1", f"a{job.pk}") == "admitted"
    # the beat does not start them again while their runs are in flight
    assert claim_due_jobs("beat-2", 10).runs == []
    # When the runs take 3.5 s, so the occurrence 2 s after their own passed meanwhile
    time.sleep(max(0.0, 3.5 - (db_now() - due).total_seconds()))  # 3.5 s after the due time
    assert claim_due_jobs("beat-2", 10).runs == []
    for job, (_policy, _grace, _runs_next, path) in zip(jobs, IN_FLIGHT_CASES, strict=True):
        run = runs[job.pk]
        headers = headers_of(run) if path == "worker" else None
        assert complete_run(job.pk, run.token, lease.SUCCEEDED, headers=headers).applied, path
    # Then that occurrence runs once the first ends (if its misfire policy lets it), once
    claimed: dict[int, list] = {j.pk: [] for j in jobs}
    for c in claim_due_jobs("beat-2", 10).runs:
        claimed[c.job_id].append(c.scheduled_for)
    for job, case in zip(jobs, IN_FLIGHT_CASES, strict=True):
        _policy, _grace, runs_next, _path = case
        scheduled_for = runs[job.pk].scheduled_for
        if runs_next:
            assert claimed[job.pk] == [scheduled_for + timedelta(seconds=2)], case
        else:
            assert claimed[job.pk] == [], case
            job.refresh_from_db()
            assert job.scheduled_for == scheduled_for + timedelta(seconds=4), case
            assert job.missed_runs == 1, case
