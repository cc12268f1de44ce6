"""An existing database migrates forward with no loss.

From the last released state (migration 0017) with rows in it (a job of every schedule kind,
run history, a lease held by a running run, a dispatched run not yet admitted), to the latest
migration: every row and column is still there, and the current code claims, admits, renews
and completes on those rows (through the versioned functions the newer migrations create).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.apps.registry import Apps
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test import override_settings

from schedapp import lease
from schedapp.db import db_now
from schedapp.lease import DoorVerdict
from schedapp.message import RunHeaders
from schedapp.sql import query

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgresql]

RELEASED = ("schedapp", "0017_retries_exhausted")
TASK = "project.tasks.record"


def migrate_to(targets: list[tuple[str, str]]) -> None:
    MigrationExecutor(connection).migrate(targets)


def latest() -> list[tuple[str, str]]:
    return MigrationExecutor(connection).loader.graph.leaf_nodes()


@pytest.fixture
def released() -> Iterator[Apps]:
    """The database as the last release left it; migrated to the latest again whatever happens,
    so a failure here leaves no other test an old schema."""
    migrate_to([RELEASED])
    try:
        yield MigrationExecutor(connection).loader.project_state([RELEASED]).apps
    finally:
        migrate_to(latest())


def snapshot() -> dict[str, list[dict[str, Any]]]:
    """Every row of every schedapp table, column by column."""
    tables = [t for t in connection.introspection.table_names() if t.startswith("schedapp_")]
    rows = {}
    with connection.cursor() as cursor:
        for table in tables:
            cursor.execute(f"SELECT * FROM {table} ORDER BY 1")
            names = [c.name for c in cursor.description]
            rows[table] = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
    return rows


def fill(apps: Apps) -> dict[str, int]:
    """Rows as the release wrote them: each schedule kind due now, a solar job not yet due,
    a running job holding a lease (its run started), a dispatched run waiting for its door."""
    job, run = apps.get_model("schedapp", "Job"), apps.get_model("schedapp", "JobRun")
    now = db_now()
    due = now - timedelta(seconds=1)
    ids = {
        "cron": job.objects.create(
            name="cron",
            task=TASK,
            cron="*/5 * * * *",
            timezone="Europe/Paris",
            cron_day_or=False,
            scheduled_for=due,
            next_run_at=due,
            args=[1, "a"],
            kwargs={"k": "v"},
            message_options={"priority": 3},
            priority=4,
        ).pk,
        "interval": job.objects.create(
            name="interval",
            task=TASK,
            interval=timedelta(minutes=10),
            interval_anchor=due - timedelta(hours=1),
            scheduled_for=due,
            next_run_at=due,
            description="every ten minutes",
            jitter=0,
        ).pk,
        "run_at": job.objects.create(
            name="run_at", task=TASK, run_at=due, scheduled_for=due, next_run_at=due
        ).pk,
        "solar": job.objects.create(
            name="solar",
            task=TASK,
            solar_event="sunrise",
            latitude=48.85,
            longitude=2.35,
            scheduled_for=now + timedelta(hours=5),
            next_run_at=now + timedelta(hours=5),
        ).pk,
    }
    held = job.objects.create(
        name="held",
        task=TASK,
        interval=timedelta(hours=1),
        interval_anchor=due,
        scheduled_for=due,
        next_run_at=due,
        state="running",
        token=7,
        claimed_by="beat-old",
        lease_expires_at=now + timedelta(minutes=5),
        lease_seconds=300,
    )
    waiting = job.objects.create(
        name="waiting",
        task=TASK,
        run_at=due,
        scheduled_for=due,
        next_run_at=due,
        state="running",
        token=3,
        claimed_by="beat-old",
        unstarted_dispatches=1,
        lease_expires_at=now + timedelta(minutes=5),
    )
    common = {"scheduled_for": due, "due_at": due, "claimed_by": "beat-old", "dispatched_at": due}
    run.objects.create(
        job=held,
        token=6,
        attempt=1,
        task_id=f"schedapp:{held.pk}:6",
        status="succeeded",
        started_at=due,
        finished_at=due,
        worker="w-old",
        admission="a6",
        heartbeats=4,
        **common,
    )
    run.objects.create(
        job=held,
        token=7,
        attempt=1,
        task_id=f"schedapp:{held.pk}:7",
        status="running",
        started_at=due,
        heartbeat_at=due,
        heartbeats=2,
        worker="w-old",
        admission="a7",
        **common,
    )
    run.objects.create(
        job=waiting,
        token=3,
        attempt=1,
        task_id=f"schedapp:{waiting.pk}:3",
        status="dispatched",
        **common,
    )
    apps.get_model("schedapp", "Node").objects.create(
        name="w-old", kind="worker", started_at=due, last_seen_at=now
    )
    apps.get_model("schedapp", "OnceKey").objects.create(key="once", job_id=held.pk)
    return {**ids, "held": held.pk, "waiting": waiting.pk}


def test_a_released_database_migrates_forward_with_every_row_and_keeps_working(released):
    from schedapp.dispatch import message_headers
    from schedapp.models import Job, JobRun

    # Given the last release's schema with its rows
    ids = fill(released)
    before = snapshot()

    # When it migrates to the latest migration (with a default catch-up window for new jobs)
    with override_settings(SCHEDAPP_DEFAULT_CATCHUP_WINDOW=timedelta(hours=1)):
        migrate_to(latest())

    # Then every row is there with every column it had, unchanged
    after = snapshot()
    assert set(before) <= set(after)
    for table, rows in before.items():
        assert len(after[table]) == len(rows), table
        for old, new in zip(rows, after[table], strict=True):
            assert {name: new.get(name, "<dropped>") for name in old} == old, table
    # ... and no job has a catch-up window: the default is for new jobs, not existing ones
    assert {row["catchup_window"] for row in after["schedapp_job"]} == {None}
    # ... and every job keeps the DST rule it had: the documented default (0023)
    assert {row["dst_policy"] for row in after["schedapp_job"]} == {"gap_end+first"}

    # And the current code claims the due rows of every schedule kind ...
    claimed = {run.job_id: run for run in lease.claim_due_jobs("beat-new", 10).runs}
    assert set(claimed) == {ids["cron"], ids["interval"], ids["run_at"]}
    # ... lets their runs, and the one dispatched before the upgrade, through the door ...
    for run in claimed.values():
        assert lease.admit_run(run.job_id, run.token, "w-new", f"n{run.job_id}") == (
            DoorVerdict.ADMITTED
        )
    assert lease.admit_run(ids["waiting"], 3, "w-new", "n-waiting") == DoorVerdict.ADMITTED
    assert Job.objects.get(pk=ids["waiting"]).unstarted_dispatches == 0
    # ... renews every lease, the one held across the upgrade too ...
    held = [(ids["held"], 7), (ids["waiting"], 3)] + [(r.job_id, r.token) for r in claimed.values()]
    assert lease.renew_leases(held).renewed == set(held)
    assert JobRun.objects.get(job_id=ids["held"], token=7).heartbeats == 3
    # ... and completes them: the run started before the upgrade, the common success in one
    # call of the function, and the recurring ones through a worker's headers
    assert lease.complete_run(ids["held"], 7, lease.SUCCEEDED).applied
    one_off = claimed[ids["run_at"]]
    with connection.cursor() as cursor:
        cursor.execute(
            query("succeed_run"),
            [
                one_off.job_id,
                one_off.token,
                one_off.scheduled_for,
                None,
                True,
                "",
                "UTC",
                None,
                None,
                one_off.run_id,
            ],
        )
        assert cursor.fetchone() == (True,)
    for name in ("cron", "interval"):
        run = claimed[ids[name]]
        headers = RunHeaders.read(message_headers(run, "test"))
        assert lease.complete_run(run.job_id, run.token, lease.SUCCEEDED, headers=headers).applied
    states = dict(Job.objects.values_list("name", "state"))
    assert states == {
        "cron": "scheduled",
        "interval": "scheduled",
        "run_at": "succeeded",
        "solar": "scheduled",
        "held": "scheduled",
        "waiting": "running",
    }


def test_the_catch_up_window_migration_can_be_run_again_over_its_own_work():
    """It is not atomic: run again after a failure part way, it keeps what is there."""
    import importlib

    from django.apps import apps as current

    (name,) = [n for app, n in MigrationExecutor(connection).loader.graph.nodes if "catchup" in n]
    migration = importlib.import_module(f"schedapp.migrations.{name}")
    # Given the latest schema (column and constraints there), when each step runs again
    with connection.schema_editor(atomic=False) as editor:
        migration.add_column(current, editor)
        migration.add_constraints(current, editor)
    # Then nothing failed, and the constraints are there and valid, once each
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT conname, convalidated FROM pg_constraint "
            "WHERE conrelid = 'schedapp_job'::regclass AND conname LIKE %s ORDER BY 1",
            ["schedapp_job_catchup_window_%"],
        )
        assert cursor.fetchall() == [
            ("schedapp_job_catchup_window_in_range", True),
            ("schedapp_job_catchup_window_readable", True),
        ]


def test_the_dst_policy_migration_can_be_run_again_over_its_own_work():
    """Not atomic either: run again, it keeps the column and its one valid constraint."""
    import importlib

    from django.apps import apps as current

    (name,) = [n for app, n in MigrationExecutor(connection).loader.graph.nodes if "dst" in n]
    migration = importlib.import_module(f"schedapp.migrations.{name}")
    with connection.schema_editor(atomic=False) as editor:
        migration.add_column(current, editor)
        migration.add_constraint(current, editor)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT conname, convalidated FROM pg_constraint "
            "WHERE conrelid = 'schedapp_job'::regclass AND conname LIKE %s ORDER BY 1",
            ["schedapp_job_dst_policy_%"],
        )
        assert cursor.fetchall() == [("schedapp_job_dst_policy_valid", True)]
        cursor.execute(
            "SELECT column_default FROM information_schema.columns "
            "WHERE table_name = 'schedapp_job' AND column_name = 'dst_policy'"
        )
        assert "gap_end+first" in cursor.fetchone()[0]
