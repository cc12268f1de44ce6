"""The worker side of the lease protocol against real PostgreSQL: the door, renewals and
completions, each idempotent and serialised with the reaper and the API on the job row."""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta

import pytest
from celery.exceptions import Ignore
from django.db import connection, transaction

from schedapp import api, lease
from schedapp.db import db_now
from schedapp.lease import (
    Completion,
    DoorVerdict,
    admit_run,
    claim_due_jobs,
    complete_run,
    renew_leases,
)
from schedapp.lease.reap import reap_locked
from schedapp.message import HEADER_RUN, RunHeaders
from schedapp.models import Job, JobRun, JobState, RunStatus
from tests.claiming import claim_one, in_thread

pytestmark = pytest.mark.django_db(transaction=True)


claimed = claim_one


def claimed_recurring(**options):
    return claim_one(interval=60, **options)


def headers_of(run: lease.ClaimedRun) -> RunHeaders:
    """What the worker reads back from the message of ``run``."""
    from schedapp.dispatch import message_headers

    return RunHeaders.read(message_headers(run, "test"))  # type: ignore[return-value]


# --- the door ---------------------------------------------------------------------------------


def test_the_door_refuses_a_message_whose_lease_expired_before_it_arrived():
    job, run = claimed(lease_seconds=5, max_retries=0)
    Job.objects.filter(pk=job.pk).update(lease_expires_at=db_now() - timedelta(seconds=1))
    # When the message arrives after its lease ran out (and before any reaper ran)
    assert admit_run(job.pk, run.token, "w1", "a1") is DoorVerdict.LEASE_EXPIRED
    # Then it is not executed; the reaper dispatches the occurrence again, without spending
    # a retry (it never started)
    assert JobRun.objects.get(pk=run.run_id).status == RunStatus.SKIPPED
    lease.reap_expired_leases(10)
    (again,) = claim_due_jobs("beat-1", 10).runs
    assert again.token > run.token and again.attempt == 1
    assert admit_run(job.pk, again.token, "w1", "a2") is DoorVerdict.ADMITTED


def test_admission_extends_the_lease_from_the_moment_of_admission():
    job, run = claimed(lease_seconds=30)
    # the message waited in the queue for most of its lease
    Job.objects.filter(pk=job.pk).update(lease_expires_at=db_now() + timedelta(seconds=1))
    assert admit_run(job.pk, run.token, "w1", "a1") is DoorVerdict.ADMITTED
    job.refresh_from_db()
    assert job.lease_expires_at > db_now() + timedelta(seconds=28)


def test_admission_of_a_fresh_lease_leaves_the_job_row_unwritten():
    job, run = claimed(lease_seconds=30)
    before = Job.objects.values_list("lease_expires_at", "updated_at").get(pk=job.pk)
    xmin = _xmin(job.pk)
    assert admit_run(job.pk, run.token, "w1", "a1") is DoorVerdict.ADMITTED
    # The lease had (nearly) all of its length left: the door locked the row, wrote nothing
    assert Job.objects.values_list("lease_expires_at", "updated_at").get(pk=job.pk) == before
    assert _xmin(job.pk) == xmin
    assert JobRun.objects.get(pk=run.run_id).status == RunStatus.RUNNING


def _xmin(job_id: int) -> str:
    """The job row's version on PostgreSQL: a new one for every UPDATE (a row lock alone keeps
    it). Elsewhere (the portable store's run of these tests) the fields above must do."""
    if connection.vendor != "postgresql":
        return ""
    with connection.cursor() as cursor:
        cursor.execute("SELECT xmin::text FROM schedapp_job WHERE id = %s", [job_id])
        return cursor.fetchone()[0]


def test_the_door_waits_for_a_cancel_in_progress_and_then_refuses():
    job, run = claimed()
    cancelling = threading.Event()
    release = threading.Event()

    def cancel_slowly():
        with transaction.atomic():
            api.cancel(job)  # locks the job row and bumps the token
            cancelling.set()
            release.wait(10)

    canceller, _ = in_thread(cancel_slowly)
    assert cancelling.wait(10)
    door, verdict = in_thread(lambda: admit_run(job.pk, run.token, "w1", "a1"))
    # The door cannot decide while the job row is locked by the cancel...
    door.join(0.5)
    assert door.is_alive(), "the door decided without the job row's lock"
    release.set()
    canceller.join(10)
    door.join(10)
    # ... and once it commits, the door sees the new token: the message is not executed
    assert verdict["value"] is DoorVerdict.STALE_TOKEN
    assert JobRun.objects.get(pk=run.run_id).status == RunStatus.CANCELLED


def test_the_door_and_the_reaper_serialise_on_the_job_row():
    # Given a dispatched run whose lease has just expired, and a reaper deciding about it
    job, run = claimed(max_retries=0)
    Job.objects.filter(pk=job.pk).update(lease_expires_at=db_now() - timedelta(milliseconds=1))
    reaper_locked = threading.Event()
    finish_reaping = threading.Event()

    def reap():
        with transaction.atomic():
            # the reaper's first step: lock the expired lease's job row
            locked = list(
                Job.objects.select_for_update(skip_locked=True).filter(
                    pk=job.pk, lease_expires_at__lt=db_now()
                )
            )
            reaper_locked.set()
            finish_reaping.wait(10)
            return len(locked), reap_locked(10, rng=lambda: 0.5)

    reaper, reaped = in_thread(reap)
    assert reaper_locked.wait(10)
    # When the message reaches a worker while the reaper holds the row
    door, verdict = in_thread(lambda: admit_run(job.pk, run.token, "w1", "a1"))
    door.join(2)
    finish_reaping.set()
    reaper.join(10)
    door.join(10)
    # Then the door did not start it, and the reaper's "never started" decision stands: the
    # occurrence is dispatched again, no attempt spent, and exactly one run of it can execute
    assert verdict["value"] is not DoorVerdict.ADMITTED
    assert reaped["value"][0] == 1
    job.refresh_from_db()
    assert (job.state, job.retry_count) == (JobState.SCHEDULED, 0)
    assert JobRun.objects.get(pk=run.run_id).status in (RunStatus.SKIPPED, RunStatus.LOST)


def test_a_retried_door_admits_its_own_admission_and_no_other():
    job, run = claimed()
    assert admit_run(job.pk, run.token, "w1", "first") is DoorVerdict.ADMITTED
    # the same door call again (its commit landed, its reply was lost): still admitted
    assert admit_run(job.pk, run.token, "w1", "first") is DoorVerdict.ADMITTED
    # a second delivery of the message is another admission: refused
    assert admit_run(job.pk, run.token, "w2", "second") is DoorVerdict.DUPLICATE
    r = JobRun.objects.get(pk=run.run_id)
    assert (r.status, r.worker, r.admission) == (RunStatus.RUNNING, "w1", "first")


def test_a_retried_door_is_still_admitted_when_the_job_was_paused_after_its_commit_landed():
    # Given a door whose commit landed but whose reply was lost, and an operator who paused the
    # job in between (a pause lets a run in flight finish)
    job, run = claimed()
    assert admit_run(job.pk, run.token, "w1", "first") is DoorVerdict.ADMITTED
    api.pause(job.pk)
    # When the worker retries that door call
    # Then it is admitted, as it was: refusing it would leave the run "running" with nothing
    # running it, and the reaper would count the lease's expiry as a failed attempt
    assert admit_run(job.pk, run.token, "w1", "first") is DoorVerdict.ADMITTED
    # while another delivery of the same message is still refused
    assert admit_run(job.pk, run.token, "w2", "second") is DoorVerdict.JOB_PAUSED
    assert complete_run(job.pk, run.token, "succeeded").applied


# --- completion -------------------------------------------------------------------------------


def test_a_retried_success_moves_a_recurring_job_on_exactly_once():
    job, run = claimed_recurring()
    admit_run(job.pk, run.token, "w1", "a1")
    first = complete_run(job.pk, run.token, lease.SUCCEEDED, headers=headers_of(run))
    after_first = Job.objects.get(pk=job.pk)
    # the same completion again (its commit landed, its reply was lost)
    second = complete_run(job.pk, run.token, lease.SUCCEEDED, headers=headers_of(run))
    after_second = Job.objects.get(pk=job.pk)
    assert first.completion is Completion.APPLIED
    assert second.completion is Completion.ALREADY_RECORDED
    # the next occurrence is the one after the run's, not one further (no occurrence skipped)
    assert after_first.scheduled_for == run.scheduled_for + timedelta(seconds=60)
    assert after_second.scheduled_for == after_first.scheduled_for
    assert after_second.next_run_at == after_first.next_run_at


def test_a_retried_success_without_headers_is_also_applied_once():
    job, run = claimed_recurring()
    admit_run(job.pk, run.token, "w1", "a1")
    assert complete_run(job.pk, run.token, lease.SUCCEEDED).applied
    assert complete_run(job.pk, run.token, lease.SUCCEEDED).completion is (
        Completion.ALREADY_RECORDED
    )
    assert Job.objects.get(pk=job.pk).scheduled_for == run.scheduled_for + timedelta(seconds=60)


def test_a_retried_failure_spends_one_retry():
    job, run = claimed(max_retries=1, retry_backoff=0)
    admit_run(job.pk, run.token, "w1", "a1")
    assert complete_run(job.pk, run.token, lease.FAILED, error="boom").applied
    again = complete_run(job.pk, run.token, lease.FAILED, error="boom")
    job.refresh_from_db()
    # one attempt failed: one retry spent, the job is retried, not dead
    assert again.completion is Completion.ALREADY_RECORDED
    assert (job.state, job.retry_count) == (JobState.SCHEDULED, 1)


def test_a_success_edited_in_flight_follows_the_new_schedule():
    job, run = claimed_recurring()
    admit_run(job.pk, run.token, "w1", "a1")
    edited = api.update(job, interval=120)  # while the run executes
    # the one-statement success sees the schedule changed and leaves it to the general path
    assert complete_run(job.pk, run.token, lease.SUCCEEDED, headers=headers_of(run)).applied
    job.refresh_from_db()
    assert job.scheduled_for == edited.scheduled_for  # the new schedule's first occurrence
    assert job.state == JobState.SCHEDULED


def test_a_one_off_success_in_one_statement_finishes_the_job():
    job, run = claimed()
    admit_run(job.pk, run.token, "w1", "a1")
    assert complete_run(job.pk, run.token, lease.SUCCEEDED, headers=headers_of(run)).applied
    job.refresh_from_db()
    r = JobRun.objects.get(pk=run.run_id)
    assert (job.state, job.lease_expires_at, job.claimed_by) == (JobState.SUCCEEDED, None, "")
    assert (r.status, r.stale) == (RunStatus.SUCCEEDED, False) and r.finished_at is not None


def test_a_run_whose_task_is_unknown_to_the_worker_fails_and_follows_the_retry_policy():
    job, run = claimed(max_retries=1, retry_backoff=0)
    error = "task project.tasks.record is not registered on worker w1@host"
    # never admitted (Celery rejects the message before any door), yet it fails its run
    assert complete_run(job.pk, run.token, lease.FAILED, error=error, only_unstarted=True).applied
    job.refresh_from_db()
    assert (job.state, job.retry_count, job.last_error) == (JobState.SCHEDULED, 1, error)
    (again,) = claim_due_jobs("beat-1", 10).runs
    complete_run(job.pk, again.token, lease.FAILED, error=error, only_unstarted=True)
    job.refresh_from_db()
    assert job.state == JobState.DEAD
    assert JobRun.objects.get(pk=again.run_id).error == error


def test_a_copy_that_never_started_here_does_not_fail_a_run_another_worker_is_executing():
    from types import SimpleNamespace

    from schedapp.worker import WorkerHooks

    # Given a run one worker admitted and is executing
    job, run = claimed(max_retries=3, retry_backoff=0)
    assert admit_run(job.pk, run.token, "w1", "a1") is DoorVerdict.ADMITTED
    hooks = WorkerHooks()
    # When another copy of its message reaches a worker that lacks the task (a rolling
    # deploy), and a third copy arrives past its expiry (Celery reports it as revoked)
    hooks.on_task_unknown(sender=SimpleNamespace(hostname="w2@old"), name=run.task, id=run.task_id)
    hooks.completions.on_task_revoked(
        request=SimpleNamespace(id=run.task_id), terminated=False, expired=True
    )
    # Then the run in flight is untouched: no failed attempt, no retry sent beside it
    job.refresh_from_db()
    assert (job.state, job.token, job.retry_count) == (JobState.RUNNING, run.token, 0)
    assert JobRun.objects.get(pk=run.run_id).status == RunStatus.RUNNING
    # and its own outcome is the one recorded
    assert complete_run(job.pk, run.token, lease.SUCCEEDED).applied
    job.refresh_from_db()
    assert (job.state, job.last_status) == (JobState.SUCCEEDED, lease.SUCCEEDED)


def test_a_message_celery_discards_as_expired_drops_its_occurrence_as_under_celery_beat():
    from types import SimpleNamespace

    from schedapp.worker import WorkerHooks

    # Given a recurring job and a one-off whose messages waited in the queue past their
    # ``expires`` (Celery discards such a message and reports it as revoked, expired)
    recurring, every = claimed_recurring(max_retries=1)
    one_off, once = claim_one(name="one-off")
    hooks = WorkerHooks()
    for run in (every, once):
        request = SimpleNamespace(id=run.task_id)
        hooks.completions.on_task_revoked(request=request, terminated=False, expired=True)
    # Then the recurring job goes on with its next occurrence, no attempt counted (not a
    # failure retried, and never a dead job after max_retries expiries)
    recurring.refresh_from_db()
    assert (recurring.state, recurring.retry_count) == (JobState.SCHEDULED, 0)
    assert recurring.scheduled_for == every.scheduled_for + timedelta(seconds=60)
    # and the one-off, which has no next occurrence, ends without having run
    one_off.refresh_from_db()
    assert (one_off.state, one_off.retry_count) == (JobState.CANCELLED, 0)
    for run in (every, once):
        r = JobRun.objects.get(pk=run.run_id)
        assert (r.status, r.error) == (RunStatus.SKIPPED, "expired before a worker started it")


def test_the_reaper_drops_an_occurrence_whose_message_expired_unstarted_and_resends_the_rest():
    # Given three recurring jobs whose messages nobody took before their leases expired: two
    # sent with a 5 s ``expires`` 10 s ago (RabbitMQ dropped them unseen), one with 60 s
    dropped, every = claimed_recurring(name="dropped", max_retries=1)
    kept, again = claimed_recurring(name="kept", max_retries=1)
    forever, always = claimed_recurring(name="forever", max_retries=1)
    lives = {dropped.pk: 5.0, kept.pk: 60.0, forever.pk: None}
    JobRun.objects.update(dispatched_at=db_now() - timedelta(seconds=10))
    Job.objects.update(lease_expires_at=db_now() - timedelta(seconds=1))
    # When a beat reaps them
    result = lease.reap_expired_leases(10, message_expiry=lambda job: lives[job.pk])
    # Then the expired one's occurrence is dropped, as Celery beat's: its next one is due,
    # no attempt counted, and the old claim is fenced off
    assert (result.expired, result.dropped) == (3, 1)
    dropped.refresh_from_db()
    assert (dropped.state, dropped.retry_count) == (JobState.SCHEDULED, 0)
    assert dropped.scheduled_for == every.scheduled_for + timedelta(seconds=60)
    assert dropped.token > every.token
    run = JobRun.objects.get(pk=every.run_id)
    assert (run.status, run.error) == (RunStatus.SKIPPED, "expired before a worker started it")
    # and the others, whose messages may still run somewhere, are sent again for the same
    # occurrence, as before
    for job, run in ((kept, again), (forever, always)):
        job.refresh_from_db()
        assert (job.state, job.scheduled_for) == (JobState.SCHEDULED, run.scheduled_for)
        assert JobRun.objects.get(pk=run.run_id).status == RunStatus.LOST


def test_a_replacement_takes_its_run_over_once_and_a_retry_of_that_door_is_admitted_again():
    from schedapp.lease import admit_replacement

    # Given a run admitted under "a1" whose task replaced itself (Task.replace)
    job, run = claimed(lease_seconds=30)
    assert admit_run(job.pk, run.token, "w1", "a1") is DoorVerdict.ADMITTED
    # When the replacement's door takes it over under its own admission
    assert admit_replacement(job.pk, run.token, "w2", "a1", "b1") is DoorVerdict.ADMITTED
    # Then a retry of that same call (its reply lost) is admitted again, another delivery of
    # the replacement's message (carrying "a1" too) is refused, and so is a stranger's
    assert admit_replacement(job.pk, run.token, "w2", "a1", "b1") is DoorVerdict.ADMITTED
    assert admit_replacement(job.pk, run.token, "w3", "a1", "c1") is DoorVerdict.DUPLICATE
    assert admit_replacement(job.pk, run.token, "w3", "zz", "c2") is DoorVerdict.DUPLICATE
    assert admit_replacement(job.pk, run.token + 1, "w3", "a1", "c3") is DoorVerdict.UNKNOWN
    r = JobRun.objects.get(pk=run.run_id)
    assert (r.status, r.admission, r.worker) == (RunStatus.RUNNING, "b1", "w2")
    # ... and once the lease has expired, none goes on with the run
    Job.objects.filter(pk=job.pk).update(lease_expires_at=db_now() - timedelta(seconds=1))
    assert admit_replacement(job.pk, run.token, "w2", "a1", "b1") is DoorVerdict.LEASE_EXPIRED


def test_resuming_a_job_whose_worker_died_while_it_was_paused_closes_that_run_as_lost():
    # Given a run in flight when the job was paused, whose worker then died: its lease expired
    # before any beat reaped it
    job, run = claimed(max_retries=3, retry_backoff=0)
    assert admit_run(job.pk, run.token, "w1", "a1") is DoorVerdict.ADMITTED
    api.pause(job.pk)
    Job.objects.filter(pk=job.pk).update(lease_expires_at=db_now() - timedelta(seconds=1))
    # When the operator resumes it and a beat reaps
    api.resume(job.pk)
    lease.reap_expired_leases(10)
    # Then the dead run is closed as lost and counts as a failed attempt, as the reaper does
    # for any run whose worker died (it stayed "running" forever, its attempt never counted)
    assert JobRun.objects.get(pk=run.run_id).status == RunStatus.LOST
    job.refresh_from_db()
    assert (job.state, job.retry_count) == (JobState.SCHEDULED, 1)
    assert job.token > run.token


# --- cancel while a run executes ---------------------------------------------------------------


def test_a_run_cancelled_while_executing_is_closed_even_if_its_worker_then_dies():
    # Given a run executing on a worker
    job, run = claimed(max_retries=3)
    assert admit_run(job.pk, run.token, "w1", "a1") is DoorVerdict.ADMITTED
    # When the operator cancels the job, and that worker then dies (nothing more is ever
    # written for this run: it renews nothing, records nothing) and a beat reaps
    api.cancel(job.pk)
    lease.reap_expired_leases(10)
    # Then the run is closed as cancelled, not left "running" in the history for ever
    closed = JobRun.objects.get(pk=run.run_id)
    assert closed.status == RunStatus.CANCELLED
    assert closed.finished_at is not None
    assert "cancelled while running" in closed.error
    assert Job.objects.get(pk=job.pk).state == JobState.CANCELLED


def test_renewal_of_a_run_cancelled_while_executing_is_no_lost_lease():
    job, run = claimed()
    admit_run(job.pk, run.token, "w1", "a1")
    api.cancel(job.pk)
    # The worker still runs it (a revoke without terminate lets it finish) and renews it
    renewal = renew_leases([(job.pk, run.token)])
    # Then that is the cancel it is, not the alarm of a lease lost to a reaper or a beat
    assert not renewal.lost and not renewal.renewed
    assert renewal.cancelled == {(job.pk, run.token)}


def test_the_outcome_of_a_run_cancelled_while_executing_changes_nothing_and_warns_of_nothing(
    caplog,
):
    job, run = claimed_recurring()
    admit_run(job.pk, run.token, "w1", "a1")
    api.cancel(job.pk)
    token = Job.objects.get(pk=job.pk).token
    # When the task, revoked but not terminated, runs to its end and reports
    schedapp_log = logging.getLogger("schedapp")  # it does not propagate to pytest's root
    schedapp_log.addHandler(caplog.handler)
    try:
        results = [
            complete_run(job.pk, run.token, outcome, headers=headers_of(run)).completion
            for outcome in (lease.SUCCEEDED, lease.FAILED)
        ]
    finally:
        schedapp_log.removeHandler(caplog.handler)
    # Then the job stays cancelled, the run stays as the cancel closed it, and nothing is
    # logged as a warning (it was "stale completion of job ...: not applied")
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert results == [Completion.ALREADY_RECORDED] * 2
    assert Job.objects.values_list("state", "token").get(pk=job.pk) == (JobState.CANCELLED, token)
    assert JobRun.objects.get(pk=run.run_id).status == RunStatus.CANCELLED


# --- renewal ----------------------------------------------------------------------------------


def test_renewal_of_a_run_that_just_finished_is_not_a_lost_lease():
    job, run = claimed_recurring()
    admit_run(job.pk, run.token, "w1", "a1")
    complete_run(job.pk, run.token, lease.SUCCEEDED, headers=headers_of(run))
    # the worker's main process has not seen the completion yet and renews it
    renewal = renew_leases([(job.pk, run.token)])
    assert renewal.finished == {(job.pk, run.token)}
    assert not renewal.lost and not renewal.renewed


def test_renewal_of_a_message_held_here_whose_job_moved_on_before_it_started_is_no_alarm():
    # A worker holds a message it has not admitted yet (prefetched); it arrived after its
    # lease expired, and a beat reaped it and claimed the occurrence again
    job, run = claimed(lease_seconds=5)
    Job.objects.filter(pk=job.pk).update(lease_expires_at=db_now() - timedelta(seconds=1))
    lease.reap_expired_leases(10)
    (again,) = claim_due_jobs("beat-2", 10).runs
    renewal = renew_leases([(job.pk, run.token)])
    # Then nothing ran and nothing will: not a lost lease (whose outcome would be stale)
    assert renewal.unstarted == {(job.pk, run.token)}
    assert not renewal.lost and not renewal.renewed
    # while a lease lost by a run that had started still is one
    admit_run(job.pk, again.token, "w1", "a2")
    Job.objects.filter(pk=job.pk).update(lease_expires_at=db_now() - timedelta(seconds=1))
    lease.reap_expired_leases(10)
    assert renew_leases([(job.pk, again.token)]).lost == {(job.pk, again.token)}


def test_renewal_keeps_a_message_held_before_its_admission_alive():
    job, run = claimed(lease_seconds=5)
    Job.objects.filter(pk=job.pk).update(lease_expires_at=db_now() + timedelta(seconds=1))
    assert renew_leases([(job.pk, run.token)]).renewed == {(job.pk, run.token)}
    job.refresh_from_db()
    assert job.lease_expires_at > db_now() + timedelta(seconds=4)
    assert admit_run(job.pk, run.token, "w1", "a1") is DoorVerdict.ADMITTED


def test_renewal_keeps_a_paused_jobs_running_lease():
    job, run = claimed(lease_seconds=10)
    admit_run(job.pk, run.token, "w1", "a1")
    api.pause(job)
    time.sleep(0.01)
    renewal = renew_leases([(job.pk, run.token)])
    assert renewal.renewed == {(job.pk, run.token)}
    assert JobRun.objects.get(pk=run.run_id).heartbeats == 1


@pytest.mark.postgresql
def test_a_renewal_never_waits_for_a_job_row_another_transaction_holds():
    # Given two runs a worker holds, one of whose job rows another transaction holds locked
    # (a pool process's door carrying a success locks that success's row, then the door's:
    # a renewal waiting for one of them while holding the other was a deadlock)
    busy_job, busy_run = claimed(lease_seconds=30, name="busy")
    free_job, free_run = claimed(lease_seconds=30, name="free")
    for job, run in ((busy_job, busy_run), (free_job, free_run)):
        assert admit_run(job.pk, run.token, "w1", f"a{job.pk}") is DoorVerdict.ADMITTED
    locked, release = threading.Event(), threading.Event()

    def hold_the_row():
        with transaction.atomic():
            Job.objects.select_for_update().get(pk=busy_job.pk)
            locked.set()
            release.wait(20)

    holder, _ = in_thread(hold_the_row)
    assert locked.wait(10)
    busy, free = (busy_job.pk, busy_run.token), (free_job.pk, free_run.token)
    try:
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '3s'")  # a renewal that waits fails the test
        # When the worker renews both
        renewal = renew_leases([busy, free])
    finally:
        release.set()
        holder.join(10)
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")
    # Then it renewed the one it could lock, left the other held for its next heartbeat, and
    # raised no alarm for it
    assert renewal.renewed == {free}
    assert renewal.busy == {busy}
    assert not renewal.lost
    # and once the row is free again, that one is renewed too
    assert renew_leases([busy]).renewed == {busy}
    assert JobRun.objects.get(pk=busy_run.run_id).heartbeats == 1


@pytest.fixture
def function_calls(monkeypatch) -> list[str]:
    """The worker's hot statements (PL/pgSQL function calls) made from now on."""
    from schedapp.store import postgresql

    calls: list[str] = []
    call_function = postgresql.call_function

    def counted(sql, params, *using):
        calls.append(sql)
        return call_function(sql, params, *using)

    monkeypatch.setattr(postgresql, "call_function", counted)
    return calls


@pytest.mark.parametrize(
    "schedule",
    [
        {"interval": 60, "timezone": "Europe/Paris"},
        {"cron": "*/5 * * * *", "timezone": "America/New_York"},
    ],
)
@pytest.mark.postgresql
def test_a_recurring_success_is_one_statement(schedule, function_calls):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    calls = function_calls

    job = api.schedule("project.tasks.record", name="fast", **schedule)
    Job.objects.filter(pk=job.pk).update(next_run_at=db_now() - timedelta(seconds=1))
    (run,) = claim_due_jobs("beat-1", 10).runs
    admit_run(job.pk, run.token, "w1", "a1")
    calls.clear()  # the door's
    with CaptureQueriesContext(connection) as queries:  # the ORM's statements
        assert complete_run(job.pk, run.token, lease.SUCCEEDED, headers=headers_of(run)).applied
    assert len(queries) + len(calls) == 1, ([q["sql"][:80] for q in queries], calls)
    job.refresh_from_db()
    assert job.state == JobState.SCHEDULED and job.scheduled_for > run.scheduled_for


@pytest.mark.postgresql
def test_connections_the_worker_closed_are_not_kept_alive_by_its_hot_statements():
    import gc
    import weakref

    # Given a worker whose connection is closed around its tasks and opened again by the next
    # door (Celery's Django fixup closes it before and after every task unless
    # CELERY_DB_REUSE_MAX is set; a thread or greenlet that ends drops its own)
    job, run = claimed_recurring()
    closed = []
    for _ in range(3):
        renew_leases([(job.pk, run.token)])  # a hot statement on this connection
        closed.append(weakref.ref(connection.connection))
        connection.close()
    gc.collect()
    # Then nothing holds on to the connections it closed: a long-lived worker does not grow
    # by a connection object (and its cursor) per reconnect
    assert [ref() for ref in closed] == [None, None, None]


def test_successes_gathered_by_a_pool_process_are_written_together_and_once():
    # Given three runs in flight: a one-off, an interval job and a run whose job moved on
    runs = []
    for i, schedule in enumerate(({"run_at": db_now()}, {"interval": 60}, {"run_at": db_now()})):
        job = api.schedule("project.tasks.record", name=f"batch-{i}", **schedule)
        Job.objects.filter(pk=job.pk).update(next_run_at=db_now() - timedelta(seconds=1))
    runs = sorted(claim_due_jobs("beat-1", 10).runs, key=lambda r: r.name)
    for run in runs:
        admit_run(run.job_id, run.token, "w1", f"a{run.token}")
    _lose_lease(runs[2].job_id)  # its completion will be stale
    items = [(r.job_id, r.token, headers_of(r)) for r in runs]
    # When they are recorded together, twice (the first write's reply was lost)
    first = lease.complete_successes(items)
    second = lease.complete_successes(items)
    # Then the common ones went through in one statement, the stale one was told apart
    assert [r.completion for r in first] == [
        Completion.APPLIED,
        Completion.APPLIED,
        Completion.STALE,
    ]
    assert {r.completion for r in second} == {Completion.ALREADY_RECORDED}
    once, every = (Job.objects.get(pk=r.job_id) for r in runs[:2])
    assert once.state == JobState.SUCCEEDED
    assert every.scheduled_for == runs[1].scheduled_for + timedelta(seconds=60)


def _lose_lease(job_id: int) -> None:
    """The job moves on under a run in flight: its lease expired and a beat reaped it."""
    Job.objects.filter(pk=job_id).update(lease_expires_at=db_now() - timedelta(seconds=1))
    lease.reap_expired_leases(10)


# --- a pool process's successes ride with its next door ---------------------------------------


class _Task:
    """What the door reads of the task it guards: the worker's name, and its own for logs."""

    name = "project.tasks.record"

    def __init__(self, hostname: str = "w1@host") -> None:
        self.request = type("Request", (), {"hostname": hostname})()


def pool_hooks(linger: float = 3600.0):
    """The hooks of a prefork pool process; by default no success is written by the linger
    thread within a test, so what gets written, the door wrote."""
    from schedapp.worker import WorkerHooks

    hooks = WorkerHooks()
    hooks.completions.open_pending(linger=linger)
    return hooks


def succeeded_in(hooks, name: str = "every-minute", waited: bool = False) -> lease.ClaimedRun:
    """A recurring run admitted and succeeded in the pool process of ``hooks``: its success
    waits there for the process's next door (``waited``: its task's body waited)."""
    _, run = claim_one(name=name, interval=60)
    admit_run(run.job_id, run.token, "w1", f"admission-{name}")
    hooks.completions.complete(run.task_id, lease.SUCCEEDED, headers=headers_of(run), waited=waited)
    return run


def _run_status(run: lease.ClaimedRun) -> str:
    return JobRun.objects.get(pk=run.run_id).status


def _status_within(run: lease.ClaimedRun, status: str, seconds: float = 10.0) -> str:
    """The run's status once it is ``status``, or after ``seconds``: for writes made by the
    linger thread."""
    deadline = time.monotonic() + seconds
    while _run_status(run) != status and time.monotonic() < deadline:
        time.sleep(0.02)
    return _run_status(run)


def test_a_pool_process_records_its_success_with_its_next_door():
    # Given a recurring run that succeeded in a pool process, and the next message's run
    hooks = pool_hooks()
    done = succeeded_in(hooks)
    _, nxt = claim_one(name="next")
    assert _run_status(done) == RunStatus.RUNNING  # not written yet: it waits for a door
    # When the process admits its next run
    hooks.door.admit(_Task(), nxt.task_id)  # raises Ignore if refused
    # Then both are recorded: the job moved on once, the next run started
    assert _run_status(done) == RunStatus.SUCCEEDED
    assert Job.objects.get(pk=done.job_id).scheduled_for == done.scheduled_for + timedelta(
        seconds=60
    )
    assert _run_status(nxt) == RunStatus.RUNNING
    hooks.completions.close_pending()


@pytest.mark.postgresql
@pytest.mark.parametrize("successes", [1, 3])
def test_a_door_carrying_successes_is_one_statement(successes, function_calls):
    hooks = pool_hooks()
    done = [succeeded_in(hooks, f"every-minute-{i}") for i in range(successes)]
    _, nxt = claim_one(name="next")
    function_calls.clear()
    hooks.door.admit(_Task(), nxt.task_id)
    assert len(function_calls) == 1, function_calls  # one round trip and one commit for all
    assert {_run_status(r) for r in done} == {RunStatus.SUCCEEDED}
    assert _run_status(nxt) == RunStatus.RUNNING
    hooks.completions.close_pending()


def test_a_door_leaves_the_success_of_a_task_that_waited_to_the_thread(monkeypatch):
    from schedapp.worker import door

    carried = []
    admit_after = door.admit_run_after_successes

    def carrying(successes, *args, **kwargs):
        carried.extend((job_id, token) for job_id, token, _ in successes)
        return admit_after(successes, *args, **kwargs)

    monkeypatch.setattr(door, "admit_run_after_successes", carrying)
    # Given two successes waiting in a pool process whose thread never writes on its own
    # (an hour's linger): one of a task that kept the CPU busy, one of a task that waited
    hooks = pool_hooks()
    busy = succeeded_in(hooks, "busy")
    waited = succeeded_in(hooks, "waited", waited=True)
    _, nxt = claim_one(name="next")
    # When the process admits its next run
    hooks.door.admit(_Task(), nxt.task_id)
    # Then the door carried the busy task's success only
    assert carried == [(busy.job_id, busy.token)]
    assert _run_status(busy) == RunStatus.SUCCEEDED
    assert _run_status(nxt) == RunStatus.RUNNING
    # and the thread wrote the other once the door had answered, not after its linger
    assert _status_within(waited, RunStatus.SUCCEEDED) == RunStatus.SUCCEEDED
    assert Job.objects.get(pk=waited.job_id).scheduled_for == waited.scheduled_for + timedelta(
        seconds=60
    )
    assert hooks.completions.take_pending() == []
    hooks.completions.close_pending()


def test_a_door_refusing_its_run_still_records_the_successes_it_carries():
    from celery.exceptions import Ignore

    hooks = pool_hooks()
    done = succeeded_in(hooks)
    late, nxt = claim_one(name="late")
    Job.objects.filter(pk=late.pk).update(lease_expires_at=db_now() - timedelta(seconds=1))
    with pytest.raises(Ignore):
        hooks.door.admit(_Task(), nxt.task_id)
    assert _run_status(done) == RunStatus.SUCCEEDED
    assert _run_status(nxt) == RunStatus.SKIPPED
    hooks.completions.close_pending()


def test_a_success_carried_by_a_door_after_its_job_moved_on_is_recorded_stale():
    hooks = pool_hooks()
    done = succeeded_in(hooks)
    _, nxt = claim_one(name="next")
    _lose_lease(done.job_id)  # while the success waited for the door
    hooks.door.admit(_Task(), nxt.task_id)
    r = JobRun.objects.get(pk=done.run_id)
    assert r.stale and r.status == RunStatus.SUCCEEDED
    job = Job.objects.get(pk=done.job_id)
    assert (job.state, job.retry_count) == (JobState.SCHEDULED, 1)  # the reaper's, not moved on
    assert _run_status(nxt) == RunStatus.RUNNING
    hooks.completions.close_pending()


def test_a_success_that_no_door_takes_is_written_by_the_process_itself():
    hooks = pool_hooks(linger=0.05)
    done = succeeded_in(hooks)
    # no door came; the linger thread wrote it
    assert _status_within(done, RunStatus.SUCCEEDED) == RunStatus.SUCCEEDED
    hooks.completions.close_pending()


def test_a_pool_process_writes_the_successes_still_waiting_when_it_exits():
    hooks = pool_hooks()
    done = succeeded_in(hooks)
    hooks.on_process_shutdown(pid=0)
    assert _run_status(done) == RunStatus.SUCCEEDED
    assert hooks.completions.pending is None


def test_a_door_that_cannot_carry_its_successes_leaves_them_to_the_thread_and_admits(monkeypatch):
    from schedapp.worker import door

    carried = []

    def broken(successes, *args, **kwargs):
        carried.extend(successes)
        raise RuntimeError("the combined statement failed")

    monkeypatch.setattr(door, "admit_run_after_successes", broken)
    _, nxt = claim_one(name="next")
    hooks = pool_hooks(linger=0.5)  # long enough for the door to come first
    done = succeeded_in(hooks)
    hooks.door.admit(_Task(), nxt.task_id)  # takes the success, fails to carry it
    assert [(j, t) for j, t, _ in carried] == [(done.job_id, done.token)]
    assert _run_status(nxt) == RunStatus.RUNNING  # the door, alone
    # written by the thread
    assert _status_within(done, RunStatus.SUCCEEDED) == RunStatus.SUCCEEDED
    hooks.completions.close_pending()


def test_a_failure_in_a_pool_process_is_written_at_once():
    _, run = claim_one(name="every-minute", interval=60, max_retries=2, retry_backoff=0)
    admit_run(run.job_id, run.token, "w1", "a1")
    hooks = pool_hooks()
    hooks.completions.complete(run.task_id, lease.FAILED, error="RuntimeError: boom")
    assert _run_status(run) == RunStatus.FAILED  # failures do not wait for a door
    hooks.completions.close_pending()


class _Unpicklable(Exception):
    pass


def _unpicklable() -> Exception:
    """What Celery's tracer reports for an exception it cannot pickle: its wrapper."""
    from celery.utils.serialization import get_pickleable_exception

    return get_pickleable_exception(_Unpicklable("boom", threading.Lock()))


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise ValueError("no text for this one")


@pytest.mark.parametrize(
    ("exception", "error"),
    [
        (RuntimeError("read b'\x00\x01' from the device"), "RuntimeError: read b'\\x00\x01' from"),
        (OSError("bad name 'caf\udce9'"), "OSError: bad name 'caf\\udce9'"),
        (_Unprintable("x"), "_Unprintable: <unprintable _Unprintable object>"),
        (RuntimeError("x" * 100_000), "RuntimeError: xxx"),
        (_unpicklable(), "_Unpicklable: _Unpicklable('boom', <unlocked"),
    ],
    ids=["nul", "surrogate", "str-raises", "huge", "unpicklable"],
)
def test_a_failure_whose_exception_text_postgresql_cannot_store_is_still_recorded(exception, error):
    from schedapp.worker import WorkerHooks

    # Given an admitted run whose task raised an exception with a NUL, a lone surrogate (a
    # file name decoded with surrogateescape), a __str__ that raises, a huge message, or one
    # Celery could not pickle
    _, run = claim_one(max_retries=0)
    admit_run(run.job_id, run.token, "w1", "a1")
    try:
        raise exception
    except Exception:
        from billiard.einfo import ExceptionInfo

        einfo = ExceptionInfo()
    # When the worker reports the failure
    WorkerHooks().completions.on_task_failure(task_id=run.task_id, exception=exception, einfo=einfo)
    # Then it is recorded, with text PostgreSQL can store, cut to the column's size
    r = JobRun.objects.get(pk=run.run_id)
    assert r.status == RunStatus.FAILED, r.status
    assert r.error.startswith(error), r.error[:80]
    assert len(r.error) <= 10_000 and "Traceback" in r.traceback
    assert Job.objects.get(pk=run.job_id).state == JobState.DEAD


# --- what the logs say (issue 29, item 11) --------------------------------------------------


@pytest.fixture
def schedapp_records(caplog):
    """The schedapp loggers' records (they do not propagate to pytest's root handler)."""
    schedapp_log = logging.getLogger("schedapp")
    schedapp_log.addHandler(caplog.handler)
    caplog.set_level(logging.INFO, logger="schedapp")
    yield lambda: [r.getMessage() for r in caplog.records if r.name.startswith("schedapp")]
    schedapp_log.removeHandler(caplog.handler)


def test_a_dead_job_is_logged_by_its_name_and_id(schedapp_records):
    job, run = claimed(name="nightly-report", max_retries=0)
    admit_run(job.pk, run.token, "w1", "a1")
    complete_run(job.pk, run.token, lease.FAILED, error="boom\nmore")
    (line,) = [m for m in schedapp_records() if "is dead" in m]
    assert line == f"job 'nightly-report' (id {job.pk}) is dead after 1 attempt(s): boom"


def test_a_refused_delivery_says_when_its_run_is_dispatched_again(schedapp_records):
    from celery.exceptions import Ignore

    hooks = pool_hooks()
    late, run = claim_one(name="late")
    Job.objects.filter(pk=late.pk).update(lease_expires_at=db_now() - timedelta(seconds=1))
    with pytest.raises(Ignore):
        hooks.door.admit(_Task(), run.task_id)
    (line,) = [m for m in schedapp_records() if "delivered but not executed" in m]
    assert line.startswith(f"job {late.pk} (project.tasks.record) token {run.token} delivered")
    assert line.endswith(
        "its lease expired before it arrived: a beat reaps it and dispatches it again at its "
        "next tick, not counted as an attempt"
    )
    hooks.completions.close_pending()


def test_a_delivery_refused_for_a_newer_claim_says_it_is_not_run_again(schedapp_records):
    from celery.exceptions import Ignore

    hooks = pool_hooks()
    job, run = claim_one(name="moved-on")
    Job.objects.filter(pk=job.pk).update(token=run.token + 1)
    with pytest.raises(Ignore):
        hooks.door.admit(_Task(), run.task_id)
    (line,) = [m for m in schedapp_records() if "delivered but not executed" in m]
    assert line.endswith(
        "its claim is no longer the job's current one: not run again from this message (the "
        "job's newer claim, or its cancellation, stands)"
    )
    hooks.completions.close_pending()


# --- the run by its key ----------------------------------------------------------------------


def _task_of(run: lease.ClaimedRun, run_id: int) -> _Task:
    """A task whose request carries the message's run header, as Celery sets custom headers
    as attributes of the request in the worker."""
    task = _Task()
    setattr(task.request, HEADER_RUN, run_id)
    return task


@pytest.mark.postgresql
def test_the_door_reads_its_run_by_the_id_the_message_carries(monkeypatch):
    """A read of a run by its id reaches one partition of a history partitioned by id;
    one by (job, token) visits every partition's index. The door sends the header's id."""
    from schedapp.store import postgresql

    sent: list[list] = []
    counted = postgresql.call_function

    def with_params(sql, params, *using):
        sent.append(list(params))
        return counted(sql, params, *using)

    monkeypatch.setattr(postgresql, "call_function", with_params)
    hooks = pool_hooks()
    _, run = claim_one(name="keyed", interval=60)
    _, other = claim_one(name="other", interval=60)
    # Given a message whose run header names another claim's run, the door finds no such run
    with pytest.raises(Ignore):
        hooks.door.admit(_task_of(run, other.run_id), run.task_id)
    assert sent[-1][-1] == other.run_id
    assert _run_status(run) == RunStatus.DISPATCHED  # nothing written to a run it did not find
    # And with its own run's id it is admitted, the id sent with the job and token
    hooks.door.admit(_task_of(run, run.run_id), run.task_id)
    assert sent[-1] == [run.job_id, run.token, "w1@host", sent[-1][3], run.run_id]
    assert _run_status(run) == RunStatus.RUNNING
    hooks.completions.close_pending()


def test_the_heartbeat_renews_with_the_run_ids_of_the_messages_it_holds(monkeypatch):
    from schedapp.worker import HeldLeases, leases

    _, run = claim_one(name="held", interval=60)
    admit_run(run.job_id, run.token, "w1", "a1")
    request = type(
        "Request", (), {"id": run.task_id, "request_dict": {HEADER_RUN: str(run.run_id)}}
    )()
    held = HeldLeases()
    held.on_task_received(request=request)
    asked: list = []
    renew = leases.renew_leases

    def recorded(due, run_ids=None):
        asked.append((list(due), dict(run_ids or {})))
        return renew(due, run_ids)

    monkeypatch.setattr(leases, "renew_leases", recorded)
    monkeypatch.setattr(leases, "live_task_ids", lambda consumer=None: {run.task_id})
    held.held[(run.job_id, run.token)].renewed_at -= 3600  # due for renewal
    held.renew_held_leases()
    assert asked == [([(run.job_id, run.token)], {(run.job_id, run.token): run.run_id})]
    assert JobRun.objects.get(pk=run.run_id).heartbeats == 1  # renewed, the run found by id
