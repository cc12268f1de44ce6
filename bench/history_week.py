"""History at volume (issue 32, parts 1-2): a simulated week of run history, partitioned by day.

For each size N in ``--sizes`` the script makes a scratch database (``--db``), migrates it (so
``schedapp_jobrun`` is partitioned by migration 0046, the real one), adds 10,000 jobs (the
admin bench's rows, ``project/admin_data.py``) and 1,000 one-off jobs due now, then:

* partitions: the migration's first, empty partition is dropped and one partition per
  simulated day is made for the 7 days, N/7 ids each, with the DDL ``ensure_partitions`` uses
  (``schedapp_jobrun_p<lower>``, the legacy partition's fillfactor, the unique (job, token)
  index); after the load the real ``schedapp.partitions.ensure_partitions`` (period: a day)
  makes the partitions ahead of the sequence, sized from the rate it observes;
* the load: N runs with ``COPY ... FROM STDIN`` (rows generated here, written in blocks),
  spread evenly over the week ending now: ids rise with dispatched_at, started 5 ms later,
  finished 50 ms to 2 s after; 2 % failed (error and a 20-line traceback), 0.5 % skipped, the
  rest succeeded; job ``i % 10,000``, token ``i // 10,000 + 1`` (unique per job), task id
  ``schedapp:<job>:<token>``; one transaction per day; then ``VACUUM (ANALYZE)``, as
  autovacuum would have done to a week-old, insert-only history;
* what it costs: rows; bytes on disk of every partition with its indexes and TOAST
  (``pg_total_relation_size`` summed), per run;
* the claim (bench/scale.py's way): ``claim_due_jobs`` of the 1,000 due jobs, each rolled back
  after its deferred foreign-key checks ran, ``--repeat`` times, median;
* the worker's statements on runs of the newest partition (300 claimed and committed):
  the door, one renewal and the common success (``admit_run``, ``renew_leases`` and
  ``succeed_run`` of ``schedapp/sql/queries.sql``, with the run's id as a worker sends it),
  each its own autocommit round trip, median us; and
  EXPLAIN (ANALYZE, BUFFERS) of the (job, token) lookup those functions make, which names no
  id and so cannot be pruned to one partition;
* "did it run?": ``schedapp.explain`` of one occurrence in mid-week of a job like most
  (N/10,000 runs) and of the busy job (one run in ten, ``BUSY_SHARE``), and the claim again,
  each with the runs' occurrence index (migration 0050) and without it (the lookups: the index
  dropped in a transaction rolled back, the same rows in the same sitting; the claim: the index
  dropped, then built again, timed); the index's size; EXPLAIN of the lookup;
* the admin pages of bench/admin_changelist.py (runs changelist, page 2, status=failed, the
  runs of one job, a job's page, the overview) through Django's test client: one warm-up, then
  ``--repeat`` requests, median; EXPLAIN (ANALYZE, BUFFERS) of the runs changelist's main query
  and of a run looked up by id, with the partitions each touched;
* the drop of a day, three times each way, oldest day first: ``drop_expired_partitions``
  with a retention (5.5, 3.5, 1.5 days) under which exactly the oldest day left has expired,
  timed (after a first pass that drops only the empty legacy partition the migration left),
  alternating with the next day by ``ALTER TABLE ... DETACH PARTITION ... CONCURRENTLY`` and
  ``DROP TABLE``, each timed; medians.

Why: at 1,000 executions a second, history grows by 86 million runs a day. Partitioning is
worth it if what people and processes do stays flat as it grows (the claim, the worker's
writes, the admin) and retention costs a constant, not a DELETE proportional to a day.

Run from the repository root (PostgreSQL at BENCH_PG, default 127.0.0.1:5432, user postgres)::

    .venv/bin/python -m bench.history_week [--sizes 1000000 10000000 30000000] \\
        [--db schedapp_bench_history_week] [--repeat 5] [--keep] [--tag TAG]

It prints one markdown row per size and writes every figure, plans included, to
``bench/results/history-week-<date>[-<tag>].txt`` (and ``.json``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import common  # noqa: E402
from project import admin_data  # noqa: E402

PARENT = "schedapp_jobrun"
JOBS = 10_000  # the jobs the history's runs belong to (project/admin_data.py's rows)
BUSY_SHARE = 10  # one run in ten is the busy job's (its last): a job that fires every second
DUE = 1_000  # one-off jobs due now, for the claim
WORKER_RUNS = 300  # runs claimed and committed for the worker's statements
DAYS = 7
WEEK = DAYS * 86_400.0
BLOCK = 20_000  # rows per COPY write
MASK = 2**128 - 1  # the admission: 32 hex digits, as a door writes a uuid4's
SPREAD = 0x9E3779B97F4A7C15F39CC0605CEDC835
RETENTION = timedelta(days=5.5)  # only the oldest day's runs are all older
COLUMNS = (
    "id, job_id, token, attempt, kind, scheduled_for, due_at, claimed_by, dispatched_at, "
    "started_at, finished_at, heartbeat_at, heartbeats, worker, admission, task_id, status, "
    "stale, error, traceback, own_lease, lease_expires_at, retry_at"
)
TRACEBACK = (
    "Traceback (most recent call last):\\n"
    + '  File "project/tasks.py", line 12, in record\\n    raise RuntimeError(boom)\\n' * 10
    + "RuntimeError: boom"
)


# --- the database ----------------------------------------------------------------------------


def url(db: str) -> str:
    return f"{common.PG}/{db}"


def recreate(db: str) -> None:
    from django.db import connections

    connections.close_all()
    with psycopg.connect(url("postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{db}"')


def drop(db: str) -> None:
    from django.db import connections

    connections.close_all()
    with psycopg.connect(url("postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')


def one(conn: psycopg.Connection, sql: str, params: Any = None) -> Any:
    row = conn.execute(sql, params).fetchone()
    return row[0] if row else None


def day_partitions(conn: psycopg.Connection, n: int) -> tuple[int, list[tuple[str, int, int]]]:
    """Drop the migration's first (empty) partition; make one of ``n / 7`` ids per day from the
    cut, as ensure_partitions makes its partitions. The cut and the days' (name, lower, upper)."""
    from schedapp import partitions

    parts = partitions.partitions()
    legacy, first = parts[0], parts[1]
    assert legacy.lower is None and len(parts) == 2, parts
    cut = first.lower
    assert cut is not None
    options = one(conn, "SELECT reloptions FROM pg_class WHERE relname = %s", [legacy.name])
    with_options = f" WITH ({', '.join(options)})" if options else ""
    days = []
    with conn.transaction():
        conn.execute(f"DROP TABLE {first.name}")
        for day in range(DAYS):
            lower, upper = cut + n * day // DAYS, cut + n * (day + 1) // DAYS
            name = f"{PARENT}_p{lower}"
            conn.execute(
                f"CREATE TABLE {name} PARTITION OF {PARENT} "
                f"FOR VALUES FROM ({lower}) TO ({upper}){with_options}"
            )
            conn.execute(
                f"CREATE UNIQUE INDEX schedapp_run_job_token_p{lower} ON {name} (job_id, token)"
            )
            days.append((name, lower, upper))
    return cut, days


# --- the rows --------------------------------------------------------------------------------


class Stamps:
    """Timestamps as COPY text, fast: the minute's text is cached, seconds appended."""

    def __init__(self) -> None:
        self.minutes: dict[int, str] = {}

    def __call__(self, epoch: float) -> str:
        minute, micros = divmod(round(epoch * 1e6), 60_000_000)
        text = self.minutes.get(minute)
        if text is None:
            if len(self.minutes) > 100_000:
                self.minutes.clear()
            text = datetime.fromtimestamp(minute * 60, UTC).strftime("%Y-%m-%d %H:%M")
            self.minutes[minute] = text
        seconds, fraction = divmod(micros, 1_000_000)
        return f"{text}:{seconds:02d}.{fraction:06d}+00"


def rows(cut: int, n: int, start: int, stop: int, week_start: float, first_job: int) -> str:
    """COPY text of runs ``start..stop-1`` (ids ``cut + i``) of the ``n`` spread over the week."""
    stamp = Stamps()
    step = WEEK / n
    out = []
    for i in range(start, stop):
        if i % BUSY_SHARE == 3:  # the busy job; its tokens above its own (a held lease)
            job, token = first_job + JOBS - 1, n // JOBS + 3 + i // BUSY_SHARE
        else:
            job, token = first_job + i % JOBS, i // JOBS + 1
        t = week_start + i * step
        due = stamp(t - 0.002)
        dispatched = stamp(t)
        started = stamp(t + 0.005)
        finished = stamp(t + 0.055 + (i % 40) * 0.05)
        if i % 50 == 7:
            status, error, tb = "failed", "RuntimeError: boom", TRACEBACK
        elif i % 200 == 11:
            status, error, tb = "skipped", "delivered but not executed: the job is paused", ""
        else:
            status, error, tb = "succeeded", "", ""
        out.append(
            f"{cut + i}\t{job}\t{token}\t1\tscheduled\t{due}\t{due}\tbeat-{i % 2}@host-a\t"
            f"{dispatched}\t{started}\t{finished}\t\\N\t0\tworker{i % 16}@host-b\t"
            f"{(i * SPREAD + 1) & MASK:032x}\tschedapp:{job}:{token}\t{status}\tf\t"
            f"{error}\t{tb}\tf\t\\N\t\\N\n"
        )
    return "".join(out)


def _rows(task: tuple[int, int, int, int, float, int]) -> bytes:
    return rows(*task).encode()


def load(conn: psycopg.Connection, cut: int, n: int, first_job: int) -> dict[str, Any]:
    """COPY the ``n`` runs, one transaction per day; the week ends now (the database's). The
    rows are made by two processes while this one writes them (``waiting``: its time spent
    waiting for them, not writing)."""
    week_start = float(one(conn, "SELECT extract(epoch FROM now())")) - WEEK
    started = time.monotonic()
    generating = 0.0
    with multiprocessing.get_context("fork").Pool(2) as pool:
        for day in range(DAYS):
            lo, hi = n * day // DAYS, n * (day + 1) // DAYS
            tasks = [
                (cut, n, b, min(hi, b + BLOCK), week_start, first_job) for b in range(lo, hi, BLOCK)
            ]
            with conn.transaction(), conn.cursor() as cursor:
                with cursor.copy(f"COPY {PARENT} ({COLUMNS}) FROM STDIN") as copy:
                    blocks = pool.imap(_rows, tasks)
                    while True:
                        t0 = time.monotonic()
                        text = next(blocks, None)
                        generating += time.monotonic() - t0
                        if text is None:
                            break
                        copy.write(text)
            done = time.monotonic() - started
            print(f"    day {day + 1}: {hi:,} runs in {done:.0f}s ({hi / done:,.0f}/s)", flush=True)
    copy_s = time.monotonic() - started
    conn.execute("SELECT setval(pg_get_serial_sequence(%s, 'id'), %s, false)", [PARENT, cut + n])
    t0 = time.monotonic()
    conn.execute(f"VACUUM (ANALYZE) {PARENT}")
    conn.execute("VACUUM (ANALYZE) schedapp_job")
    vacuum_s = time.monotonic() - t0
    return {
        "copy_s": copy_s,
        "copy_rows_per_s": n / copy_s,
        "waiting_for_rows_s": generating,
        "vacuum_analyze_s": vacuum_s,
    }


def add_jobs(conn: psycopg.Connection, n: int) -> int:
    """The admin bench's 10,000 jobs (their tokens past their runs'), and 1,000 due now."""
    from django.db import connection

    with connection.cursor() as cursor:  # its parameters bound as Django binds them
        admin_data.fill_jobs(cursor, 1, JOBS)
    with conn.transaction():
        # Past every run's token; the running ones' leases far ahead, so that no claim reaps
        # them; their few due ones later, so that the claim takes the 1,000 one-off jobs.
        conn.execute(
            "UPDATE schedapp_job SET token = %s, lease_expires_at = CASE WHEN "
            "lease_expires_at IS NOT NULL THEN now() + interval '1 day' END, "
            "next_run_at = greatest(next_run_at, now() + interval '1 hour')",
            [n // JOBS + 2],
        )
    first_job = one(conn, "SELECT min(id) FROM schedapp_job")
    now = common.db_now(conn)
    common.insert_jobs(
        conn, JOBS + 1, JOBS + DUE, now - timedelta(minutes=1), prefix="due-", notify=False
    )
    return first_job


# --- what it costs ---------------------------------------------------------------------------


def sizes(conn: psycopg.Connection) -> dict[str, Any]:
    parts = conn.execute(
        "SELECT c.relname, pg_total_relation_size(c.oid), pg_relation_size(c.oid), "
        "pg_indexes_size(c.oid) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "WHERE i.inhparent = %s::regclass ORDER BY c.relname",
        [PARENT],
    ).fetchall()
    return {
        "partitions": [
            {"name": name, "total": total, "heap": heap, "indexes": idx}
            for name, total, heap, idx in parts
        ],
        "total_bytes": sum(p[1] for p in parts),
        "heap_bytes": sum(p[2] for p in parts),
        "index_bytes": sum(p[3] for p in parts),
    }


def time_claims(repeat: int) -> dict[str, Any]:
    """bench/scale.py's measure: the claim of the due jobs, rolled back each time."""
    from django.db import connection, transaction

    from schedapp.lease import claim_due_jobs

    times, claimed = [], 0
    for _ in range(repeat):
        with transaction.atomic():
            t0 = time.perf_counter()
            result = claim_due_jobs("bench-history", DUE)
            with connection.cursor() as cursor:
                cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
            times.append(time.perf_counter() - t0)
            claimed = len(result.runs)
            transaction.set_rollback(True)
    return {
        "claim_ms": [t * 1000 for t in times],
        "claim_median_ms": statistics.median(times) * 1000,
        "claimed": claimed,
    }


def explain(conn: psycopg.Connection, sql: str, params: Any = None) -> dict[str, Any]:
    """EXPLAIN (ANALYZE, BUFFERS) in a transaction rolled back, summed up by ``summary``."""
    with conn.transaction(force_rollback=True):
        plan = "\n".join(
            r[0] for r in conn.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params).fetchall()
        )
    return summary(plan)


def summary(plan: str) -> dict[str, Any]:
    """A plan and what it says of the partitions: the scan nodes on them, the partitions it
    names, the nodes never executed, the subplans pruned away; its execution time."""
    on_partition = [
        ln for ln in plan.splitlines() if re.search(rf" on {PARENT}_(p\d+|legacy)\b", ln)
    ]
    return {
        "plan": plan,
        "partition_nodes": len(on_partition),
        "partitions_named": len(set(re.findall(rf" on ({PARENT}_(?:p\d+|legacy))\b", plan))),
        "never_executed": sum("never executed" in ln for ln in on_partition),
        "subplans_removed": sum(int(m) for m in re.findall(r"Subplans Removed: (\d+)", plan)),
        "execution_ms": float(re.search(r"Execution Time: ([\d.]+)", plan).group(1)),
    }


def worker_statements(conn: psycopg.Connection, explains: dict[str, Any]) -> dict[str, Any]:
    """Door, renewal and success on runs of the newest partition, each an autocommit round
    trip (as a worker makes them), WORKER_RUNS of each."""
    from django.db import transaction

    from schedapp.lease import claim_due_jobs
    from schedapp.sql import query

    with transaction.atomic():
        claimed = claim_due_jobs("bench-history", WORKER_RUNS).runs
    doors, renewals, successes, verdicts, applied = [], [], [], {}, 0
    for run in claimed:
        t0 = time.perf_counter()
        (verdict,) = conn.execute(
            query("admit_run"), [run.job_id, run.token, "bench@host", uuid.uuid4().hex, run.run_id]
        ).fetchone()
        doors.append(time.perf_counter() - t0)
        verdicts[verdict] = verdicts.get(verdict, 0) + 1
    for run in claimed:
        t0 = time.perf_counter()
        conn.execute(query("renew_leases"), [[run.job_id], [run.token], [run.run_id]]).fetchall()
        renewals.append(time.perf_counter() - t0)
    for run in claimed:
        t0 = time.perf_counter()
        (ok,) = conn.execute(
            query("succeed_run"),
            [
                run.job_id,
                run.token,
                run.scheduled_for,
                None,
                True,
                "",
                "UTC",
                None,
                None,
                run.run_id,
            ],
        ).fetchone()
        successes.append(time.perf_counter() - t0)
        applied += bool(ok)
    last = claimed[-1]
    explains["run by (job, token), as the door, renewal and success look it up"] = explain(
        conn,
        f"SELECT status FROM {PARENT} WHERE job_id = %s AND token = %s",
        [last.job_id, last.token],
    )
    explains["renewal's join of (job, token) pairs to their runs"] = explain(
        conn,
        "SELECT coalesce(array_agg(r.id), '{}') FROM unnest(%s::bigint[], %s::bigint[]) "
        f"AS h (id, token) JOIN {PARENT} r ON r.job_id = h.id AND r.token = h.token "
        "WHERE r.own_lease",
        [[last.job_id], [last.token]],
    )
    explains["run by id"] = explain(conn, f"SELECT * FROM {PARENT} WHERE id = %s", [last.run_id])
    return {
        "runs": len(claimed),
        "door_verdicts": verdicts,
        "successes_applied": applied,
        "door_median_us": statistics.median(doors) * 1e6,
        "renew_median_us": statistics.median(renewals) * 1e6,
        "succeed_median_us": statistics.median(successes) * 1e6,
    }


def admin_pages(
    repeat: int, first_job: int, conn: psycopg.Connection, explains: dict[str, Any]
) -> list[dict[str, Any]]:
    from django.contrib.auth.models import User
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext
    from django.urls import reverse

    from bench.admin_changelist import time_page

    client = Client()
    user = User.objects.filter(username="bench").first() or User.objects.create_superuser(
        "bench", "b@example.com", "pw"
    )
    client.force_login(user)
    runs = reverse("admin:schedapp_jobrun_changelist")
    some_job = first_job + JOBS // 2
    pages = [
        ("runs", runs),
        ("runs, page 2", f"{runs}?p=2"),
        ("runs, status=failed", f"{runs}?status__exact=failed"),
        ("runs of one job", f"{runs}?job={some_job}"),
        ("job page", reverse("admin:schedapp_job_change", args=[some_job])),
        ("overview", reverse("admin:schedapp_job_overview")),
    ]
    out = []
    for label, page in pages:
        median, worst, queries, status = time_page(client, page, repeat)
        out.append(
            {
                "page": label,
                "median_ms": median * 1000,
                "worst_ms": worst * 1000,
                "queries": queries,
                "status": status,
            }
        )
        # Every query of the page that reads the run table, explained (the first is, on the
        # runs pages, the changelist's main query: the 100 rows shown).
        with CaptureQueriesContext(connection) as captured:
            client.get(page)
        reads = [
            q["sql"]
            for q in captured.captured_queries
            # the ORM's quoted name, or the raw SQL's bare one (schedapp/sql/queries.sql)
            if re.search(rf"\b{PARENT}\b", q["sql"])
            and q["sql"].lstrip().upper().startswith(("SELECT", "WITH"))
        ]
        for k, sql in enumerate(reads[:6]):
            explains[f"{label}: run-table query {k + 1}"] = {**explain(conn, sql), "sql": sql}
    return out


OCCURRENCE_INDEX = "schedapp_run_occurrence"  # runs by (job, scheduled_for): migration 0050


def occurrence_lookups(
    conn: psycopg.Connection, first_job: int, repeat: int, explains: dict[str, Any]
) -> dict[str, Any]:
    """ "Did it run?" (``schedapp.explain``) of one occurrence in mid-week, of a job like most
    (N/10,000 runs) and of the busy one (N/10), the whole call and its read of the runs alone,
    and the claim, each timed with the runs' occurrence index and without it: the index is
    dropped in a transaction rolled back, so both arms read the same rows in the same sitting;
    three rounds, the arms in turn. The claim: with the index, then without it (dropped), then
    the index built again (timed: a plain build, not the migration's concurrent one), three
    rounds. Also the index's size on disk, every partition's."""
    from django.db import connection, transaction
    from django.test.utils import CaptureQueriesContext

    from schedapp.explain import RAN
    from schedapp.explain import explain as did_it_run

    jobs = {"a job like most": first_job + JOBS // 2, "the busy job": first_job + JOBS - 1}
    asked = {}
    for label, job in jobs.items():
        (count,) = conn.execute(
            f"SELECT count(*) FROM {PARENT} WHERE job_id = %s", [job]
        ).fetchone()
        (at,) = conn.execute(
            f"SELECT scheduled_for FROM {PARENT} WHERE job_id = %s ORDER BY id OFFSET %s LIMIT 1",
            [job, count // 2],
        ).fetchone()
        with CaptureQueriesContext(connection) as captured:
            answer = did_it_run(job, at)
        assert answer.entry is not None and answer.entry.fate == RAN, answer.text
        (sql,) = [q["sql"] for q in captured.captured_queries if f'"{PARENT}"' in q["sql"]]
        asked[label] = {"job": job, "job_runs": count, "at": at, "sql": sql}
    index_bytes = one(
        conn,
        "SELECT coalesce(sum(pg_relation_size(i.inhrelid)), 0) FROM pg_inherits i "
        "WHERE i.inhparent = %s::regclass",
        [OCCURRENCE_INDEX],
    )

    def timed(fn: Any) -> float:
        fn()  # a warm-up
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times) * 1000

    def read(sql: str) -> None:
        with connection.cursor() as cursor:
            cursor.execute(sql)
            cursor.fetchall()

    def arm() -> dict[str, Any]:
        out: dict[str, Any] = {}
        for label, a in asked.items():
            out[f"{label}: explain_ms"] = timed(lambda a=a: did_it_run(a["job"], a["at"]))
            out[f"{label}: runs read_ms"] = timed(lambda a=a: read(a["sql"]))
        return out

    arms: dict[str, list[dict[str, Any]]] = {"with_index": [], "without_index": []}
    for _ in range(3):
        arms["with_index"].append(arm())
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute(f"DROP INDEX {OCCURRENCE_INDEX}")
            arms["without_index"].append(arm())
            for label, a in asked.items():
                explains[f"did it run, {label}, without the occurrence index"] = explain_in(
                    a["sql"]
                )
            transaction.set_rollback(True)
    for label, a in asked.items():
        explains[f"did it run, {label}: the runs of one occurrence"] = explain(conn, a["sql"])
    # The claim's cost of the index (an insert into it per run): timed with the index there
    # and after it was dropped for good, then built again (in a transaction rolled back, the
    # claim's savepoints under the DROP's locks cost more than the index itself)
    for with_index, without_index in zip(arms["with_index"], arms["without_index"], strict=True):
        with_index["claim_ms"] = time_claims(repeat)["claim_median_ms"]
        conn.execute(f"DROP INDEX {OCCURRENCE_INDEX}")
        without_index["claim_ms"] = time_claims(repeat)["claim_median_ms"]
        t0 = time.perf_counter()
        conn.execute(f"CREATE INDEX {OCCURRENCE_INDEX} ON {PARENT} (job_id, scheduled_for)")
        with_index["index_build_ms"] = (time.perf_counter() - t0) * 1000
    medians = {
        name: {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
        for name, rounds in arms.items()
    }
    return {
        "asked": {k: {**v, "at": str(v["at"])} for k, v in asked.items()},
        "index_bytes": index_bytes,
        "rounds": arms,
        **medians,
    }


def explain_in(sql: str) -> dict[str, Any]:
    """``explain`` on Django's connection, inside its transaction (the index dropped there)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql)
        return summary("\n".join(r[0] for r in cursor.fetchall()))


def drop_day(conn: psycopg.Connection, days: list[tuple[str, int, int]]) -> dict[str, Any]:
    """Six of the seven days dropped, oldest first, alternating the two ways: days 1, 3 and
    5 by ``drop_expired_partitions`` with a retention under which exactly that day has
    expired (5.5, 3.5, 1.5 days), days 2, 4 and 6 by DETACH CONCURRENTLY then DROP TABLE."""
    from schedapp import partitions

    t0 = time.perf_counter()
    first_pass = partitions.drop_expired_partitions(timedelta(days=8))
    first_s = time.perf_counter() - t0
    module, detach, drop_table, dropped = [], [], [], []
    for k in range(3):
        t0 = time.perf_counter()
        gone = partitions.drop_expired_partitions(RETENTION - timedelta(days=2 * k))
        module.append((time.perf_counter() - t0) * 1000)
        assert gone == [days[2 * k][0]], gone
        dropped += gone
        name = days[2 * k + 1][0]
        t0 = time.perf_counter()
        conn.execute(f"ALTER TABLE {PARENT} DETACH PARTITION {name} CONCURRENTLY")
        detach.append((time.perf_counter() - t0) * 1000)
        t0 = time.perf_counter()
        conn.execute(f"DROP TABLE {name}")
        drop_table.append((time.perf_counter() - t0) * 1000)
        dropped.append(name)
    return {
        "first_pass_dropped": first_pass,
        "first_pass_ms": first_s * 1000,
        "dropped_in_order": dropped,
        "drop_expired_each_ms": module,
        "detach_concurrently_each_ms": detach,
        "drop_table_each_ms": drop_table,
        "drop_expired_ms": statistics.median(module),
        "detach_concurrently_ms": statistics.median(detach),
        "drop_table_ms": statistics.median(drop_table),
    }


# --- one size --------------------------------------------------------------------------------


def one_size(db: str, n: int, repeat: int) -> dict[str, Any]:
    from django.core.management import call_command

    from schedapp import partitions

    print(f"history_week: {n:,} runs in {db}", flush=True)
    recreate(db)
    call_command("migrate", verbosity=0)
    # Parameters bound client-side, as Django binds them (not as smallint, psycopg's own)
    with psycopg.connect(url(db), autocommit=True, cursor_factory=psycopg.ClientCursor) as conn:
        first_job = add_jobs(conn, n)
        cut, days = day_partitions(conn, n)
        loaded = load(conn, cut, n, first_job)
        ahead = partitions.ensure_partitions(period=timedelta(days=1))
        count = one(conn, f"SELECT count(*) FROM {PARENT}")
        disk = sizes(conn)
        print(
            f"  {count:,} runs, {disk['total_bytes'] / 2**30:.2f} GiB, "
            f"{disk['total_bytes'] / count:.0f} B/run; made ahead: {ahead}",
            flush=True,
        )
        explains: dict[str, Any] = {}
        load_before = os.getloadavg()
        claims = time_claims(repeat)
        print(f"  claim of {claims['claimed']}: {claims['claim_median_ms']:.1f} ms", flush=True)
        worker = worker_statements(conn, explains)
        print(
            f"  door {worker['door_median_us']:.0f} us, renew {worker['renew_median_us']:.0f}"
            f" us, succeed {worker['succeed_median_us']:.0f} us",
            flush=True,
        )
        lookups = occurrence_lookups(conn, first_job, repeat, explains)
        for arm in ("with_index", "without_index"):
            print(f"  {arm}: " + ", ".join(f"{k} {v:.2f}" for k, v in lookups[arm].items()))
        pages = admin_pages(repeat, first_job, conn, explains)
        for p in pages:
            print(f"  {p['page']}: {p['median_ms']:.0f} ms ({p['queries']} queries)", flush=True)
        dropping = drop_day(conn, days)
        print(
            f"  drop of a day (median of 3): drop_expired_partitions "
            f"{dropping['drop_expired_ms']:.1f} ms; "
            f"DETACH CONCURRENTLY {dropping['detach_concurrently_ms']:.1f} ms + DROP TABLE "
            f"{dropping['drop_table_ms']:.1f} ms",
            flush=True,
        )
    return {
        "size": n,
        "load_average_before_after": [load_before, os.getloadavg()],
        "rows": count,
        "cut": cut,
        "days": days,
        "made_ahead": ahead,
        **loaded,
        **disk,
        **claims,
        "worker": worker,
        "occurrence_lookups": lookups,
        "admin": pages,
        "drop": dropping,
        "explain": explains,
    }


def table(results: list[dict[str, Any]]) -> str:
    head = [
        "runs",
        "GiB on disk",
        "B/run",
        "COPY runs/s",
        "drop a day (ms)",
        "detach+drop (ms)",
        "claim 1,000 (ms)",
        "door (us)",
        "renew (us)",
        "succeed (us)",
        "did it run, most jobs (ms)",
        "... without the index (ms)",
        "did it run, the busy job (ms)",
        "... without the index (ms)",
        "claim with / without the index (ms)",
        "index build (ms)",
        "occurrence index B/run",
    ]
    pages = [p["page"] for p in results[0]["admin"]] if results else []
    head += [f"{p} (ms)" for p in pages]
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for r in results:
        w, d, o = r["worker"], r["drop"], r["occurrence_lookups"]
        cells = [
            f"{r['rows']:,}",
            f"{r['total_bytes'] / 2**30:.2f}",
            f"{r['total_bytes'] / r['rows']:.0f}",
            f"{r['copy_rows_per_s']:,.0f}",
            f"{d['drop_expired_ms']:.1f}",
            f"{d['detach_concurrently_ms'] + d['drop_table_ms']:.1f}",
            f"{r['claim_median_ms']:.1f}",
            f"{w['door_median_us']:.0f}",
            f"{w['renew_median_us']:.0f}",
            f"{w['succeed_median_us']:.0f}",
            f"{o['with_index']['a job like most: explain_ms']:.1f}",
            f"{o['without_index']['a job like most: explain_ms']:.1f}",
            f"{o['with_index']['the busy job: explain_ms']:.1f}",
            f"{o['without_index']['the busy job: explain_ms']:.1f}",
            f"{o['with_index']['claim_ms']:.0f} / {o['without_index']['claim_ms']:.0f}",
            f"{o['with_index']['index_build_ms']:,.0f}",
            f"{o['index_bytes'] / r['rows']:.0f}",
        ]
        cells += [f"{p['median_ms']:.0f}" for p in r["admin"]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def report(results: list[dict[str, Any]], machine: dict[str, Any]) -> str:
    out = [
        f"history_week {datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        json.dumps(machine),
        "",
        table(results),
        "",
    ]
    for r in results:
        out.append(f"## {r['rows']:,} runs")
        out.append(
            f"load: COPY {r['copy_s']:.0f} s ({r['copy_rows_per_s']:,.0f} runs/s, of which"
            f" {r['waiting_for_rows_s']:.0f} s waiting for rows), VACUUM (ANALYZE)"
            f" {r['vacuum_analyze_s']:.0f} s"
        )
        out.append(
            f"disk: {r['total_bytes']:,} B total ({r['heap_bytes']:,} heap, "
            f"{r['index_bytes']:,} indexes), {r['total_bytes'] / r['rows']:.1f} B/run"
        )
        for p in r["partitions"]:
            out.append(
                f"  {p['name']}: {p['total']:,} B ({p['heap']:,} heap, {p['indexes']:,} indexes)"
            )
        out.append(
            f"load average (1, 5, 15 min) before and after measuring: "
            f"{r['load_average_before_after']}"
        )
        out.append(f"made ahead by ensure_partitions: {r['made_ahead']}")
        out.append(f"claim: {[round(x, 1) for x in r['claim_ms']]} ms, {r['claimed']} claimed")
        out.append(f"worker: {json.dumps(r['worker'])}")
        out.append(f"occurrence lookups: {json.dumps(r['occurrence_lookups'], default=str)}")
        out.append(f"drop: {json.dumps(r['drop'])}")
        for p in r["admin"]:
            out.append(
                f"admin {p['page']}: median {p['median_ms']:.0f} ms, worst "
                f"{p['worst_ms']:.0f} ms, {p['queries']} queries, HTTP {p['status']}"
            )
        for label, e in r["explain"].items():
            out.append(
                f"\n### EXPLAIN: {label}: {e['partition_nodes']} partition scan nodes "
                f"over {e['partitions_named']} partitions, {e['never_executed']} never "
                f"executed, {e['subplans_removed']} subplans removed, "
                f"{e['execution_ms']:.2f} ms"
            )
            if "sql" in e:
                out.append(e["sql"])
            out.append(e["plan"])
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", type=int, default=[1_000_000, 10_000_000, 30_000_000])
    parser.add_argument("--db", default=common.bench_db("history_week"))
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--keep", action="store_true", help="keep the last size's database")
    parser.add_argument("--tag", default="", help="results as history-week-<date>-<tag>.txt")
    args = parser.parse_args(argv)
    if not args.db.startswith("schedapp_"):
        parser.error("--db must name a scratch database (schedapp_...)")
    os.environ["DATABASE_URL"] = url(args.db)
    os.environ["DJANGO_SETTINGS_MODULE"] = "project.settings"
    os.environ["DJANGO_ALLOWED_HOSTS"] = "testserver"
    os.environ["DJANGO_DEBUG"] = "0"
    os.environ.setdefault("CELERY_BROKER_URL", "memory://")
    # the database is made per size: nothing may connect before
    with psycopg.connect(url("postgres"), autocommit=True) as conn:
        if not one(conn, "SELECT 1 FROM pg_database WHERE datname = %s", [args.db]):
            conn.execute(f'CREATE DATABASE "{args.db}"')
    import django

    django.setup()
    machine = common.machine()
    results = []
    stamp = datetime.now(UTC).strftime("%Y-%m-%d") + (f"-{args.tag}" if args.tag else "")
    path = common.RESULTS / f"history-week-{stamp}.txt"
    try:
        for n in args.sizes:
            results.append(one_size(args.db, n, args.repeat))
            path.write_text(report(results, machine))
            (common.RESULTS / f"history-week-{stamp}.json").write_text(
                json.dumps({"machine": machine, "sizes": results}, indent=1, default=str)
            )
    finally:
        if not args.keep:
            drop(args.db)
    print()
    print(table(results))
    print(f"\nwritten: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
