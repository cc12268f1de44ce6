"""The runs of one occurrence found by their own index (migration 0050): "did 08:00 run?" reads
that occurrence's runs, not the job's whole history, and the migration builds the index on
every partition of a populated history, taking up one an interrupted pass left."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.db.migrations.executor import MigrationExecutor

from schedapp.db import db_now
from schedapp.explain import RAN, explain, unaccounted
from schedapp.models import Job, JobRun
from schedapp.partitions import ensure_partitions, partitions

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgresql]

BEFORE = ("schedapp", "0049_compact_job_checks")
AFTER = ("schedapp", "0050_runs_by_occurrence")
HISTORY = 2_000  # runs of the job, one a minute


def _rows(sql: str, params: list | None = None) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params or [])
        return cursor.fetchall()


def _history(runs: int = HISTORY, name: str = "minutely") -> tuple[Job, list]:
    """A job with ``runs`` succeeded runs, one a minute up to now; their scheduled times."""
    now = db_now().replace(second=0, microsecond=0)
    job = Job.objects.create(
        name=name,
        task="project.tasks.noop",
        cron="* * * * *",
        timezone="UTC",
        state="paused",
        token=runs,
    )
    times = [now - timedelta(minutes=runs - token) for token in range(1, runs + 1)]
    JobRun.objects.bulk_create(
        JobRun(
            job=job,
            token=token,
            attempt=1,
            kind="scheduled",
            scheduled_for=at,
            due_at=at,
            dispatched_at=at,
            finished_at=at,
            task_id=f"schedapp:{job.id}:{token}",
            status="succeeded",
        )
        for token, at in enumerate(times, start=1)
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE schedapp_jobrun")
    return job, times


def _run_rows_read() -> int:
    """Rows of the run history read in this transaction so far: fetched through an index or
    read by a scan, every partition."""
    ((read,),) = _rows(
        "SELECT coalesce(sum(coalesce(idx_tup_fetch, 0) + coalesce(seq_tup_read, 0)), 0) "
        "FROM pg_stat_xact_user_tables WHERE relname LIKE 'schedapp\\_jobrun%%'"
    )
    return int(read)


def test_did_it_run_reads_the_runs_of_that_occurrence_not_the_jobs_history():
    # Given a job that ran every minute for 2,000 minutes
    job, times = _history()
    at = times[HISTORY // 2]

    # When a person asks whether one of them ran, and which occurrences around it are
    # unaccounted for, in one transaction whose reads PostgreSQL counts
    with transaction.atomic():
        before = _run_rows_read()
        answer = explain(job, at)
        missing = unaccounted(job, at - timedelta(minutes=2), at + timedelta(minutes=2))
        read = _run_rows_read() - before
        transaction.set_rollback(True)

    # Then the answers are right, and each read the runs of its occurrences only (one, then
    # five), not the job's 2,000 (on a job that fires every few seconds, a year is millions)
    assert answer.entry is not None and answer.entry.fate == RAN
    assert [a.token for a in answer.entry.attempts] == [HISTORY // 2 + 1]
    assert missing == []
    assert read <= 20, read


def _index_state() -> tuple[bool | None, dict[str, tuple[str | None, bool | None]]]:
    """Whether the parent's index is valid, and each partition's index attached to it (its
    name and validity; None: none attached)."""
    parent = _rows(
        "SELECT x.indisvalid FROM pg_index x JOIN pg_class c ON c.oid = x.indexrelid "
        "WHERE c.relname = 'schedapp_run_occurrence'"
    )
    attached = {}
    if parent:
        attached = {
            part: (index, valid)
            for part, index, valid in _rows(
                "SELECT t.relname, c.relname, x.indisvalid FROM pg_inherits i "
                "JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_index x ON x.indexrelid = c.oid "
                "JOIN pg_class t ON t.oid = x.indrelid "
                "WHERE i.inhparent = 'schedapp_run_occurrence'::regclass"
            )
        }
    parts = {p.name: attached.get(p.name, (None, None)) for p in partitions()}
    return (parent[0][0] if parent else None), parts


def _set_next_id(value: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT setval(pg_get_serial_sequence('schedapp_jobrun', 'id'), %s, false)", [value]
        )


@pytest.fixture
def without_the_index() -> Iterator[None]:
    """The database before 0050, with a populated history over several partitions; migrated
    to the latest again after."""
    executor = MigrationExecutor(connection)
    executor.migrate([BEFORE])
    try:
        yield
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())


def test_the_migration_indexes_every_partition_of_a_populated_history(without_the_index):
    # Given runs in the first partition and in one made ahead (the beats' ensure_partitions),
    # with no occurrence index anywhere
    _history(300, "before")
    _set_next_id(partitions()[-1].upper - 10)
    assert ensure_partitions()
    _set_next_id(partitions()[-1].lower)
    _history(300, "after")
    assert len(partitions()) >= 3
    assert _index_state() == (None, {p.name: (None, None) for p in partitions()})
    # and a pass interrupted after it built one partition's index, before attaching it (and
    # the parent's index made: the migration's first step)
    first = partitions()[1].name
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE INDEX schedapp_run_occurrence ON ONLY schedapp_jobrun (job_id, scheduled_for)"
        )
        cursor.execute(
            f"CREATE INDEX schedapp_run_occurrence_{first.removeprefix('schedapp_jobrun_')} "
            f"ON {first} (job_id, scheduled_for)"
        )
    rows = _rows("SELECT count(*), sum(id) FROM schedapp_jobrun")

    # When the migration runs
    MigrationExecutor(connection).migrate([AFTER])

    # Then every partition has its index, attached, and the parent's is valid: a lookup by
    # occurrence may use it in every partition; the rows are those there were
    valid, parts = _index_state()
    assert valid is True
    assert all(index is not None and ok for index, ok in parts.values()), parts
    assert parts[first][0] == f"schedapp_run_occurrence_{first.removeprefix('schedapp_jobrun_')}"
    assert _rows("SELECT count(*), sum(id) FROM schedapp_jobrun") == rows
    # and a partition made after it gets one from its attach
    _set_next_id(partitions()[-1].upper - 10)
    assert ensure_partitions()
    valid, parts = _index_state()
    assert valid is True and all(index is not None for index, _ in parts.values()), parts

    # And backwards, the index goes from every partition
    MigrationExecutor(connection).migrate([BEFORE])
    assert _index_state() == (None, {p.name: (None, None) for p in partitions()})
