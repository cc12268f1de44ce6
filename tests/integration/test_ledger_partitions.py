"""The occurrence ledger partitioned by id on PostgreSQL (migration 0048, schedapp.partitions).

The migration, applied to a populated one-table ledger, keeps every record (count and
checksum) and attaches the old table as the first partition without rebuilding or rescanning
anything under its lock; the beats make the ledger's partitions ahead; expired partitions are
dropped whole, by the prune too. (job, scheduled_for) is unique within a partition only: a
decision repeated across a boundary writes a second record, and the readers tell the first.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from django.apps.registry import Apps
from django.db import IntegrityError, connection, transaction
from django.db.migrations.executor import MigrationExecutor

from schedapp import api, explain, ledger, partitions
from schedapp.db import db_now
from schedapp.models import Fate, Job, Occurrence
from schedapp.partitions import LEDGER, drop_expired_partitions, ensure_partitions
from schedapp.prune import prune_runs
from tests.migrating import files, migrate_noting

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgresql]

BEFORE = ("schedapp", "0047_generic_plans")
AFTER = ("schedapp", "0048_partitioned_ledger")
CHECKSUM = "SELECT count(*), md5(string_agg(t::text, ',' ORDER BY id)) FROM schedapp_occurrence t"
EIGHT = datetime(2026, 11, 2, 8, 0, tzinfo=UTC)  # an occurrence of "0 8 * * *" long past


def _rows(sql: str, params: list | None = None) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params or [])
        return cursor.fetchall()


def _one(sql: str, params: list | None = None):
    return _rows(sql, params)[0][0]


def _set_next_id(value: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT setval(pg_get_serial_sequence('schedapp_occurrence', 'id'), %s, false)", [value]
        )


def _next_id() -> int:
    with connection.cursor() as cursor:
        return partitions.next_id(cursor, LEDGER)


def _partition_of(record_id: int) -> str:
    return _one(
        "SELECT tableoid::regclass::text FROM schedapp_occurrence WHERE id = %s", [record_id]
    )


def _into_a_later_partition(after: int) -> partitions.Partition:
    """The ledger's sequence moved into a partition above the one holding id ``after`` (made
    if none is)."""

    def later() -> list[partitions.Partition]:
        parts = partitions.partitions(table=LEDGER)
        return [p for p in parts if p.lower is not None and p.lower > after]

    if not later():
        _set_next_id(partitions.partitions(table=LEDGER)[-1].upper - 10)
        ensure_partitions(table=LEDGER)
    target = later()[0]
    _set_next_id(target.lower + 5)
    return target


def _daily(name: str = "daily") -> Job:
    return api.schedule("project.tasks.record", cron="0 8 * * *", name=name)


@pytest.fixture
def unpartitioned() -> Iterator[Apps]:
    """The database before 0048 (one ledger table); migrated to the latest again after."""
    executor = MigrationExecutor(connection)
    executor.migrate([BEFORE])
    try:
        assert _one("SELECT relkind FROM pg_class WHERE relname = 'schedapp_occurrence'") == "r"
        yield executor.loader.project_state([BEFORE]).apps
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())


def _fill(apps: Apps, jobs: int = 20, per_job: int = 100) -> list[int]:
    job_model = apps.get_model("schedapp", "Job")
    record_model = apps.get_model("schedapp", "Occurrence")
    now = db_now()
    made = job_model.objects.bulk_create(
        job_model(
            name=f"old-{i}",
            task="project.tasks.record",
            interval=timedelta(minutes=1),
            state="paused",
        )
        for i in range(jobs)
    )
    record_model.objects.bulk_create(
        record_model(
            job_id=job.id,
            scheduled_for=now - timedelta(hours=per_job - n),
            last=now - timedelta(hours=per_job - n) + timedelta(minutes=n % 5),
            count=1 + n % 5,
            fate=("misfired", "paused", "cancelled")[n % 3],
            detail="x" * (n % 7),
            decided_by=f"beat-{n % 2}",
        )
        for job in made
        for n in range(per_job)
    )
    return [job.id for job in made]


def test_the_migration_keeps_every_record_and_rebuilds_nothing_under_its_lock(unpartitioned):
    job_ids = _fill(unpartitioned)
    before = _rows(CHECKSUM)[0]
    assert before[0] == 2000
    files_before = files("schedapp_occurrence")
    fk_before = _one(
        "SELECT oid FROM pg_constraint WHERE conrelid = 'schedapp_occurrence'::regclass "
        "AND contype = 'f'"
    )
    notices = migrate_noting(AFTER)

    # The same records, column by column, read through the partitioned table.
    assert _rows(CHECKSUM)[0] == before
    assert _one("SELECT relkind FROM pg_class WHERE relname = 'schedapp_occurrence'") == "p"
    parts = partitions.partitions(table=LEDGER)
    legacy, first = parts[0], parts[1]
    assert legacy.name == "schedapp_occurrence_legacy" and legacy.lower is None
    assert first.lower == legacy.upper
    assert legacy.upper > _one("SELECT max(id) FROM schedapp_occurrence") + 9_000_000
    # No rescan: the validated check proved the bound (PostgreSQL says so at DEBUG1)...
    assert any(
        'partition constraint for table "schedapp_occurrence_legacy" is implied' in n
        for n in notices
    ), notices
    # ...no rewrite and no index built: the table and each index kept its file.
    files_after = files("schedapp_occurrence_legacy")
    renamed = {
        "schedapp_occurrence": "schedapp_occurrence_legacy",
        "schedapp_occurrence_pkey": "schedapp_occurrence_legacy_pkey",
        "schedapp_occurrence_job_time": "schedapp_occurrence_job_time",
    }
    assert files_after == {renamed.get(n, f"{n}_legacy"): f for n, f in files_before.items()}
    assert (
        _one(
            "SELECT count(*) FROM pg_inherits i JOIN pg_index x ON x.indexrelid = i.inhrelid "
            "WHERE x.indrelid = 'schedapp_occurrence_legacy'::regclass"
        )
        == len(files_before) - 2
    )  # all but the table itself and the unique (job, scheduled_for)
    fk = _rows(
        "SELECT oid, conparentid <> 0, convalidated, condeferrable, condeferred "
        "FROM pg_constraint WHERE conrelid = 'schedapp_occurrence_legacy'::regclass "
        "AND contype = 'f'"
    )
    assert fk == [(fk_before, True, True, True, True)]

    # The legacy partition's own unique constraint still refuses a second record in it.
    taken = _rows(
        "SELECT id, scheduled_for FROM schedapp_occurrence WHERE job_id = %s ORDER BY id LIMIT 1",
        [job_ids[0]],
    )[0]
    with pytest.raises(IntegrityError, match="schedapp_occurrence_job_time"):
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO schedapp_occurrence (id, job_id, scheduled_for, last, count, fate, "
                "detail, decided_by) VALUES (%s, %s, %s, %s, 1, 'paused', '', '')",
                [taken[0] + 100_000, job_ids[0], taken[1], taken[1]],
            )
    # A new record lands in the new partition; a decision made twice keeps its first there.
    job = _daily()
    assert ledger.record_one(job.pk, EIGHT, Fate.CANCELLED, "first", "test") is None
    ledger.record_one(job.pk, EIGHT, Fate.QUARANTINED, "second", "test")
    [(record_id, fate)] = _rows(
        "SELECT id, fate FROM schedapp_occurrence WHERE job_id = %s", [job.pk]
    )
    assert fate == Fate.CANCELLED and _partition_of(record_id) == first.name


def test_the_migration_backwards_keeps_the_first_record_of_a_pair_written_twice():
    """Back to one table, whose unique constraint holds no second record of a pair."""
    ensure_partitions(table=LEDGER)
    job = _daily()
    ledger.record_one(job.pk, EIGHT, Fate.CANCELLED, "first", "test")
    _into_a_later_partition(Occurrence.objects.get(job=job).pk)
    ledger.record_one(job.pk, EIGHT, Fate.QUARANTINED, "second", "test")
    ledger.record_one(job.pk, EIGHT + timedelta(days=1), Fate.PAUSED, "other", "test")
    assert Occurrence.objects.filter(job=job).count() == 3
    executor = MigrationExecutor(connection)
    try:
        executor.migrate([BEFORE])
        assert _one("SELECT relkind FROM pg_class WHERE relname = 'schedapp_occurrence'") == "r"
        assert sorted(Occurrence.objects.filter(job=job).values_list("detail", flat=True)) == [
            "first",
            "other",
        ]
        # One table again, with its identity past every id it holds.
        ledger.record_one(job.pk, EIGHT + timedelta(days=2), Fate.PAUSED, "after", "test")
        assert Occurrence.objects.filter(job=job).count() == 3
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
    assert _one("SELECT relkind FROM pg_class WHERE relname = 'schedapp_occurrence'") == "p"


def test_the_ledgers_partitions_are_made_ahead_with_their_unique_index():
    ensure_partitions(table=LEDGER)
    top = partitions.partitions(table=LEDGER)[-1]
    _set_next_id(top.upper - 10)  # the sequence nearly through the last partition
    made = ensure_partitions(table=LEDGER)
    assert made, "nothing made ahead of a sequence about to leave the last partition"
    assert all(name.startswith("schedapp_occurrence_p") for name in made)
    parts = partitions.partitions(table=LEDGER)
    ahead = [p for p in parts if p.lower is not None and p.lower >= top.upper]
    assert [p.name for p in ahead] == made
    size = ahead[0].upper - ahead[0].lower
    assert size >= partitions.MIN_SIZE
    assert parts[-1].upper - (top.upper - 10) >= partitions.AHEAD * size
    for lower, upper in itertools.pairwise(ahead):
        assert lower.upper == upper.lower
    for p in ahead:
        assert _rows(
            "SELECT indexdef FROM pg_indexes WHERE tablename = %s AND indexdef LIKE %s",
            [p.name, "CREATE UNIQUE INDEX schedapp_occurrence_job_time_p% (job_id, scheduled_for)"],
        ), p.name
    assert ensure_partitions(table=LEDGER) == []  # idempotent
    # The run history's partitions are not the ledger's.
    assert not set(made) & {p.name for p in partitions.partitions()}
    # A record inserted right at the top goes in, and one past it too.
    job = _daily()
    ledger.record_one(job.pk, EIGHT, Fate.CANCELLED, "at the top", "test")
    _set_next_id(top.upper + 5)
    ledger.record_one(job.pk, EIGHT + timedelta(days=1), Fate.CANCELLED, "past it", "test")
    ids = sorted(Occurrence.objects.filter(job=job).values_list("id", flat=True))
    assert ids == [top.upper - 10, top.upper + 5]
    assert _partition_of(ids[1]) == made[0]


def test_a_beat_makes_the_ledgers_partitions_ahead_as_it_starts(broker_url, monkeypatch):
    from schedapp import beat
    from schedapp.celeryapp import celery_app

    ensure_partitions(table=LEDGER)
    top = partitions.partitions(table=LEDGER)[-1]
    _set_next_id(top.upper - 10)
    scheduler = beat.LeaseScheduler(celery_app(), lazy=True)
    monkeypatch.setattr(scheduler, "_sleep", lambda delay: delay)
    try:
        scheduler.setup_schedule()
        made = [
            p
            for p in partitions.partitions(table=LEDGER)
            if p.lower is not None and p.lower >= top.upper
        ]
        assert made, "the beat started without making the ledger's partitions ahead"
    finally:
        scheduler.close()


def _put(target: partitions.Partition, offset: int, recorded: str, name: str) -> None:
    """A record with id ``target.lower + offset``, recorded at ``recorded`` (SQL)."""
    job = _daily(name)
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO schedapp_occurrence (id, job_id, scheduled_for, last, count, fate, "
            f"detail, decided_by, recorded_at) VALUES (%s, %s, %s, %s, 1, 'paused', '', 't', "
            f"{recorded})",
            [target.lower + offset, job.pk, EIGHT, EIGHT],
        )


def _fresh(monkeypatch, count: int) -> list[partitions.Partition]:
    """``count`` ledger partitions above the sequence, empty."""
    monkeypatch.setattr(partitions, "AHEAD", count + 2)
    _set_next_id(max(_next_id(), partitions.partitions(table=LEDGER)[-1].upper - 10))
    ensure_partitions(table=LEDGER)
    position = _next_id()
    fresh = [
        p for p in partitions.partitions(table=LEDGER) if p.lower is not None and p.lower > position
    ]
    monkeypatch.setattr(partitions, "AHEAD", 2)
    return fresh[:count]


def test_an_expired_ledger_partition_is_dropped_whole_and_one_with_a_recent_record_kept(
    monkeypatch,
):
    expired, young = _fresh(monkeypatch, 2)
    _put(expired, 1, "now() - interval '40 days'", "old-1")
    _put(expired, 2, "now() - interval '35 days'", "old-2")
    _put(young, 1, "now() - interval '40 days'", "young-1")
    _put(young, 2, "now() - interval '1 day'", "young-2")
    _set_next_id(young.upper + 5)  # the ids past both
    ensure_partitions(table=LEDGER)
    below = [p.name for p in partitions.partitions(table=LEDGER) if p.upper <= expired.lower]
    runs_before = [p.name for p in partitions.partitions()]

    dropped = drop_expired_partitions(timedelta(days=30), table=LEDGER)

    assert dropped == [*below, expired.name]
    assert _one("SELECT to_regclass(%s) IS NULL", [expired.name])
    assert young.name in {p.name for p in partitions.partitions(table=LEDGER)}
    assert Occurrence.objects.count() == 2  # the young partition's, both
    assert [p.name for p in partitions.partitions()] == runs_before  # the runs' untouched
    assert drop_expired_partitions(timedelta(days=30), table=LEDGER) == []


def test_the_prune_drops_expired_ledger_partitions_whole(monkeypatch):
    (expired,) = _fresh(monkeypatch, 1)
    _put(expired, 1, "now() - interval '40 days'", "old-1")
    _set_next_id(expired.upper + 5)
    ensure_partitions(table=LEDGER)
    kept = _daily("kept")
    ledger.record_one(kept.pk, EIGHT, Fate.CANCELLED, "recent", "test")  # past the partition

    result = prune_runs(timedelta(days=30))

    assert expired.name in result.dropped_partitions
    assert _one("SELECT to_regclass(%s) IS NULL", [expired.name])
    assert list(Occurrence.objects.values_list("detail", flat=True)) == ["recent"]


def test_a_decision_repeated_across_a_partition_boundary_is_told_as_the_first():
    """(job, scheduled_for) is unique within a partition: ON CONFLICT DO NOTHING (no conflict
    target) keeps a second decision out there, in Python's writes and the SQL functions'. In
    the next partition the second is written; the ledger's readers count the first only."""
    ensure_partitions(table=LEDGER)
    job = _daily()
    # Given a decision recorded, and made again in the same partition: kept out
    ledger.record_one(job.pk, EIGHT, Fate.CANCELLED, "first decision", "beat-1")
    ledger.record_one(job.pk, EIGHT, Fate.QUARANTINED, "again, same partition", "beat-1")
    with connection.cursor() as cursor:  # as functions.sql writes a record
        cursor.execute(
            "INSERT INTO schedapp_occurrence (job_id, scheduled_for, last, count, fate, detail, "
            "decided_by) VALUES (%s, %s, %s, 1, 'late', 'door', 'w') ON CONFLICT DO NOTHING",
            [job.pk, EIGHT, EIGHT],
        )
    assert Occurrence.objects.filter(job=job).count() == 1
    first_id = Occurrence.objects.get(job=job).pk
    # When the sequence has moved into the next partition and the decision is made again
    _into_a_later_partition(first_id)
    ledger.record_one(job.pk, EIGHT, Fate.QUARANTINED, "second decision", "beat-2")
    ledger.record_one(job.pk, EIGHT + timedelta(days=1), Fate.PAUSED, "next day", "beat-2")
    records = list(Occurrence.objects.filter(job=job, scheduled_for=EIGHT).order_by("id"))
    assert [r.detail for r in records] == ["first decision", "second decision"]
    assert _partition_of(records[0].pk) != _partition_of(records[1].pk)

    # Then explain answers with the first decision
    answer = explain.explain(job, EIGHT)
    assert answer.entry is not None
    assert (answer.entry.fate, answer.entry.detail) == (Fate.CANCELLED, "first decision")
    assert "second decision" not in answer.text
    # and the timeline lists it once
    entries = [e for e in explain.timeline(job) if e.first == EIGHT]
    assert [(e.fate, e.detail) for e in entries] == [(Fate.CANCELLED, "first decision")]
    assert [e.detail for e in explain.timeline(job, fates=[Fate.QUARANTINED])] == []
    # and the fleet's view counts it once, under the first fate
    fleet = explain.not_run(db_now() - timedelta(hours=1))
    assert fleet.occurrences_by_fate == {Fate.CANCELLED: 1, Fate.PAUSED: 1}
    assert sorted(e.detail for _job, _name, e in fleet.records) == ["first decision", "next day"]
    # (the fleet's view looks for the first within its window only: not a scan of the whole
    # ledger for each record it counts)
    Occurrence.objects.filter(pk=records[0].pk).update(recorded_at=db_now() - timedelta(hours=2))
    fleet = explain.not_run(db_now() - timedelta(hours=1))
    assert fleet.occurrences_by_fate == {Fate.QUARANTINED: 1, Fate.PAUSED: 1}
    # and nothing is unaccounted for either way
    assert explain.unaccounted(job, EIGHT, EIGHT + timedelta(days=1)) == []
