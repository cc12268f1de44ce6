"""Rows changed behind the API's back (by SQL, an old release, a restore): one such row among
healthy ones never stops a beat. The database refuses what can never be valid; a row it
holds anyway is quarantined (``dead``, with the reason) by whoever finds it, and the healthy
jobs are claimed and dispatched as if it were not there (DESIGN 19)."""

from __future__ import annotations

import importlib
from datetime import timedelta

import pytest
from django.apps import apps as django_apps
from django.db import DatabaseError, connection, transaction

from schedapp import api, beat, policies
from schedapp.celeryapp import celery_app
from schedapp.db import db_now
from schedapp.lease import Completion, admit_run, claim_due_jobs, complete_run
from schedapp.models import Job, JobRun, JobState, RunStatus

pytestmark = [pytest.mark.django_db, pytest.mark.postgresql]
TASK = "project.tasks.record"


def sql(statement: str, params: list | None = None) -> None:
    with connection.cursor() as cursor:
        cursor.execute(statement, params or [])


def refused(statement: str, params: list | None = None) -> bool:
    """Whether the database refuses a write (in a savepoint: the test goes on either way)."""
    try:
        with transaction.atomic():
            sql(statement, params)
    except DatabaseError:
        return True
    return False


def due_jobs(*names: str, **options) -> list[Job]:
    """Interval jobs due a second ago, in the order given."""
    jobs = [api.schedule(TASK, interval=60, name=name, **options) for name in names]
    due = db_now() - timedelta(seconds=1)
    Job.objects.filter(pk__in=[j.pk for j in jobs]).update(scheduled_for=due, next_run_at=due)
    return jobs


def quarantined(job: Job) -> str:
    """The reason a job was quarantined for (it must be dead, its reason recorded)."""
    # (read column by column: the row may hold what Python cannot load, args nested too deep)
    row = Job.objects.values(
        "state", "last_status", "last_error", "next_run_at", "lease_expires_at"
    ).get(pk=job.pk)
    assert row["state"] == JobState.DEAD, row
    assert row["last_status"] == "quarantined" and row["last_error"].startswith("quarantined: ")
    assert row["next_run_at"] is None and row["lease_expires_at"] is None
    return row["last_error"]


# --- 1. a due job whose occurrence is NULL -----------------------------------------------------


def test_a_due_job_without_its_occurrence_is_refused_by_the_database():
    # Given a due job among others
    (job,) = due_jobs("no-occurrence")
    # When its occurrence is set NULL behind the API's back, the database refuses it
    assert refused("UPDATE schedapp_job SET scheduled_for = NULL WHERE id = %s", [job.pk])


def test_a_claim_quarantines_a_row_it_cannot_claim_and_claims_the_others():
    # Given a row without its occurrence, from before the constraint (or a DBA dropped it),
    # the first in the due order, among healthy due jobs
    bad, *healthy = due_jobs("no-occurrence", "healthy-1", "healthy-2")
    sql("ALTER TABLE schedapp_job DROP CONSTRAINT IF EXISTS schedapp_job_occurrence_known")
    sql("UPDATE schedapp_job SET scheduled_for = NULL WHERE id = %s", [bad.pk])
    # When a beat claims (the statement inserted a run with a NULL occurrence and failed)
    result = claim_due_jobs("beat-1", 10)
    # Then the healthy jobs are claimed, and the bad one is dead with the database's reason
    assert sorted(r.job_id for r in result.runs) == sorted(j.pk for j in healthy)
    assert [q.job_id for q in result.quarantined] == [bad.pk]
    assert "scheduled_for" in quarantined(bad)
    assert not JobRun.objects.filter(job=bad, status=RunStatus.DISPATCHED).exists()
    # ... and the next claim is an ordinary one
    assert claim_due_jobs("beat-1", 10).runs == []


def unreadable(job: Job) -> None:
    """Give a job a time psycopg cannot read (infinity), as a row from before migration 0016
    could hold (its constraint is dropped here, in the test's transaction)."""
    sql("ALTER TABLE schedapp_job DROP CONSTRAINT IF EXISTS schedapp_job_updated_at_in_range")
    sql("UPDATE schedapp_job SET updated_at = 'infinity' WHERE id = %s", [job.pk])


def test_the_reaper_quarantines_a_row_it_cannot_read_and_the_claim_goes_on():
    # Given a job whose run started and whose lease expired, its row unreadable, and a
    # healthy job due
    bad, healthy = due_jobs("unreadable", "healthy")
    earlier = db_now() - timedelta(seconds=5)
    Job.objects.filter(pk=bad.pk).update(scheduled_for=earlier, next_run_at=earlier)
    (run,) = claim_due_jobs("beat-1", 1).runs
    admit_run(bad.pk, run.token, "w1", "a1")
    Job.objects.filter(pk=bad.pk).update(lease_expires_at=db_now() - timedelta(seconds=1))
    unreadable(bad)
    # When a beat claims (the reaper, inside the claim, could not load the row)
    result = claim_due_jobs("beat-1", 10)
    # Then the healthy job is claimed, and the unreadable one is quarantined with the error
    assert [r.job_id for r in result.runs] == [healthy.pk]
    assert [q.job_id for q in result.reap.quarantined] == [bad.pk]
    assert "the reaper cannot take this row (DataError" in quarantined(bad)
    assert JobRun.objects.get(job=bad).status == RunStatus.FAILED


def test_a_completion_whose_job_row_cannot_be_read_records_the_run_and_quarantines_the_job():
    (job,) = due_jobs("unreadable")
    (run,) = claim_due_jobs("beat-1", 10).runs
    admit_run(job.pk, run.token, "w1", "a1")
    unreadable(job)
    result = complete_run(job.pk, run.token, "succeeded")
    assert result.completion is Completion.APPLIED and result.dead
    assert "its run's outcome cannot be written (DataError" in quarantined(job)
    assert JobRun.objects.get(job=job).status == RunStatus.SUCCEEDED


# --- 2. a backoff of a million years ------------------------------------------------------------


def test_a_failure_with_a_backoff_of_a_million_years_waits_the_longest_delay():
    # Given a failing job whose backoff was set to a million years behind the API's back
    (job,) = due_jobs("forever", max_retries=3)
    sql(
        "UPDATE schedapp_job SET retry_backoff = '1000000 years', "
        "retry_backoff_max = '1000000 years' WHERE id = %s",
        [job.pk],
    )
    (run,) = claim_due_jobs("beat-1", 10).runs
    admit_run(run.job_id, run.token, "w1", "a1")
    # When its run fails (the completion failed: "timestamp out of range")
    result = complete_run(run.job_id, run.token, "failed", error="boom")
    # Then it is retried after the longest delay schedapp waits, no later
    assert result.completion is Completion.APPLIED
    job.refresh_from_db()
    assert job.state == JobState.SCHEDULED and job.retry_count == 1
    wait = job.next_run_at - db_now()
    assert (
        policies.MAX_DELAY - timedelta(minutes=1) < wait < policies.MAX_DELAY + timedelta(minutes=1)
    )


def test_the_reaper_bounds_a_backoff_of_a_million_years_and_the_claim_goes_on():
    # Given a job with a million-year backoff whose run started and whose worker died
    bad, healthy = due_jobs("forever", "healthy", max_retries=3)
    sql(
        "UPDATE schedapp_job SET retry_backoff = '1000000 years', "
        "retry_backoff_max = '1000000 years' WHERE id = %s",
        [bad.pk],
    )
    earlier = db_now() - timedelta(seconds=5)
    Job.objects.filter(pk=bad.pk).update(scheduled_for=earlier, next_run_at=earlier)
    runs = claim_due_jobs("beat-1", 1).runs  # the bad one alone (it is due first)
    assert [r.job_id for r in runs] == [bad.pk]
    admit_run(bad.pk, runs[0].token, "w1", "a1")
    Job.objects.filter(pk=bad.pk).update(lease_expires_at=db_now() - timedelta(seconds=1))
    # When a beat claims (the reaper's write failed inside every claim transaction)
    result = claim_due_jobs("beat-1", 10)
    # Then the healthy job is claimed, and the bad one waits the longest delay for its retry
    assert [r.job_id for r in result.runs] == [healthy.pk]
    assert result.reap.expired == 1
    bad.refresh_from_db()
    assert bad.state == JobState.SCHEDULED and bad.retry_count == 1
    assert bad.next_run_at - db_now() < policies.MAX_DELAY + timedelta(minutes=1)


# --- 3. arguments nested 3,000 deep -------------------------------------------------------------


def test_arguments_nested_too_deep_to_build_a_message_quarantine_the_job_not_the_batch():
    # Given a due job whose args are valid jsonb nested 3,000 deep, among healthy ones
    bad, *healthy = due_jobs("deep", "healthy-1", "healthy-2")
    deep = "[" * 3000 + "]" * 3000
    sql("UPDATE schedapp_job SET args = %s::jsonb WHERE id = %s", [deep, bad.pk])
    # (max_interval: the tick's sleep on its LISTEN connection afterwards, 5 s, is not this
    # test's; a back-off would be cut as short, and publish_failures below still counts it)
    scheduler = beat.LeaseScheduler(celery_app(), lazy=True, max_interval=0.1)
    try:
        # When a beat ticks (building the message raised RecursionError, taken for a broker
        # failure: the whole batch was released and the beat backed off)
        scheduler.tick()
    finally:
        scheduler.close()
    # Then the healthy jobs were dispatched, and the bad one is dead with the reason
    for job in healthy:
        assert JobRun.objects.get(job=job).status == RunStatus.DISPATCHED
    assert "nested" in quarantined(bad)
    assert scheduler.stats["publish_failures"] == 0


# --- what the database refuses, and the rows already there --------------------------------------


def test_the_migration_quarantines_rows_that_break_its_constraints_then_validates_them():
    # Given rows written before migration 0016 (its constraints are dropped here), each
    # breaking one of them, and a healthy row
    migration = importlib.import_module("schedapp.migrations.0016_job_constraints")
    names = [op.constraint.name for op in migration.ADDED]
    for name in names:
        sql(f"ALTER TABLE schedapp_job DROP CONSTRAINT {name}")
    corruptions = {
        "no-occurrence": ("scheduled_for = NULL", "schedapp_job_occurrence_known"),
        "ends-never": ("expires_at = '-infinity'", "schedapp_job_expires_at_in_range"),
        "backoff": ("retry_backoff = '-1 second'", "schedapp_job_retry_backoff_in_range"),
        "token": ("token = -5", "schedapp_job_token_in_range"),
        "state": ("state = 'bogus'", "schedapp_job_state_valid"),
        "leaseless": ("state = 'running', lease_expires_at = NULL", "running_has_lease"),
        "policy": ("misfire_policy = 'twice'", "schedapp_job_misfire_policy_valid"),
        "off-globe": ("latitude = 'NaN'", "schedapp_job_latitude_in_range"),
        "args": ("""args = '{"a": 1}'""", "schedapp_job_args_array"),
    }
    *bad, fine = due_jobs(*corruptions, "fine")
    for job in bad:
        sql(f"UPDATE schedapp_job SET {corruptions[job.name][0]} WHERE id = %s", [job.pk])
    # When the migration runs
    with connection.schema_editor() as editor:
        migration.quarantine_violations(django_apps, editor)
        migration.add_constraints(django_apps, editor)
    # Then every constraint is there and validated ...
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT conname, convalidated FROM pg_constraint WHERE conname = ANY(%s)", [names]
        )
        assert dict(cursor.fetchall()) == dict.fromkeys(names, True)
    # ... each bad row is quarantined, with the constraint it broke and the value it held
    for job in bad:
        reason = quarantined(job)
        assert corruptions[job.name][1] in reason, reason
    assert "held NULL" in quarantined(bad[0]) and "held -infinity" in quarantined(bad[1])
    assert "held -5" in quarantined(bad[3])
    assert Job.objects.get(pk=bad[8].pk).args == []
    assert Job.objects.get(pk=bad[7].pk).latitude == 90
    assert Job.objects.get(pk=bad[6].pk).misfire_policy == "skip"
    # ... and the healthy one is left as it was
    assert Job.objects.get(pk=fine.pk).state == JobState.SCHEDULED


@pytest.mark.parametrize(
    "change",
    [
        "next_run_at = 'infinity'",
        "interval_anchor = '0044-03-15 BC'",
        "interval = '0'",
        "retry_backoff_max = '100000000 years'",
        "token = 9223372036854775807",
        "retry_count = 2147483647",
        "state = 'bogus'",
        "state = 'running', lease_expires_at = NULL",
        "misfire_policy = 'run_twice'",
        "latitude = 'NaN'",
        "longitude = 180.5",
        """kwargs = '[1]'""",
        """message_options = '"x"'""",
    ],
)
def test_the_database_refuses_what_can_never_be_valid(change):
    (job,) = due_jobs("job")
    assert refused(f"UPDATE schedapp_job SET {change} WHERE id = %s", [job.pk])
