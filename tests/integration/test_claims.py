"""Claiming: concurrent claims, leases, fencing tokens, reaping; against real PostgreSQL (the
portable store's side of the seam is tested by tests/integration/test_store_contract.py)."""

from __future__ import annotations

import re
import threading
from datetime import timedelta

import pytest
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
from schedapp.models import Job, JobRun, JobState, RunStatus
from schedapp.sql import query
from schedapp.store import PostgreSQLStore, get_store
from tests.claiming import in_thread

pytestmark = pytest.mark.django_db(transaction=True)


def due_jobs(n: int, **options) -> list[Job]:
    when = db_now() - timedelta(seconds=1)
    names = [f"job-{i}" for i in range(n)]
    created = api.schedule_many(
        {"task": "project.tasks.record", "run_at": when, "name": name, **options} for name in names
    )
    assert created == n
    return list(Job.objects.filter(name__in=names).order_by("id"))  # ids follow input order


def start_run(job_id: int, token: int, worker: str = "w1") -> DoorVerdict:
    """The door, as a worker calls it: one admission per delivery."""
    return admit_run(job_id, token, worker, admission=f"{worker}-{token}")


def expire_lease(job_id: int) -> None:
    Job.objects.filter(pk=job_id).update(lease_expires_at=db_now() - timedelta(seconds=1))


@pytest.mark.postgresql  # SQLite's IMMEDIATE transactions make B wait for A instead
def test_two_open_claim_transactions_never_return_the_same_job():
    # Given 20 due jobs
    due_jobs(20)
    first_claimed = threading.Event()
    release_first = threading.Event()

    # When connection A claims 10 and keeps its transaction open...
    def claim_and_hold():
        with transaction.atomic():
            rows, _now = PostgreSQLStore().claim("beat-A", 10)
            first_claimed.set()
            release_first.wait(10)
        return {r["id"] for r in rows}

    thread, out = in_thread(claim_and_hold)
    assert first_claimed.wait(10)
    # ... connection B claims at the same time (its rows are locked by A, not yet committed)
    second = {r.job_id for r in claim_due_jobs("beat-B", 100).runs}
    release_first.set()
    thread.join(10)

    # Then they got disjoint sets that together cover every due job
    first = out["value"]
    assert len(first) == 10 and len(second) == 10
    assert not first & second
    assert len(first | second) == 20


def test_many_racing_connections_claim_each_job_exactly_once():
    due_jobs(600)
    barrier = threading.Barrier(4)
    results = []

    def racer(name):
        def run():
            barrier.wait(10)
            got = []
            while True:
                batch = claim_due_jobs(name, 25).runs
                if not batch:
                    return got
                got.extend(r.job_id for r in batch)

        return run

    threads = [in_thread(racer(f"beat-{i}")) for i in range(4)]
    for thread, out in threads:
        thread.join(60)
        assert "error" not in out, out.get("error")
        results.append(out["value"])
    every = [job for got in results for job in got]
    assert len(every) == 600
    assert len(set(every)) == 600
    if get_store().name == "postgresql":  # SQLite's lock is not fair: one racer may take all
        assert sum(1 for got in results if got) > 1  # the work was actually shared
    assert JobRun.objects.count() == 600


def test_a_claim_stamps_lease_token_and_a_run_from_database_time():
    (job,) = due_jobs(1, lease_seconds=30)
    before = db_now()
    (run,) = claim_due_jobs("beat-1", 10).runs
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    assert job.claimed_by == "beat-1"
    assert job.token == run.token == 1
    assert before + timedelta(seconds=29) < job.lease_expires_at <= db_now() + timedelta(seconds=30)
    db_run = JobRun.objects.get(pk=run.run_id)
    assert (db_run.job_id, db_run.token, db_run.status) == (job.pk, 1, RunStatus.DISPATCHED)
    assert db_run.task_id == f"schedapp:{job.pk}:1"
    assert db_run.scheduled_for == job.scheduled_for


def test_an_expired_lease_is_claimed_again_with_a_higher_token():
    (job,) = due_jobs(1)
    (first,) = claim_due_jobs("beat-1", 10).runs
    # Not expired yet: nobody else can take it
    assert claim_due_jobs("beat-2", 10).runs == []
    expire_lease(job.pk)
    (second,) = claim_due_jobs("beat-2", 10).runs
    assert second.job_id == job.pk
    assert second.token > first.token
    assert JobRun.objects.get(pk=first.run_id).status == RunStatus.LOST
    job.refresh_from_db()
    assert job.claimed_by == "beat-2" and job.token == second.token


def test_a_lease_that_has_not_expired_is_not_reclaimed_at_the_boundary():
    (job,) = due_jobs(1)
    claim_due_jobs("beat-1", 10)
    Job.objects.filter(pk=job.pk).update(lease_expires_at=db_now() + timedelta(seconds=2))
    assert claim_due_jobs("beat-2", 10).runs == []


def test_stale_completion_changes_nothing_on_the_job():
    # Given a recurring job claimed twice (the first lease expired)
    job = api.schedule("project.tasks.record", interval=60, name="every-minute")
    Job.objects.filter(pk=job.pk).update(next_run_at=db_now() - timedelta(seconds=1))
    (old,) = claim_due_jobs("beat-1", 10).runs
    expire_lease(job.pk)
    (new,) = claim_due_jobs("beat-2", 10).runs
    before = Job.objects.get(pk=job.pk)
    # When the first holder reports success late
    result = complete_run(job.pk, old.token, lease.SUCCEEDED)
    # Then its run records it, flagged stale, and the job is untouched
    assert result.completion is Completion.STALE
    after = Job.objects.get(pk=job.pk)
    assert (after.state, after.next_run_at, after.token, after.claimed_by, after.retry_count) == (
        before.state,
        before.next_run_at,
        before.token,
        before.claimed_by,
        before.retry_count,
    )
    old_run = JobRun.objects.get(pk=old.run_id)
    assert old_run.stale and old_run.status == RunStatus.SUCCEEDED
    # ... and the current holder's completion still applies
    start_run(job.pk, new.token)
    assert complete_run(job.pk, new.token, lease.SUCCEEDED).applied
    after = Job.objects.get(pk=job.pk)
    assert after.state == JobState.SCHEDULED
    assert after.scheduled_for == new.scheduled_for + timedelta(seconds=60)


def test_the_door_starts_only_the_current_dispatched_claim():
    (job,) = due_jobs(1)
    (run,) = claim_due_jobs("beat-1", 10).runs
    assert start_run(job.pk, run.token, "w1") is DoorVerdict.ADMITTED
    # a second delivery of the same message (broker redelivery) does not start it again
    assert start_run(job.pk, run.token, "w2") is DoorVerdict.DUPLICATE
    assert JobRun.objects.get(pk=run.run_id).worker == "w1"


def test_the_door_refuses_a_message_older_than_the_latest_claim():
    (job,) = due_jobs(1)
    (old,) = claim_due_jobs("beat-1", 10).runs
    expire_lease(job.pk)
    (new,) = claim_due_jobs("beat-2", 10).runs
    # the old message is already marked lost by the reaper: not started again
    assert start_run(job.pk, old.token, "w1") is DoorVerdict.STALE_TOKEN
    assert JobRun.objects.get(pk=old.run_id).status == RunStatus.LOST
    assert start_run(job.pk, new.token, "w1") is DoorVerdict.ADMITTED


def test_the_door_skips_a_message_for_a_job_paused_after_dispatch():
    (job,) = due_jobs(1)
    (run,) = claim_due_jobs("beat-1", 10).runs
    api.pause(job)
    assert start_run(job.pk, run.token, "w1") is DoorVerdict.JOB_PAUSED
    assert JobRun.objects.get(pk=run.run_id).status == RunStatus.SKIPPED
    # the lease was given back, so resuming makes it claimable at once
    api.resume(job)
    assert Job.objects.get(pk=job.pk).state == JobState.SCHEDULED
    (again,) = claim_due_jobs("beat-1", 10).runs
    assert again.token > run.token


def test_renewal_extends_only_current_leases_and_counts_heartbeats():
    a, b = due_jobs(2, lease_seconds=5)
    runs = {r.job_id: r for r in claim_due_jobs("beat-1", 10).runs}
    for r in runs.values():
        start_run(r.job_id, r.token, "w1")
    expire_lease(b.pk)
    claim_due_jobs("beat-2", 10)  # b is reaped and claimed again: its old token is stale
    renewal = renew_leases([(a.pk, runs[a.pk].token), (b.pk, runs[b.pk].token)])
    assert renewal.renewed == {(a.pk, runs[a.pk].token)}
    assert renewal.lost == {(b.pk, runs[b.pk].token)} and not renewal.finished
    assert JobRun.objects.get(pk=runs[a.pk].run_id).heartbeats == 1
    a.refresh_from_db()
    assert a.lease_expires_at > db_now() + timedelta(seconds=4)


def test_a_lost_run_that_had_started_counts_as_a_failed_attempt():
    (job,) = due_jobs(1, max_retries=1, retry_backoff=0)
    (run,) = claim_due_jobs("beat-1", 10).runs
    start_run(job.pk, run.token, "w1")
    expire_lease(job.pk)
    lease.reap_expired_leases(10)
    job.refresh_from_db()
    assert (job.state, job.retry_count, job.last_status) == (JobState.SCHEDULED, 1, "lost")
    (run2,) = claim_due_jobs("beat-1", 10).runs
    start_run(job.pk, run2.token, "w1")
    expire_lease(job.pk)
    lease.reap_expired_leases(10)
    job.refresh_from_db()
    assert job.state == JobState.DEAD


def test_a_run_never_started_is_dispatched_again_without_spending_a_retry():
    (job,) = due_jobs(1, max_retries=0)
    claim_due_jobs("beat-1", 10)  # the beat "dies" before publishing
    expire_lease(job.pk)
    (run,) = claim_due_jobs("beat-2", 10).runs
    job.refresh_from_db()
    assert job.retry_count == 0 and run.attempt == 1


def test_higher_priority_is_claimed_first_then_earliest():
    now = db_now()
    api.schedule("project.tasks.record", run_at=now - timedelta(seconds=9), name="low-early")
    api.schedule(
        "project.tasks.record", run_at=now - timedelta(seconds=1), name="high-late", priority=5
    )
    api.schedule(
        "project.tasks.record", run_at=now - timedelta(seconds=5), name="high-early", priority=5
    )
    api.schedule("project.tasks.record", run_at=now - timedelta(seconds=3), name="mid", priority=1)
    order = [Job.objects.get(pk=r.job_id).name for r in claim_due_jobs("b", 10).runs]
    assert order == ["high-early", "high-late", "mid", "low-early"]


def test_a_future_job_is_not_claimed_and_the_beat_knows_when_to_wake():
    api.schedule("project.tasks.record", run_at=db_now() + timedelta(seconds=30), name="later")
    assert claim_due_jobs("b", 10).runs == []
    _now, delay = lease.seconds_until_due()
    assert 28 < delay <= 30


def test_a_claim_that_did_not_fill_its_batch_reads_when_to_wake_in_its_own_transaction():
    (job,) = due_jobs(1)
    later = api.schedule("project.tasks.record", run_at=db_now() + timedelta(seconds=30))
    result = claim_due_jobs("b", 10, next_due=True)
    assert [r.job_id for r in result.runs] == [job.pk]
    assert result.wake is not None
    assert result.wake.due == Job.objects.get(pk=later.pk).next_run_at
    _now, delay = result.wake.until_due()
    assert 28 < delay <= 30
    # a full batch reads nothing: more may be due, the beat claims again at once
    past = db_now() - timedelta(seconds=1)
    api.schedule_many({"task": "project.tasks.record", "run_at": past} for _ in range(2))
    assert claim_due_jobs("b", 2, next_due=True).wake is None
    # nor does a claim not asked to
    assert claim_due_jobs("b", 10).wake is None


@pytest.mark.postgresql
def test_the_claim_reaches_the_rows_it_takes_by_their_key_however_small_the_table():
    """The due ids are planned as the batch's size (the CTE's LIMIT): joined to the job table,
    the update was planned as a hash join over a scan of every job once the table was small
    enough (a few thousand jobs), and took 5.5 ms of a 6.5 ms claim at 40,000."""
    later = db_now() + timedelta(hours=1)
    api.schedule_many({"task": "project.tasks.record", "run_at": later} for _ in range(3000))
    due_jobs(5)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE schedapp_job")
        cursor.execute("EXPLAIN " + query("claim_due_jobs"), {"limit": 500, "beat": "b"})
        plan = "\n".join(row[0] for row in cursor.fetchall())
    # (schedapp_job itself: an empty partition of schedapp_jobrun may well be read whole)
    assert not re.search(r"Seq Scan on schedapp_job\b", plan), plan


def test_publish_failure_releases_claims_and_fences_the_old_token():
    (job,) = due_jobs(1)
    (run,) = claim_due_jobs("beat-1", 10).runs
    assert lease.release_claims([(job.pk, run.token)], "broker down") == 1
    job.refresh_from_db()
    assert job.state == JobState.SCHEDULED and job.token > run.token
    assert JobRun.objects.get(pk=run.run_id).status == RunStatus.LOST
    # a message that did reach the broker after all is refused at the door
    assert start_run(job.pk, run.token, "w1") is DoorVerdict.STALE_TOKEN
    (again,) = claim_due_jobs("beat-1", 10).runs
    assert again.job_id == job.pk


def test_giving_back_a_batch_keeps_the_claim_of_a_run_a_worker_already_admitted():
    # Given a batch of two claims, the first of whose messages reached a worker that admitted
    # it before the beat was stopped part-way through publishing the batch
    due_jobs(2)
    first, second = claim_due_jobs("beat-1", 10).runs
    assert start_run(first.job_id, first.token) is DoorVerdict.ADMITTED
    # When the beat gives the whole batch back
    released = lease.release_claims([(r.job_id, r.token) for r in (first, second)], "stopped")
    # Then only the run that never started is given back; the admitted one keeps its claim,
    # so no beat claims its job again while it runs
    assert released == 1
    job = Job.objects.get(pk=first.job_id)
    assert (job.state, job.token) == (JobState.RUNNING, first.token)
    assert JobRun.objects.get(pk=first.run_id).status == RunStatus.RUNNING
    assert [r.job_id for r in claim_due_jobs("beat-2", 10).runs] == [second.job_id]
    # and its outcome is applied, not recorded as stale
    assert complete_run(first.job_id, first.token, "succeeded").applied


@pytest.mark.postgresql
def test_the_claim_query_walks_the_due_index_not_the_table():
    due_jobs(5)
    with connection.cursor() as cursor, transaction.atomic():
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("EXPLAIN " + query("claim_due_jobs"), {"limit": 10, "beat": "b"})
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "schedapp_job_due" in plan
    assert "Seq Scan on schedapp_job" not in plan


def lease_left(job_id: int) -> float:
    job = Job.objects.get(pk=job_id)
    return (job.lease_expires_at - db_now()).total_seconds()


def test_a_message_left_unstarted_waits_twice_as_long_each_time_it_is_sent_again():
    # Given a job whose message waits in a queue behind busy workers: its lease runs out
    # before any worker's door sees it, again and again
    (job,) = due_jobs(1, lease_seconds=10)
    (first,) = claim_due_jobs("beat-1", 10).runs
    assert 9 < lease_left(job.pk) <= 10
    waits = []
    for _ in range(6):
        expire_lease(job.pk)
        claim_due_jobs("beat-1", 10)  # reaped (never started) and sent again
        waits.append(lease_left(job.pk))
    # Then each copy is given twice the wait of the one before, up to 16 leases: a backlog
    # longer than a lease does not fill the queue with one copy per lease (nor expire the
    # newest copy behind the older ones)
    assert [round(w / 10) for w in waits] == [2, 4, 8, 16, 16, 16], waits
    # ... and once a worker's door admits the newest copy, the run holds an ordinary lease
    current = Job.objects.get(pk=job.pk)
    assert start_run(job.pk, current.token) is DoorVerdict.ADMITTED
    assert 9 < lease_left(job.pk) <= 10
    # ... and the job's next dispatch waits one lease again
    assert complete_run(job.pk, current.token, lease.FAILED, error="boom").applied
    Job.objects.filter(pk=job.pk).update(next_run_at=db_now() - timedelta(seconds=1))
    (retry,) = claim_due_jobs("beat-1", 10).runs
    assert retry.token > current.token
    assert 9 < lease_left(job.pk) <= 10
    assert first.token < current.token


@pytest.mark.parametrize("action", ["run_now", "requeue", "resume"])
def test_a_person_setting_a_job_going_again_gives_it_an_ordinary_wait(action):
    # Given a job whose last copies waited in a queue unstarted, three times in a row
    (job,) = due_jobs(1, lease_seconds=10)
    state = {"run_now": JobState.SUCCEEDED, "requeue": JobState.DEAD, "resume": JobState.PAUSED}
    Job.objects.filter(pk=job.pk).update(
        state=state[action], unstarted_dispatches=3, claimed_by="", lease_expires_at=None
    )
    # When a person runs it now, requeues or resumes it
    getattr(api, action)(job)
    # Then its next copy waits one lease, not eight
    assert len(claim_due_jobs("beat-1", 10).runs) == 1
    assert 9 < lease_left(job.pk) <= 10


def job_missing(every: timedelta, count: int, **options) -> Job:
    """A job every ``every`` that missed its last ``count`` occurrences, the latest half an
    ``every`` ago (an interval, so the test does not depend on the wall clock)."""
    now = db_now()
    latest = now - every / 2
    job = api.schedule(
        "project.tasks.record", interval=every, interval_anchor=latest, name="late", **options
    )
    first = latest - (count - 1) * every
    Job.objects.filter(pk=job.pk).update(scheduled_for=first, next_run_at=first)
    return Job.objects.get(pk=job.pk)


def test_run_recent_folds_missed_occurrences_within_its_grace_into_the_latest():
    """As Celery sends a crontab once under beat_cron_starting_deadline: the grace is a
    deadline, not a window in which each missed occurrence runs in turn."""
    every = timedelta(minutes=5)  # missed 7.5 and 2.5 minutes ago, both within the grace
    job = job_missing(every, 2, misfire_policy="run_recent", misfire_grace=600)
    (run,) = claim_due_jobs("beat-1", 10).runs
    assert run.scheduled_for == job.scheduled_for + every  # the latest
    job.refresh_from_db()
    assert job.missed_runs == 1
    start_run(job.pk, run.token)
    assert complete_run(job.pk, run.token, lease.SUCCEEDED).applied
    assert claim_due_jobs("beat-1", 10).runs == []  # not the next one at once
    job.refresh_from_db()
    assert job.next_run_at == run.scheduled_for + every


def test_run_recent_skips_when_its_latest_missed_occurrence_is_older_than_its_grace():
    every = timedelta(hours=1)
    job = job_missing(every, 3, misfire_policy="run_recent", misfire_grace=600)
    first = job.scheduled_for
    result = claim_due_jobs("beat-1", 10)
    assert (result.runs, result.skipped_misfires) == ([], 1)
    job.refresh_from_db()
    assert (job.state, job.missed_runs) == (JobState.SCHEDULED, 3)
    assert job.next_run_at == first + 3 * every  # the first one after now


def test_a_job_whose_token_went_back_behind_its_runs_is_quarantined_and_the_rest_claimed():
    """A job row restored from an older backup (its token behind a run it already has): the
    claim's run row broke the run table's unique key, and the whole claim failed, every tick.
    Here on every store: the claim goes on one row at a time and quarantines that job."""
    restored, healthy = due_jobs(2)
    JobRun.objects.create(
        job=restored,
        token=restored.token + 1,
        scheduled_for=restored.scheduled_for,
        due_at=restored.next_run_at,
        dispatched_at=db_now(),
        task_id="from-the-backup",
        status=RunStatus.SUCCEEDED,
    )
    result = claim_due_jobs("beat-1", 10)
    assert [r.job_id for r in result.runs] == [healthy.pk]
    assert [q.job_id for q in result.quarantined] == [restored.pk]
    restored.refresh_from_db()
    assert restored.state == JobState.DEAD and restored.last_status == "quarantined"
    assert "the claim cannot take this row (IntegrityError" in restored.last_error


def _job_rows_read(fn) -> int:
    """Rows of schedapp_job ``fn`` read (heap fetches through an index, and sequential)."""
    read = (
        "SELECT coalesce(idx_tup_fetch, 0) + coalesce(seq_tup_read, 0) "
        "FROM pg_stat_xact_user_tables WHERE relname = 'schedapp_job'"
    )
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(read)  # (this backend's counts not yet flushed, from before too)
        before = cursor.fetchone()[0]
        fn()
        cursor.execute(read)
        return cursor.fetchone()[0] - before


def test_with_statistics_from_before_a_burst_the_looks_beside_the_claim_read_no_running_job():
    """Right after a burst's claims the planner's statistics (from the bulk load: every job
    scheduled) still see few running jobs. The look for runs to supersede (once a second,
    in the claim's transaction) and the beat's look at when to wake read only their partial
    indexes, not every running job through (state, task): with 100,000 claimed jobs those
    took 80-260 ms and 170 ms a look. Before, both read each of the 3,000 here."""
    from schedapp.lease.supersede import supersede_due

    api.schedule_many(
        {
            "task": "project.tasks.record",
            "run_at": db_now() - timedelta(seconds=1),
            "name": f"burst-{i}",
        }
        for i in range(3000)
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE schedapp_job")  # as autovacuum would, soon after the load
    while claim_due_jobs("beat-1", 500).claimed:
        pass
    assert Job.objects.filter(state=JobState.RUNNING).count() == 3000
    assert _job_rows_read(supersede_due) < 50
    assert _job_rows_read(get_store().next_due) < 50
