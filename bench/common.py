"""Helpers shared by the benchmarks: databases, Redis, processes, clocks and statistics.

Everything here runs on this host: PostgreSQL and Redis on loopback, beats and workers as real
``celery`` subprocesses. The benchmarks only ever touch PostgreSQL databases whose names start
with ``schedapp_bench_`` (created and dropped here) and Redis databases 12-15.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil
import psycopg
import redis

from schedapp.testing import processes

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
RESULTS = BENCH / "results"
PYTHON = sys.executable
CELERY = processes.CELERY
# Beats run the demo project's Celery app; workers the bench's, which installs the ceilings
# and timing hooks when their environment variables are set (bench/worker_app.py).
BEAT_APP = "project"
WORKER_APP = "bench.worker_app"

PG = os.environ.get("BENCH_PG", "postgresql://postgres@127.0.0.1:5432")
REDIS = os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379")
DB_PREFIX = "schedapp_bench_"
REDIS_DBS = (9, 12, 13, 14, 15)
# A run that must keep out of the bench's own databases (a helper proving a flag at a tiny
# size beside a measurement): BENCH_DB_TAG goes after the prefix of every database name
# (schedapp_bench_<tag>burst), BENCH_REDIS_DB replaces every Redis database the bench uses.
DB_TAG = os.environ.get("BENCH_DB_TAG", "")
REDIS_OVERRIDE = int(os.environ["BENCH_REDIS_DB"]) if os.environ.get("BENCH_REDIS_DB") else None


def bench_db(name: str) -> str:
    """A bench database's name (``schedapp_bench_<BENCH_DB_TAG><name>``)."""
    return f"{DB_PREFIX}{DB_TAG}{name}"


def bench_redis(db: int) -> int:
    """The Redis database a bench uses for ``db``: itself, or BENCH_REDIS_DB if set."""
    return db if REDIS_OVERRIDE is None else REDIS_OVERRIDE
QUEUE = "celery"  # Celery's default queue: a Redis list of that name

OURS_SCHEDULER = "schedapp.beat:LeaseScheduler"
DCB_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
REDBEAT_SCHEDULER = "redbeat.RedBeatScheduler"
OURS_SETTINGS = "project.settings_test"
BASELINE_SETTINGS = "bench.settings_baseline"


# --- PostgreSQL ------------------------------------------------------------------------------


def db_url(name: str) -> str:
    return f"{PG}/{name}"


def _check_name(name: str) -> None:
    if not name.startswith(DB_PREFIX) or name == "schedapp_bench_admin":
        raise ValueError(f"refusing to touch database {name!r}: not one of the bench's own")


def admin() -> psycopg.Connection:
    """An autocommit connection to the ``postgres`` database: reading the statistics from
    there keeps the measuring connection's own transactions out of the bench database's."""
    return psycopg.connect(db_url("postgres"), autocommit=True)


def connect(name: str) -> psycopg.Connection:
    _check_name(name)
    return psycopg.connect(db_url(name), autocommit=True)


def recreate_db(name: str, settings: str = BASELINE_SETTINGS) -> None:
    """Drop and create ``name``, then migrate it (schedapp, and the baselines' tables when
    ``settings`` is the baseline settings module)."""
    drop_db(name)
    with admin() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    env = bench_env(name, 12, settings)
    subprocess.run([PYTHON, "-m", "django", "migrate", "-v", "0"], cwd=ROOT, env=env,
                   check=True)


def drop_db(name: str) -> None:
    _check_name(name)
    with admin() as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def xact_commits(name: str) -> int:
    """Committed transactions in database ``name`` so far (``pg_stat_database``).

    Backends flush their counters at most once a second, and when they go idle: wait for
    ``settle_stats`` after the work before reading."""
    with admin() as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = %s", [name]
        ).fetchone()
    return int(row[0]) if row else 0


def settle_stats() -> None:
    """Let every backend flush its pending statistics (PostgreSQL 15: about a second after
    it goes idle; autovacuum's transactions in the database count too, a few per run)."""
    time.sleep(3.0)


def db_clock_offset(name: str, samples: int = 5) -> float:
    """Seconds to add to this host's ``time.time()`` to get the database's clock (~0 here:
    same host), measured as the midpoint of a ``clock_timestamp()`` round trip."""
    offsets = []
    with connect(name) as conn:
        for _ in range(samples):
            t0 = time.time()
            (db,) = conn.execute("SELECT extract(epoch FROM clock_timestamp())").fetchone()
            t1 = time.time()
            offsets.append(float(db) - (t0 + t1) / 2)
    return statistics.median(offsets)


# (a str.format template: braces meant for SQL are doubled)
_INSERT_JOBS = """
INSERT INTO schedapp_job (name, task, args, kwargs, run_at, cron, timezone, interval, state,
    priority, queue, max_retries, retry_backoff, retry_backoff_max, jitter, lease_seconds,
    misfire_policy, misfire_grace, misfire_max_catchup, next_run_at, scheduled_for,
    retry_count, missed_runs, claimed_by, lease_expires_at, token, source, last_run_at,
    last_status, last_error{deadline_columns}, created_at, updated_at)
SELECT %(prefix)s || g, %(task)s, jsonb_build_array(g), '{{}}'::jsonb, d.due, '', 'UTC', NULL,
    'scheduled', 0, '', 0, interval '10 s', interval '1 h', 0, %(lease)s, 'run_once',
    interval '60 s', 100, d.due, d.due, 0, 0, '', NULL, 0, 'imported', NULL, '',
    ''{deadline_values},
    now(), now()
FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS g
CROSS JOIN LATERAL (
    SELECT %(t0)s::timestamptz + (g - %(first)s) * %(step)s * interval '1 second' AS due
) AS d
"""


# Every deadline field (``--deadlines``), none of which a bench run breaches: a start deadline
# and max runtime of an hour (skipping late occurrences), a finish_by at the day's last
# minute, an alert after 3 failures, a notification channel. What it measures is the cost of
# jobs carrying deadlines in the claim and at the worker's door, not of breaches.
_DEADLINE_COLUMNS = (
    ", start_deadline, skip_late, max_runtime, finish_by, alert_after_failures, notify"
)
_DEADLINE_VALUES = (
    ", interval '1 h', true, interval '1 h', time '23:59', 3, '[\"bench\"]'::jsonb"
)

# The same jobs as daily intervals whose occurrence is their due time, each under the calendar
# %(calendar)s (NULL: none): the burst's ``--interval`` and ``--calendar`` jobs. (A str.format
# template, as _INSERT_JOBS.)
_INSERT_INTERVAL_JOBS = """
INSERT INTO schedapp_job (name, task, args, kwargs, run_at, cron, timezone, interval,
    interval_anchor, calendar_id, calendar_mode, calendar_roll, state,
    priority, queue, max_retries, retry_backoff, retry_backoff_max, jitter, lease_seconds,
    misfire_policy, misfire_grace, misfire_max_catchup, next_run_at, scheduled_for,
    retry_count, missed_runs, claimed_by, lease_expires_at, token, source, last_run_at,
    last_status, last_error{deadline_columns}, created_at, updated_at)
SELECT %(prefix)s || g, %(task)s, jsonb_build_array(g), '{{}}'::jsonb, NULL, '', 'UTC',
    interval '1 day', d.due, %(calendar)s::bigint, 'exclude', 'skip',
    'scheduled', 0, '', 0, interval '10 s', interval '1 h', 0, %(lease)s, 'run_once',
    interval '60 s', 100, d.due, d.due, 0, 0, '', NULL, 0, 'imported', NULL, '',
    ''{deadline_values},
    now(), now()
FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS g
CROSS JOIN LATERAL (
    SELECT %(t0)s::timestamptz + (g - %(first)s) * %(step)s * interval '1 second' AS due
) AS d
"""


def insert_jobs(conn: psycopg.Connection, first: int, last: int, t0: datetime,
                step: float = 0.0, prefix: str = "bench-", lease: int = 3600,
                task: str = "project.tasks.noop", notify: bool = True,
                kind: str = "once", calendar: int | None = None,
                deadlines: bool = False) -> None:
    """Bulk-load one-off jobs ``first..last`` (args ``[i]``), job ``i`` due at
    ``t0 + (i - first) * step`` seconds, in one ``INSERT ... SELECT generate_series``, the way
    an import would; then wake the beats (``NOTIFY``, as ``schedule_many`` does). ``kind``
    ``interval``: daily intervals due then instead, under the calendar of id ``calendar``
    when given. With ``deadlines``, every job carries every deadline field
    (``_DEADLINE_VALUES``).

    Leases are long (an hour) because no worker completes these runs in the to-the-broker
    benchmarks: a lease that expired mid-run would be reaped and published again."""
    template = _INSERT_JOBS if kind == "once" else _INSERT_INTERVAL_JOBS
    statement = template.format(
        deadline_columns=_DEADLINE_COLUMNS if deadlines else "",
        deadline_values=_DEADLINE_VALUES if deadlines else "",
    )
    with conn.transaction():
        conn.execute(statement, {"prefix": prefix, "task": task, "lease": lease,
                                 "first": first, "last": last, "t0": t0, "step": step,
                                 "calendar": calendar})
        if notify:
            conn.execute("SELECT pg_notify('schedapp', %s)", [f"{t0.timestamp():.6f}"])


def db_now(conn: psycopg.Connection) -> datetime:
    (now,) = conn.execute("SELECT clock_timestamp()").fetchone()
    return now


# --- Redis -----------------------------------------------------------------------------------


def redis_url(db: int) -> str:
    if db not in REDIS_DBS and db != REDIS_OVERRIDE:
        raise ValueError(f"refusing to use Redis database {db}: the bench owns {REDIS_DBS}")
    return f"{REDIS}/{db}"


def flush_redis(*dbs: int) -> None:
    for db in dbs:
        redis.Redis.from_url(redis_url(db)).flushdb()


# --- processes -------------------------------------------------------------------------------


def bench_env(db: str, redis_db: int, settings: str = OURS_SETTINGS,
              extra: dict[str, Any] | None = None) -> dict[str, str]:
    """The environment of a beat or worker: the same variables the end-to-end tests use."""
    env = dict(os.environ)
    env.update({
        "DATABASE_URL": db_url(db),
        "CELERY_BROKER_URL": redis_url(redis_db),
        "DJANGO_SETTINGS_MODULE": settings,
        "PYTHONPATH": str(ROOT),
        "SCHEDAPP_VAR_DIR": str(RESULTS / "var"),
        "SCHEDAPP_LOG_LEVEL": "INFO",
        "PYTHONUNBUFFERED": "1",
    })
    for key, value in (extra or {}).items():
        env[key] = str(value)
    return env


# One harness for the tests, the benchmarks and the demo (schedapp/testing/processes.py).
Proc = processes.Proc


def run_dir(name: str) -> Path:
    path = RESULTS / "logs" / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def start_beat(name: str, scheduler: str, env: dict[str, str], logs: Path,
               count_statements: bool = True) -> Proc:
    """A real ``celery beat`` process; with ``count_statements`` it runs through
    ``bench.beat_counting``, which counts the SQL statements it executes."""
    log_path = logs / f"{name}.log"
    if not count_statements:
        return processes.start_beat(
            name, env, logs, app=BEAT_APP, cwd=ROOT, scheduler=scheduler, append=False
        )
    stmt_path = logs / f"{name}.stmts.json"
    if stmt_path.exists():
        stmt_path.unlink()
    argv = [PYTHON, "-m", "bench.beat_counting",
            *processes.beat_args(logs / f"{name}-schedule", app=BEAT_APP, scheduler=scheduler)]
    env = {**env, "BENCH_STMT_FILE": str(stmt_path)}
    return Proc(name, argv, env, log_path, cwd=ROOT, append=False, stmt_path=stmt_path)


def start_worker(name: str, env: dict[str, str], logs: Path, concurrency: int = 2,
                 pool: str = "prefork") -> Proc:
    argv = [CELERY, *processes.worker_args(name, app=WORKER_APP, concurrency=concurrency,
                                           pool=pool, loglevel="WARNING", heartbeat=2)]
    return Proc(name, argv, env, logs / f"{name}.log", cwd=ROOT, append=False)


def stop_all(procs: Iterable[Proc]) -> None:
    for proc in procs:
        proc.stop(timeout=20.0)


def wait_until(predicate: Any, timeout: float, interval: float = 0.1) -> Any:
    """The predicate's value: true once it held, its last (false) value at the timeout."""
    return processes.wait_until(predicate, timeout, interval, raise_on_timeout=False)


def sleep_until(epoch: float) -> None:
    delay = epoch - time.time()
    if delay > 0:
        time.sleep(delay)


def start_profiler(pid: int, out: Path) -> subprocess.Popen:
    """py-spy sampling ``pid`` until it exits: collapsed stacks, idle (waiting) included, so
    the profile shows wall-clock time: Python work and waits on PostgreSQL and Redis."""
    spy = str(Path(sys.executable).parent / "py-spy")
    return subprocess.Popen([spy, "record", "--pid", str(pid), "--rate", "200", "--idle",
                             "--format", "raw", "--output", str(out), "--nonblocking"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def profile_summary(path: Path, top: int = 25) -> dict[str, Any]:
    """Inclusive share of samples per function (``name (file:line)``) from py-spy's collapsed
    stacks, the ``top`` ones; only samples taken while the beat was working (a stack that
    is inside ``LeaseScheduler._work``)."""
    inclusive: dict[str, int] = {}
    total = 0
    if not path.exists():
        return {"samples": 0, "functions": []}
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = {re.sub(r":\d+\)$", ")", f).replace(str(ROOT) + "/", "")
                  for f in stack.split(";")}
        # "_work (...)" before py-spy 0.4, "LeaseScheduler._work (...)" from it on
        if not any(re.match(r"(\w+\.)?_work \(", f) and "schedapp/beat.py" in f
                   for f in frames):
            continue
        n = int(count)
        total += n
        for frame in frames:
            inclusive[frame] = inclusive.get(frame, 0) + n
    ranked = sorted(inclusive.items(), key=lambda kv: -kv[1])[:top]
    return {"samples": total,
            "functions": [{"frame": f, "share": c / total} for f, c in ranked if total]}


# --- the watcher -----------------------------------------------------------------------------


def start_watcher(redis_db: int, out: Path, expect: int, deadline: float,
                  linger: float = 2.0, queues: Sequence[str] = (QUEUE,)) -> subprocess.Popen:
    """Start ``bench.watcher`` (a separate process that pops and timestamps every message)
    and wait until it is listening."""
    if out.exists():
        out.unlink()
    argv = [PYTHON, "-m", "bench.watcher", "--redis", redis_url(redis_db), "--out", str(out),
            "--expect", str(expect), "--deadline", f"{deadline:.6f}", "--linger", str(linger),
            *[f"--queue={q}" for q in queues]]
    popen = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, text=True,
                             start_new_session=True)
    line = popen.stdout.readline() if popen.stdout else ""
    if "ready" not in line:
        raise RuntimeError(f"watcher did not start: {line!r}")
    return popen


def watcher_result(popen: subprocess.Popen, out: Path, timeout: float) -> dict[str, Any]:
    try:
        popen.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        popen.terminate()
        popen.wait(timeout=10)
    return json.loads(out.read_text())


# --- statistics and output -------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100), nearest rank on the sorted values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1))))
    return ordered[rank]


def save(name: str, data: Any) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(data, indent=2, default=str))
    return path


@dataclass
class Table:
    """A plain-text (and Markdown) table for the console and the README."""

    headers: list[str]
    rows: list[list[str]] = field(default_factory=list)

    def add(self, *cells: Any) -> None:
        self.rows.append([fmt(c) for c in cells])

    def markdown(self) -> str:
        lines = ["| " + " | ".join(self.headers) + " |",
                 "|" + "|".join("---" for _ in self.headers) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in self.rows]
        return "\n".join(lines)


def fmt(value: Any) -> str:
    if isinstance(value, float):
        if value != value:  # NaN
            return "-"
        if abs(value) >= 100:
            return f"{value:,.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:.3g}" if abs(value) < 1 else f"{value:.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    with admin() as conn:
        (pg_version,) = conn.execute("SHOW server_version").fetchone()
    info = redis.Redis.from_url(redis_url(12)).info("server")
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "nproc": os.cpu_count(),
        "cpu": _cpu_model(),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "postgresql": pg_version,
        "redis": info.get("redis_version"),
        "python": sys.version.split()[0],
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "?"
