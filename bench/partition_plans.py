"""What a door-like PL/pgSQL function costs PostgreSQL over a partitioned run table, by the
number of partitions, with PL/pgSQL's own plan choice and with generic plans.

    .venv/bin/python -m bench.partition_plans [--partitions 0 2 30 60 120 200 365] [--n 4000]

For each count a table shaped like ``schedapp_jobrun`` (its columns that the door reads and
writes, its eight indexes, fillfactor 70, 200,000 rows; 0 partitions: one plain table) and a
function doing what the door and the success do to a run by its id: a read for its own
lease, a read of its status, two updates. Each call is its own transaction, on one prepared
statement, as a worker sends it. Two copies of the function: one as PL/pgSQL chooses
(``plan_cache_mode = auto``: over a partitioned table it stays on custom plans, planning
each statement again on every call), one with ``SET plan_cache_mode = force_generic_plan``
(planned once per session; the plan covers every partition, locks them all as it starts,
and prunes to the run's). Reported: the serving backend's CPU per call (from /proc) and the
wall time, rounds alternating. Migration 0047 gives the door and the successes generic
plans; ``schedapp.W016`` warns above 100 partitions.
"""

from __future__ import annotations

import argparse
import os
import time

import psycopg

from bench import common

ROWS = 200_000
COLUMNS = (
    "id bigint NOT NULL, job_id bigint NOT NULL, token bigint NOT NULL, task_id text, "
    "dispatched_at timestamptz DEFAULT now(), lease_expires_at timestamptz, "
    "retry_at timestamptz, status text DEFAULT 'dispatched', worker text DEFAULT '', "
    "admission text DEFAULT '', started_at timestamptz, own_lease boolean DEFAULT false"
)
INDEXES = (
    "(job_id, token)",
    "(task_id)",
    "(job_id, id DESC)",
    "(dispatched_at)",
    "(job_id, lease_expires_at) WHERE lease_expires_at IS NOT NULL",
    "(lease_expires_at) WHERE lease_expires_at IS NOT NULL",
    "(retry_at) WHERE retry_at IS NOT NULL",
)
BODY = """
DECLARE r record;
BEGIN
    IF EXISTS (SELECT FROM {t} WHERE id = p_run AND job_id = p_job AND token = p_token
               AND own_lease) THEN
        RETURN 'own';
    END IF;
    SELECT status, admission INTO r FROM {t}
    WHERE id = p_run AND job_id = p_job AND token = p_token;
    UPDATE {t} SET status = 'running', started_at = now(), worker = 'w', admission = 'a'
    WHERE id = p_run AND job_id = p_job AND token = p_token;
    UPDATE {t} SET status = 'succeeded', worker = 'w2'
    WHERE id = p_run AND job_id = p_job AND token = p_token;
    RETURN r.status;
END
"""
MODES = {"auto": "", "generic": "SET plan_cache_mode = force_generic_plan"}


def build(conn: psycopg.Connection, parts: int) -> str:
    """The run table with ``parts`` partitions (0: one table) and its two door functions."""
    table = f"runs_{parts}"
    conn.execute(f"DROP TABLE IF EXISTS {table} CASCADE")
    if parts == 0:
        conn.execute(f"CREATE TABLE {table} ({COLUMNS}, PRIMARY KEY (id)) WITH (fillfactor=70)")
    else:
        conn.execute(f"CREATE TABLE {table} ({COLUMNS}, PRIMARY KEY (id)) PARTITION BY RANGE (id)")
        step = ROWS // parts + 1
        for i in range(parts):
            conn.execute(
                f"CREATE TABLE {table}_p{i} PARTITION OF {table} "
                f"FOR VALUES FROM ({i * step}) TO ({(i + 1) * step}) WITH (fillfactor=70)"
            )
    for index in INDEXES:
        conn.execute(f"CREATE INDEX ON {table} {index}")
    conn.execute(
        f"INSERT INTO {table} (id, job_id, token, task_id) "
        f"SELECT g, g, 1, 't' || g FROM generate_series(1, {ROWS}) g"
    )
    conn.execute(f"VACUUM ANALYZE {table}")
    for mode, setting in MODES.items():
        conn.execute(
            f"CREATE OR REPLACE FUNCTION door_{mode}_{table}(p_job bigint, p_token bigint, "
            f"p_run bigint) RETURNS text LANGUAGE plpgsql {setting} AS $$"
            + BODY.format(t=table)
            + "$$"
        )
    return table


def backend_cpu(pid: int) -> float:
    """Seconds of CPU the backend ``pid`` has used (user + system)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def calls(dsn: str, function: str, first: int, n: int) -> tuple[float, float]:
    """CPU and wall ms per call of ``function`` on runs first..first+n-1, a new session."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        cpu, wall = backend_cpu(pid), time.perf_counter()
        for run in range(first, first + n):
            conn.execute(f"SELECT {function}(%s, 1, %s)", (run, run), prepare=True)
        return (backend_cpu(pid) - cpu) / n * 1000, (time.perf_counter() - wall) / n * 1000


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, nargs="+", default=[0, 2, 30, 60, 120, 200])
    parser.add_argument("--n", type=int, default=4000, help="calls per round and mode")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    if args.n * 2 * args.rounds > ROWS:
        parser.error(f"--n x 2 modes x --rounds must stay within {ROWS:,} runs")
    db = common.bench_db("partition_plans")
    common.drop_db(db)
    with common.admin() as conn:
        conn.execute(f'CREATE DATABASE "{db}"')
    dsn = common.db_url(db)
    with psycopg.connect(dsn, autocommit=True) as conn:
        tables = {parts: build(conn, parts) for parts in args.partitions}
    print(f"{common.machine()}; {args.n} calls per round and mode, CPU of the serving backend")
    for round_ in range(args.rounds):
        for parts, table in tables.items():
            for k, mode in enumerate(MODES):
                first = 1 + (round_ * len(MODES) + k) * args.n
                cpu, wall = calls(dsn, f"door_{mode}_{table}", first, args.n)
                print(
                    f"round {round_ + 1}  {parts:4d} partitions  {mode:8s} "
                    f"PostgreSQL CPU {cpu:.3f} ms  wall {wall:.3f} ms a call",
                    flush=True,
                )
    common.drop_db(db)


if __name__ == "__main__":
    main()
