"""Migration 0046 (run history partitioned) on a populated install: each step timed.

A database of its own is migrated to 0045 (one table of runs), filled with ``RUNS`` runs over
``JOBS`` jobs by ``INSERT ... SELECT generate_series`` (then VACUUM ANALYZE, as a live install
would be), and migrated by 0046's own steps, timed one by one: the cut (a NOT VALID check),
the validation (a scan, writers not blocked), the swap (the one transaction under ACCESS
EXCLUSIVE: the lock's duration). Count and checksum of every row before and after; whether
the legacy table and its indexes kept their files (nothing rebuilt under the lock)::

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/schedapp_h1big RUNS=10000000 \\
        .venv/bin/python -m bench.partition_migration

``WRITERS=1``: a writer on a connection of its own inserts runs one by one (each its own
transaction, as claims do) from before the cut to after the swap; reported: how many, the
longest insert during the validation and during the swap (what the lock costs a writer), and
that its inserts landed on both sides of the cut.

The database named in DATABASE_URL is dropped and created again. Prints one JSON line. Then,
on the migrated database, the beats' ``ensure_partitions`` and the prune's
``drop_expired_partitions`` (retention one minute, so the legacy partition, its newest run
dispatched when the fill ended, is expired), timed; ``--after`` does only this last part, on
a database this script migrated before.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import threading
import time
from datetime import timedelta
from urllib.parse import urlparse

import psycopg

RUNS = int(os.environ.get("RUNS", "1000000"))
JOBS = int(os.environ.get("JOBS", "1000"))
# The filled rows (the writer's, WRITERS=1, have tokens from 10**9).
CHECKSUM = (
    "SELECT count(*), md5(string_agg(md5(t::text), '' ORDER BY id)) FROM schedapp_jobrun t "
    "WHERE token < 1000000000"
)
FILES = (
    "SELECT c.relname, c.relfilenode FROM pg_class c WHERE c.relname = 'schedapp_jobrun' "
    "OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = 'schedapp_jobrun'::regclass)"
)


def main() -> None:
    url = os.environ["DATABASE_URL"]
    if "--after" in sys.argv:
        print(json.dumps(housekeeping()))
        return
    name = urlparse(url).path.lstrip("/")
    admin = url.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name}")
        conn.execute(f"CREATE DATABASE {name}")
    env = dict(os.environ)
    manage = [sys.executable, "manage.py", "migrate", "-v0"]
    subprocess.run([*manage, "schedapp", "0045"], check=True, env=env)
    subprocess.run([*manage, "django_celery_results"], check=False, env=env)
    figures: dict[str, object] = {"runs": RUNS, "jobs": JOBS}
    with psycopg.connect(url, autocommit=True) as conn:
        started = time.monotonic()
        fill(conn)
        figures["fill_s"] = round(time.monotonic() - started, 1)
        figures["table_mb"] = conn.execute(
            "SELECT pg_total_relation_size('schedapp_jobrun') / 1048576"
        ).fetchone()[0]
        before = conn.execute(CHECKSUM).fetchone()
        files_before = dict(conn.execute(FILES).fetchall())
        migration = importlib.import_module("schedapp.migrations.0046_partitioned_runs")
        writer = Writer(url) if os.environ.get("WRITERS") == "1" else None
        if writer:
            writer.start()
            time.sleep(1)
        with conn.cursor() as cursor:
            t0 = time.monotonic()
            cut = migration.choose_cut(cursor)
            t1 = time.monotonic()
            migration.validate(cursor)
            t2 = time.monotonic()
        figures["cut"] = cut
        CUT[0] = cut
        figures["cut_s"] = round(t1 - t0, 3)
        figures["validate_s"] = round(t2 - t1, 2)
    # The swap through Django's connection, as the migration runs it.
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    django.setup()
    from django.db import connection

    t3 = time.monotonic()
    migration.swap(connection, cut)
    t4 = time.monotonic()
    figures["lock_s"] = round(t4 - t3, 3)
    connection.close()
    if writer:
        time.sleep(1)
        writer.stop()
        figures["writer"] = writer.report(t1, t2, t3, t4)
    with psycopg.connect(url, autocommit=True) as conn:
        after = conn.execute(CHECKSUM).fetchone()
        files_after = dict(
            conn.execute(FILES.replace("'schedapp_jobrun'", "'schedapp_jobrun_legacy'")).fetchall()
        )
        figures["partitioned"] = (
            conn.execute(
                "SELECT relkind FROM pg_class WHERE relname = 'schedapp_jobrun'"
            ).fetchone()[0]
            == "p"
        )
    figures["rows_before"], figures["rows_after"] = before[0], after[0]
    figures["checksum_equal"] = before == after
    figures["legacy_files_kept"] = sorted(files_before.values()) == sorted(files_after.values())
    figures.update(housekeeping())
    print(json.dumps(figures))


def housekeeping() -> dict[str, object]:
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    django.setup()
    from schedapp.partitions import drop_expired_partitions, ensure_partitions, partitions

    t0 = time.monotonic()
    made = ensure_partitions()
    t1 = time.monotonic()
    legacy_rows = _count("schedapp_jobrun_legacy")
    t2 = time.monotonic()
    dropped = drop_expired_partitions(timedelta(minutes=1))
    t3 = time.monotonic()
    return {
        "ensure_s": round(t1 - t0, 3),
        "made": made,
        "drop_s": round(t3 - t2, 3),
        "dropped": dropped,
        "dropped_rows": legacy_rows if "schedapp_jobrun_legacy" in dropped else 0,
        "partitions_left": [p.name for p in partitions()],
    }


def _count(table: str) -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {table}")
        return cursor.fetchone()[0]


class Writer(threading.Thread):
    """Runs inserted one by one, each timed (started at, seconds)."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.times: list[tuple[float, float]] = []
        self.ids: list[int] = []
        self.errors: list[str] = []
        self._halt = threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            job = conn.execute("SELECT min(id) FROM schedapp_job").fetchone()[0]
            token = 10**9
            while not self._halt.is_set():
                token += 1
                started = time.monotonic()
                try:
                    row = conn.execute(
                        "INSERT INTO schedapp_jobrun (job_id, token, attempt, scheduled_for, "
                        "due_at, claimed_by, dispatched_at, heartbeats, worker, admission, "
                        "task_id, status, stale, error, traceback) VALUES (%s, %s, 1, now(), "
                        "now(), 'w', now(), 0, '', '', 't', 'dispatched', false, '', '') "
                        "RETURNING id",
                        [job, token],
                    ).fetchone()
                    self.ids.append(row[0])
                except psycopg.Error as exc:
                    self.errors.append(str(exc).splitlines()[0])
                self.times.append((started, time.monotonic() - started))
                time.sleep(0.001)

    def stop(self) -> None:
        self._halt.set()
        self.join()

    def report(self, validate_from: float, validate_to: float, swap_from: float, swap_to: float):
        def longest(a: float, b: float) -> float:
            return round(max((d for t, d in self.times if a <= t + d and t <= b), default=0), 3)

        return {
            "inserts": len(self.ids),
            "errors": sorted(set(self.errors)),
            "longest_insert_s": round(max(d for _t, d in self.times), 3),
            "longest_during_validate_s": longest(validate_from, validate_to),
            "longest_during_swap_s": longest(swap_from, swap_to),
            "ids_below_cut": sum(1 for i in self.ids if i < CUT[0]),
            "ids_from_cut": sum(1 for i in self.ids if i >= CUT[0]),
        }


CUT = [0]


def fill(conn: psycopg.Connection) -> None:
    """JOBS jobs and RUNS finished runs, token per job rising, a day of dispatch times."""
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    django.setup()
    from schedapp.models import Job

    Job.objects.bulk_create(
        [
            Job(
                name=f"bench-{i}",
                task="project.tasks.record",
                interval=timedelta(seconds=60),
                state="paused",
            )
            for i in range(JOBS)
        ]
    )
    from django.db import connection

    connection.close()
    ids = [r[0] for r in conn.execute("SELECT id FROM schedapp_job ORDER BY id").fetchall()]
    conn.execute(
        """
        INSERT INTO schedapp_jobrun (job_id, token, attempt, kind, scheduled_for, due_at,
            claimed_by, dispatched_at, started_at, finished_at, heartbeats, worker, admission,
            task_id, status, stale, error, traceback)
        SELECT %(first)s + (g %% %(jobs)s), g / %(jobs)s + 1, 1, 'scheduled',
            now() - (%(runs)s - g) * interval '1 second' * 86400 / %(runs)s,
            now() - (%(runs)s - g) * interval '1 second' * 86400 / %(runs)s, 'bench-beat',
            now() - (%(runs)s - g) * interval '1 second' * 86400 / %(runs)s,
            now() - (%(runs)s - g) * interval '1 second' * 86400 / %(runs)s,
            now() - (%(runs)s - g) * interval '1 second' * 86400 / %(runs)s, 0, 'bench-worker',
            '', md5(g::text), 'succeeded', false, '', ''
        FROM generate_series(0, %(runs)s - 1) g
        """,
        {"first": ids[0], "jobs": JOBS, "runs": RUNS},
    )
    conn.execute("VACUUM ANALYZE schedapp_jobrun")


if __name__ == "__main__":
    main()
