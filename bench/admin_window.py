"""The runs changelist's count on a partitioned history: what a filter reads (issue 32).

``--load`` makes a scratch database (``--db``) with bench/history_week.py's week of history
(``--runs`` runs, one partition per simulated day, 2 % failed, 0.5 % skipped, no ``lost``;
``VACUUM (ANALYZE)`` of the parent and then, as autovacuum leaves it, the parent's statistics
forgotten: ``reltuples`` -1), and keeps it. Without ``--load`` it measures the pages of that
database through Django's test client with the schedapp it imports (this checkout's, or
another one's via PYTHONPATH, for a before/after on the same data): the unfiltered runs
changelist, ``status=failed`` (2 %), ``status=lost`` (never), the runs of one job; one
warm-up, then ``--repeat`` requests, median and worst; then EXPLAIN (ANALYZE, BUFFERS) of
every query of those pages that reads runs, with the partitions it scanned. ``--drop``
drops the database.

Run from the repository root::

    .venv/bin/python -m bench.admin_window --load --runs 3000000 --db schedapp_bench_window
    PYTHONPATH=<checkout> .venv/bin/python -m bench.admin_window --db schedapp_bench_window
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import common, history_week  # noqa: E402

PARENT = history_week.PARENT


def load(db: str, n: int) -> None:
    from django.core.management import call_command

    history_week.recreate(db)
    call_command("migrate", verbosity=0)
    with psycopg.connect(history_week.url(db), autocommit=True) as conn:
        first_job = history_week.add_jobs(conn, n)
        cut, _days = history_week.day_partitions(conn, n)
        history_week.load(conn, cut, n, first_job)
        # What autovacuum leaves: each partition analysed, the parent never.
        conn.execute("UPDATE pg_class SET reltuples = -1 WHERE oid = %s::regclass", [PARENT])
    print(f"loaded {n:,} runs into {db}", flush=True)


def measure(db: str, repeat: int) -> None:
    from django.contrib.auth.models import User
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext
    from django.urls import reverse

    import schedapp
    from bench.admin_changelist import time_page

    print(f"schedapp from {Path(schedapp.__file__).parent}")
    client = Client()
    user = User.objects.filter(username="bench").first() or User.objects.create_superuser(
        "bench", "b@example.com", "pw"
    )
    client.force_login(user)
    runs = reverse("admin:schedapp_jobrun_changelist")
    with connection.cursor() as cursor:
        cursor.execute("SELECT min(id) FROM schedapp_job")
        some_job = cursor.fetchone()[0] + history_week.JOBS // 2
    pages = [
        ("runs", runs),
        ("runs, status=failed", f"{runs}?status__exact=failed"),
        ("runs, status=lost (none)", f"{runs}?status__exact=lost"),
        ("runs of one job", f"{runs}?job={some_job}"),
    ]
    with psycopg.connect(history_week.url(db), autocommit=True) as conn:
        for label, page in pages:
            median, worst, queries, status = time_page(client, page, repeat)
            with CaptureQueriesContext(connection) as captured:
                response = client.get(page)
            shown = re.search(
                r'id="schedapp-result-count">(.*?)\(<a', response.content.decode(), re.S
            ) or re.search(r'class="paginator">.*?\n(.*?)\n', response.content.decode(), re.S)
            text = " ".join(shown.group(1).split()) if shown else "?"
            print(
                f"{label}: median {median * 1000:.0f} ms, worst {worst * 1000:.0f} ms, "
                f"{queries} queries, HTTP {status}; says {text!r}",
                flush=True,
            )
            for q in captured.captured_queries:
                sql = q["sql"]
                if PARENT not in sql or not sql.lstrip().upper().startswith("SELECT"):
                    continue
                plan = history_week.explain(conn, sql)
                kind = "count" if "COUNT(" in sql.upper() else "query"
                print(
                    f"  {kind}: {plan['execution_ms']:.1f} ms, {plan['partitions_named']} "
                    f"partitions in the plan, {plan['never_executed']} never executed\n"
                    f"    {sql}\n    " + plan["plan"].replace("\n", "\n    "),
                    flush=True,
                )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default=common.bench_db("admin_window"))
    parser.add_argument("--runs", type=int, default=3_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--load", action="store_true", help="make the database, keep it")
    parser.add_argument("--drop", action="store_true", help="drop the database")
    args = parser.parse_args(argv)
    if not args.db.startswith("schedapp_"):
        parser.error("--db must name a scratch database (schedapp_...)")
    if args.drop:
        history_week.drop(args.db)
        return 0
    os.environ["DATABASE_URL"] = history_week.url(args.db)
    os.environ["DJANGO_SETTINGS_MODULE"] = "project.settings"
    os.environ["DJANGO_ALLOWED_HOSTS"] = "testserver"
    os.environ["DJANGO_DEBUG"] = "0"
    os.environ.setdefault("CELERY_BROKER_URL", "memory://")
    with psycopg.connect(history_week.url("postgres"), autocommit=True) as conn:
        if not history_week.one(conn, "SELECT 1 FROM pg_database WHERE datname = %s", [args.db]):
            conn.execute(f'CREATE DATABASE "{args.db}"')
    import django

    django.setup()
    if args.load:
        load(args.db, args.runs)
    else:
        measure(args.db, args.repeat)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
