"""Overlap policies and fixed delay through the claim, the door and the completion, on
PostgreSQL: what happens to the occurrences that came due while a run was in flight, decided
when it ends, and recorded in the ledger."""

from __future__ import annotations

from datetime import timedelta

import pytest

from schedapp import api, explain, lease
from schedapp.db import db_now
from schedapp.lease import admit_run, claim_due_jobs, complete_run
from schedapp.models import Job, JobRun, JobState, Occurrence

pytestmark = pytest.mark.django_db(transaction=True)

MINUTE = timedelta(minutes=1)


def job_running_since(
    minutes: float, *, admitted: bool = True, **options
) -> tuple[Job, lease.ClaimedRun]:
    """A job every minute whose run, for the occurrence ``minutes`` ago, is in flight: claimed
    and admitted (or only dispatched). Its grace is an hour: lateness alone never makes a
    misfire here."""
    occurrence = db_now() - timedelta(minutes=minutes)
    job = api.schedule(
        "project.tasks.record",
        interval=MINUTE,
        interval_anchor=occurrence,
        misfire_grace=timedelta(hours=1),
        name=f"overlap-{options.get('overlap', 'default')}",
        **options,
    )
    Job.objects.filter(pk=job.pk).update(scheduled_for=occurrence, next_run_at=occurrence)
    [run] = claim_due_jobs("beat-1", 10).runs
    assert run.scheduled_for == occurrence
    if admitted:
        assert admit_run(run.job_id, run.token, "w1", admission=f"w1-{run.token}") == "admitted"
    return Job.objects.get(pk=job.pk), run


def succeed(run: lease.ClaimedRun) -> None:
    assert complete_run(run.job_id, run.token, lease.SUCCEEDED).applied


def claim_and_succeed() -> list:
    """Every run the beats would send now, each run to success; their occurrences."""
    ran = []
    while True:
        runs = claim_due_jobs("beat-1", 10).runs
        if not runs:
            return ran
        for run in runs:
            assert admit_run(run.job_id, run.token, "w1", admission=f"w1-{run.token}")
            succeed(run)
            ran.append(run.scheduled_for)


def test_skip_records_what_came_due_during_the_run_and_waits_for_the_next():
    job, run = job_running_since(3.5, overlap="skip")
    # When the run ends, three occurrences after it having come due meanwhile
    succeed(run)
    # Then none of them runs: they are one ledger record, and the job waits for the next
    [record] = Occurrence.objects.filter(job=job)
    assert (record.fate, record.count) == ("overlapped", 3)
    assert (record.scheduled_for, record.last) == (
        run.scheduled_for + MINUTE,
        run.scheduled_for + 3 * MINUTE,
    )
    job.refresh_from_db()
    assert job.state == JobState.SCHEDULED
    assert job.scheduled_for == run.scheduled_for + 4 * MINUTE > db_now()
    assert claim_and_succeed() == []
    # And explain says so for one of them
    answer = explain.explain(job, run.scheduled_for + 2 * MINUTE)
    assert answer.entry is not None and answer.entry.fate == "overlapped"


def test_buffer_all_runs_each_buffered_occurrence_and_drops_beyond_its_bound():
    job, run = job_running_since(3.5, overlap="buffer_all", max_buffer=2)
    succeed(run)
    # The oldest of the three is dropped, the two most recent run one after another, due at
    # once and not as misfires
    [record] = Occurrence.objects.filter(job=job)
    assert (record.fate, record.count, record.scheduled_for) == (
        "buffer_full",
        1,
        run.scheduled_for + MINUTE,
    )
    ran = claim_and_succeed()
    assert ran == [run.scheduled_for + 2 * MINUTE, run.scheduled_for + 3 * MINUTE]
    job.refresh_from_db()
    assert job.missed_runs == 0 and Occurrence.objects.filter(job=job).count() == 1
    assert job.scheduled_for == run.scheduled_for + 4 * MINUTE
    # Every occurrence from the first run to the last has exactly one fate
    runs = set(JobRun.objects.filter(job=job).values_list("scheduled_for", flat=True))
    for k in range(4):
        t = run.scheduled_for + k * MINUTE
        assert (t in runs) != (t == record.scheduled_for), t


def test_buffer_one_is_as_before_overlap_policies():
    job, run = job_running_since(3.5)
    assert job.overlap == "buffer_one"
    succeed(run)
    assert not Occurrence.objects.filter(job=job).exists()
    job.refresh_from_db()
    assert job.scheduled_for == run.scheduled_for + MINUTE  # within its grace: it runs now
    assert claim_and_succeed()[0] == run.scheduled_for + MINUTE


def test_a_fixed_delay_counts_the_next_occurrence_from_the_end_of_the_run():
    job, run = job_running_since(3.5, fixed_delay=True)
    succeed(run)
    job.refresh_from_db()
    ended = JobRun.objects.get(job=job, token=run.token).finished_at
    assert abs(job.interval_anchor - ended) < timedelta(seconds=1)
    assert job.scheduled_for == job.interval_anchor + MINUTE
    assert not Occurrence.objects.filter(job=job).exists()


def test_a_fixed_delay_job_found_late_runs_its_one_occurrence_without_a_misfire():
    job = api.schedule("project.tasks.record", interval=MINUTE, fixed_delay=True, name="fixed-late")
    long_ago = db_now() - timedelta(hours=5)
    Job.objects.filter(pk=job.pk).update(scheduled_for=long_ago, next_run_at=long_ago)
    [run] = claim_due_jobs("beat-1", 10).runs
    assert run.scheduled_for == long_ago
    job.refresh_from_db()
    assert job.missed_runs == 0 and not Occurrence.objects.filter(job=job).exists()


def test_an_unknown_overlap_written_behind_the_apis_back_quarantines_the_job_at_run_end():
    job, run = job_running_since(3.5, overlap="skip")
    Job.objects.filter(pk=job.pk).update(overlap="sometimes")
    result = complete_run(run.job_id, run.token, lease.SUCCEEDED)
    assert result.applied and result.quarantined is not None
    job.refresh_from_db()
    assert job.state == JobState.DEAD and "overlap 'sometimes'" in job.last_error


@pytest.mark.parametrize("overlap", ["cancel_other", "terminate_other"])
def test_a_run_whose_next_occurrence_came_due_is_superseded_and_its_revoke_moves_the_job_on(
    overlap,
):
    # A revoke reaches a running task only by terminating it; under cancel_other it discards
    # the message of a run not started yet
    terminate = overlap == "terminate_other"
    job, run = job_running_since(2.5, overlap=overlap, max_retries=3, admitted=terminate)
    # The claim noted when the run is to be cancelled: the first occurrence after it (those
    # already due then are not the run's to cancel)
    job.refresh_from_db()
    assert job.supersede_at == run.scheduled_for + 3 * MINUTE and not job.superseded
    assert lease.supersede_due() == []
    # When that time has come and a beat looks: it is superseded, to be revoked (terminated
    # under terminate_other)
    Job.objects.filter(pk=job.pk).update(supersede_at=db_now())
    [superseded] = lease.supersede_due()
    assert (superseded.job_id, superseded.token) == (job.pk, run.token)
    assert superseded.task_ids == (run.task_id,)
    assert superseded.terminate == (overlap == "terminate_other")
    assert lease.supersede_due() == []  # once
    # And when the worker reports the revoke: the run is cancelled, not a failed attempt to
    # retry; the latest occurrence due runs now, the one before it recorded
    lease.record_cancelled(job.pk, run.token, terminated=terminate)
    job.refresh_from_db()
    closed = JobRun.objects.get(job=job, token=run.token)
    assert closed.status == "cancelled" and "superseded" in closed.error
    assert (job.state, job.retry_count, job.superseded) == (JobState.SCHEDULED, 0, False)
    assert job.scheduled_for == run.scheduled_for + 2 * MINUTE
    [record] = Occurrence.objects.filter(job=job)
    assert (record.fate, record.count) == ("overlapped", 1)
    assert record.scheduled_for == run.scheduled_for + MINUTE
    assert [r.scheduled_for for r in claim_due_jobs("beat-1", 10).runs] == [job.scheduled_for]


def test_a_superseded_run_that_ends_on_its_own_is_not_retried():
    job, run = job_running_since(1.5, overlap="cancel_other", max_retries=3)
    Job.objects.filter(pk=job.pk).update(supersede_at=db_now())
    assert len(lease.supersede_due()) == 1
    # The task could not be interrupted (cancel_other): it fails at its end
    assert complete_run(run.job_id, run.token, lease.FAILED, error="boom").applied
    job.refresh_from_db()
    assert (job.retry_count, job.scheduled_for) == (0, run.scheduled_for + MINUTE)
    assert JobRun.objects.get(job=job, token=run.token).status == "failed"


def test_a_run_not_yet_due_to_be_superseded_is_left_alone():
    job, run = job_running_since(0.5, overlap="terminate_other")
    assert lease.supersede_due() == []
    Job.objects.filter(pk=job.pk).update(overlap="cancel_other")  # (only the time matters)
    succeed(run)  # ends before the next occurrence: as any run
    job.refresh_from_db()
    assert (job.scheduled_for, job.supersede_at) == (run.scheduled_for + MINUTE, None)
    assert not Occurrence.objects.filter(job=job).exists()


def test_a_superseded_run_whose_message_never_started_is_not_sent_again():
    job, run = job_running_since(2.5, overlap="cancel_other")
    Job.objects.filter(pk=job.pk).update(supersede_at=db_now())
    assert len(lease.supersede_due()) == 1
    # Its worker died before starting it: the lease lapses
    JobRun.objects.filter(job=job, token=run.token).update(status="dispatched", started_at=None)
    Job.objects.filter(pk=job.pk).update(lease_expires_at=db_now() - MINUTE)
    assert claim_due_jobs("beat-1", 10).reap.dropped == 1  # (due from its statement's now())
    # Then the latest occurrence runs, not the superseded one again
    runs = claim_due_jobs("beat-1", 10).runs
    assert [r.scheduled_for for r in runs] == [run.scheduled_for + 2 * MINUTE]
    # and the skipped run says why: superseded, not a message past its expiry
    skipped = JobRun.objects.get(job=job, token=run.token)
    assert skipped.status == "skipped"
    assert skipped.error == "superseded by a later occurrence before a worker started it"
