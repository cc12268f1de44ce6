"""History tables' partitions on PostgreSQL: made ahead of the ids, dropped whole when expired.

Two tables grow with time and are partitioned by range of ``id`` the same way (ids come from
each table's one sequence, so they rise with time), each described by a ``History``: the run
history, ``schedapp_jobrun`` (``RUNS``, since migration 0046), and the occurrence ledger,
``schedapp_occurrence`` (``LEDGER``, since migration 0048). The functions below take the
table as ``table`` (default: the runs). A row inserted with an id no partition covers would be
refused, so partitions are made ahead, never by the insert: ``ensure_partitions`` keeps at
least ``AHEAD`` partitions' worth of ids above the sequence, each sized to hold about one
``SCHEDAPP_HISTORY_PARTITION`` (default a day) at the id rate observed over the last such
period within a partition (never under ``MIN_SIZE`` ids). The beats call it for both tables
as they start and every ``CHECK_EVERY`` seconds after (before a claim); two beats take turns
on an advisory lock.

``drop_expired_partitions`` drops, oldest first, each partition (below the one the sequence is
in) whose every row is older than the retention cutoff (runs: dispatched; records: recorded),
unless a row in it is still needed (runs: one holds a lease, its own or a job's through its
current token, or waits to be retried; the ledger has no such rows). A drop is the checks
(index probes), ``DETACH PARTITION ... CONCURRENTLY``, then ``DROP TABLE`` of the detached
table: constant time, whatever the partition holds. Neither making nor dropping takes the
table's ACCESS EXCLUSIVE lock; both take the foreign key's lock on the job table, waited for
at most ``LOCK_TIMEOUT`` (job writes queue behind it meanwhile), and what a pass could not do
the next one does. The housekeeping prune (``schedapp.prune``) calls it for both tables
before its batched DELETEs, which still prune what is left. Every comparison uses the
database's clock.

A unique constraint on a partitioned table must hold the partition key, so each table's
(runs: ``(job_id, token)``; ledger: ``(job_id, scheduled_for)``) is a unique index per
partition. The ledger's readers keep its rule across partitions: of a (job, scheduled_for)
recorded twice, in two partitions, the first record counts (``schedapp.ledger.first_records``).

On SQLite, or on a database not yet migrated (0046 for runs, 0048 for the ledger), both do
nothing.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

from django.db import connections, transaction

log = logging.getLogger("schedapp.partitions")

MIN_SIZE = 100_000  # ids: the smallest partition made
AHEAD = 2  # partitions' worth of ids kept above the sequence
CHECK_EVERY = 60.0  # seconds between a beat's partition passes
LOCK_TIMEOUT = "100ms"  # the longest any claim, door or job write waits behind our DDL
LOCK_NOT_AVAILABLE = "55P03"  # SQLSTATE of a lock_timeout (whatever lc_messages says)
# pg_advisory_xact_lock key: ensure_partitions of several beats, one at a time.
LOCK_KEY = 0x5C4ED_9A47


@dataclass(frozen=True)
class History:
    """A history table partitioned by range of id, and what its partitions need."""

    parent: str  # the partitioned table; its partitions are <parent>_p<first id>, <parent>_legacy
    what: str  # for people: "run history"
    unique_index: str  # each partition's unique index is <unique_index>_p<first id>
    unique_columns: str  # ... on these columns
    time_column: str  # when a row was written (indexed): its age, and the id rate
    # Queries over a partition ``{name}`` true when a row in it is still needed: never dropped.
    still_needed: tuple[str, ...] = ()

    @property
    def prefix(self) -> str:
        """Partition names: the prefix, then the partition's first id."""
        return f"{self.parent}_p"

    @property
    def legacy(self) -> str:
        """The table the migration attached for the ids below its cut."""
        return f"{self.parent}_legacy"


RUNS = History(
    parent="schedapp_jobrun",
    what="run history",
    unique_index="schedapp_run_job_token",
    unique_columns="job_id, token",
    time_column="dispatched_at",
    still_needed=(
        "SELECT EXISTS (SELECT FROM {name} WHERE lease_expires_at IS NOT NULL)",
        "SELECT EXISTS (SELECT FROM {name} WHERE retry_at IS NOT NULL)",
        "SELECT EXISTS (SELECT FROM schedapp_job j JOIN {name} r "
        "ON r.job_id = j.id AND r.token = j.token WHERE j.lease_expires_at IS NOT NULL)",
    ),
)
LEDGER = History(
    parent="schedapp_occurrence",
    what="occurrence ledger",
    unique_index="schedapp_occurrence_job_time",
    unique_columns="job_id, scheduled_for",
    time_column="recorded_at",
)
TABLES = (RUNS, LEDGER)
PARENT = RUNS.parent  # the run table (callers from before the ledger was partitioned)


@dataclass(frozen=True)
class Partition:
    name: str
    lower: int | None  # None: MINVALUE (the legacy partition, migrations 0046, 0048)
    upper: int


_BOUND = re.compile(r"FROM \((.+?)\) TO \((.+?)\)")


def _value(text: str) -> int | None:
    text = text.strip("'")
    return None if text == "MINVALUE" else int(text)


def is_partitioned(using: str = "default", table: History = RUNS) -> bool:
    """Whether ``table`` is partitioned here (PostgreSQL, migrated)."""
    connection = connections[using]
    if connection.vendor != "postgresql":
        return False
    with connection.cursor() as cursor:
        cursor.execute("SELECT relkind FROM pg_class WHERE oid = to_regclass(%s)", [table.parent])
        row = cursor.fetchone()
    return bool(row) and row[0] == "p"


def partitions(using: str = "default", table: History = RUNS) -> list[Partition]:
    """The table's partitions, lowest ids first."""
    with connections[using].cursor() as cursor:
        cursor.execute(
            "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i "
            "JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = %s::regclass",
            [table.parent],
        )
        found = []
        for name, bound in cursor.fetchall():
            match = _BOUND.search(bound)
            if match is None:  # a DEFAULT partition: not ours
                continue
            upper = _value(match.group(2))
            assert upper is not None
            found.append(Partition(name, _value(match.group(1)), upper))
    return sorted(found, key=lambda p: -math.inf if p.lower is None else p.lower)


def next_id(cursor, table: History = RUNS) -> int:
    """The id the table's sequence gives next."""
    cursor.execute("SELECT pg_get_serial_sequence(%s, 'id')", [table.parent])
    sequence = cursor.fetchone()[0]
    cursor.execute(f"SELECT last_value, is_called FROM {sequence}")
    last, called = cursor.fetchone()
    return last + 1 if called else last


def partition_size(
    cursor,
    period: timedelta,
    existing: list[Partition],
    position: int,
    look: int = 3,
    table: History = RUNS,
) -> int:
    """Ids for one ``period`` at the rate rows were inserted over the last period (at least
    MIN_SIZE). Read within one partition, the newest with a span of a minute or more (of the
    ``look`` newest below ``position``), from its newest row and its first written in the
    period (``table.time_column``), two probes of its indexes: between partitions the ids may
    jump (a migration's cut), which is no rate."""
    at = table.time_column
    written = [p for p in existing if p.lower is None or p.lower < position][-look:]
    for partition in reversed(written):
        cursor.execute(
            f"SELECT n.id - o.id, extract(epoch FROM n.{at} - o.{at}) "
            f"FROM (SELECT id, {at} FROM {partition.name} "
            "      ORDER BY id DESC LIMIT 1) n, "
            f"     (SELECT id, {at} FROM {partition.name} "
            f"      WHERE {at} >= now() - %s ORDER BY {at} LIMIT 1) o",
            [period],
        )
        row = cursor.fetchone()
        if row is not None and row[1] >= 60 and row[0] > 0:
            rate = row[0] / float(row[1])
            return max(MIN_SIZE, math.ceil(rate * period.total_seconds()))
    return MIN_SIZE


def ensure_partitions(
    period: timedelta | None = None, using: str = "default", table: History = RUNS
) -> list[str]:
    """Make partitions of ``table`` above its last one until ``AHEAD`` partitions' worth of
    ids are free above the sequence; the names made (none: enough already). Idempotent;
    callers racing take turns on an advisory lock, and the later finds the work done."""
    if not is_partitioned(using, table):
        return []
    if period is None:
        from .conf import get_settings

        period = get_settings().HISTORY_PARTITION
    made = []
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [LOCK_KEY])
        cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
        existing = partitions(using, table)
        position = next_id(cursor, table)
        size = partition_size(cursor, period, existing, position, table=table)
        newest = existing[-1]
        top = newest.upper
        cursor.execute("SELECT reloptions FROM pg_class WHERE relname = %s", [newest.name])
        options = cursor.fetchone()[0]
        with_options = f" WITH ({', '.join(options)})" if options else ""
        try:
            while top - position < AHEAD * size:
                name = f"{table.prefix}{top}"
                # Made on its own, then attached: ``CREATE TABLE ... PARTITION OF`` would take
                # the table's ACCESS EXCLUSIVE lock, queueing every read and write of it
                # behind it; the attach takes SHARE UPDATE EXCLUSIVE, which no claim, door,
                # record or page conflicts with. Both clone the foreign key, whose lock on the
                # job table (SHARE ROW EXCLUSIVE) job writes wait for while it is waited for:
                # hence LOCK_TIMEOUT, short, and another try at the next pass.
                cursor.execute(
                    f"CREATE TABLE {name} (LIKE {table.parent} INCLUDING DEFAULTS "
                    f"INCLUDING CONSTRAINTS INCLUDING STORAGE){with_options}"
                )
                # Unique per partition. Runs: across partitions, the claim's token increment
                # under the job's row lock keeps each claim's pair new. Ledger: a decision
                # repeated across a boundary may be written twice; its readers keep the first.
                cursor.execute(
                    f"CREATE UNIQUE INDEX {table.unique_index}_p{top} "
                    f"ON {name} ({table.unique_columns})"
                )
                cursor.execute(
                    f"ALTER TABLE {table.parent} ATTACH PARTITION {name} "
                    f"FOR VALUES FROM ({top}) TO ({top + size})"
                )
                made.append(name)
                top += size
        except Exception as exc:
            if not _lock_timeout(exc):
                raise
            log.warning(
                "%s partitions not made this time: a lock was not had within %s; "
                "the next pass tries again (%d partitions' worth of ids are made ahead)",
                table.what,
                LOCK_TIMEOUT,
                AHEAD,
                extra={"action": "partitions_busy", "table": table.parent},
            )
            transaction.set_rollback(True, using=using)
            return []
    if made:
        log.info(
            "made %s partition(s) %s (%d ids each)",
            table.what,
            ", ".join(made),
            size,
            extra={"action": "partitions_made", "partitions": made, "table": table.parent},
        )
    return made


def drop_expired_partitions(
    older_than: timedelta, using: str = "default", table: History = RUNS
) -> list[str]:
    """Drop the partitions of ``table`` whose every row was written (``table.time_column``)
    more than ``older_than`` ago (by the database's clock), oldest first, none the sequence
    has not passed, none holding a row still needed (runs: under a lease or waiting for a
    retry); the names dropped. Outside a transaction only (autocommit, as a task or a command
    runs): inside one it drops nothing, and says so."""
    if not is_partitioned(using, table):
        return []
    if connections[using].in_atomic_block:
        # DETACH ... CONCURRENTLY refuses to run in a transaction, and a plain DETACH would
        # hold the table's ACCESS EXCLUSIVE lock until the caller's commit: none here.
        log.warning(
            "expired %s partitions are dropped outside a transaction only: none "
            "dropped by this call (the prune's batched DELETE still removes expired rows)",
            table.what,
            extra={"action": "partitions_drop_in_transaction", "table": table.parent},
        )
        return []
    _drop_detached(using, table)
    with connections[using].cursor() as cursor:
        position = next_id(cursor, table)
    dropped = []
    for partition in partitions(using, table):
        if partition.upper > position:
            break  # the partition being written, and those ahead
        verdict = _drop_if_expired(partition, older_than, using, table)
        if verdict == "young":
            break  # ids rise with time: the later ones are younger still
        if verdict == "busy":
            break  # one detach may be pending at a time: the next call finishes it first
        if verdict == "dropped":
            dropped.append(partition.name)
    if dropped:
        log.info(
            "dropped expired %s partition(s) %s",
            table.what,
            ", ".join(dropped),
            extra={"action": "partitions_dropped", "partitions": dropped, "table": table.parent},
        )
    return dropped


def _drop_if_expired(
    partition: Partition, older_than: timedelta, using: str, table: History = RUNS
) -> str:
    """'dropped', 'young' (a row written since the cutoff), 'held' (a row still needed: for
    runs, a lease or a retry in it) or 'busy' (its lock not had in time). Each statement
    commits on its own (autocommit): the checks, then ``DETACH ... CONCURRENTLY``, which
    refuses to run inside a transaction.

    The checks need no lock: in a partition the sequence has passed, none can turn true again.
    No row gets in (ids come from the sequence, above it). For runs, a lease is granted to a
    new run (a claim, a retry's run), and the door and renewals extend only a lease still
    valid, so a partition with no lease in it, its own or its job's through its token, gets
    none.

    ``DETACH PARTITION ... CONCURRENTLY`` (outside a transaction): it never takes the table's
    ACCESS EXCLUSIVE lock, which would queue every read and write of it behind it; it waits
    for the transactions that may read the partition, and for its foreign key's lock on the
    job table, each at most LOCK_TIMEOUT. A detach interrupted there stays pending, and the
    next call finishes it (``_drop_detached``)."""
    name = partition.name
    try:
        with connections[using].cursor() as cursor:
            # The newest row through the partition's index of the time; none: empty.
            cursor.execute(
                f"SELECT coalesce(max({table.time_column}) < now() - %s, true) FROM {name}",
                [older_than],
            )
            if not cursor.fetchone()[0]:
                return "young"
            if table.still_needed:
                checks = " OR ".join(f"({q.replace('{name}', name)})" for q in table.still_needed)
                cursor.execute(f"SELECT {checks}")
                if cursor.fetchone()[0]:
                    return "held"
            with _lock_timeout_set(cursor):
                cursor.execute(f"ALTER TABLE {table.parent} DETACH PARTITION {name} CONCURRENTLY")
    except Exception as exc:
        if not _lock_timeout(exc):
            raise
        return "busy"
    # Dropped once detached: removing the files of a large partition takes seconds, which
    # no writer waits for.
    _drop_detached(using, table)
    return "dropped"


def _lock_timeout(exc: BaseException) -> bool:
    """Whether ``exc`` is a lock not had within lock_timeout (told by SQLSTATE)."""
    return getattr(exc.__cause__, "sqlstate", None) == LOCK_NOT_AVAILABLE


@contextmanager
def _lock_timeout_set(cursor) -> Iterator[None]:
    """LOCK_TIMEOUT for the statements of this block, outside a transaction (SET LOCAL needs
    one; DETACH ... CONCURRENTLY and FINALIZE refuse to run in one)."""
    cursor.execute(f"SET lock_timeout = '{LOCK_TIMEOUT}'")
    try:
        yield
    finally:
        cursor.execute("RESET lock_timeout")


def _drop_detached(using: str, table: History = RUNS) -> None:
    """Finish the detaches left pending (a concurrent detach interrupted between its two
    transactions), then drop the tables named as partitions that are no partition (detached,
    their drop interrupted or refused its lock): each waits LOCK_TIMEOUT at most, and what is
    left is finished by the next call."""
    with connections[using].cursor() as cursor, _lock_timeout_set(cursor):
        cursor.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = %s::regclass AND i.inhdetachpending",
            [table.parent],
        )
        for (name,) in cursor.fetchall():
            _unless_locked(cursor, f"ALTER TABLE {table.parent} DETACH PARTITION {name} FINALIZE")
        cursor.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = current_schema() AND c.relkind = 'r' AND NOT c.relispartition "
            "AND (c.relname = %s OR c.relname ~ %s)",
            [table.legacy, f"^{table.prefix}[0-9]+$"],
        )
        for (name,) in cursor.fetchall():
            _unless_locked(cursor, f"DROP TABLE IF EXISTS {name}")


def _unless_locked(cursor, sql: str) -> None:
    """Run ``sql``, unless its lock is not had within the lock timeout: the next pass tries
    again. Any other error is raised."""
    try:
        cursor.execute(sql)
    except Exception as exc:
        if not _lock_timeout(exc):
            raise
