"""The runs of one occurrence found by an index: ``schedapp_run_occurrence`` on (job_id,
scheduled_for). "Did 08:00 run?" (``schedapp.explain``), a backfill's look for runs of its
range and ``unaccounted`` read a job's runs by their occurrence; without it they walked every
run of the job (its (job, id) index, filtered): a few hundred rows on a small install, the
whole history of a job that fires every few seconds on a large one. The column is written once,
as the run is inserted, so admission and completion updates stay heap-only.

Without downtime beyond short locks, on PostgreSQL's partitioned run history (0046): the index
is made on the parent alone (``ON ONLY``: catalog work, under a SHARE lock on the parent, which
waits at most ``LOCK_TIMEOUT`` and is tried again), then built on each partition with ``CREATE
INDEX CONCURRENTLY`` (SHARE UPDATE EXCLUSIVE: claims, doors and completions go on writing) and
attached to it; once every partition has its own, PostgreSQL marks the parent's valid. A
partition attached meanwhile (a beat's ``ensure_partitions``) gets its index from the attach.
The migration is not atomic: interrupted, it is run again and takes up where it stopped (an
index a cancelled build left invalid is dropped and built again). An unpartitioned PostgreSQL
table gets one concurrent build; SQLite a plain index. Backwards, the index is dropped."""

import time

from django.db import OperationalError, migrations, models, transaction

NAME = "schedapp_run_occurrence"
TABLE = "schedapp_jobrun"
COLUMNS = "(job_id, scheduled_for)"
LOCK_TIMEOUT = "5s"
LOCK_TRIES = 20
INDEX = models.Index(fields=["job", "scheduled_for"], name=NAME)

# The partitions that have no index attached to the parent's yet (an earlier, interrupted pass
# may have left one its own index, built or not: ``_build_concurrently`` takes that up).
UNINDEXED = f"""
SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = '{TABLE}'::regclass
  AND NOT EXISTS (
      SELECT FROM pg_inherits ii JOIN pg_index x ON x.indexrelid = ii.inhrelid
      WHERE ii.inhparent = '{NAME}'::regclass AND x.indrelid = c.oid)
ORDER BY c.relname
"""


def _one(cursor, sql, params=()):
    cursor.execute(sql, params)
    row = cursor.fetchone()
    return row[0] if row else None


def _locked(connection, sql: str) -> None:
    """``sql`` in its own transaction, waiting at most LOCK_TIMEOUT for its lock; tried again
    (a long transaction on the table must not queue every writer behind this one)."""
    for attempt in range(LOCK_TRIES):
        try:
            with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
                cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
                cursor.execute(sql)
            return
        except OperationalError as exc:
            timed_out = getattr(exc.__cause__, "sqlstate", None) == "55P03"  # lock_timeout
            if not timed_out or attempt == LOCK_TRIES - 1:
                raise
            time.sleep(1)


def _build_concurrently(cursor, name: str, table: str) -> None:
    """``name`` on ``table`` without blocking its writers; one a cancelled build left invalid
    is dropped first."""
    valid = _one(
        cursor,
        "SELECT x.indisvalid FROM pg_index x JOIN pg_class c ON c.oid = x.indexrelid "
        "WHERE c.relname = %s",
        [name],
    )
    if valid is False:
        cursor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
    cursor.execute(f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON {table} {COLUMNS}")


def forward(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        schema_editor.add_index(apps.get_model("schedapp", "JobRun"), INDEX)
        return
    with connection.cursor() as cursor:
        kind = _one(cursor, f"SELECT relkind FROM pg_class WHERE oid = '{TABLE}'::regclass")
    if kind != "p":
        with connection.cursor() as cursor:
            _build_concurrently(cursor, NAME, TABLE)
        return
    _locked(connection, f"CREATE INDEX IF NOT EXISTS {NAME} ON ONLY {TABLE} {COLUMNS}")
    with connection.cursor() as cursor:
        cursor.execute(UNINDEXED)
        unindexed = [row[0] for row in cursor.fetchall()]
    for partition in unindexed:
        own = f"{NAME}_{partition.removeprefix(TABLE + '_')}"
        with connection.cursor() as cursor:
            _build_concurrently(cursor, own, partition)
        _locked(connection, f"ALTER INDEX {NAME} ATTACH PARTITION {own}")


def backward(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        schema_editor.remove_index(apps.get_model("schedapp", "JobRun"), INDEX)
        return
    _locked(connection, f"DROP INDEX IF EXISTS {NAME}")  # the partitions' with it


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("schedapp", "0049_compact_job_checks")]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(forward, backward, elidable=False)],
            state_operations=[migrations.AddIndex(model_name="jobrun", index=INDEX)],
        )
    ]
