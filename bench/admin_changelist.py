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
from project import admin_data  # noqa: E402  (the rows: shared with test_admin_scale)

BENCH_DB = "schedapp_bench_admin"
CHUNK = 100_000


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
                admin_data.fill_jobs(cursor, start, min(jobs, start + CHUNK - 1))
        for start in range(1, runs + 1, CHUNK):
            with transaction.atomic():
                stop = min(runs, start + CHUNK - 1)
                admin_data.fill_runs(cursor, start, stop, jobs=jobs, runs_total=runs)
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
