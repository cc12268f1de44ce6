"""Burst: N one-off jobs due at the same instant, measured to the broker (and end to end).

Ours: the beats start first and sleep (LISTEN/NOTIFY); then N jobs are bulk-loaded due at
``db now + margin`` and the beats are notified. The due instant is the jobs' ``run_at``, in
the database's clock; a watcher process (``bench.watcher``) pops and timestamps every message
as it lands in Redis. Reported: seconds from the due instant to the last message, jobs/s,
duplicates (by job id), the beats' peak RSS and CPU seconds over the burst, and the database
commits (``pg_stat_database.xact_commit`` delta) and statements (counted in the beats by
``bench.beat_counting``) per dispatched job.

Baselines, on the same database and broker: django-celery-beat's ``DatabaseScheduler`` with one
``ClockedSchedule`` one-off ``PeriodicTask`` per job, and RedBeat with one entry per job whose
schedule fires once (``redbeat.schedules.rrule(SECONDLY, dtstart=instant, count=1)``, saved with
``last_run_at`` a second before the instant so its score in RedBeat's sorted set is the
instant). Their entries are created first and their beat started after, a margin before the
due instant (they get to load their schedule for free); the instant is the wall clock of this
host (the database's clock, same host, offset measured). A baseline is stopped at its cap and
its partial rate reported.

End to end: the same burst with a worker (prefork, 2 processes) executing the no-op; time to the
last succeeded run, and commits per execution on the worker side (total commits, less the
beats' own transactions counted by ``bench.beat_counting``, less the measuring polls).
"""

from __future__ import annotations

import json
import os
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import redis

from bench import common

DB = common.bench_db("burst")
REDIS_DB = common.bench_redis(12)  # the broker
REDBEAT_DB = common.bench_redis(13)  # RedBeat's schedule
_TABLES = ("schedapp_jobrun", "schedapp_job", "schedapp_node",
           "django_celery_results_taskresult", "django_celery_beat_periodictask",
           "django_celery_beat_clockedschedule", "django_celery_beat_intervalschedule",
           "django_celery_beat_periodictasks", "project_execution")

_django_ready = False


def setup(recreate: bool = True) -> None:
    """The bench database (schedapp's and django-celery-beat's tables) and Django in this
    process, for creating the baselines' entries through their own APIs."""
    global _django_ready
    if recreate:
        common.recreate_db(DB)
    os.environ["DATABASE_URL"] = common.db_url(DB)
    os.environ["CELERY_BROKER_URL"] = common.redis_url(REDIS_DB)
    os.environ["BENCH_REDBEAT_URL"] = common.redis_url(REDBEAT_DB)
    os.environ["DJANGO_SETTINGS_MODULE"] = common.BASELINE_SETTINGS
    if not _django_ready:
        import django

        django.setup()
        _django_ready = True


def reset() -> None:
    from django.db import connection

    connection.close()
    with common.connect(DB) as conn:
        conn.execute("TRUNCATE " + ", ".join(_TABLES) + " RESTART IDENTITY CASCADE")
    common.flush_redis(REDIS_DB, REDBEAT_DB)


def _margin(n: int) -> float:
    """Seconds between loading the jobs and their due instant: the load must be over and the
    statistics flushed before the instant."""
    return 5.0 + n / 25_000


def _snapshot(beats: list[common.Proc]) -> dict[str, Any]:
    for beat in beats:
        beat.mark_cpu()
    return {"commits": common.xact_commits(DB),
            "statements": [b.statements() for b in beats],
            "at": time.time()}


def _beat_figures(beats: list[common.Proc], before: dict[str, Any]) -> dict[str, Any]:
    stmts: dict[str, int] = {}
    for beat, start in zip(beats, before["statements"], strict=True):
        for kind, count in beat.statements().items():
            stmts[kind] = stmts.get(kind, 0) + count - start.get(kind, 0)
    return {
        "commits": common.xact_commits(DB) - before["commits"],
        "statements": stmts,
        "cpu_s": [b.cpu_seconds() - b.cpu_mark for b in beats],
        "cpu_total_s": [b.cpu_seconds() for b in beats],
        "peak_rss_mb": [b.memory()["peak_rss_mb"] for b in beats],
    }


def _summary(kind: str, n: int, beats: int, due: float, seen: dict[str, Any],
             figures: dict[str, Any], cap: float, offset: float) -> dict[str, Any]:
    """Rates and lags from the watcher's timestamps (host clock, moved to the DB clock)."""
    received = seen["received"]
    unique = seen["unique"]
    finished = unique >= n
    last = (seen["last"] + offset) if seen["last"] else None
    first = (seen["first"] + offset) if seen["first"] else None
    elapsed = (last - due) if finished and last else cap
    stmts = figures["statements"]
    return {
        "kind": kind, "n": n, "beats": beats, "finished": finished,
        "published": unique, "received": received, "duplicates": seen["duplicates"],
        "seconds": elapsed, "jobs_per_s": unique / elapsed if elapsed > 0 else float("nan"),
        "first_after_s": (first - due) if first else None,
        "commits": figures["commits"],
        "commits_per_job": figures["commits"] / unique if unique else None,
        "statements": stmts.get("total", 0),
        "statements_per_job": stmts.get("total", 0) / unique if unique else None,
        "beat_transactions": stmts.get("transactions", 0),
        "statement_kinds": stmts,
        "cpu_s": figures["cpu_s"], "cpu_total_s": figures["cpu_total_s"],
        "peak_rss_mb": figures["peak_rss_mb"],
        "clock_offset_s": offset,
    }


def _watch_and_measure(beats: list[common.Proc], n: int, due: float, cap: float,
                       tag: str) -> tuple[dict[str, Any], dict[str, Any]]:
    logs = common.run_dir(tag)
    out = logs / "watcher.json"
    watcher = common.start_watcher(REDIS_DB, out, expect=n, deadline=due + cap)
    common.sleep_until(due - 1.0)
    before = _snapshot(beats)
    seen = common.watcher_result(watcher, out, timeout=cap + 30)
    common.settle_stats()
    figures = _beat_figures(beats, before)
    return seen, figures


def run_ours(n: int, beats: int, cap: float = 300.0, settings: dict[str, Any] | None = None,
             profile: bool = False, jobs: str = "once",
             deadlines: bool = False) -> dict[str, Any]:
    """N jobs due at once, ``beats`` LeaseScheduler beats, to the broker. With ``profile``,
    py-spy samples the first beat (wall clock, idle included) over the burst. ``jobs``:
    ``once`` (one-offs), ``interval`` (daily intervals due at the instant) or ``calendar``
    (those intervals, each under a calendar that allows the instant: ``burst_calendar``);
    with ``deadlines``, every job carries every deadline field (``common.insert_jobs``)."""
    reset()
    calendar = burst_calendar() if jobs == "calendar" else None
    tag = f"ours-{n}-{beats}b" + ("-profiled" if profile else "")
    tag += "" if jobs == "once" else f"-{jobs}"
    tag += "-deadlines" if deadlines else ""
    logs = common.run_dir(tag)
    env = common.bench_env(DB, REDIS_DB, common.OURS_SETTINGS, settings)
    procs = [common.start_beat(f"beat{i + 1}", common.OURS_SCHEDULER, env, logs)
             for i in range(beats)]
    spy = None
    try:
        for p in procs:
            p.wait_for("schedapp.beat: beat ", timeout=60)
        offset = common.db_clock_offset(DB)
        loadavg = os.getloadavg()[0]
        due_dt = _load_ours(n, kind="once" if jobs == "once" else "interval", calendar=calendar,
                            deadlines=deadlines)
        due = due_dt.timestamp()
        if profile:
            spy = common.start_profiler(procs[0].pid, logs / "beat1.pyspy.txt")
        seen, figures = _watch_and_measure(procs, n, due, cap, tag)
        kind = "schedapp" if jobs == "once" else f"schedapp ({jobs})"
        result = _summary(kind, n, beats, due, seen, figures, cap, offset)
        result["per_beat"] = _per_beat()
        result["settings"] = settings or {}
        result["deadlines"] = deadlines
        result["loadavg_before"] = loadavg
    finally:
        common.stop_all(procs)
    if spy is not None:
        spy.wait(timeout=30)
        result["profile"] = common.profile_summary(logs / "beat1.pyspy.txt")
    _print(result)
    return result


def burst_calendar() -> int:
    """A calendar every ``--calendar`` job follows (issue 31's "claim cost with 100,000 jobs
    each attached to a calendar"): Germany's public holidays and every day of the week but
    today's excluded, less today and tomorrow (the burst's instant is allowed, so every job
    is due and claimed exactly as without it). Saved through the API: its id."""
    from datetime import date

    from django.db import connection

    from schedapp import api

    with common.connect(DB) as conn:
        today: date = common.db_now(conn).astimezone(UTC).date()
    days = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
    closed = [d for i, d in enumerate(days) if i != today.weekday()]
    open_days = [today.isoformat(), (today + timedelta(days=1)).isoformat()]
    calendar = api.save_calendar("bench-burst", {"difference": [
        {"union": [{"holidays": {"country": "DE"}}, {"weekdays": closed}]},
        {"dates": open_days}]})
    pk = int(calendar.pk)
    connection.close()
    return pk


def _load_ours(n: int, first: int = 1, kind: str = "once",
               calendar: int | None = None, deadlines: bool = False) -> datetime:
    with common.connect(DB) as conn:
        due = common.db_now(conn) + timedelta(seconds=_margin(n))
        common.insert_jobs(conn, first, first + n - 1, due, kind=kind, calendar=calendar,
                           deadlines=deadlines)
        conn.execute("ANALYZE schedapp_job")  # as autovacuum would, soon after a bulk load
        if common.db_now(conn) >= due - timedelta(seconds=1.5):
            raise RuntimeError("loading the jobs took longer than the margin")
    return due


def _per_beat() -> dict[str, int]:
    with common.connect(DB) as conn:
        rows = conn.execute("SELECT claimed_by, count(*) FROM schedapp_jobrun "
                            "GROUP BY claimed_by ORDER BY claimed_by").fetchall()
    return {str(beat): int(count) for beat, count in rows}


# --- baselines -------------------------------------------------------------------------------


def run_dcb(n: int, cap: float, beats: int = 1) -> dict[str, Any]:
    """django-celery-beat: one ClockedSchedule + one-off PeriodicTask per job."""
    from django.db import connection, transaction
    from django_celery_beat.models import ClockedSchedule, PeriodicTask, PeriodicTasks

    reset()
    tag = f"dcb-{n}-{beats}b"
    logs = common.run_dir(tag)
    due = time.time() + 8.0 + n / 2_000  # entries are created through the ORM: slower
    instant = datetime.fromtimestamp(due, UTC)
    with transaction.atomic():
        clocks = ClockedSchedule.objects.bulk_create(
            [ClockedSchedule(clocked_time=instant) for _ in range(n)], batch_size=5000)
        PeriodicTask.objects.bulk_create(
            [PeriodicTask(name=f"dcb-{i}", task="project.tasks.noop", clocked=clock,
                          one_off=True, args=json.dumps([f"dcb-{i}"]))
             for i, clock in enumerate(clocks, 1)], batch_size=5000)
        PeriodicTasks.update_changed()  # bulk_create sends no signal: tell the beats
    connection.close()
    env = common.bench_env(DB, REDIS_DB, common.BASELINE_SETTINGS)
    procs = [common.start_beat(f"beat{i + 1}", common.DCB_SCHEDULER, env, logs)
             for i in range(beats)]
    try:
        for p in procs:
            p.wait_for("beat: Starting", timeout=60)
        if time.time() > due - 2:
            raise RuntimeError("creating the entries took longer than the margin")
        offset = common.db_clock_offset(DB)
        seen, figures = _watch_and_measure(procs, n, due, cap, tag)
        result = _summary("django-celery-beat", n, beats, due, seen, figures, cap, 0.0)
        result["clock_offset_s"] = offset
    finally:
        common.stop_all(procs)
    _print(result)
    return result


def run_redbeat(n: int, cap: float) -> dict[str, Any]:
    """RedBeat: one entry per job, fired once at the instant (one beat: it holds a lock)."""
    from celery import current_app
    from redbeat.decoder import RedBeatJSONEncoder
    from redbeat.schedulers import RedBeatSchedulerEntry
    from redbeat.schedules import rrule

    reset()
    tag = f"redbeat-{n}"
    logs = common.run_dir(tag)
    due = time.time() + 6.0 + n / 10_000
    instant = datetime.fromtimestamp(due, UTC)
    app = current_app
    client = redis.Redis.from_url(common.redis_url(REDBEAT_DB))
    pipe = client.pipeline(transaction=False)
    for i in range(1, n + 1):
        entry = RedBeatSchedulerEntry(
            f"rb-{i}", "project.tasks.noop", rrule("SECONDLY", dtstart=instant, count=1),
            args=[f"rb-{i}"], app=app)
        entry.last_run_at = instant - timedelta(seconds=1)
        _stage_redbeat(pipe, entry, RedBeatJSONEncoder)
        if i % 5000 == 0:
            pipe.execute()
    pipe.execute()
    env = common.bench_env(DB, REDIS_DB, common.BASELINE_SETTINGS,
                           {"BENCH_REDBEAT_URL": common.redis_url(REDBEAT_DB)})
    procs = [common.start_beat("beat1", common.REDBEAT_SCHEDULER, env, logs)]
    try:
        procs[0].wait_for("beat: Starting", timeout=60)
        if time.time() > due - 2:
            raise RuntimeError("creating the entries took longer than the margin")
        seen, figures = _watch_and_measure(procs, n, due, cap, tag)
        result = _summary("RedBeat", n, 1, due, seen, figures, cap, 0.0)
    finally:
        common.stop_all(procs)
    _print(result)
    return result


def _stage_redbeat(pipe: Any, entry: Any, encoder: type[json.JSONEncoder]) -> None:
    """What ``RedBeatSchedulerEntry.save()`` writes, staged in a shared pipeline (its own
    save is one round trip per entry: minutes for 100,000 entries)."""
    definition = {"name": entry.name, "task": entry.task, "args": entry.args,
                  "kwargs": entry.kwargs, "options": entry.options,
                  "schedule": entry.schedule, "enabled": entry.enabled}
    meta = {"last_run_at": entry.last_run_at}
    pipe.hset(entry.key, "definition", json.dumps(definition, cls=encoder))
    pipe.hset(entry.key, "meta", json.dumps(meta, cls=encoder))
    pipe.zadd(entry.app.redbeat_conf.schedule_key, {entry.key: entry.score})


# --- end to end ------------------------------------------------------------------------------


def run_e2e(n: int, beats: int = 2, backend: str = "", cap: float = 300.0,
            concurrency: int = 2) -> dict[str, Any]:
    """The burst with a worker executing the no-op: time to the last succeeded run and
    commits per execution. ``backend`` is CELERY_RESULT_BACKEND ("" disables it)."""
    reset()
    tag = f"e2e-{n}-{beats}b-{backend or 'nobackend'}"
    logs = common.run_dir(tag)
    env = common.bench_env(DB, REDIS_DB, common.OURS_SETTINGS,
                           {"CELERY_RESULT_BACKEND": backend})
    procs = [common.start_beat(f"beat{i + 1}", common.OURS_SCHEDULER, env, logs)
             for i in range(beats)]
    worker = common.start_worker("worker1", env, logs, concurrency=concurrency)
    try:
        for p in procs:
            p.wait_for("schedapp.beat: beat ", timeout=60)
        wait_worker_ready()
        due = _load_ours(n).timestamp()
        common.sleep_until(due - 1.0)
        before = _snapshot([*procs, worker])
        polls, done_at, succeeded = _poll_runs(n, due + cap)
        common.settle_stats()
        figures = _beat_figures(procs, {**before, "statements": before["statements"][:-1]})
        worker_cpu = worker.cpu_seconds() - worker.cpu_mark
        results = _count_results()
    finally:
        worker.stop()
        common.stop_all(procs)
    beat_tx = figures["statements"].get("transactions", 0)
    total = figures["commits"] - polls
    elapsed = (done_at - due) if done_at else cap
    result = {
        "kind": "schedapp e2e", "n": n, "beats": beats, "backend": backend or "disabled",
        "worker_concurrency": concurrency, "finished": done_at is not None,
        "executed": succeeded, "seconds": elapsed, "jobs_per_s": succeeded / elapsed,
        "commits_total": total, "commits_per_execution": total / max(succeeded, 1),
        "beat_commits": beat_tx, "beat_commits_per_job": beat_tx / max(succeeded, 1),
        "worker_commits_per_execution": (total - beat_tx) / max(succeeded, 1),
        "task_results_stored": results,
        "beat_cpu_s": figures["cpu_s"], "worker_cpu_s": worker_cpu,
        "peak_rss_mb": figures["peak_rss_mb"],
    }
    print(f"  e2e n={n} beats={beats} backend={result['backend']}: {elapsed:.2f}s "
          f"{result['jobs_per_s']:,.0f} jobs/s, commits/execution "
          f"{result['commits_per_execution']:.3f} (worker "
          f"{result['worker_commits_per_execution']:.3f})", flush=True)
    return result


def wait_worker_ready(timeout: float = 60.0) -> None:
    """The worker registers itself in schedapp's node table when Celery says it is ready."""
    def ready() -> bool:
        with common.connect(DB) as conn:
            return bool(conn.execute("SELECT count(*) FROM schedapp_node WHERE kind = 'worker'"
                                     ).fetchone()[0])

    if not common.wait_until(ready, timeout=timeout, interval=0.5):
        raise TimeoutError("the worker did not become ready")
    time.sleep(1.0)


def _poll_runs(n: int, deadline: float) -> tuple[int, float | None, int]:
    """Poll the succeeded runs every 0.25 s; each poll is one transaction of our own."""
    polls, succeeded = 0, 0
    with common.connect(DB) as conn:
        while time.time() < deadline:
            (succeeded,) = conn.execute(
                "SELECT count(*) FROM schedapp_jobrun WHERE status = 'succeeded'").fetchone()
            polls += 1
            if succeeded >= n:
                return polls, time.time(), succeeded
            time.sleep(0.25)
    return polls, None, succeeded


def _count_results() -> int:
    with common.connect(DB) as conn:
        (count,) = conn.execute("SELECT count(*) FROM django_celery_results_taskresult"
                                ).fetchone()
    return int(count)


def _print(r: dict[str, Any]) -> None:
    done = "" if r["finished"] else f" (PARTIAL: {r['published']:,}/{r['n']:,} in the cap)"
    print(f"  {r['kind']} n={r['n']:,} beats={r['beats']}: {r['seconds']:.2f}s, "
          f"{r['jobs_per_s']:,.0f} jobs/s{done}, duplicates {r['duplicates']}, "
          f"commits/job {r['commits_per_job'] or 0:.4f}, statements/job "
          f"{r['statements_per_job'] or 0:.4f}, CPU {[round(c, 2) for c in r['cpu_s']]}, "
          f"peak RSS {[round(m, 1) for m in r['peak_rss_mb']]}", flush=True)


def log_dir() -> Path:
    return common.RESULTS / "logs"
