"""Run history becomes a table partitioned by range of ``id`` on PostgreSQL, so that retention
drops whole partitions (``schedapp.history``) instead of deleting 86 million rows a day one
batch at a time. The rows stay where they are: the existing table becomes the first partition,
``schedapp_jobrun_legacy``, for the ids below a cut; the new runs go to partitions from the cut
on. SQLite keeps one table; Django's model state is unchanged.

Without downtime beyond a short lock, in three steps, each its own transaction (the migration
is not atomic):

1. The cut: the id sequence's current value plus ``CUT_MARGIN`` (10 million), so that the runs
   inserted while step 2 scans the table (it may take minutes on a large one, at up to a
   thousand runs a second) cannot reach it. ``CHECK (id < cut) NOT VALID``: a catalog change.
2. ``VALIDATE CONSTRAINT``: reads the whole table, under SHARE UPDATE EXCLUSIVE only, so claims,
   doors and completions go on writing meanwhile.
3. One short transaction under ACCESS EXCLUSIVE (waiting at most ``LOCK_TIMEOUT`` for it, and
   trying again, so that a long transaction cannot queue every writer behind this one): the
   table, its indexes and its primary key are renamed to the legacy names and it loses its
   identity (its sequence: the new table's starts at the cut); a partitioned
   ``schedapp_jobrun`` is made ``LIKE`` it (the same columns, defaults and checks), with the
   same foreign key to schedapp_job (DEFERRABLE INITIALLY DEFERRED, as Django made it) and the
   same indexes, made while it has no partition (catalog only); the legacy table is attached
   ``FROM (MINVALUE) TO (cut)``. The validated check proves the partition constraint, so the
   attach reads no row, and the legacy table's own indexes and foreign key match the parent's,
   so they are attached as they are, not built or checked again. Then the first partition from
   the cut (``FIRST_SIZE`` ids; the beats' ``ensure_partitions`` adds the next ones, sized from
   the observed rate). Every step is catalog work: milliseconds, whatever the table holds.

The unique constraint (job, token) cannot exist on the parent (it lacks the partition key): the
legacy table keeps its own, and each partition has a unique index ``schedapp_run_job_token_p<N>``
(schedapp.history makes them). One run per claim across partitions holds because the claim
increments the job's token under the job's row lock, so a claim's (job, token) is new whatever
partition its run lands in; the per-partition index still refuses a second insert of one claim.

A partitioned table takes no storage parameters: each partition gets the legacy table's
(fillfactor 80, migration 0005). A migration interrupted after step 1 or 2 takes up the cut it
chose; run again on a partitioned table it does nothing. Backwards, it copies every row into
one table made as Django made it (``INSERT ... SELECT`` under ACCESS EXCLUSIVE: as long as the
copy takes, and twice the disk), for tests and for a downgrade of a small install."""

import re
import time

from django.db import OperationalError, migrations, transaction

CUT_MARGIN = 10_000_000
FIRST_SIZE = 10_000_000
CHECK = "schedapp_jobrun_before_partitions"
LEGACY = "schedapp_jobrun_legacy"
LOCK_TIMEOUT = "5s"
LOCK_TRIES = 20
FK = "schedapp_jobrun_job_id_30740df8_fk_schedapp_job_id"
# The run table's indexes as the models declare them (frozen here).
INDEXES = {
    "schedapp_run_task_id": "(task_id)",
    "schedapp_run_job_recent": "(job_id, id DESC)",
    "schedapp_run_dispatched": "(dispatched_at)",
    "schedapp_run_in_flight": "(job_id, lease_expires_at) WHERE lease_expires_at IS NOT NULL",
    "schedapp_run_leased": "(lease_expires_at) WHERE lease_expires_at IS NOT NULL",
    "schedapp_run_retry_due": "(retry_at) WHERE retry_at IS NOT NULL",
}


def _one(cursor, sql, params=()):
    cursor.execute(sql, params)
    row = cursor.fetchone()
    return row[0] if row else None


def choose_cut(cursor) -> int:
    """Step 1: the cut, from the check an interrupted run left, or a new one."""
    existing = _one(
        cursor,
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint "
        "WHERE conrelid = 'schedapp_jobrun'::regclass AND conname = %s",
        [CHECK],
    )
    if existing:
        return int(re.search(r"(\d+)", existing).group(1))
    sequence = _one(cursor, "SELECT pg_get_serial_sequence('schedapp_jobrun', 'id')")
    cursor.execute(f"SELECT last_value FROM {sequence}")
    last = cursor.fetchone()[0]
    highest = _one(cursor, "SELECT max(id) FROM schedapp_jobrun") or 0
    cut = max(last, highest) + CUT_MARGIN
    # A catalog change, but under ACCESS EXCLUSIVE: waited for LOCK_TIMEOUT at most (a long
    # transaction on the table fails the migration here, to be run again, rather than queue
    # every writer behind it).
    cursor.execute(f"SET lock_timeout = '{LOCK_TIMEOUT}'")
    try:
        cursor.execute(
            f"ALTER TABLE schedapp_jobrun ADD CONSTRAINT {CHECK} CHECK (id < {cut}) NOT VALID"
        )
    finally:
        cursor.execute("RESET lock_timeout")
    return cut


def validate(cursor) -> None:
    """Step 2: reads every row; writers go on (SHARE UPDATE EXCLUSIVE)."""
    cursor.execute(f"ALTER TABLE schedapp_jobrun VALIDATE CONSTRAINT {CHECK}")


def swap(connection, cut: int) -> None:
    """Step 3, under the lock; tried again when the lock is not had within LOCK_TIMEOUT."""
    for attempt in range(LOCK_TRIES):
        try:
            with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
                cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
                cursor.execute("LOCK TABLE schedapp_jobrun IN ACCESS EXCLUSIVE MODE")
                _swap_locked(cursor, cut)
            return
        except OperationalError as exc:
            timed_out = getattr(exc.__cause__, "sqlstate", None) == "55P03"  # lock_timeout
            if not timed_out or attempt == LOCK_TRIES - 1:
                raise
            time.sleep(1)


def _swap_locked(cursor, cut: int) -> None:
    options = _one(
        cursor, "SELECT reloptions FROM pg_class WHERE oid = 'schedapp_jobrun'::regclass"
    )
    cursor.execute(f"ALTER TABLE schedapp_jobrun RENAME TO {LEGACY}")
    cursor.execute(f"ALTER TABLE {LEGACY} RENAME CONSTRAINT schedapp_jobrun_pkey TO {LEGACY}_pkey")
    for name in INDEXES:
        cursor.execute(f"ALTER INDEX {name} RENAME TO {name}_legacy")
    # Its sequence goes with it; the new table's identity starts at the cut.
    cursor.execute(f"ALTER TABLE {LEGACY} ALTER COLUMN id DROP IDENTITY")
    cursor.execute(
        f"CREATE TABLE schedapp_jobrun (LIKE {LEGACY} INCLUDING DEFAULTS INCLUDING CONSTRAINTS "
        "INCLUDING STORAGE INCLUDING COMMENTS) PARTITION BY RANGE (id)"
    )
    cursor.execute(f"ALTER TABLE schedapp_jobrun DROP CONSTRAINT {CHECK}")
    cursor.execute(
        "ALTER TABLE schedapp_jobrun ALTER COLUMN id "
        f"ADD GENERATED BY DEFAULT AS IDENTITY (START WITH {cut})"
    )
    cursor.execute(
        "ALTER TABLE schedapp_jobrun ADD CONSTRAINT schedapp_jobrun_pkey PRIMARY KEY (id)"
    )
    # Made before the attach: the legacy table's identical foreign key becomes its child,
    # not validated again.
    cursor.execute(
        f"ALTER TABLE schedapp_jobrun ADD CONSTRAINT {FK} FOREIGN KEY (job_id) "
        "REFERENCES schedapp_job (id) DEFERRABLE INITIALLY DEFERRED"
    )
    for name, definition in INDEXES.items():
        cursor.execute(f"CREATE INDEX {name} ON schedapp_jobrun {definition}")
    # No row read (the validated check implies the bound), no index built (the legacy
    # table's match the parent's and are attached to them).
    cursor.execute(
        f"ALTER TABLE schedapp_jobrun ATTACH PARTITION {LEGACY} "
        f"FOR VALUES FROM (MINVALUE) TO ({cut})"
    )
    cursor.execute(f"ALTER TABLE {LEGACY} DROP CONSTRAINT {CHECK}")
    first = f"schedapp_jobrun_p{cut}"
    with_options = f" WITH ({', '.join(options)})" if options else ""
    cursor.execute(
        f"CREATE TABLE {first} PARTITION OF schedapp_jobrun "
        f"FOR VALUES FROM ({cut}) TO ({cut + FIRST_SIZE}){with_options}"
    )
    cursor.execute(f"CREATE UNIQUE INDEX schedapp_run_job_token_p{cut} ON {first} (job_id, token)")


def forward(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        if (
            _one(cursor, "SELECT relkind FROM pg_class WHERE oid = 'schedapp_jobrun'::regclass")
            == "p"
        ):
            return
        cut = choose_cut(cursor)
        validate(cursor)
    swap(connection, cut)


def backward(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        return
    with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
        if (
            _one(cursor, "SELECT relkind FROM pg_class WHERE oid = 'schedapp_jobrun'::regclass")
            != "p"
        ):
            return
        cursor.execute("LOCK TABLE schedapp_jobrun IN ACCESS EXCLUSIVE MODE")
        sequence = _one(cursor, "SELECT pg_get_serial_sequence('schedapp_jobrun', 'id')")
        cursor.execute(f"SELECT last_value, is_called FROM {sequence}")
        last, called = cursor.fetchone()
        start = max(last + 1 if called else last, 1)
        cursor.execute(
            "CREATE TABLE schedapp_jobrun_plain (LIKE schedapp_jobrun INCLUDING DEFAULTS "
            "INCLUDING CONSTRAINTS INCLUDING STORAGE INCLUDING COMMENTS) WITH (fillfactor = 80)"
        )
        cursor.execute("INSERT INTO schedapp_jobrun_plain SELECT * FROM schedapp_jobrun")
        cursor.execute("DROP TABLE schedapp_jobrun")
        cursor.execute("ALTER TABLE schedapp_jobrun_plain RENAME TO schedapp_jobrun")
        cursor.execute(
            "ALTER TABLE schedapp_jobrun ALTER COLUMN id "
            f"ADD GENERATED BY DEFAULT AS IDENTITY (START WITH {start})"
        )
        cursor.execute(
            "ALTER TABLE schedapp_jobrun ADD CONSTRAINT schedapp_jobrun_pkey PRIMARY KEY (id)"
        )
        cursor.execute(
            "ALTER TABLE schedapp_jobrun "
            "ADD CONSTRAINT schedapp_run_job_token UNIQUE (job_id, token)"
        )
        cursor.execute(
            f"ALTER TABLE schedapp_jobrun ADD CONSTRAINT {FK} FOREIGN KEY (job_id) "
            "REFERENCES schedapp_job (id) DEFERRABLE INITIALLY DEFERRED"
        )
        for name, definition in INDEXES.items():
            cursor.execute(f"CREATE INDEX {name} ON schedapp_jobrun {definition}")


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("schedapp", "0045_run_by_id")]

    operations = [migrations.RunPython(forward, backward, elidable=False)]
