"""Deadlines per job (docs/semantics.md, Deadlines): a late occurrence skipped by the claim
is recorded in the ledger; each breach (late, overrunning, missed finish_by, failing, dead)
is recorded once per incident, its signal sent once after the recording commits, and a
``recovered`` recorded and sent when it ends. The detection runs on both stores."""

from __future__ import annotations

from datetime import timedelta

import pytest

from schedapp import api, explain
from schedapp.db import db_now
from schedapp.lease import claim_due_jobs
from schedapp.models import Job, JobRun, JobState, Occurrence

pytestmark = pytest.mark.django_db(transaction=True)

TASK = "project.tasks.record"
MINUTE = timedelta(minutes=1)


def job_found(ago: timedelta, every: timedelta = 5 * MINUTE, **options) -> Job:
    """An interval job whose pending occurrence was ``ago`` before the database's now."""
    occurrence = db_now() - ago
    job = api.schedule(TASK, interval=every, interval_anchor=occurrence, name="j", **options)
    Job.objects.filter(pk=job.pk).update(scheduled_for=occurrence, next_run_at=occurrence)
    return Job.objects.get(pk=job.pk)


# --- skip_late: the claim ----------------------------------------------------------------------


def test_an_occurrence_past_its_start_deadline_is_skipped_and_recorded_late():
    # Given a job skipping late occurrences, 30 s past one with a 10 s deadline (grace 60 s)
    job = job_found(timedelta(seconds=30), start_deadline=10, skip_late=True)
    missed = job.scheduled_for
    # When a beat claims
    result = claim_due_jobs("beat-1", 10)
    # Then it runs nothing, records the occurrence as late, and waits for the next one
    assert result.runs == [] and not JobRun.objects.filter(job=job).exists()
    [record] = Occurrence.objects.filter(job=job)
    assert (record.fate, record.scheduled_for, record.count) == ("late", missed, 1)
    assert "start deadline (0:00:10)" in record.detail
    job.refresh_from_db()
    assert (job.state, job.scheduled_for) == (JobState.SCHEDULED, missed + 5 * MINUTE)
    answer = explain.explain(job, missed)
    assert answer.entry is not None and answer.entry.fate == "late"


def test_without_skip_late_the_late_occurrence_runs():
    job = job_found(timedelta(seconds=30), start_deadline=10)
    (run,) = claim_due_jobs("beat-1", 10).runs
    assert run.scheduled_for == job.scheduled_for
    assert not Occurrence.objects.filter(job=job).exists()


def test_older_occurrences_are_late_and_the_policy_decides_among_those_within_the_deadline():
    # Given a minutely job back after 10 minutes, skipping occurrences older than 2 minutes,
    # under run_all: the two within the deadline run, the eight before are late
    job = job_found(
        timedelta(minutes=9, seconds=30),
        every=MINUTE,
        start_deadline=120,
        skip_late=True,
        misfire_policy="run_all",
    )
    first = job.scheduled_for
    (run,) = claim_due_jobs("beat-1", 10).runs
    [late] = Occurrence.objects.filter(job=job, fate="late")
    assert (late.scheduled_for, late.count) == (first, 8)
    assert run.scheduled_for == first + 8 * MINUTE
