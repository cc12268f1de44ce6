"""The revoked mark of an overrun is a column (``Breach.revoked``, migration 0041), not a
marker string in the breach's detail: the pass records it and reads it, and the migration marks
the rows written before it from the marker."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.apps.registry import Apps
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test import override_settings

from schedapp.deadlines import REVOKED, check_deadlines
from schedapp.models import Breach, Job, JobRun, JobState, Notification
from tests.integration.test_deadlines import make, now_of, run
from tests.integration.test_notifications import hook
from tests.receivers import webhook_receiver

pytestmark = pytest.mark.django_db(transaction=True)
MINUTE = timedelta(minutes=1)
BEFORE = ("schedapp", "0040_admit_run_v5")
AFTER = ("schedapp", "0041_breach_revoked")


def overrunning(revoke: bool, token: int) -> tuple[Job, JobRun]:
    now = now_of("default")
    job = make(
        "default",
        name=f"overrun-{token}",
        max_runtime=timedelta(seconds=30),
        revoke_overrun=revoke,
        state=JobState.RUNNING,
        lease_expires_at=now + MINUTE,
        token=token,
    )
    return job, run("default", job, status="running", started_at=now - MINUTE)


def end(job: Job, running: JobRun) -> None:
    JobRun.objects.filter(pk=running.pk).update(status="succeeded", finished_at=running.started_at)
    Job.objects.filter(pk=job.pk).update(state=JobState.SCHEDULED)


def test_the_pass_records_the_revoked_mark_on_its_column():
    revoked, _ = overrunning(True, 7)
    kept, _ = overrunning(False, 8)
    check_deadlines()
    assert Breach.objects.get(job=revoked).revoked
    assert not Breach.objects.get(job=kept).revoked


def test_the_recovery_reads_the_column_not_the_detail():
    with webhook_receiver() as receiver:
        with override_settings(SCHEDAPP_NOTIFICATIONS={"ops": hook(receiver.url)}):
            # Given two overruns not revoked by the pass, one marked revoked on its column
            # (its detail without the marker), the other with the marker in its detail only
            marked, marked_run = overrunning(False, 3)
            worded, worded_run = overrunning(False, 4)
            check_deadlines()
            Breach.objects.filter(job=marked).update(revoked=True)
            Breach.objects.filter(job=worded).update(detail=f"overran{REVOKED}")
            # When both runs end before the alerts went out
            end(marked, marked_run)
            end(worded, worded_run)
            assert len(check_deadlines().recovered) == 2
            # Then the revoked one keeps its alert and its recovery follows it; the other,
            # whatever its detail says, is withdrawn
            kinds = sorted(
                Notification.objects.filter(job_id=marked.pk).values_list("kind", flat=True)
            )
            assert kinds == ["overrunning", "recovered"]
            assert not Notification.objects.filter(job_id=worded.pk).exists()


@pytest.fixture
def before() -> Iterator[Apps]:
    executor = MigrationExecutor(connection)
    executor.migrate([BEFORE])
    try:
        yield MigrationExecutor(connection).loader.project_state([BEFORE]).apps
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())


@pytest.mark.postgresql
def test_the_migration_marks_the_breaches_whose_detail_says_revoked(before):
    # the job as the schema before 0041 has it (today's model has columns added since)
    job = before.get_model("schedapp", "Job").objects.create(
        name="overrun-9", task="project.tasks.record", interval=MINUTE, timezone="UTC",
        state="paused",
    )
    OldBreach = before.get_model("schedapp", "Breach")
    now = now_of("default")
    said = OldBreach.objects.create(
        job_id=job.pk, kind="overrunning", scheduled_for=now, detail=f"ran long{REVOKED}"
    )
    cleared = OldBreach.objects.create(
        job_id=job.pk,
        kind="overrunning",
        scheduled_for=now - MINUTE,
        detail=f"ran long{REVOKED}",
        cleared_at=now,
    )
    plain = OldBreach.objects.create(
        job_id=job.pk, kind="late", scheduled_for=now, detail="not started"
    )
    MigrationExecutor(connection).migrate([AFTER])
    marks = dict(
        Breach.objects.filter(pk__in=[said.pk, cleared.pk, plain.pk]).values_list("pk", "revoked")
    )
    assert marks == {said.pk: True, cleared.pk: True, plain.pk: False}
