"""Time the admin's jobs and runs changelists with 1,000,000 jobs and 1,000,000 runs.

Run (from the repository root, with a PostgreSQL server the URL's user may create databases
on; the script creates, fills and drops the scratch database ``schedapp_bench_admin``)::

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres \\
        .venv/bin/python bench/admin_changelist.py [--jobs 1000000] [--runs 1000000] [--keep]

Rows are generated inside PostgreSQL (``INSERT ... SELECT generate_series``, 100,000 per
transaction), then ``VACUUM ANALYZE``. Each page is requested through Django's test client
as a logged-in superuser: one warm-up, then ``--repeat`` timed requests; the table shows the
median and the worst, and how many SQL queries the page ran. Results: bench/README-admin.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
BENCH_DB = "schedapp_bench_admin"
CHUNK = 100_000

FILL_JOBS = """
INSERT INTO schedapp_job (
    name, task, args, kwargs, run_at, cron, timezone, interval, state, priority, queue,
    max_retries, retry_backoff, retry_backoff_max, jitter, lease_seconds, misfire_policy,
    misfire_grace, misfire_max_catchup, next_run_at, scheduled_for, retry_count, missed_runs,
    claimed_by, lease_expires_at, token, source, last_run_at, last_status, last_error,
    created_at, updated_at)
SELECT
    'job-' || i,
    (ARRAY['project.tasks.record', 'project.tasks.noop', 'project.tasks.add'])[1 + i %% 3],
    '[]', '{"label": "bench"}', NULL,
    CASE WHEN i %% 2 = 0 THEN (ARRAY['0 0 * * 1-5', '*/5 * * * *', '30 2 * * *'])[1 + i %% 3]
         ELSE '' END,
    (ARRAY['Europe/Paris', 'UTC', 'America/New_York'])[1 + i %% 3],
    CASE WHEN i %% 2 = 1 THEN make_interval(secs => 60 + i %% 600) END,
    -- per 1,000 jobs: 10 running, 1 dead, 10 paused, 20 succeeded, 5 cancelled; rest scheduled
    CASE WHEN i %% 100 = 0 THEN 'running' WHEN i %% 1000 = 1 THEN 'dead'
         WHEN i %% 100 = 2 THEN 'paused' WHEN i %% 50 = 3 THEN 'succeeded'
         WHEN i %% 200 = 4 THEN 'cancelled' ELSE 'scheduled' END,
    i %% 3, (ARRAY['', 'reports', 'low', 'high'])[1 + i %% 4], 3, interval '10 seconds',
    interval '1 hour', 0, 60, 'run_once', interval '60 seconds', 100,
    -- a thousand jobs already due, the rest over the next days
    now() + make_interval(secs => CASE WHEN i %% 1000 = 7 THEN -30 ELSE i %% 259200 END),
    now() + make_interval(secs => i %% 259200), i %% 4, 0,
    CASE WHEN i %% 100 = 0 THEN 'beat-' || (i %% 7) ELSE '' END,
    CASE WHEN i %% 100 = 0 THEN now() + interval '60 seconds' END,
    i %% 50, 'api', now() - interval '1 hour',
    CASE WHEN i %% 4 = 0 THEN 'failed' ELSE 'succeeded' END,
    CASE WHEN i %% 1000 = 1 THEN 'RuntimeError: boom ' || i ELSE '' END,
    now(), now()
FROM generate_series(%(start)s, %(stop)s) AS i
"""

FILL_RUNS = """
INSERT INTO schedapp_jobrun (
    job_id, token, attempt, scheduled_for, due_at, claimed_by, dispatched_at,
    started_at, finished_at, heartbeat_at, heartbeats, worker, admission, task_id, status,
    stale, error, traceback)
SELECT
    1 + n %% %(jobs)s, 1000 + n, 1,
    now() - make_interval(secs => (%(total)s - n) * 0.01),
    now() - make_interval(secs => (%(total)s - n) * 0.01),
    'beat-' || n %% 7,
    now() - make_interval(secs => (%(total)s - n) * 0.01 - (n %% 50) * 0.002),
    now() - make_interval(secs => (%(total)s - n) * 0.01),
    now() - make_interval(secs => (%(total)s - n) * 0.01 - 1.5), NULL, 0,
    'worker' || n %% 16 || '@host', '', 'schedapp:' || (1 + n %% %(jobs)s) || ':' || (1000 + n),
    (ARRAY['succeeded', 'failed', 'lost', 'succeeded', 'succeeded'])[1 + n %% 5], false,
    CASE WHEN n %% 5 = 1 THEN 'RuntimeError: boom' ELSE '' END,
    CASE WHEN n %% 5 = 1 THEN repeat('  File "tasks.py", line 1, in run' || chr(10), 20)
         ELSE '' END
FROM generate_series(%(start)s, %(stop)s) AS n
"""


def _with_db(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{name}"))


def recreate_database(url: str) -> str:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {BENCH_DB} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {BENCH_DB}")
    return _with_db(url, BENCH_DB)


def drop_database(url: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {BENCH_DB} WITH (FORCE)")


def fill(jobs: int, runs: int) -> float:
    from django.db import connection, transaction

    started = time.monotonic()
    with connection.cursor() as cursor:
        for start in range(1, jobs + 1, CHUNK):
            with transaction.atomic():
                cursor.execute(FILL_JOBS, {"start": start, "stop": min(jobs, start + CHUNK - 1)})
        for start in range(1, runs + 1, CHUNK):
            with transaction.atomic():
                cursor.execute(
                    FILL_RUNS,
                    {
                        "start": start,
                        "stop": min(runs, start + CHUNK - 1),
                        "jobs": jobs,
                        "total": runs,
                    },
                )
        cursor.execute("VACUUM ANALYZE schedapp_job")
        cursor.execute("VACUUM ANALYZE schedapp_jobrun")
    return time.monotonic() - started


def time_page(client, url: str, repeat: int) -> tuple[float, float, int, int]:  # type: ignore[no-untyped-def]
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as captured:
        response = client.get(url)  # warm-up, and the query count
    queries = len(captured)  # now: every request clears the connection's query log
    status = response.status_code
    timings = []
    for _ in range(repeat):
        started = time.perf_counter()
        response = client.get(url)
        timings.append(time.perf_counter() - started)
        status = max(status, response.status_code)
    return statistics.median(timings), max(timings), queries, status


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--keep", action="store_true", help="Keep the scratch database.")
    options = parser.parse_args()
    base = os.environ.get("DATABASE_URL")
    if not base:
        parser.error("DATABASE_URL must point to a PostgreSQL server (any database on it).")

    os.environ["DATABASE_URL"] = recreate_database(base)
    os.environ["DJANGO_SETTINGS_MODULE"] = "project.settings"
    os.environ["DJANGO_ALLOWED_HOSTS"] = "testserver"
    os.environ["DJANGO_DEBUG"] = "0"
    os.environ.setdefault("CELERY_BROKER_URL", "memory://")
    import django

    django.setup()
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.test import Client
    from django.urls import reverse

    try:
        call_command("migrate", verbosity=0)
        print(f"loading {options.jobs:,} jobs and {options.runs:,} runs ...", flush=True)
        print(f"loaded in {fill(options.jobs, options.runs):.0f}s", flush=True)
        client = Client()
        client.force_login(User.objects.create_superuser("bench", "b@example.com", "pw"))
        jobs = reverse("admin:schedapp_job_changelist")
        runs = reverse("admin:schedapp_jobrun_changelist")
        some_job = options.jobs // 2
        pages = [
            ("jobs", jobs),
            ("jobs, page 2", f"{jobs}?p=2"),
            ("jobs, page 100 (OFFSET 9,900)", f"{jobs}?p=100"),
            ("jobs, page 5,000 (OFFSET 499,900)", f"{jobs}?p=5000"),
            ("jobs, state=scheduled", f"{jobs}?state__exact=scheduled"),
            ("jobs, dead letters", f"{jobs}?state__exact=dead"),
            ("jobs, task filter", f"{jobs}?task=project.tasks.noop"),
            ("jobs, queue filter", f"{jobs}?queue=reports"),
            ("jobs, kind=cron", f"{jobs}?kind=cron"),
            ("jobs, search name (rare match)", f"{jobs}?q=job-999999"),
            ("jobs, search task (common)", f"{jobs}?q=tasks.noop"),
            ("job page", reverse("admin:schedapp_job_change", args=[some_job])),
            ("runs", runs),
            ("runs, page 5,000 (OFFSET 499,900)", f"{runs}?p=5000"),
            ("runs, status=failed", f"{runs}?status__exact=failed"),
            ("runs of one job", f"{runs}?job={some_job}"),
            ("runs, task id search", f"{runs}?q=schedapp:{some_job}:{1000 + some_job}"),
            ("overview", reverse("admin:schedapp_job_overview")),
        ]
        print(f"\n| page | median | worst of {options.repeat} | queries |")
        print("|---|---:|---:|---:|")
        for label, url in pages:
            median, worst, queries, status = time_page(client, url, options.repeat)
            flag = "" if status == 200 else f" (HTTP {status})"
            print(
                f"| {label}{flag} | {median * 1000:.0f} ms | {worst * 1000:.0f} ms | {queries} |",
                flush=True,
            )
    finally:
        from django.db import connections

        connections.close_all()
        if not options.keep:
            drop_database(base)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
