"""Scale: does a claim cost the same with 10 thousand, 1 million and 10 million jobs?

The table grows in place (10k, then 1M, then 10M rows) in a database of its own; at each size
500 jobs are due now and the rest are due far in the future (one a second from tomorrow on).
At each size: the time of one ``claim_due_jobs(limit=500)`` (median of several, each rolled
back after its deferred foreign-key checks ran), ``EXPLAIN (ANALYZE, BUFFERS)`` of the claim
statement (it must range-scan the ``schedapp_job_due`` index, never scan the table), and the
peak RSS of a real beat process that starts, claims and publishes the 500, then idles.

    .venv/bin/python -m bench.scale [--sizes 10000,1000000,10000000] [--keep]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from datetime import timedelta
from typing import Any

import redis

from bench import common

DB = "schedapp_bench_scale"
REDIS_DB = 14
DUE_NOW = 500
CHUNK = 1_000_000


def _django() -> None:
    os.environ["DATABASE_URL"] = common.db_url(DB)
    os.environ["CELERY_BROKER_URL"] = common.redis_url(REDIS_DB)
    os.environ["DJANGO_SETTINGS_MODULE"] = common.OURS_SETTINGS
    import django

    django.setup()


def grow(conn: Any, have: int, want: int) -> None:
    """Add far-future jobs until the table holds ``want`` rows, a million per transaction."""
    now = common.db_now(conn)
    while have < want:
        last = min(want, have + CHUNK)
        t0 = time.monotonic()
        common.insert_jobs(conn, have + 1, last, now + timedelta(days=1), step=1.0,
                           prefix="scale-", notify=False)
        print(f"  loaded jobs {have + 1:,}..{last:,} in {time.monotonic() - t0:.1f}s",
              flush=True)
        have = last


def add_due_now(conn: Any, base: int) -> None:
    now = common.db_now(conn)
    common.insert_jobs(conn, base + 1, base + DUE_NOW, now - timedelta(minutes=1),
                       prefix="due-", notify=False)


def reset_due(conn: Any) -> None:
    """Put the claimed due jobs back, as if never claimed (between beat runs)."""
    with conn.transaction():
        conn.execute("DELETE FROM schedapp_jobrun")
        conn.execute("UPDATE schedapp_job SET state = 'scheduled', claimed_by = '', "
                     "lease_expires_at = NULL WHERE state = 'running'")


def time_claims(repeat: int) -> dict[str, Any]:
    """``claim_due_jobs`` as a beat calls it, rolled back each time so all sizes claim the
    same 500 rows."""
    from django.db import connection, transaction

    from schedapp.lease import claim_due_jobs, seconds_until_due

    times, next_due, claimed = [], [], 0
    for _ in range(repeat):
        with transaction.atomic():
            t0 = time.perf_counter()
            result = claim_due_jobs("bench-scale", DUE_NOW)
            with connection.cursor() as cursor:  # what COMMIT would run: the deferred FK checks
                cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
            times.append(time.perf_counter() - t0)
            claimed = len(result.runs)
            transaction.set_rollback(True)
        t0 = time.perf_counter()
        seconds_until_due()
        next_due.append(time.perf_counter() - t0)
    connection.close()
    return {"claim_ms": [t * 1000 for t in times],
            "claim_median_ms": statistics.median(times) * 1000,
            "next_due_median_ms": statistics.median(next_due) * 1000,
            "claimed": claimed}


def explain() -> str:
    from django.db import connection, transaction

    from schedapp.sql import query

    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + query("claim_due_jobs"),
                       {"limit": DUE_NOW, "beat": "explain"})
        plan = "\n".join(row[0] for row in cursor.fetchall())
        transaction.set_rollback(True)
    return plan


def beat_memory(size: int) -> dict[str, Any]:
    """Start a beat, let it claim and publish the due 500, idle a few seconds, read its RSS."""
    common.flush_redis(REDIS_DB)
    logs = common.run_dir(f"scale-{size}")
    env = common.bench_env(DB, REDIS_DB)
    beat = common.start_beat("beat", common.OURS_SCHEDULER, env, logs)
    try:
        beat.wait_for("schedapp.beat: beat ", timeout=60)
        client = redis.Redis.from_url(common.redis_url(REDIS_DB))
        t0 = time.monotonic()
        got = common.wait_until(lambda: client.llen(common.QUEUE) >= DUE_NOW, timeout=60)
        published_in = time.monotonic() - t0
        time.sleep(6.0)  # at least one idle wake-up (MAX_SLEEP is 5 s)
        memory = beat.memory()
        cpu = beat.cpu_seconds()
        queued = client.llen(common.QUEUE)
    finally:
        beat.stop()
    return {"published": queued, "all_published": bool(got),
            "published_within_s": published_in, "cpu_s": cpu, **memory}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,1000000,10000000")
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--keep", action="store_true", help="do not drop the database")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]

    print(f"scale: creating {DB}", flush=True)
    common.recreate_db(DB, settings=common.OURS_SETTINGS)
    _django()
    results: dict[str, Any] = {"machine": common.machine(), "sizes": []}
    conn = common.connect(DB)
    try:
        add_due_now(conn, 0)
        have = DUE_NOW
        for size in sizes:
            t0 = time.monotonic()
            grow(conn, have, size)
            have = size
            conn.execute("VACUUM (ANALYZE) schedapp_job")
            load_s = time.monotonic() - t0
            (table_mb,) = conn.execute(
                "SELECT pg_total_relation_size('schedapp_job') / 1048576.0").fetchone()
            (rows,) = conn.execute("SELECT count(*) FROM schedapp_job").fetchone()
            claims = time_claims(args.repeat)
            plan = explain()
            memory = beat_memory(size)
            reset_due(conn)
            row = {
                "size": size,
                "rows": rows,
                "load_s": load_s,
                "table_mb": float(table_mb),
                **claims,
                "plan": plan,
                "uses_due_index": "schedapp_job_due" in plan,
                "seq_scan_on_job": "Seq Scan on schedapp_job" in plan,
                "beat": memory,
            }
            results["sizes"].append(row)
            print(f"  {rows:>11,} rows: claim {claims['claim_median_ms']:.2f} ms "
                  f"(next-due {claims['next_due_median_ms']:.2f} ms), due index "
                  f"{row['uses_due_index']}, seq scan {row['seq_scan_on_job']}, beat peak RSS "
                  f"{memory['peak_rss_mb']:.1f} MB", flush=True)
            common.save("scale", results)
    finally:
        conn.close()
        if not args.keep:
            from django.db import connection

            connection.close()
            common.drop_db(DB)
    print(table(results).markdown())
    return results


def table(results: dict[str, Any]) -> common.Table:
    t = common.Table(["jobs in table", "table + indexes MB", "claim of 500 (median ms)",
                      "next-due query (ms)", "due-index range scan", "seq scan",
                      "beat peak RSS MB", "beat RSS idle MB"])
    for r in results["sizes"]:
        t.add(r["rows"], r["table_mb"], r["claim_median_ms"], r["next_due_median_ms"],
              "yes" if r["uses_due_index"] else "NO", "yes" if r["seq_scan_on_job"] else "no",
              r["beat"]["peak_rss_mb"], r["beat"]["rss_mb"])
    return t


if __name__ == "__main__":
    main()
