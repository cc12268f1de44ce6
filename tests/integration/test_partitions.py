"""Run history partitioned by id on PostgreSQL (migration 0046, schedapp.partitions).

The migration, applied to a populated one-table install, keeps every row (count and checksum),
attaches the old table as the first partition without rebuilding or rescanning anything under
its lock, and claims and doors work after it; partitions are made ahead of the ids, once,
whoever races; expired partitions are dropped whole, never one holding a lease, by the
database's clock.
"""

from __future__ import annotations

import importlib
import itertools
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.apps.registry import Apps
from django.db import IntegrityError, OperationalError, connection, connections, transaction
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from schedapp import lease, partitions
from schedapp.db import db_now
from schedapp.lease import DoorVerdict
from schedapp.partitions import drop_expired_partitions, ensure_partitions
from tests.claiming import claim_one
from tests.migrating import files, migrate_noting

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgresql]

BEFORE = ("schedapp", "0045_run_by_id")
AFTER = ("schedapp", "0046_partitioned_runs")
CHECKSUM = "SELECT count(*), md5(string_agg(t::text, ',' ORDER BY id)) FROM schedapp_jobrun t"


def _rows(sql: str, params: list | None = None) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params or [])
        return cursor.fetchall()


def _one(sql: str, params: list | None = None):
    return _rows(sql, params)[0][0]


@pytest.fixture
def unpartitioned() -> Iterator[Apps]:
    """The database before 0046 (one run table); migrated to the latest again after."""
    executor = MigrationExecutor(connection)
    executor.migrate([BEFORE])
    try:
        assert _one("SELECT relkind FROM pg_class WHERE relname = 'schedapp_jobrun'") == "r"
        yield executor.loader.project_state([BEFORE]).apps
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())


def _fill(apps: Apps, jobs: int = 20, runs_per_job: int = 150) -> list[int]:
    job_model, run_model = apps.get_model("schedapp", "Job"), apps.get_model("schedapp", "JobRun")
    now = db_now()
    made = job_model.objects.bulk_create(
        job_model(
            name=f"old-{i}",
            task="project.tasks.record",
            interval=timedelta(minutes=1),
            state="paused",
            token=runs_per_job,
        )
        for i in range(jobs)
    )
    run_model.objects.bulk_create(
        run_model(
            job_id=job.id,
            token=token,
            attempt=1,
            kind="scheduled",
            scheduled_for=now - timedelta(minutes=runs_per_job - token),
            due_at=now - timedelta(minutes=runs_per_job - token),
            dispatched_at=now - timedelta(minutes=runs_per_job - token),
            finished_at=now - timedelta(minutes=runs_per_job - token),
            task_id=f"task-{job.id}-{token}",
            status="succeeded",
            error="x" * (token % 7),
        )
        for job in made
        for token in range(1, runs_per_job + 1)
    )
    return [job.id for job in made]


def test_the_migration_keeps_every_row_and_rebuilds_nothing_under_its_lock(unpartitioned):
    job_ids = _fill(unpartitioned)
    before = _rows(CHECKSUM)[0]
    assert before[0] == 3000
    files_before = files("schedapp_jobrun")
    fk_before = _one(
        "SELECT oid FROM pg_constraint WHERE conrelid = 'schedapp_jobrun'::regclass "
        "AND contype = 'f'"
    )
    notices = migrate_noting(AFTER)

    # The same rows, column by column, read through the partitioned table.
    assert _rows(CHECKSUM)[0] == before
    assert _one("SELECT relkind FROM pg_class WHERE relname = 'schedapp_jobrun'") == "p"
    parts = partitions.partitions()
    legacy, first = parts[0], parts[1]
    assert legacy.name == "schedapp_jobrun_legacy" and legacy.lower is None
    assert first.lower == legacy.upper
    assert legacy.upper > max(_one("SELECT max(id) FROM schedapp_jobrun"), 1) + 9_000_000
    # No rescan: the validated check proved the bound (PostgreSQL says so at DEBUG1)...
    assert any(
        'partition constraint for table "schedapp_jobrun_legacy" is implied' in n for n in notices
    ), notices
    # ...no rewrite and no index built: the table and each index kept its file.
    files_after = files("schedapp_jobrun_legacy")
    renamed = {
        "schedapp_jobrun": "schedapp_jobrun_legacy",
        "schedapp_jobrun_pkey": "schedapp_jobrun_legacy_pkey",
        "schedapp_run_job_token": "schedapp_run_job_token",
    }
    assert files_after == {renamed.get(n, f"{n}_legacy"): f for n, f in files_before.items()}
    # Each parent index has the legacy table's as its partition: none made anew.
    assert (
        _one(
            "SELECT count(*) FROM pg_inherits i JOIN pg_index x ON x.indexrelid = i.inhrelid "
            "WHERE x.indrelid = 'schedapp_jobrun_legacy'::regclass"
        )
        == len(files_before) - 2
    )  # all but the table itself and the unique (job, token)
    # The foreign key is the one Django made, now a child of the parent's: not checked again.
    fk = _rows(
        "SELECT oid, conparentid <> 0, convalidated, condeferrable, condeferred "
        "FROM pg_constraint WHERE conrelid = 'schedapp_jobrun_legacy'::regclass "
        "AND contype = 'f'"
    )
    assert fk == [(fk_before, True, True, True, True)]
    assert _rows(
        "SELECT reloptions FROM pg_class WHERE relname IN (%s, %s)", [legacy.name, first.name]
    ) == [(["fillfactor=80"],), (["fillfactor=80"],)]

    # One run per claim, in the legacy partition and in a new one.
    free = _one("SELECT max(id) + 1 FROM schedapp_jobrun")
    with pytest.raises(IntegrityError, match="schedapp_run_job_token"), transaction.atomic():
        _copy_run(job_ids[0], 1, free)
    # The claim and the door on the migrated table: the new run in the new partition.
    job, run = claim_one(interval=60)
    assert _one(
        "SELECT tableoid::regclass::text FROM schedapp_jobrun WHERE job_id = %s", [job.id]
    ) == (first.name)
    assert lease.admit_run(run.job_id, run.token, "w-1", "a-1") == DoorVerdict.ADMITTED
    assert lease.complete_run(run.job_id, run.token, lease.SUCCEEDED).applied
    with pytest.raises(IntegrityError, match="schedapp_run_job_token_p"), transaction.atomic():
        _copy_run(job.id, run.token, first.lower + 1_000)


def _holding_the_run_table():  # type: ignore[no-untyped-def]
    """Another connection in a transaction that read the run table (a long report, an admin
    page): its ACCESS SHARE lock stands between the migration and its ACCESS EXCLUSIVE one."""
    import psycopg

    other = psycopg.connect(**connection.get_connection_params())
    other.execute("BEGIN")
    other.execute("SELECT count(*) FROM schedapp_jobrun")
    return other


def _cut_and_validated(apps: Apps, monkeypatch, sleep):  # type: ignore[no-untyped-def]
    """Migration 0046 (its lock waited for 100 ms at most, ``sleep`` between its tries) on a
    few runs, through its steps 1 and 2; the module, its cut, and the rows' checksum."""
    migration = importlib.import_module("schedapp.migrations.0046_partitioned_runs")
    monkeypatch.setattr(migration, "LOCK_TIMEOUT", "100ms")
    monkeypatch.setattr(migration, "time", SimpleNamespace(sleep=sleep))
    _fill(apps, jobs=2, runs_per_job=10)
    before = _rows(CHECKSUM)[0]
    with connection.cursor() as cursor:
        cut = migration.choose_cut(cursor)
        migration.validate(cursor)
    return migration, cut, before


def test_the_swap_waits_out_a_long_transaction_by_trying_again(unpartitioned, monkeypatch):
    """Step 3 waits at most ``LOCK_TIMEOUT`` for its lock, so that a long transaction on the
    run table cannot queue every claim and door behind the migration, and then tries again:
    a transaction ending within its tries delays the swap, and fails nothing."""
    waits: list[float] = []
    migration, cut, before = _cut_and_validated(
        unpartitioned, monkeypatch, sleep=lambda s: (waits.append(s), time.sleep(0.05))
    )
    # Given a transaction holding the table as the swap begins, ending a moment later
    other = _holding_the_run_table()
    ending = threading.Timer(0.5, other.execute, ["COMMIT"])
    ending.start()
    try:
        migration.swap(connection, cut)
    finally:
        ending.join()
        other.close()
    # Then the swap tried again until it had the lock, and made the partitions
    assert waits, "the swap never waited for its lock"
    assert _one("SELECT relkind FROM pg_class WHERE relname = 'schedapp_jobrun'") == "p"
    assert partitions.partitions()[0].upper == cut
    assert _rows(CHECKSUM)[0] == before


def test_a_swap_out_of_tries_leaves_one_table_and_a_second_run_takes_up_its_cut(
    unpartitioned, monkeypatch
):
    migration, cut, before = _cut_and_validated(unpartitioned, monkeypatch, sleep=lambda s: None)
    monkeypatch.setattr(migration, "LOCK_TRIES", 2)
    # Given a transaction holding the table through every try
    other = _holding_the_run_table()
    try:
        with pytest.raises(OperationalError, match="lock timeout"):
            migration.swap(connection, cut)
        # Then nothing is half-made: one table, every row, the check and its cut kept
        assert _one("SELECT relkind FROM pg_class WHERE relname = 'schedapp_jobrun'") == "r"
        assert _one("SELECT to_regclass('schedapp_jobrun_legacy')") is None
        assert _rows(CHECKSUM)[0] == before
    finally:
        other.execute("ROLLBACK")
        other.close()
    # and the migration run again once the table is free takes up the cut it chose
    MigrationExecutor(connection).migrate([AFTER])
    assert partitions.partitions()[0].upper == cut
    assert _rows(CHECKSUM)[0] == before


def _copy_run(job_id: int, token: int, new_id: int) -> None:
    """A second row for the claim (job_id, token), a copy of its first."""
    columns = (
        "token, attempt, scheduled_for, due_at, claimed_by, dispatched_at, heartbeats, worker, "
        "task_id, status, stale, error, traceback, job_id, admission"
    )
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO schedapp_jobrun (id, {columns}) "
            f"SELECT %s, {columns} FROM schedapp_jobrun WHERE job_id = %s AND token = %s",
            [new_id, job_id, token],
        )


def _set_next_id(value: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT setval(pg_get_serial_sequence('schedapp_jobrun', 'id'), %s, false)", [value]
        )


def test_partitions_are_made_ahead_once_with_their_unique_index():
    ensure_partitions()
    top = partitions.partitions()[-1]
    _set_next_id(top.upper - 10)  # the sequence nearly through the last partition
    made = ensure_partitions()
    assert made, "nothing made ahead of a sequence about to leave the last partition"
    parts = partitions.partitions()
    ahead = [p for p in parts if p.lower is not None and p.lower >= top.upper]
    assert [p.name for p in ahead] == made
    size = ahead[0].upper - ahead[0].lower
    assert size >= partitions.MIN_SIZE
    assert parts[-1].upper - (top.upper - 10) >= partitions.AHEAD * size
    # Contiguous: every id from the old top on has exactly one partition.
    for lower, upper in itertools.pairwise(ahead):
        assert lower.upper == upper.lower
    for p in ahead:
        assert _rows(
            "SELECT indexdef FROM pg_indexes WHERE tablename = %s AND indexdef LIKE %s",
            [p.name, "CREATE UNIQUE INDEX schedapp_run_job_token_p%"],
        ), p.name
        assert _one("SELECT reloptions FROM pg_class WHERE relname = %s", [p.name]) == [
            "fillfactor=80"
        ]
    assert ensure_partitions() == []  # idempotent
    # A run inserted right at the top goes in.
    job, _run = claim_one(interval=60)
    assert _one("SELECT id FROM schedapp_jobrun WHERE job_id = %s", [job.id]) == top.upper - 10


def test_two_callers_racing_make_the_partitions_once():
    ensure_partitions()
    _set_next_id(partitions.partitions()[-1].upper - 10)
    barrier = threading.Barrier(2)
    results: list[object] = []

    def call() -> None:
        try:
            barrier.wait(5)
            results.append(ensure_partitions())
        except Exception as exc:  # pragma: no cover - reported by the assertion below
            results.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=call) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert all(isinstance(r, list) for r in results), results
    assert sorted(len(r) for r in results)[0] == 0 and sorted(len(r) for r in results)[1] > 0


def test_partitions_are_sized_from_the_rate_observed_within_a_partition():
    ensure_partitions()
    with connection.cursor() as cursor:
        position = partitions.next_id(cursor)
    home = next(p for p in partitions.partitions() if p.lower is not None and p.lower > position)
    _set_next_id(home.lower)  # both runs at the start of a partition
    _job, first = claim_one(interval=60)
    _job, second = claim_one(name="second", interval=60)
    gap = 3_600
    assert home.lower <= first.run_id < first.run_id + gap < home.upper
    with connection.cursor() as cursor:
        # Two runs `gap` ids and 72 s apart: gap / 72 ids a second, a day of it per partition.
        cursor.execute(
            "UPDATE schedapp_jobrun SET dispatched_at = now() - interval '72 seconds' "
            "WHERE id = %s",
            [first.run_id],
        )
        cursor.execute(
            "UPDATE schedapp_jobrun SET id = %s WHERE id = %s", [first.run_id + gap, second.run_id]
        )
        existing = partitions.partitions()
        size = partitions.partition_size(cursor, timedelta(days=1), existing, 10**15)
        expected = max(partitions.MIN_SIZE, gap / 72 * 86_400)
        assert size == pytest.approx(expected, rel=0.01)
        assert size > partitions.MIN_SIZE
        # Ids jumping between partitions (as at migration 0046's cut) are no rate: each
        # partition is read alone; a partition with less than a minute of runs, neither.
        cursor.execute(
            "UPDATE schedapp_jobrun SET dispatched_at = now() - interval '30 seconds' "
            "WHERE id = %s",
            [first.run_id],
        )
        assert partitions.partition_size(cursor, timedelta(days=1), existing, 10**15) == (
            partitions.MIN_SIZE
        )
        # No history within the period: the floor.
        assert partitions.partition_size(cursor, timedelta(seconds=1), existing, 10**15) == (
            partitions.MIN_SIZE
        )


def test_expired_partitions_are_dropped_whole_but_never_one_holding_a_lease(monkeypatch):
    monkeypatch.setattr(partitions, "AHEAD", 7)
    ensure_partitions()
    with connection.cursor() as cursor:
        position = partitions.next_id(cursor)
    fresh = [p for p in partitions.partitions() if p.lower is not None and p.lower > position]
    expired, own_lease, retry, job_held, young = fresh[:5]
    old = "now() - interval '40 days'"

    def put(target: partitions.Partition, run_id: int, sql_set: str = "") -> int:
        job, run = claim_one(name=f"in-{target.name}-{run_id}", interval=60)
        # Finished: the job's lease is let go.
        assert lease.admit_run(run.job_id, run.token, "w-1", f"a-{run.run_id}") == (
            DoorVerdict.ADMITTED
        )
        assert lease.complete_run(run.job_id, run.token, lease.SUCCEEDED).applied
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE schedapp_jobrun SET id = %s, dispatched_at = {old}, "
                f"status = 'succeeded', finished_at = {old}{sql_set} WHERE id = %s",
                [target.lower + run_id, run.run_id],
            )
        return job.id

    for target in (expired, own_lease, retry, job_held, young):
        put(target, 1)
    put(own_lease, 2, ", own_lease = true, lease_expires_at = now() + interval '1 minute'")
    put(retry, 2, ", own_lease = true, retry_at = now() + interval '1 minute'")
    with connection.cursor() as cursor:  # a run dispatched yesterday: the partition is young
        cursor.execute(
            "UPDATE schedapp_jobrun SET dispatched_at = now() - interval '1 day' WHERE id = %s",
            [young.lower + 1],
        )
    # A job whose lease is held by the claim of a run in job_held.
    holder, run = claim_one(name="holder", interval=60)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE schedapp_jobrun SET id = %s, dispatched_at = {old} WHERE id = %s",
            [job_held.lower + 2, run.run_id],
        )
    assert _one("SELECT lease_expires_at IS NOT NULL FROM schedapp_job WHERE id = %s", [holder.id])
    # The ids past all five (and partitions made above again).
    monkeypatch.setattr(partitions, "AHEAD", 2)
    _set_next_id(young.upper + 5)
    ensure_partitions()
    below = [p.name for p in partitions.partitions() if p.upper <= expired.lower]
    assert (
        _one(f"SELECT count(*) FROM ({' UNION ALL '.join(f'SELECT FROM {n}' for n in below)}) t")
        == 0
    )
    # Python's clock a year ahead: nothing changes, only the database's counts.
    monkeypatch.setattr(timezone, "now", lambda: db_now() + timedelta(days=365))
    dropped = drop_expired_partitions(timedelta(days=30))
    assert dropped == [*below, expired.name]
    kept = {p.name for p in partitions.partitions()}
    assert {own_lease.name, retry.name, job_held.name, young.name} <= kept
    assert drop_expired_partitions(timedelta(days=30)) == []
    # With a retention longer than their age, nothing is dropped, held or not.
    assert drop_expired_partitions(timedelta(days=45)) == []
    # A partition detached by a drop interrupted before its DROP TABLE: dropped by the next.
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE schedapp_jobrun DETACH PARTITION {own_lease.name}")
    drop_expired_partitions(timedelta(days=45))
    assert _one("SELECT to_regclass(%s) IS NULL", [own_lease.name])
    assert _one("SELECT to_regclass(%s) IS NOT NULL", [retry.name])


def test_a_beat_makes_the_partitions_ahead_as_it_starts_and_after_a_missing_one(
    broker_url, monkeypatch
):
    from schedapp import beat
    from schedapp.celeryapp import celery_app

    ensure_partitions()
    top = partitions.partitions()[-1]
    _set_next_id(top.upper - 10)
    scheduler = beat.LeaseScheduler(celery_app(), lazy=True)
    # Each tick returns its delay instead of waiting it out on its LISTEN connection.
    monkeypatch.setattr(scheduler, "_sleep", lambda delay: delay)
    try:
        scheduler.setup_schedule()
        made = [p for p in partitions.partitions() if p.lower is not None and p.lower >= top.upper]
        assert made, "the beat started without making partitions ahead"
        # Ids past every partition (as if no beat had run for days): the claim is refused,
        # the next tick makes the partitions and claims the job.
        _set_next_id(partitions.partitions()[-1].upper + 5)
        job = api_job()
        scheduler.tick()
        assert _one("SELECT count(*) FROM schedapp_jobrun WHERE job_id = %s", [job]) == 0
        scheduler.tick()
        assert _one("SELECT count(*) FROM schedapp_jobrun WHERE job_id = %s", [job]) == 1
    finally:
        scheduler.close()


def api_job() -> int:
    from schedapp import api

    return api.schedule("project.tasks.record", run_at=db_now(), name="after-a-gap").pk


def test_a_drop_that_cannot_have_the_lock_in_time_leaves_the_partition_to_the_next(monkeypatch):
    import psycopg

    ensure_partitions()
    with connection.cursor() as cursor:
        position = partitions.next_id(cursor)
    passed = next(p for p in partitions.partitions() if p.lower is not None and p.lower > position)
    _set_next_id(passed.upper + 5)  # an empty partition the ids have passed: expired
    ensure_partitions()
    monkeypatch.setattr(partitions, "LOCK_TIMEOUT", "200ms")
    other = psycopg.connect(**connection.get_connection_params())
    try:
        other.execute("BEGIN")
        other.execute("LOCK TABLE schedapp_jobrun IN ACCESS SHARE MODE")  # a long reader
        assert passed.name not in drop_expired_partitions(timedelta(days=1))
        assert _one("SELECT to_regclass(%s) IS NOT NULL", [passed.name])
        other.execute("ROLLBACK")
        assert passed.name in drop_expired_partitions(timedelta(days=1))
    finally:
        other.close()


# --- the worker's reads, one partition each --------------------------------------------------


def _reads() -> dict[str, int]:
    """Scans (by index or whole) of each run partition made by this transaction so far."""
    return dict(
        _rows(
            "SELECT relname, coalesce(idx_scan, 0) + coalesce(seq_scan, 0) "
            "FROM pg_stat_xact_user_tables WHERE relname LIKE 'schedapp\\_jobrun\\_%%'"
        )
    )


def _read_by(calls) -> set[str]:
    """The partitions ``calls`` read, in one transaction rolled back."""
    with transaction.atomic():
        before = _reads()
        calls()
        after = _reads()
        transaction.set_rollback(True)
    return {name for name, scans in after.items() if scans > before.get(name, 0)}


def test_the_worker_reads_its_run_in_one_partition_by_the_id_its_message_carries():
    """A read of a run by (job, token) cannot be pruned: it visits every partition's unique
    index, 2x the door's lookup at 20 partitions. With the message's run id (v6 door and
    renewal, v5 success) each reaches the run's partition only, the tenth call as the first
    (PL/pgSQL plans a statement anew for its first five calls, then may keep a generic plan,
    which prunes as it starts)."""
    from schedapp.dispatch import message_headers
    from schedapp.message import RunHeaders

    # Given recurring runs in two partitions: an older one, and the one being written
    ensure_partitions()
    claim_one(name="older", interval=60)
    _set_next_id(partitions.partitions()[-1].upper - 10)
    assert ensure_partitions()  # more partitions, ahead of the ids
    parts = [p for p in partitions.partitions() if p.lower is not None]
    _set_next_id(parts[1].lower + 5)
    _, run = claim_one(name="newer", interval=60)
    (here,) = [p.name for p in parts if p.lower <= run.run_id < p.upper]
    key = (run.job_id, run.token)
    headers = RunHeaders.read(message_headers(run, "test"))
    assert headers is not None and headers.run_id == run.run_id

    def door(run_id):
        return lambda: [
            lease.admit_run(*key, "w1", "adm-1", run_id) is DoorVerdict.ADMITTED for _ in range(10)
        ]

    def renewal(run_ids):
        def calls():
            lease.admit_run(*key, "w1", "adm-1", run.run_id)
            for _ in range(10):
                assert lease.renew_leases([key], run_ids).renewed == {key}

        return calls

    # Then the door, with the run's id, reads its partition only; without, partition after
    # partition (in id order, until a lookup finds its row: here the older one too)
    assert _read_by(door(run.run_id)) == {here}
    assert len(_read_by(door(None))) > 1
    # and so does the heartbeat
    assert _read_by(renewal({key: run.run_id})) == {here}
    assert len(_read_by(renewal({}))) > 1

    # and the success in one call, with the id its message's headers carry
    def success():
        lease.admit_run(*key, "w1", "adm-1", run.run_id)
        assert lease.complete_run(*key, lease.SUCCEEDED, headers=headers).applied

    assert _read_by(success) == {here}


@pytest.mark.parametrize("end", ["failure", "retry", "expired", "revoked", "own lease"])
def test_a_run_ending_otherwise_is_read_in_its_partition_by_the_id_its_message_carries(end):
    """Failures, retries, expiries, revokes and the runs with their own lease take the general
    completion path (the ORM, the job row locked): it too finds the run by the id the
    message carries, not by (job, token), which probes every partition."""
    from types import SimpleNamespace

    from celery.exceptions import Retry

    from schedapp.message import HEADER_RUN
    from schedapp.models import JobRun
    from schedapp.worker.completions import Completions

    # Given a run in the newer of two partitions, admitted
    ensure_partitions()
    claim_one(name="older", interval=60)
    _set_next_id(partitions.partitions()[-1].upper - 10)
    assert ensure_partitions()
    parts = [p for p in partitions.partitions() if p.lower is not None]
    _set_next_id(parts[1].lower + 5)
    _, run = claim_one(
        name="newer", interval=60, overlap="allow_all" if end == "own lease" else "skip"
    )
    (here,) = [p.name for p in parts if p.lower <= run.run_id < p.upper]
    key = (run.job_id, run.token)

    def ends(run_id):
        request = SimpleNamespace(id=run.task_id, headers={HEADER_RUN: run_id} if run_id else {})
        task = SimpleNamespace(request=request)

        def calls():
            if end != "expired":
                lease.admit_run(*key, "w1", "adm-1", run.run_id)
            completions = Completions()
            if end == "retry":
                completions.on_task_retry(request=request, reason=Retry(exc=KeyError("k")))
            elif end == "expired":
                completions.on_task_revoked(request=request, expired=True)
            elif end == "revoked":
                completions.on_task_revoked(request=request, terminated=True)
            else:
                completions.on_task_failure(
                    sender=task, task_id=run.task_id, exception=KeyError("k")
                )
            status = JobRun.objects.filter(pk=run.run_id).values_list("status", flat=True).get()
            assert status == {"expired": "skipped", "revoked": "cancelled"}.get(end, "failed")

        return calls

    # Then the worker's outcome reads and writes the run in its partition only; without the
    # id, partition after partition
    assert _read_by(ends(run.run_id)) == {here}
    assert len(_read_by(ends(None))) > 1


def test_partitions_are_made_and_dropped_while_runs_are_read_and_written():
    """``CREATE TABLE ... PARTITION OF`` and a plain ``DETACH`` take the run table's ACCESS
    EXCLUSIVE lock: a long read of the history (an admin page, a report) held them off, and
    while they waited, every claim, door and page queued behind them. Attached and detached
    concurrently, neither waits for a reader or a writer of runs."""
    import psycopg

    ensure_partitions()
    _set_next_id(partitions.partitions()[-1].upper - 10)
    other = psycopg.connect(**connection.get_connection_params())
    try:
        # Given a transaction that read runs and wrote one, still open
        _, run = claim_one(interval=60)
        other.execute("BEGIN")
        other.execute("SELECT count(*) FROM schedapp_jobrun")
        other.execute("UPDATE schedapp_jobrun SET worker = 'w' WHERE id = %s", [run.run_id])
        # Then partitions are made ahead meanwhile
        made = ensure_partitions()
        assert made and all(_one("SELECT to_regclass(%s) IS NOT NULL", [n]) for n in made)
        other.execute("COMMIT")
    finally:
        other.close()


def test_a_drop_asked_inside_a_transaction_drops_nothing_and_leaves_it_usable(caplog):
    ensure_partitions()
    with connection.cursor() as cursor:
        position = partitions.next_id(cursor)
    _set_next_id(partitions.partitions()[-1].upper - 10)
    ensure_partitions()
    _set_next_id(partitions.partitions()[-1].lower + 5)
    expired = [p.name for p in partitions.partitions() if p.upper <= position]
    assert expired
    with transaction.atomic():
        assert drop_expired_partitions(timedelta(days=1)) == []
        assert _one("SELECT 1") == 1  # the caller's transaction goes on
    assert "outside a transaction only" in caplog.text
    assert set(expired) <= set(drop_expired_partitions(timedelta(days=1)))
