"""Does dropping a big partition block its parent while the files are removed?

``schedapp.partitions.drop_expired_partitions`` takes ``ACCESS EXCLUSIVE`` on the run table
and the expired partition, then ``DROP TABLE``s it, in one transaction. bench.history_week
found the drop's time growing with the partition's size (85 ms for 63 MiB, 836 ms for
2 GiB). This times the two parts apart on a bare table of the same shape (a parent, a 2 GiB
partition, a small one): lock + ``DROP TABLE`` (what runs under the lock), then ``COMMIT``
(where PostgreSQL removes the files, after releasing the locks), while another connection
reads a row of the parent's other partition in a loop; its slowest read during the drop says
whether it was blocked. Twice (the big partition made again between).

    .venv/bin/python -m bench.partition_drop_lock [--db schedapp_bench_drop_lock]
"""

from __future__ import annotations

import argparse
import threading
import time

import psycopg

from bench import common

ROWS = 7_000_000  # with a 250-character pad: about 2.1 GiB with its primary key


def fill(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("CREATE TABLE p_old PARTITION OF p FOR VALUES FROM (0) TO (10000000)")
        conn.execute(
            "INSERT INTO p_old SELECT g, repeat('x', 250) FROM generate_series(0, %s) g", [ROWS - 1]
        )
        conn.execute("CHECKPOINT")


def once(db: str) -> str:
    latencies: list[tuple[float, float]] = []
    stop = threading.Event()

    def reader() -> None:
        with psycopg.connect(db, autocommit=True) as conn:
            while not stop.is_set():
                t0 = time.perf_counter()
                conn.execute("SELECT pad FROM p WHERE id = 10000005").fetchone()
                latencies.append((t0, time.perf_counter() - t0))

    thread = threading.Thread(target=reader)
    thread.start()
    time.sleep(0.5)
    with psycopg.connect(db) as conn:
        t0 = time.perf_counter()
        conn.execute("SET LOCAL lock_timeout = '2s'")
        conn.execute("LOCK TABLE p, p_old IN ACCESS EXCLUSIVE MODE")
        conn.execute("DROP TABLE p_old")
        t1 = time.perf_counter()
        conn.commit()
        t2 = time.perf_counter()
    time.sleep(0.5)
    stop.set()
    thread.join()
    during = [d for s, d in latencies if t0 - 0.01 <= s <= t2]
    return (
        f"lock + DROP TABLE {1000 * (t1 - t0):.1f} ms, COMMIT {1000 * (t2 - t1):.1f} ms; "
        f"the reader: {len(during)} reads during them, slowest {1000 * max(during):.1f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default=common.bench_db("drop_lock"))
    args = parser.parse_args()
    with psycopg.connect(common.db_url("postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{args.db}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{args.db}"')
    db = common.db_url(args.db)
    try:
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute("CREATE TABLE p (id bigint PRIMARY KEY, pad text) PARTITION BY RANGE (id)")
            conn.execute(
                "CREATE TABLE p_new PARTITION OF p FOR VALUES FROM (10000000) TO (20000000)"
            )
            conn.execute(
                "INSERT INTO p_new SELECT g, 'y' FROM generate_series(10000000, 10000999) g"
            )
        for attempt in range(2):
            fill(db)
            with psycopg.connect(db, autocommit=True) as conn:
                (size,) = conn.execute("SELECT pg_total_relation_size('p_old')").fetchone()
            print(f"{attempt + 1}: {size / 2**20:,.0f} MiB dropped: {once(db)}", flush=True)
    finally:
        with psycopg.connect(common.db_url("postgres"), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{args.db}" WITH (FORCE)')


if __name__ == "__main__":
    main()
