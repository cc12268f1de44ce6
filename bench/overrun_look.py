"""What the deadline pass's overrun look (``schedapp.deadlines._open_overrunning``) costs with
many runs in flight, few of them overrunning (issue 30: the look read every running job with
a max runtime and probed its run, 130-215 ms a pass at 100,000).

    .venv/bin/python -m bench.overrun_look [--running 100000] [--overrunning 5] [--repeat 20]

N jobs with every deadline field (``common.insert_jobs``: max runtime an hour) are made
running, each with its run started a minute ago; ``--overrunning`` of them spread through the
table started two hours ago (and ``--other`` more jobs run with a max runtime of a day,
started two hours ago: running long, not overrunning). ``--history`` finished runs sit in the
table beside them, as a week of a busy fleet would. Each timed look runs in a transaction
rolled back (its breaches are not kept, so every look finds the same). Printed: the median
and best wall time of a look, and what it found (the overrunning jobs, no other).
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import time
from datetime import timedelta

from bench import common

DB = common.bench_db("overrun")

_RUNS = """
INSERT INTO schedapp_jobrun (job_id, token, attempt, kind, scheduled_for, due_at, claimed_by,
    dispatched_at, started_at, finished_at, heartbeats, worker, task_id, status, stale, error,
    traceback, admission)
SELECT j.id, %(token)s, 1, 'scheduled', j.scheduled_for, j.scheduled_for, 'bench',
    %(started)s, %(started)s, %(finished)s, 0, 'bench', 'bench-' || j.id || '-' || %(token)s,
    %(status)s, false, '', '', ''
FROM schedapp_job j WHERE j.id BETWEEN %(first)s AND %(last)s
"""


def load(running: int, overrunning: int, other: int, history: int) -> list[int]:
    """The jobs and runs; the ids of the jobs that overrun."""
    common.recreate_db(DB)
    step = max(running // max(overrunning, 1), 1)
    late = [1 + i * step for i in range(overrunning)]
    with common.connect(DB) as conn, conn.transaction():
        now = common.db_now(conn)
        total = running + other
        common.insert_jobs(conn, 1, total, now - timedelta(hours=3), notify=False, deadlines=True)
        conn.execute(
            "UPDATE schedapp_job SET max_runtime = interval '1 day' WHERE id > %s", [running]
        )
        # a week of history: finished runs of the same jobs, tokens 1..k
        rounds = -(-history // total) if history else 0
        for token in range(1, rounds + 1):
            ago = now - timedelta(days=7) + timedelta(minutes=token)
            conn.execute(
                _RUNS,
                {
                    "token": token,
                    "started": ago,
                    "finished": ago,
                    "status": "succeeded",
                    "first": 1,
                    "last": total,
                },
            )
        token = rounds + 1
        conn.execute(
            _RUNS,
            {
                "token": token,
                "started": now - timedelta(minutes=1),
                "finished": None,
                "status": "running",
                "first": 1,
                "last": running,
            },
        )
        conn.execute(
            _RUNS,
            {
                "token": token,
                "started": now - timedelta(hours=2),
                "finished": None,
                "status": "running",
                "first": running + 1,
                "last": total,
            },
        )
        conn.execute(
            "UPDATE schedapp_jobrun SET started_at = %s, dispatched_at = %s "
            "WHERE token = %s AND job_id = ANY(%s)",
            [now - timedelta(hours=2), now - timedelta(hours=2), token, late],
        )
        conn.execute(
            "UPDATE schedapp_job SET state = 'running', token = %s, claimed_by = 'bench',"
            " lease_expires_at = now() + interval '1 h'",
            [token],
        )
        has_claimed_at = conn.execute(
            "SELECT 1 FROM information_schema.columns "
            "WHERE table_name = 'schedapp_job' AND column_name = 'claimed_at'"
        ).fetchone()
        if has_claimed_at:  # as the claim stamps it (0044): when its run was dispatched
            conn.execute(
                "UPDATE schedapp_job j SET claimed_at = r.dispatched_at FROM schedapp_jobrun r "
                "WHERE r.job_id = j.id AND r.token = %s",
                [token],
            )
    with common.connect(DB) as conn:
        conn.autocommit = True
        conn.execute("VACUUM ANALYZE schedapp_job")
        conn.execute("VACUUM ANALYZE schedapp_jobrun")
    return late


def time_looks(repeat: int) -> tuple[list[float], list[int]]:
    """Wall seconds of each look, and the jobs the last one found."""
    import django

    os.environ["DATABASE_URL"] = common.db_url(DB)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", common.OURS_SETTINGS)
    django.setup()
    logging.getLogger("schedapp.deadlines").setLevel(logging.ERROR)  # each look's breaches
    from django.db import transaction

    from schedapp import deadlines

    times: list[float] = []
    found: list[int] = []
    for _ in range(repeat):
        with transaction.atomic():
            result = deadlines.DeadlineResult()
            t0 = time.perf_counter()
            deadlines._open_overrunning("default", deadlines.PASS_LIMIT, result)
            times.append(time.perf_counter() - t0)
            found = sorted(e.job_id for e in result.opened)
            transaction.set_rollback(True)
    return times, found


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--running", type=int, default=100_000)
    parser.add_argument("--overrunning", type=int, default=5)
    parser.add_argument("--other", type=int, default=1_000)
    parser.add_argument("--history", type=int, default=300_000)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--no-load", action="store_true", help="reuse the loaded database")
    args = parser.parse_args(argv)
    step = max(args.running // max(args.overrunning, 1), 1)
    late = [1 + i * step for i in range(args.overrunning)]
    if not args.no_load:
        late = load(args.running, args.overrunning, args.other, args.history)
    times, found = time_looks(args.repeat)
    ms = [t * 1000 for t in times]
    print(
        f"{args.running:,} running (+{args.other:,} long, not overrunning), "
        f"{args.overrunning} overrunning: look median {statistics.median(ms):.2f} ms, "
        f"best {min(ms):.2f} ms over {args.repeat}; found {found == late} ({len(found)})"
    )


if __name__ == "__main__":
    main()
