"""Overlap policy allow_all: several runs of one job in flight at once, each under a lease of
its own, through the claim, the door, the heartbeat, the completion and the reaper. Runs on
the default database: PostgreSQL (its PL/pgSQL door and renewal), and on SQLite with
project.settings_test_sqlite (the portable store's ORM paths); the race between beats is
PostgreSQL's alone (SQLite serialises the claims)."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError

from schedapp import api, lease
from schedapp.db import db_now
from schedapp.lease import (
    admit_run,
    claim_due_jobs,
    complete_run,
    reap_expired_leases,
    renew_leases,
)
from schedapp.models import Job, JobRun, JobState, RunStatus
from tests.claiming import in_thread

pytestmark = pytest.mark.django_db(transaction=True)

SECOND = timedelta(seconds=1)
LEASE = 60
JOB_FIELDS = ("state", "scheduled_for", "next_run_at", "last_status", "failed_occurrences", "token")


def allow_all_job(max_concurrent: int = 3, every: timedelta = SECOND, **options) -> Job:
    """An allow_all job whose occurrences, every ``every`` from ten minutes ago, are all past:
    its grace is an hour, so each claim takes the next one at once, never as a misfire."""
    first = db_now() - timedelta(minutes=10)
    job = api.schedule(
        "project.tasks.record",
        interval=every,
        interval_anchor=first,
        misfire_grace=timedelta(hours=1),
        lease_seconds=LEASE,
        overlap="allow_all",
        max_concurrent=max_concurrent,
        name=f"allow-all-{max_concurrent}",
        **{"max_retries": 0, **options},
    )
    Job.objects.filter(pk=job.pk).update(scheduled_for=first, next_run_at=first)
    return Job.objects.get(pk=job.pk)


def in_flight(job: Job) -> int:
    return JobRun.objects.filter(job=job, lease_expires_at__isnull=False).count()


def claim_one() -> lease.ClaimedRun | None:
    runs = claim_due_jobs("beat-1", 10).runs
    assert len(runs) <= 1
    return runs[0] if runs else None


def job_row(job: Job) -> dict:
    return Job.objects.filter(pk=job.pk).values(*JOB_FIELDS).get()


def test_two_runs_of_one_job_are_in_flight_at_once_each_renewed_on_its_own_row():
    # Given an allow_all job, claimed twice: its first two occurrences
    job = allow_all_job(max_concurrent=3)
    first, second = claim_one(), claim_one()
    assert first is not None and second is not None
    assert second.scheduled_for == first.scheduled_for + SECOND
    # the job moved on at each claim: it waits for its third occurrence, holding no lease
    moved_on = Job.objects.get(pk=job.pk)
    assert moved_on.state == JobState.SCHEDULED
    assert moved_on.scheduled_for == second.scheduled_for + SECOND
    assert moved_on.lease_expires_at is None
    # When both are admitted and the worker's heartbeat renews them
    for run in (first, second):
        assert admit_run(run.job_id, run.token, "w1", f"adm-{run.token}") == "admitted"
    before = dict(JobRun.objects.filter(job=job).values_list("token", "lease_expires_at"))
    renewal = renew_leases([(first.job_id, first.token), (second.job_id, second.token)])
    # Then each is renewed, on its own row, and both are running
    assert renewal.renewed == {(first.job_id, first.token), (second.job_id, second.token)}
    runs = {r.token: r for r in JobRun.objects.filter(job=job)}
    for run in (first, second):
        row = runs[run.token]
        assert row.status == RunStatus.RUNNING and row.own_lease
        assert row.lease_expires_at >= before[run.token]
        assert row.heartbeats == 1
    # When the first ends, the second goes on: still renewed, still its lease
    assert complete_run(first.job_id, first.token, lease.SUCCEEDED).applied
    assert renew_leases([(second.job_id, second.token)]).renewed == {(second.job_id, second.token)}
    assert renew_leases([(first.job_id, first.token)]).finished == {(first.job_id, first.token)}
    assert in_flight(job) == 1
    assert complete_run(second.job_id, second.token, lease.SUCCEEDED).applied
    assert in_flight(job) == 0
    assert Job.objects.get(pk=job.pk).last_status == RunStatus.SUCCEEDED


def test_a_stale_completion_changes_nothing_and_a_run_lost_leaves_the_others_alone():
    # Given two runs in flight, both admitted
    job = allow_all_job(max_concurrent=3, when_retries_exhausted="next_occurrence")
    lost, alive = claim_one(), claim_one()
    assert lost is not None and alive is not None
    for run in (lost, alive):
        assert admit_run(run.job_id, run.token, "w1", f"adm-{run.token}") == "admitted"
    # When the first one's lease lapses (its worker died) and the reaper runs
    JobRun.objects.filter(job=job, token=lost.token).update(lease_expires_at=db_now() - SECOND)
    assert reap_expired_leases(10).expired == 1
    # Then only that run is lost, counted as a failed occurrence; the other runs on
    rows = {r.token: r for r in JobRun.objects.filter(job=job)}
    assert rows[lost.token].status == RunStatus.LOST
    assert rows[lost.token].lease_expires_at is None
    assert rows[alive.token].status == RunStatus.RUNNING
    assert rows[alive.token].lease_expires_at is not None
    after_reap = job_row(job)
    assert after_reap["failed_occurrences"] == 1
    assert after_reap["state"] == JobState.SCHEDULED
    # When the lost run's worker reports late, success then failure
    for outcome in (lease.SUCCEEDED, lease.FAILED):
        result = complete_run(lost.job_id, lost.token, outcome)
        # Then nothing of the job changes: the outcome is kept on the run, flagged stale
        assert not result.applied
        assert job_row(job) == after_reap
    assert JobRun.objects.get(job=job, token=lost.token).stale
    assert renew_leases([(alive.job_id, alive.token)]).renewed == {(alive.job_id, alive.token)}
    # and the run still in flight completes as usual
    assert complete_run(alive.job_id, alive.token, lease.SUCCEEDED).applied
    assert JobRun.objects.get(job=job, token=alive.token).status == RunStatus.SUCCEEDED


def test_a_retried_completion_of_a_run_with_its_own_lease_changes_nothing():
    job = allow_all_job()
    run = claim_one()
    assert run is not None
    assert admit_run(run.job_id, run.token, "w1", "adm") == "admitted"
    assert complete_run(run.job_id, run.token, lease.FAILED, error="boom").applied
    after = job_row(job)
    assert after["state"] == JobState.DEAD  # when_retries_exhausted: dead (the default)
    again = complete_run(run.job_id, run.token, lease.FAILED, error="boom")
    assert again.completion is lease.Completion.ALREADY_RECORDED
    assert job_row(job) == after


def test_max_concurrent_holds_an_occurrence_until_a_slot_frees():
    # Given an allow_all job bounded to two runs in flight, with many occurrences due
    job = allow_all_job(max_concurrent=2)
    first, second = claim_one(), claim_one()
    assert first is not None and second is not None
    # When the beat claims again: nothing, the third occurrence waits (still due)
    assert claim_one() is None
    waiting = Job.objects.get(pk=job.pk)
    assert waiting.state == JobState.SCHEDULED
    assert waiting.scheduled_for == second.scheduled_for + SECOND
    # When one run ends, the waiting occurrence starts
    assert admit_run(first.job_id, first.token, "w1", "a") == "admitted"
    assert complete_run(first.job_id, first.token, lease.SUCCEEDED).applied
    third = claim_one()
    assert third is not None and third.scheduled_for == waiting.scheduled_for
    assert claim_one() is None
    assert in_flight(job) == 2


def test_a_door_refuses_a_run_of_a_paused_job_that_had_not_started_and_lets_one_in_flight_end():
    job = allow_all_job()
    started, unstarted = claim_one(), claim_one()
    assert started is not None and unstarted is not None
    assert admit_run(started.job_id, started.token, "w1", "a") == "admitted"
    api.pause(job.pk)
    assert admit_run(unstarted.job_id, unstarted.token, "w1", "b") == "job_paused"
    assert JobRun.objects.get(job=job, token=unstarted.token).lease_expires_at is None
    assert complete_run(started.job_id, started.token, lease.SUCCEEDED).applied
    assert Job.objects.get(pk=job.pk).state == JobState.PAUSED
    assert in_flight(job) == 0


def test_a_run_not_published_is_given_back_at_once_and_one_a_worker_admitted_is_kept():
    """A beat that could not publish (the broker down, the beat stopped once its claim
    committed) gives back each run it did not send. A run of an allow_all job holds a lease of
    its own, its job having moved on at the claim: it is closed lost and its occurrence is
    claimed again at once, the same attempt. Before, it waited, dispatched and never sent,
    for its own lease to lapse (a minute here). A run a worker admitted (its message did go
    out) is kept, or a second copy would run beside it."""
    # Given two runs of an allow_all job claimed (both its slots), the second admitted
    allow_all_job(max_concurrent=2)
    unsent, admitted = claim_one(), claim_one()
    assert unsent is not None and admitted is not None and unsent.own_lease
    assert admit_run(admitted.job_id, admitted.token, "w1", "a") == "admitted"
    # When the beat gives both back (its publish failed)
    assert lease.give_back([unsent, admitted], "broker down") == 1
    # Then the unsent run is lost, holding no slot, and the admitted one runs on
    lost = JobRun.objects.get(pk=unsent.run_id)
    assert (lost.status, lost.error) == (RunStatus.LOST, "not published: broker down")
    assert lost.lease_expires_at is None and lost.started_at is None
    kept = JobRun.objects.get(pk=admitted.run_id)
    assert kept.status == RunStatus.RUNNING and kept.lease_expires_at is not None
    # and the next claim sends the unsent occurrence again now, the same attempt, in the
    # slot it freed (a retry is claimed before the job's next occurrence)
    again = claim_one()
    assert again is not None and again.run_id not in (unsent.run_id, admitted.run_id)
    assert (again.scheduled_for, again.attempt) == (unsent.scheduled_for, unsent.attempt)
    # given back again (it was never admitted), nothing is given back twice
    assert lease.give_back([unsent], "broker down") == 0


def test_cancel_closes_every_run_in_flight():
    job = allow_all_job()
    runs = [claim_one(), claim_one()]
    api.cancel(job.pk)
    assert in_flight(job) == 0
    assert set(JobRun.objects.filter(job=job).values_list("status", flat=True)) == {
        RunStatus.CANCELLED
    }
    for run in runs:
        assert run is not None
        assert admit_run(run.job_id, run.token, "w1", "a") == "stale_token"


@pytest.mark.postgresql
def test_max_concurrent_holds_against_beats_claiming_at_once():
    # Given an allow_all job bounded to three runs in flight, hundreds of occurrences due
    job = allow_all_job(max_concurrent=3)
    barrier = threading.Barrier(4)
    stop = threading.Event()
    seen: list[int] = []

    def beat(name: str):
        def run() -> int:
            barrier.wait(10)
            claimed = 0
            for _ in range(40):
                claimed += len(claim_due_jobs(name, 5).runs)
                seen.append(in_flight(job))
            return claimed

        return run

    # When four beats, each on its own connection, claim as fast as they can
    threads = [in_thread(beat(f"beat-{i}")) for i in range(4)]
    total = 0
    for thread, out in threads:
        thread.join(120)
        assert "error" not in out, out.get("error")
        total += out["value"]
    stop.set()
    # Then exactly three runs were ever started, and never more than three in flight
    assert total == 3
    assert in_flight(job) == 3
    assert JobRun.objects.filter(job=job).count() == 3
    assert max(seen) == 3


def test_allow_all_is_refused_where_it_cannot_hold_naming_the_field():
    base = {"interval": SECOND, "overlap": "allow_all", "name": "refused", "max_retries": 0}
    cases = [
        ({"fixed_delay": True}, "fixed_delay"),
        ({"max_concurrent": 0}, "max_concurrent"),
        ({"max_concurrent": 1001}, "max_concurrent"),
    ]
    for extra, field in cases:
        with pytest.raises(ValidationError) as caught:
            api.schedule("project.tasks.record", **{**base, **extra})
        assert field in caught.value.message_dict, (extra, caught.value.message_dict)
    with pytest.raises(ValidationError) as caught:
        api.schedule(
            "project.tasks.record",
            run_at=db_now() + timedelta(hours=1),
            overlap="allow_all",
            max_retries=0,
            name="once",
        )
    assert "overlap" in caught.value.message_dict
    assert not Job.objects.exists()


def due_now(run_id: int) -> None:
    """A waiting retry's backoff over: its due time now."""
    JobRun.objects.filter(pk=run_id).update(retry_at=db_now() - SECOND)


def test_a_failed_run_is_retried_as_a_run_of_its_own_for_the_same_occurrence():
    # Given an allow_all job with two retries, two runs in flight
    job = allow_all_job(max_concurrent=10, max_retries=2, retry_backoff=timedelta(minutes=5))
    failing, other = claim_one(), claim_one()
    assert failing is not None and other is not None
    for run in (failing, other):
        assert admit_run(run.job_id, run.token, "w1", f"a{run.token}") == "admitted"
    # When the first fails
    assert complete_run(failing.job_id, failing.token, lease.FAILED, error="boom").applied
    # Then a retry of its occurrence waits for its backoff: a run of its own, no lease yet
    retry = JobRun.objects.get(job=job, attempt=2)
    assert retry.scheduled_for == failing.scheduled_for
    assert retry.kind == "retry" and retry.own_lease and retry.lease_expires_at is None
    assert retry.retry_at is not None and retry.retry_at > db_now() + timedelta(minutes=4)
    assert retry.token > other.token
    assert Job.objects.get(pk=job.pk).state == JobState.SCHEDULED
    # the beat's claim does not send it before its time, the job's next occurrence aside
    sent = claim_due_jobs("beat-1", 10).runs
    assert all(r.run_id != retry.pk for r in sent)
    # When its time comes, the beat sends it, with the occurrence's idempotency key
    due_now(retry.pk)
    [resent] = [r for r in claim_due_jobs("beat-1", 10).runs if r.run_id == retry.pk]
    assert resent.attempt == 2 and resent.own_lease
    assert resent.idempotency_key == failing.idempotency_key
    assert admit_run(resent.job_id, resent.token, "w2", "r") == "admitted"
    assert complete_run(resent.job_id, resent.token, lease.SUCCEEDED).applied
    # and the run in flight beside it was never touched
    assert JobRun.objects.get(job=job, token=other.token).status == RunStatus.RUNNING


def test_retries_spent_follow_when_retries_exhausted():
    job = allow_all_job(max_retries=1, when_retries_exhausted="next_occurrence")
    run = claim_one()
    assert run is not None
    assert admit_run(run.job_id, run.token, "w1", "a") == "admitted"
    assert complete_run(run.job_id, run.token, lease.FAILED, error="one").applied
    retry = JobRun.objects.get(job=job, attempt=2)
    due_now(retry.pk)
    [again] = [r for r in claim_due_jobs("beat-1", 10).runs if r.run_id == retry.pk]
    assert admit_run(again.job_id, again.token, "w1", "b") == "admitted"
    assert complete_run(again.job_id, again.token, lease.FAILED, error="two").applied
    assert not JobRun.objects.filter(job=job, attempt=3).exists()
    after = Job.objects.get(pk=job.pk)
    assert after.failed_occurrences == 1
    assert after.state == JobState.SCHEDULED


def test_a_run_lost_while_running_is_retried_and_one_never_started_is_sent_again_as_is():
    # Given two runs in flight: one started, one whose message never reached a worker
    job = allow_all_job(max_retries=1)
    started, unstarted = claim_one(), claim_one()
    assert started is not None and unstarted is not None
    assert admit_run(started.job_id, started.token, "w1", "a") == "admitted"
    # When both leases lapse and the reaper runs
    JobRun.objects.filter(job=job, token__in=[started.token, unstarted.token]).update(
        lease_expires_at=db_now() - SECOND
    )
    assert reap_expired_leases(10).expired == 2
    # Then the started one is retried (attempt 2, after its backoff), the other sent again
    # at once as the same attempt; both for their own occurrence
    waiting = {r.scheduled_for: r for r in JobRun.objects.filter(job=job, retry_at__isnull=False)}
    assert waiting[started.scheduled_for].attempt == 2
    assert waiting[unstarted.scheduled_for].attempt == 1
    assert waiting[unstarted.scheduled_for].retry_at <= db_now()
    resent = [r for r in claim_due_jobs("beat-1", 10).runs if r.scheduled_for in waiting]
    assert [r.scheduled_for for r in resent] == [unstarted.scheduled_for]
    # the old messages are refused at the door: nothing runs twice
    assert admit_run(unstarted.job_id, unstarted.token, "w1", "x") == "stale_token"
    assert admit_run(resent[0].job_id, resent[0].token, "w1", "y") == "admitted"


def test_a_retry_waits_while_its_job_is_paused_or_has_no_slot():
    job = allow_all_job(max_concurrent=1, max_retries=1)
    run = claim_one()
    assert run is not None
    assert admit_run(run.job_id, run.token, "w1", "a") == "admitted"
    assert complete_run(run.job_id, run.token, lease.FAILED, error="boom").applied
    retry = JobRun.objects.get(job=job, attempt=2)
    due_now(retry.pk)
    api.pause(job.pk)
    assert claim_due_jobs("beat-1", 10).runs == []
    api.resume(job.pk)
    # the retry takes the one slot before the job's next occurrence, though that was due
    # first (its occurrence is older than any still waiting), and the occurrence waits
    Job.objects.filter(pk=job.pk).update(next_run_at=db_now() - timedelta(hours=2))
    [first] = claim_due_jobs("beat-1", 10).runs
    assert first.run_id == retry.pk
    assert claim_due_jobs("beat-1", 10).runs == []
    assert admit_run(first.job_id, first.token, "w1", "b") == "admitted"
    assert complete_run(first.job_id, first.token, lease.SUCCEEDED).applied
    [then] = claim_due_jobs("beat-1", 10).runs
    assert then.run_id != retry.pk and then.attempt == 1


def test_a_job_whose_slots_stay_full_still_runs_its_retries():
    # Given an allow_all job with one slot, always behind its schedule, its run in flight
    job = allow_all_job(max_concurrent=1, max_retries=1)
    run = claim_one()
    assert run is not None
    assert admit_run(run.job_id, run.token, "w1", "a") == "admitted"
    # When that run fails and its retry is due while the job's next occurrence is too
    assert complete_run(run.job_id, run.token, lease.FAILED, error="boom").applied
    retry = JobRun.objects.get(job=job, attempt=2)
    due_now(retry.pk)
    # Then the slot that freed goes to the retry, not to the next occurrence
    [sent] = claim_due_jobs("beat-1", 10).runs
    assert sent.run_id == retry.pk and sent.scheduled_for == run.scheduled_for


@pytest.mark.postgresql
def test_a_run_the_previous_releases_door_refused_is_sent_again_when_its_lease_lapses():
    # Given a run of an allow_all job, delivered to a worker of the previous release, whose
    # door (schedapp_admit_run_v3, kept for it) knows no run lease: its job moved on, refused
    from django.db import connection

    job = allow_all_job()
    run = claim_one()
    assert run is not None
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT schedapp_admit_run_v3(%s, %s, %s, %s)", [run.job_id, run.token, "old", "a"]
        )
        assert cursor.fetchone()[0] == "job_state"
    assert JobRun.objects.get(pk=run.run_id).status == RunStatus.SKIPPED
    # When its lease lapses and the reaper runs
    JobRun.objects.filter(pk=run.run_id).update(lease_expires_at=db_now() - SECOND)
    reap_expired_leases(10)
    # Then nothing of it counts in flight any more, and its occurrence is sent again, once,
    # as the same attempt
    assert JobRun.objects.get(pk=run.run_id).lease_expires_at is None
    again = [r for r in claim_due_jobs("beat-1", 10).runs if r.scheduled_for == run.scheduled_for]
    assert len(again) == 1 and again[0].attempt == 1 and again[0].token > run.token
    reap_expired_leases(10)
    assert JobRun.objects.filter(job=job, scheduled_for=run.scheduled_for).count() == 2


def test_a_waiting_retry_reads_as_waiting_not_dispatched(client):
    # Given an allow_all occurrence whose first attempt failed: its retry waits as a run row
    from django.contrib.auth.models import User
    from django.urls import reverse

    from schedapp import explain

    job = allow_all_job(max_concurrent=10, max_retries=2, retry_backoff=timedelta(minutes=5))
    failing = claim_one()
    assert failing is not None
    assert admit_run(failing.job_id, failing.token, "w1", "a") == "admitted"
    assert complete_run(failing.job_id, failing.token, lease.FAILED, error="boom").applied
    retry = JobRun.objects.get(job=job, attempt=2)
    assert retry.retry_at is not None
    # Then the timeline says the retry waits for its time, not that it was sent
    answer = explain.explain(job, failing.scheduled_for)
    assert "attempt 2" in answer.text
    second = answer.text.split("attempt 2", 1)[1]
    assert "waiting" in second and "dispatched" not in second.split(";")[0]
    assert answer.entry is not None and answer.entry.attempts[-1].shown_status == "waiting"
    # and so do the admin's runs list and the job page
    user = User.objects.create_superuser("boss", "boss@example.com", "pw")
    client.force_login(user)
    for url in (
        reverse("admin:schedapp_jobrun_changelist"),
        reverse("admin:schedapp_job_change", args=[job.pk]),
    ):
        page = client.get(url).content.decode()
        assert "waiting for its retry" in page, url
    # Once a beat sends it, it reads as dispatched again
    due_now(retry.pk)
    assert any(r.run_id == retry.pk for r in claim_due_jobs("beat-1", 10).runs)
    answer = explain.explain(job, failing.scheduled_for)
    assert answer.entry is not None and answer.entry.attempts[-1].shown_status == "dispatched"


def test_a_run_whose_message_arrives_after_its_lease_is_sent_again_not_lost():
    """The message reached a worker only after the run's own lease ran out (a busy worker's
    prefetch buffer): the door refuses it and leaves it to the reaper, which sends the
    occurrence again. The door closed it as skipped and cleared its lease, so no reaper
    found it and the occurrence never ran (the chaos run's ledger check: allow3, lost)."""
    job = allow_all_job()
    late = claim_one()
    assert late is not None
    JobRun.objects.filter(job=job, token=late.token).update(lease_expires_at=db_now() - SECOND)
    assert admit_run(late.job_id, late.token, "w1", "a") == "lease_expired"
    # When the reaper runs
    assert reap_expired_leases(10).expired == 1
    # Then the occurrence is sent again, as the same attempt, and that copy is admitted
    resent = [r for r in claim_due_jobs("beat-1", 10).runs if r.scheduled_for == late.scheduled_for]
    assert [r.attempt for r in resent] == [late.attempt]
    assert admit_run(late.job_id, late.token, "w1", "b") == "stale_token"
    assert admit_run(resent[0].job_id, resent[0].token, "w1", "c") == "admitted"
