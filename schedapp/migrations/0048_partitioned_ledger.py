"""The occurrence ledger becomes a table partitioned by range of ``id`` on PostgreSQL, as the run
history did in 0046 (its ids come from one sequence too, so they rise with time), so that
retention drops whole partitions of records with the runs' (``schedapp.partitions``). The rows
stay where they are: the existing table becomes the first partition,
``schedapp_occurrence_legacy``, for the ids below a cut; new records go to partitions from the
cut on. SQLite keeps one table; Django's model state is unchanged.

Without downtime beyond a short lock, in three steps, each its own transaction (the migration
is not atomic), as 0046:

1. The cut: the id sequence's current value plus ``CUT_MARGIN`` (10 million), out of reach of
   the records inserted while step 2 scans the table. ``CHECK (id < cut) NOT VALID``: a
   catalog change.
2. ``VALIDATE CONSTRAINT``: reads the whole table, under SHARE UPDATE EXCLUSIVE only, so the
   claims, resumes, cancels and doors go on recording meanwhile.
3. One short transaction under ACCESS EXCLUSIVE (waiting at most ``LOCK_TIMEOUT`` for it, and
   trying again): the table, its index of times and its primary key are renamed to the legacy
   names and it loses its identity (its sequence: the new table's starts at the cut); a
   partitioned ``schedapp_occurrence`` is made ``LIKE`` it (the same columns, defaults and
   checks), with the same foreign key to schedapp_job (DEFERRABLE INITIALLY DEFERRED, as
   Django made it) and the same index, made while it has no partition (catalog only); the
   legacy table is attached ``FROM (MINVALUE) TO (cut)``, no row read (the validated check
   proves the bound) and no index built (its own are attached to the parent's). Then the
   first partition from the cut (``FIRST_SIZE`` ids, so that beats of the previous release,
   which make no ledger partitions, keep recording through a rolling upgrade; the beats'
   ``ensure_partitions`` adds the next ones, sized from the observed rate).

The unique constraint (job, scheduled_for) cannot exist on the parent (it lacks the partition
key): the legacy table keeps its own, ``schedapp_occurrence_job_time``, and each partition has
a unique index ``schedapp_occurrence_job_time_p<N>``, so ``ON CONFLICT DO NOTHING`` (no
conflict target: every unique index of the partition inserted into is an arbiter) still keeps
the first record of a decision made twice within a partition. A decision repeated across a
partition boundary (seconds apart) can write a second record; the ledger's readers count the
first only (``schedapp.ledger.first_records``).

A migration interrupted after step 1 or 2 takes up the cut it chose; run again on a
partitioned table it does nothing. Backwards, it copies every record into one table made as
Django made it, the first of each (job, scheduled_for) only (``INSERT ... SELECT`` under
ACCESS EXCLUSIVE: as long as the copy takes, and twice the disk), for tests and for a
downgrade of a small install."""

import re
import time

from django.db import OperationalError, migrations, transaction

CUT_MARGIN = 10_000_000
FIRST_SIZE = 10_000_000
CHECK = "schedapp_occurrence_before_partitions"
LEGACY = "schedapp_occurrence_legacy"
LOCK_TIMEOUT = "5s"
LOCK_TRIES = 20
FK = "schedapp_occurrence_job_id_1a3671ce_fk_schedapp_job_id"
UNIQUE = "schedapp_occurrence_job_time"
# The ledger's indexes as the model declares them (frozen here).
INDEXES = {"schedapp_occurrence_recorded": "(recorded_at)"}


def _one(cursor, sql, params=()):
    cursor.execute(sql, params)
    row = cursor.fetchone()
    return row[0] if row else None


def choose_cut(cursor) -> int:
    """Step 1: the cut, from the check an interrupted run left, or a new one."""
    existing = _one(
        cursor,
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint "
        "WHERE conrelid = 'schedapp_occurrence'::regclass AND conname = %s",
        [CHECK],
    )
    if existing:
        return int(re.search(r"(\d+)", existing).group(1))
    sequence = _one(cursor, "SELECT pg_get_serial_sequence('schedapp_occurrence', 'id')")
    cursor.execute(f"SELECT last_value FROM {sequence}")
    last = cursor.fetchone()[0]
    highest = _one(cursor, "SELECT max(id) FROM schedapp_occurrence") or 0
    cut = max(last, highest) + CUT_MARGIN
    # A catalog change, but under ACCESS EXCLUSIVE: waited for LOCK_TIMEOUT at most.
    cursor.execute(f"SET lock_timeout = '{LOCK_TIMEOUT}'")
    try:
        cursor.execute(
            f"ALTER TABLE schedapp_occurrence ADD CONSTRAINT {CHECK} CHECK (id < {cut}) NOT VALID"
        )
    finally:
        cursor.execute("RESET lock_timeout")
    return cut


def validate(cursor) -> None:
    """Step 2: reads every row; writers go on (SHARE UPDATE EXCLUSIVE)."""
    cursor.execute(f"ALTER TABLE schedapp_occurrence VALIDATE CONSTRAINT {CHECK}")


def swap(connection, cut: int) -> None:
    """Step 3, under the lock; tried again when the lock is not had within LOCK_TIMEOUT."""
    for attempt in range(LOCK_TRIES):
        try:
            with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
                cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
                cursor.execute("LOCK TABLE schedapp_occurrence IN ACCESS EXCLUSIVE MODE")
                _swap_locked(cursor, cut)
            return
        except OperationalError as exc:
            timed_out = getattr(exc.__cause__, "sqlstate", None) == "55P03"  # lock_timeout
            if not timed_out or attempt == LOCK_TRIES - 1:
                raise
            time.sleep(1)


def _swap_locked(cursor, cut: int) -> None:
    options = _one(
        cursor, "SELECT reloptions FROM pg_class WHERE oid = 'schedapp_occurrence'::regclass"
    )
    cursor.execute(f"ALTER TABLE schedapp_occurrence RENAME TO {LEGACY}")
    cursor.execute(
        f"ALTER TABLE {LEGACY} RENAME CONSTRAINT schedapp_occurrence_pkey TO {LEGACY}_pkey"
    )
    for name in INDEXES:
        cursor.execute(f"ALTER INDEX {name} RENAME TO {name}_legacy")
    # Its sequence goes with it; the new table's identity starts at the cut.
    cursor.execute(f"ALTER TABLE {LEGACY} ALTER COLUMN id DROP IDENTITY")
    cursor.execute(
        f"CREATE TABLE schedapp_occurrence (LIKE {LEGACY} INCLUDING DEFAULTS "
        "INCLUDING CONSTRAINTS INCLUDING STORAGE INCLUDING COMMENTS) PARTITION BY RANGE (id)"
    )
    cursor.execute(f"ALTER TABLE schedapp_occurrence DROP CONSTRAINT {CHECK}")
    cursor.execute(
        "ALTER TABLE schedapp_occurrence ALTER COLUMN id "
        f"ADD GENERATED BY DEFAULT AS IDENTITY (START WITH {cut})"
    )
    cursor.execute(
        "ALTER TABLE schedapp_occurrence ADD CONSTRAINT schedapp_occurrence_pkey PRIMARY KEY (id)"
    )
    # Made before the attach: the legacy table's identical foreign key becomes its child,
    # not validated again.
    cursor.execute(
        f"ALTER TABLE schedapp_occurrence ADD CONSTRAINT {FK} FOREIGN KEY (job_id) "
        "REFERENCES schedapp_job (id) DEFERRABLE INITIALLY DEFERRED"
    )
    for name, definition in INDEXES.items():
        cursor.execute(f"CREATE INDEX {name} ON schedapp_occurrence {definition}")
    # No row read (the validated check implies the bound), no index built (the legacy
    # table's match the parent's and are attached to them).
    cursor.execute(
        f"ALTER TABLE schedapp_occurrence ATTACH PARTITION {LEGACY} "
        f"FOR VALUES FROM (MINVALUE) TO ({cut})"
    )
    cursor.execute(f"ALTER TABLE {LEGACY} DROP CONSTRAINT {CHECK}")
    first = f"schedapp_occurrence_p{cut}"
    with_options = f" WITH ({', '.join(options)})" if options else ""
    cursor.execute(
        f"CREATE TABLE {first} PARTITION OF schedapp_occurrence "
        f"FOR VALUES FROM ({cut}) TO ({cut + FIRST_SIZE}){with_options}"
    )
    cursor.execute(f"CREATE UNIQUE INDEX {UNIQUE}_p{cut} ON {first} (job_id, scheduled_for)")


def forward(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        if (
            _one(cursor, "SELECT relkind FROM pg_class WHERE oid = 'schedapp_occurrence'::regclass")
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
            _one(cursor, "SELECT relkind FROM pg_class WHERE oid = 'schedapp_occurrence'::regclass")
            != "p"
        ):
            return
        cursor.execute("LOCK TABLE schedapp_occurrence IN ACCESS EXCLUSIVE MODE")
        sequence = _one(cursor, "SELECT pg_get_serial_sequence('schedapp_occurrence', 'id')")
        cursor.execute(f"SELECT last_value, is_called FROM {sequence}")
        last, called = cursor.fetchone()
        start = max(last + 1 if called else last, 1)
        cursor.execute(
            "CREATE TABLE schedapp_occurrence_plain (LIKE schedapp_occurrence INCLUDING DEFAULTS "
            "INCLUDING CONSTRAINTS INCLUDING STORAGE INCLUDING COMMENTS)"
        )
        # The first record of each (job, scheduled_for): one table holds no second.
        cursor.execute(
            "INSERT INTO schedapp_occurrence_plain SELECT DISTINCT ON (job_id, scheduled_for) * "
            "FROM schedapp_occurrence ORDER BY job_id, scheduled_for, id"
        )
        cursor.execute("DROP TABLE schedapp_occurrence")
        cursor.execute("ALTER TABLE schedapp_occurrence_plain RENAME TO schedapp_occurrence")
        cursor.execute(
            "ALTER TABLE schedapp_occurrence ALTER COLUMN id "
            f"ADD GENERATED BY DEFAULT AS IDENTITY (START WITH {start})"
        )
        cursor.execute(
            "ALTER TABLE schedapp_occurrence "
            "ADD CONSTRAINT schedapp_occurrence_pkey PRIMARY KEY (id)"
        )
        cursor.execute(
            f"ALTER TABLE schedapp_occurrence ADD CONSTRAINT {UNIQUE} "
            "UNIQUE (job_id, scheduled_for)"
        )
        cursor.execute(
            f"ALTER TABLE schedapp_occurrence ADD CONSTRAINT {FK} FOREIGN KEY (job_id) "
            "REFERENCES schedapp_job (id) DEFERRABLE INITIALLY DEFERRED"
        )
        for name, definition in INDEXES.items():
            cursor.execute(f"CREATE INDEX {name} ON schedapp_occurrence {definition}")


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("schedapp", "0047_generic_plans")]

    operations = [migrations.RunPython(forward, backward, elidable=False)]
