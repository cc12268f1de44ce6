"""Ingest: how fast does ``api.schedule_many`` write jobs, next to a raw ``COPY`` of the same rows?

In one run, on a database of its own (``schedapp_bench_ingest``, created and dropped here):

(a) the limit: a raw ``COPY schedapp_job FROM STDIN`` of 100,000 one-off rows built in memory
    beforehand (no validation, no Python per row while the clock runs), in text and in binary
    format; the faster is the limit;
(b) ``schedule_many`` of the equivalent 100,000 one-off specs (distinct names, four tasks,
    ``args`` lists), as a generator, with COPY in binary (the default) and in text format;
(b'') (b) with the audit trail off (``SCHEDAPP_AUDIT = False``): what its records cost;
(c) a mix: a third one-offs, a third cron (four expressions and zones), a third intervals
    (four periods), with ``kwargs`` and a jitter on some;
(c') the same mix with every cron and interval job under a calendar that closes today and
    tomorrow: each computes its first run through the calendar and records what it passed
    in the ledger (a record or two per job, one insert per 8,000); (c) is the cost of jobs
    without calendars, which the ledger's recording leaves as it was;
(d) the old path: ``main``'s algorithm (``validate_job`` per spec, a ``Job`` per spec, a name
    query, ``bulk_create``), at 10,000 specs (the size of the issue's 3,500 jobs/s);
(e) memory: a fresh process schedules 10,000, then 100,000, then 1,000,000 specs from
    generators; its peak RSS (``VmHWM``) after each shows whether it grows with the input.

Each timed section starts from an empty table after a ``CHECKPOINT``; (a) and (b) alternate
``--repeat`` times and the medians are compared. The machine is shared, so rates are noisy:
the ratio to the raw ``COPY`` of the same round is the figure to read.

    .venv/bin/python -m bench.ingest [--jobs 100000] [--repeat 3] [--rss-jobs 1000000]
                                     [--profile] [--keep] [--db schedapp_bench_ingest]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psutil

from bench import common

DB = "schedapp_bench_ingest"
TASKS = ("project.tasks.record", "project.tasks.noop", "project.tasks.add", "project.tasks.fail")
CRONS = (
    ("*/5 * * * *", "UTC"),
    ("0 9 * * 1-5", "Europe/Paris"),
    ("30 2 * * *", "America/New_York"),
    ("*/10 * * * * *", "Asia/Kolkata"),
)
INTERVALS = (30, 60, 300, timedelta(hours=1))
OLD_SIZE = 10_000


def _django() -> None:
    os.environ["DATABASE_URL"] = common.db_url(DB)
    os.environ["CELERY_BROKER_URL"] = "redis://127.0.0.1:6379/5"  # never used: nothing is sent
    os.environ["DJANGO_SETTINGS_MODULE"] = common.OURS_SETTINGS
    import django

    django.setup()


# --- the inputs ------------------------------------------------------------------------------


def one_offs(n: int, when: datetime, prefix: str = "once-") -> Iterator[dict[str, Any]]:
    for i in range(n):
        yield {"task": TASKS[i % 4], "run_at": when, "args": [i, f"label-{i}"],
               "name": f"{prefix}{i}"}


def mixed(n: int, when: datetime, prefix: str = "mix-",
          calendar: str | None = None) -> Iterator[dict[str, Any]]:
    for i in range(n):
        spec: dict[str, Any] = {"task": TASKS[i % 4], "name": f"{prefix}{i}",
                                "kwargs": {"label": f"mix-{i}", "n": i}}
        kind = i % 3
        if kind == 0:
            spec["run_at"] = when
            spec["jitter"] = 30 if i % 2 else 0
        elif kind == 1:
            spec["cron"], spec["timezone"] = CRONS[i % 4]
        else:
            spec["interval"] = INTERVALS[i % 4]
        if calendar is not None and kind:
            spec["calendar"] = calendar
        yield spec


def raw_text(n: int, when: datetime, now: datetime) -> bytes:
    """COPY text rows equal to what ``one_offs`` schedules, built before any clock runs by
    schedapp's own validation and text encoder: a hand-written row drifted from the table
    whenever a column was added (catch-up window, overlap, tags), and the bench broke."""
    from schedapp.copyrows import TextRows
    from schedapp.fields import with_defaults
    from schedapp.validation import JobValidator, job_defaults

    validator, encoder = JobValidator(), TextRows(now)
    lines = []
    for spec in one_offs(n, when):
        checked = validator.check(with_defaults(job_defaults(), spec))
        assert not checked.errors, checked.errors
        first = checked.values["run_at"]
        lines.append(encoder.encode(checked, "api", first, first))
    return "".join(lines).encode()


# --- the sections ----------------------------------------------------------------------------


class Clock:
    """Wall time, this process's CPU and the CPU of one PostgreSQL backend over a section:
    on a busy machine wall time depends on the neighbours; CPU seconds say where work went."""

    def __init__(self, backend_pid: int) -> None:
        self.backend = psutil.Process(backend_pid)

    def __enter__(self) -> Clock:
        self.t0, self.c0, self.s0 = time.perf_counter(), time.process_time(), self._server()
        return self

    def __exit__(self, *exc: object) -> None:
        self.run = {"wall": time.perf_counter() - self.t0,
                    "client_cpu": time.process_time() - self.c0,
                    "server_cpu": self._server() - self.s0}

    def _server(self) -> float:
        times = self.backend.cpu_times()
        return times.user + times.system


def backend_pid(conn: Any = None) -> int:
    if conn is not None:
        return conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


def fresh(conn: Any) -> None:
    """An empty table, and a checkpoint so that no run pays for the previous one's writes."""
    conn.execute("TRUNCATE schedapp_job, schedapp_jobchange CASCADE")
    conn.execute("CHECKPOINT")


def copy_sql(fmt: str, direction: str = "FROM STDIN") -> str:
    from schedapp.copyrows import COPY_COLUMNS

    columns = ", ".join(f'"{c}"' for c in COPY_COLUMNS)
    return f"COPY schedapp_job ({columns}) {direction} (FORMAT {fmt})"


def raw_copy(conn: Any, data: bytes, fmt: str) -> dict[str, float]:
    fresh(conn)
    with Clock(backend_pid(conn)) as clock, conn.transaction(), conn.cursor().copy(
            copy_sql(fmt)) as copy:
        for start in range(0, len(data), 1 << 20):
            copy.write(data[start:start + (1 << 20)])
    return clock.run


def binary_of(conn: Any, text: bytes) -> bytes:
    """The same rows in COPY's binary format (PostgreSQL writes it: loaded once, read back)."""
    raw_copy(conn, text, "text")
    out = bytearray()
    with conn.cursor().copy(copy_sql("binary", "TO STDOUT")) as copy:
        for block in copy:
            out += block
    return bytes(out)


def ours(conn: Any, specs: Iterator[dict[str, Any]], expect: int,
         fmt: str = "binary", audit: bool = True) -> dict[str, float]:
    """``schedule_many`` of ``specs``; ``audit``: with its audit trail's records (the
    default) or with ``SCHEDAPP_AUDIT = False``."""
    from django.test import override_settings

    from schedapp import api, bulk

    fresh(conn)
    bulk.COPY_FORMAT = fmt
    try:
        with override_settings(SCHEDAPP_AUDIT=audit), Clock(backend_pid()) as clock:
            created = api.schedule_many(specs)
    finally:
        bulk.COPY_FORMAT = "binary"
    assert created == expect, (created, expect)
    return clock.run


def stored(conn: Any, name: str) -> dict[str, Any]:
    """One job as stored, without what differs between two loads of the same rows."""
    cursor = conn.execute("SELECT * FROM schedapp_job WHERE name = %s", [name])
    columns = [c.name for c in cursor.description]
    row = dict(zip(columns, cursor.fetchone(), strict=True))
    for column in ("id", "created_at", "updated_at"):
        row.pop(column)
    return row


def old_schedule_many(specs: Iterator[dict[str, Any]]) -> int:
    """``main``'s ``schedule_many`` (before this change), for comparison: every spec through
    ``validate_job`` into a ``Job``, a name query per 5,000, ``bulk_create`` in batches."""
    from django.core.exceptions import ValidationError
    from django.db import transaction

    from schedapp.api import _first_run, _spec
    from schedapp.db import db_now
    from schedapp.models import Job
    from schedapp.validation import validate_job

    jobs, names = [], {}
    for index, raw in enumerate(specs):
        spec = dict(raw)
        task = spec.pop("task", None)
        values = validate_job(_spec(task, spec))
        values["source"] = "api"
        names[values["name"]] = index
        jobs.append(Job(**values))
    existing = set()
    for start in range(0, len(names), 5000):
        chunk = list(names)[start:start + 5000]
        existing.update(Job.objects.filter(name__in=chunk).values_list("name", flat=True))
    if existing:
        raise ValidationError("names taken")
    with transaction.atomic():
        now = db_now()
        for job in jobs:
            _first_run(job, now)
        return len(Job.objects.bulk_create(jobs, batch_size=1000))


def old(conn: Any, n: int, when: datetime) -> dict[str, float]:
    fresh(conn)
    with Clock(backend_pid()) as clock:
        created = old_schedule_many(one_offs(n, when, prefix="old-"))
    assert created == n
    return clock.run


def rss_child(sizes: list[int]) -> None:
    """In a fresh process: peak RSS before, and after scheduling each size from a generator."""
    _django()
    from django.db import connection

    from schedapp import api
    from schedapp.db import db_now

    when = db_now() + timedelta(days=1)
    out: dict[str, Any] = {"before_mb": peak_rss_mb(), "runs": []}
    for size in sizes:
        with connection.cursor() as cursor:
            cursor.execute("TRUNCATE schedapp_job, schedapp_jobchange CASCADE")
            cursor.execute("CHECKPOINT")
        t0 = time.perf_counter()
        created = api.schedule_many(one_offs(size, when, prefix=f"rss{size}-"))
        elapsed = time.perf_counter() - t0
        assert created == size
        out["runs"].append({"jobs": size, "seconds": elapsed, "peak_rss_mb": peak_rss_mb()})
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE schedapp_job, schedapp_jobchange CASCADE")
    print(json.dumps(out))


def peak_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def memory(sizes: list[int]) -> dict[str, Any]:
    run = subprocess.run([sys.executable, "-m", "bench.ingest", "--db", DB, "--rss-child",
                          ",".join(map(str, sizes))],
                         cwd=common.ROOT, capture_output=True, text=True, check=True)
    return json.loads(run.stdout.strip().splitlines()[-1])


def profile(conn: Any, n: int, when: datetime) -> str:
    from pyinstrument import Profiler

    from schedapp import api

    fresh(conn)
    profiler = Profiler(interval=0.001)
    profiler.start()
    api.schedule_many(one_offs(n, when))
    profiler.stop()
    return profiler.output_text(unicode=False, color=False)


# --- the run ---------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> dict[str, Any]:
    global DB
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--rss-jobs", type=int, default=1_000_000)
    parser.add_argument("--profile", action="store_true", help="also profile (b) (pyinstrument)")
    parser.add_argument("--keep", action="store_true", help="do not drop the database")
    parser.add_argument("--db", default=DB, help="its database (schedapp_bench_*): made, dropped")
    parser.add_argument("--rss-child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    DB = args.db
    if args.rss_child:
        rss_child([int(s) for s in args.rss_child.split(",")])
        return {}
    n = args.jobs

    print(f"ingest: creating {DB}", flush=True)
    common.recreate_db(DB, settings=common.OURS_SETTINGS)
    _django()
    from django.db import connection

    from schedapp.db import db_now

    results: dict[str, Any] = {"machine": common.machine(), "jobs": n,
                               "load_before": os.getloadavg()}
    conn = common.connect(DB)
    try:
        now = db_now()
        when = now + timedelta(days=1)
        text = raw_text(n, when, now)
        binary = binary_of(conn, text)
        ours(conn, one_offs(1000, when), 1000)  # once: Celery's task discovery, imports
        rounds: dict[str, list[dict[str, float]]] = {
            "raw_text": [], "raw_binary": [], "ours": [], "ours_text": [], "ours_unaudited": []}
        for r in range(args.repeat):
            rounds["raw_text"].append(raw_copy(conn, text, "text"))
            raw_row = stored(conn, "once-7")
            rounds["raw_binary"].append(raw_copy(conn, binary, "binary"))
            rounds["ours"].append(ours(conn, one_offs(n, when), n))
            assert stored(conn, "once-7") == raw_row, "the raw rows must equal what we write"
            rounds["ours_text"].append(ours(conn, one_offs(n, when), n, fmt="text"))
            rounds["ours_unaudited"].append(ours(conn, one_offs(n, when), n, audit=False))
            print(f"  round {r + 1}: " + ", ".join(f"{k} {v[-1]['wall']:.2f}s" for k, v in
                                                 rounds.items()), flush=True)
        results["rounds"] = rounds
        results["mixed"] = ours(conn, mixed(n, when), n)
        print(f"  mixed: {results['mixed']['wall']:.2f}s", flush=True)
        from schedapp import api

        today = now.date()
        api.save_calendar("bench-closed", {"dates": [
            today.isoformat(), (today + timedelta(days=1)).isoformat()]})
        results["mixed_calendar"] = ours(conn, mixed(n, when, calendar="bench-closed"), n)
        print(f"  mixed, under a calendar: {results['mixed_calendar']['wall']:.2f}s", flush=True)
        results["old_jobs"] = OLD_SIZE
        results["old"] = old(conn, OLD_SIZE, when)
        print(f"  old path, {OLD_SIZE:,}: {results['old']['wall']:.2f}s", flush=True)
        if args.profile:
            results["profile"] = profile(conn, n, when)
            (common.RESULTS / "ingest-profile.txt").write_text(results["profile"])
        fresh(conn)
        connection.close()
        sizes = sorted({10_000, min(100_000, args.rss_jobs), args.rss_jobs})
        results["memory"] = memory(sizes)
        print(f"  memory: {results['memory']}", flush=True)
        results["load_after"] = os.getloadavg()
        common.save("ingest", results)
    finally:
        conn.close()
        if not args.keep:
            connection.close()
            common.drop_db(DB)
    print(table(results).markdown())
    print(memory_table(results).markdown())
    return results


def table(results: dict[str, Any]) -> common.Table:
    """Medians of the rounds; the share of raw COPY is ours over the faster raw rate, from the
    same rounds. CPU is per job: this process (Python) and its PostgreSQL backend (the COPY);
    the CPU-bound rate, 1 / max(client, server), is what a machine with a free core for each
    would do, as the two work in parallel (the COPY streams while specs are validated)."""
    n = results["jobs"]

    def median(runs: list[dict[str, float]], key: str) -> float:
        return statistics.median(run[key] for run in runs)

    rounds = results["rounds"]
    limit = min(median(rounds["raw_text"], "wall"), median(rounds["raw_binary"], "wall")) / n
    t = common.Table(["what", "jobs", "seconds (median)", "runs", "jobs/s", "share of raw COPY",
                      "client CPU µs/job", "server CPU µs/job", "CPU-bound jobs/s"])

    def row(what: str, jobs: int, runs: list[dict[str, float]]) -> None:
        wall = median(runs, "wall")
        spread = " / ".join(f"{run['wall']:.2f}" for run in runs) if len(runs) > 1 else "-"
        client = median(runs, "client_cpu") / jobs * 1e6
        server = median(runs, "server_cpu") / jobs * 1e6
        # what the rate would be if this process and its backend each had a core to itself
        t.add(what, jobs, wall, spread, jobs / wall, limit / (wall / jobs), client, server,
              1e6 / max(client, server))

    row("(a) raw COPY, text", n, rounds["raw_text"])
    row("(a) raw COPY, binary", n, rounds["raw_binary"])
    row("(b) schedule_many, one-offs (COPY binary)", n, rounds["ours"])
    row("(b') schedule_many, one-offs, COPY text", n, rounds["ours_text"])
    if rounds.get("ours_unaudited"):
        row("(b'') schedule_many, one-offs (binary), audit trail off", n,
            rounds["ours_unaudited"])
    row("(c) schedule_many, one-off/cron/interval mix (binary)", n, [results["mixed"]])
    if results.get("mixed_calendar"):
        row("(c') (c), cron and interval jobs under a calendar, ledger recorded", n,
            [results["mixed_calendar"]])
    row("(d) old path (main's algorithm)", results["old_jobs"], [results["old"]])
    return t


def memory_table(results: dict[str, Any]) -> common.Table:
    mem = results["memory"]
    t = common.Table(["jobs from a generator", "seconds", "jobs/s", "peak RSS MB (VmHWM)"])
    t.add("(process after setup)", "-", "-", mem["before_mb"])
    for run in mem["runs"]:
        t.add(run["jobs"], run["seconds"], run["jobs"] / run["seconds"], run["peak_rss_mb"])
    return t


if __name__ == "__main__":
    main()
