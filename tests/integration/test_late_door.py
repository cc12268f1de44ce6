"""The door refuses a late run under ``skip_late`` (docs/semantics.md, Deadlines): a run
dispatched in time but delivered past ``scheduled_for + start_deadline`` (a stopped worker)
is not executed, costs no attempt, is recorded in the ledger as ``late``, and its job goes on
to its next occurrence as the claim's ``skip_late`` moves it; both stores, both kinds of run
(the job's lease, allow_all's own), and a retry is not subject to the start deadline."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection

from schedapp import api
from schedapp.db import db_now
from schedapp.lease import admit_run, claim_due_jobs
from schedapp.models import Job, JobRun, JobState, Occurrence
from schedapp.store import portable

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgresql]

TASK = "project.tasks.record"
MINUTE = timedelta(minutes=1)


def dispatched(*, skip_late: bool = True, **options) -> tuple[Job, JobRun]:
    """A job claimed and dispatched in time whose occurrence is now 30 s past its 10 s start
    deadline: the message waited behind a stopped worker."""
    occurrence = db_now() - timedelta(seconds=30)
    job = api.schedule(
        TASK,
        interval=5 * MINUTE,
        interval_anchor=occurrence,
        name="late-door",
        start_deadline=10,
        **options,
    )
    Job.objects.filter(pk=job.pk).update(scheduled_for=occurrence, next_run_at=occurrence)
    # claimed while it was in time (the database's clock cannot be turned back: the claim
    # sees skip_late off, as a claim 30 s ago would have seen the occurrence in time)
    (claimed,) = claim_due_jobs("beat-1", 10).runs
    Job.objects.filter(pk=job.pk).update(skip_late=skip_late)
    run = JobRun.objects.get(job=job, token=claimed.token)
    run.refresh_from_db()
    return Job.objects.get(pk=job.pk), run


def door(alias: str, run: JobRun) -> str:
    if alias == "portable":
        return str(portable._admit("default", db_now(), run.job_id, run.token, "w1", "a1"))
    return str(admit_run(run.job_id, run.token, "w1", "a1"))


@pytest.mark.parametrize("alias", ["postgresql", "portable"])
@pytest.mark.parametrize("overlap", ["buffer_one", "allow_all"])
def test_a_run_delivered_past_its_start_deadline_is_refused_late_and_the_job_goes_on(
    alias, overlap
):
    job, run = dispatched(overlap=overlap)
    missed = run.scheduled_for
    # When its message reaches the door
    assert door(alias, run) == "late"
    # Then it never starts, costs no attempt, and the occurrence is in the ledger as late
    run.refresh_from_db()
    assert (run.status, run.started_at) == ("skipped", None)
    assert "start deadline" in run.error
    [record] = Occurrence.objects.filter(job=job, scheduled_for=missed)
    assert (record.fate, record.count) == ("late", 1)
    # and the next claim moves the job on to its next occurrence, running nothing late
    claim_due_jobs("beat-1", 10)
    job.refresh_from_db()
    assert job.retry_count == 0
    assert job.state == JobState.SCHEDULED
    assert job.scheduled_for > missed
    assert not JobRun.objects.filter(job=job, status__in=["dispatched", "running"]).exists()
    assert Occurrence.objects.filter(job=job, scheduled_for=missed).count() == 1


@pytest.mark.parametrize("alias", ["postgresql", "portable"])
def test_without_skip_late_the_late_run_is_admitted(alias):
    _job, run = dispatched(skip_late=False)
    assert door(alias, run) == "admitted"


@pytest.mark.parametrize("alias", ["postgresql", "portable"])
def test_a_retry_is_not_subject_to_the_start_deadline(alias):
    _job, run = dispatched()
    JobRun.objects.filter(pk=run.pk).update(attempt=2, kind="retry")
    run.refresh_from_db()
    assert door(alias, run) == "admitted"


def test_an_older_worker_calling_v4_still_admits_the_late_run():
    _job, run = dispatched()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT schedapp_admit_run_v4(%s, %s, %s, %s)", [run.job_id, run.token, "w0", "a0"]
        )
        assert cursor.fetchone()[0] == "admitted"
