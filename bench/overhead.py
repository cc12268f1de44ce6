"""Worker overhead: the same stock worker draining the same backlog, plain Celery vs schedapp.

    .venv/bin/python -m bench.run --sections overhead          # 3 rounds of each, 3,000 tasks
    .venv/bin/python -m bench.overhead --n 3000 --rounds 3 --profile
    .venv/bin/python -m bench.overhead --n 3000 --rounds 3 --ceilings
    .venv/bin/python -m bench.overhead --n 1000 --rounds 3 --task project.tasks.wait_5ms
    .venv/bin/python -m bench.overhead --n 3000 --rounds 3 --ceilings --timing

Both sides run ``project.tasks.noop`` (or ``--task``) on one worker (prefork, ``-c 2``, acks
late, prefetch 1, result backend disabled) against the same Redis and PostgreSQL. The backlog
is put in the queue *before* the worker starts, so the worker's start-up is outside the
measurement:

* plain Celery: N messages sent with ``send_task`` (Celery's own publishing path);
* schedapp: N one-off jobs due at once, dispatched by one beat (leases of an hour, so nothing
  is reclaimed while the worker is away), then the beat is stopped.

Then the worker starts, and the clock runs from the moment the first message leaves the queue
to the moment the queue and Redis' unacked set are both empty (acks late: a message is
acknowledged after its task returned and, for schedapp, after its completion was recorded).
The ratio is schedapp's rate over plain Celery's, rounds alternating, medians reported.
Commits per execution come from ``pg_stat_database`` over the schedapp drain. ``--profile``
samples the worker's main process and its pool children with py-spy.

Each drain also reads the CPU it cost, per execution, where it was spent: the worker's main
process, its pool processes, PostgreSQL (every server process, those that exited during the
drain included: the postmaster's reaped children) and Redis. PostgreSQL, Redis and the worker
share the machine's two cores, so when the drain is CPU-bound the ratio of two sides' rates
follows the ratio of their total CPU per execution, which is steadier than the rates on a
noisy machine.

``--ceilings`` adds three more drains per round, schedapp with a part of its worker protocol
taken out (``bench/ceilings.py``): without the door (the staged runs are marked ``running``
beforehand, the completion is the real one), with a door that only waits for one empty round
trip to PostgreSQL, and without any database write. They show what
each part costs, and how far plain Celery's rate is from a worker that must record each
execution in PostgreSQL on the same two cores.

``--timing`` times each pool slot's cycle (``bench/timing.py``): the time in the task, the
door alone, and the time between two tasks of one pool process.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import redis

from bench import common
from bench import timing as bench_timing
from bench.ceilings import CEILINGS

DB = common.bench_db("overhead")
REDIS_DB = common.bench_redis(9)  # its own (tests use 7)
QUEUE = common.QUEUE
NOOP = "project.tasks.noop"
_TABLES = ("schedapp_jobrun", "schedapp_job", "schedapp_node", "project_execution")
WORKER_SETTINGS = {
    "CELERY_RESULT_BACKEND": "",  # disabled on both sides
    "DJANGO_DEBUG": "0",  # as in production: no query log kept per statement
    # The README's worker settings (acks late and prefetch 1 are the project's defaults).
}

_django_ready = False


def setup(recreate: bool = True) -> None:
    global _django_ready
    if recreate:
        common.recreate_db(DB, settings=common.OURS_SETTINGS)
    os.environ["DATABASE_URL"] = common.db_url(DB)
    os.environ["CELERY_BROKER_URL"] = common.redis_url(REDIS_DB)
    os.environ["CELERY_RESULT_BACKEND"] = ""
    os.environ["DJANGO_SETTINGS_MODULE"] = common.OURS_SETTINGS
    if not _django_ready:
        import django

        django.setup()
        _django_ready = True


def reset() -> None:
    from django.db import connection

    connection.close()
    with common.connect(DB) as conn:
        conn.execute("TRUNCATE " + ", ".join(_TABLES) + " RESTART IDENTITY CASCADE")
    common.flush_redis(REDIS_DB)


def _redis() -> redis.Redis:
    return redis.Redis.from_url(common.redis_url(REDIS_DB))


def _env(ceiling: str | None = None, timing: Path | None = None) -> dict[str, str]:
    extra = {**WORKER_SETTINGS, **({"BENCH_CEILING": ceiling} if ceiling else {}),
             **({"BENCH_TIMING": str(timing)} if timing else {})}
    return common.bench_env(DB, REDIS_DB, common.OURS_SETTINGS, extra)


def stage_plain(n: int, task: str = NOOP) -> None:
    """N messages through Celery's own ``send_task``, before any worker runs."""
    from project.celery import app

    with app.producer_or_acquire() as producer:
        for i in range(n):
            app.send_task(task, args=[i], producer=producer)


def stage_schedapp(n: int, logs: Path, task: str = NOOP, deadlines: bool = False) -> None:
    """N one-off jobs due now, dispatched by one beat which is then stopped; with
    ``deadlines``, each carries every deadline field (the door reads them)."""
    with common.connect(DB) as conn:
        now = common.db_now(conn)
        common.insert_jobs(conn, 1, n, now, lease=3600, task=task, deadlines=deadlines)
    beat = common.start_beat("beat", common.OURS_SCHEDULER, _env(), logs,
                             count_statements=False)
    try:
        beat.wait_for("schedapp.beat: beat ", timeout=60)
        r = _redis()
        if not common.wait_until(lambda: r.llen(QUEUE) >= n, timeout=120, interval=0.05):
            raise TimeoutError(f"the beat published {r.llen(QUEUE)} of {n}")
        # Let the beat finish the tick that published the last batch: a SIGTERM inside it
        # releases that batch (fencing the messages just sent), which is right for a real
        # beat and wrong for this staging.
        time.sleep(1.0)
    finally:
        beat.stop()


def admit_beforehand() -> None:
    """For the ``no-door`` ceiling: the staged runs as the door would leave them."""
    with common.connect(DB) as conn:
        conn.execute("UPDATE schedapp_jobrun SET status = 'running', started_at = now(), "
                     "worker = 'bench' WHERE status = 'dispatched'")


def drain(n: int, logs: Path, name: str, profile: bool,
          ceiling: str | None = None, timing: bool = False) -> dict[str, Any]:
    """Start the worker and time the backlog's drain."""
    r = _redis()
    assert r.llen(QUEUE) == n, r.llen(QUEUE)
    commits_before = common.xact_commits(DB)
    marks = _fresh_dir(logs / f"{name}-timing") if timing else None
    worker = common.start_worker(name, _env(ceiling, marks), logs, concurrency=2)
    spies: list[subprocess.Popen] = []
    try:
        started = _wait_first_consumed(r, n, worker)
        worker.mark_cpu()
        budget_before = cpu_budget(worker.pid)
        if profile:
            spies = _start_spies(worker, logs / name)
        while r.llen(QUEUE) or r.hlen("unacked"):
            if time.monotonic() - started > 600:
                raise TimeoutError("the worker did not drain the queue in 600 s")
            if not worker.alive():
                raise RuntimeError(f"the worker died:\n{worker.log()[-3000:]}")
            time.sleep(0.005)
        elapsed = time.monotonic() - started
        cpu = worker.cpu_seconds() - worker.cpu_mark
        budget = {k: v - budget_before[k] for k, v in cpu_budget(worker.pid).items()}
    finally:
        for spy in spies:
            spy.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
        worker.stop()
        for spy in spies:
            spy.wait(timeout=30)
    common.settle_stats()
    commits = common.xact_commits(DB) - commits_before
    slots = {"slot_cycle": bench_timing.summarise(marks)} if marks else {}
    return {**slots, "seconds": elapsed, "per_s": n / elapsed, "worker_cpu_s": cpu,
            "worker_cpu_ms_per_execution": 1000 * cpu / n,
            "pg_cpu_s": budget["postgresql"],
            "pg_cpu_ms_per_execution": 1000 * budget["postgresql"] / n,
            "cpu_ms_per_execution": {k: 1000 * v / n for k, v in budget.items()},
            "commits": commits}


def cpu_budget(worker_pid: int) -> dict[str, float]:
    """CPU seconds (user + system) so far of the worker's main process, its pool processes,
    PostgreSQL and Redis, and their total, read from /proc."""
    import psutil

    main = psutil.Process(worker_pid)
    out = {"worker_main": _cpu(worker_pid), "worker_pool": 0.0, "postgresql": 0.0,
           "redis": 0.0}
    for child in main.children(recursive=True):
        out["worker_pool"] += _cpu(child.pid)
    for proc in psutil.process_iter(["name", "ppid"]):
        name = proc.info["name"] or ""
        if name == "redis-server":
            out["redis"] += _cpu(proc.pid)
        elif name == "postgres" and proc.info["ppid"] == 1:
            # The postmaster: its own CPU, its reaped children's (backends that exited during
            # the drain, such as the pool processes' recycled connections), its live children.
            out["postgresql"] += _cpu(proc.pid, reaped=True)
            out["postgresql"] += sum(_cpu(c.pid) for c in proc.children())
    out["total"] = sum(out.values())
    return out


def _cpu(pid: int, reaped: bool = False) -> float:
    """utime + stime of ``pid`` (with ``reaped``, plus its waited-for children's)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    ticks = int(fields[11]) + int(fields[12])
    if reaped:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / os.sysconf("SC_CLK_TCK")


def _wait_first_consumed(r: redis.Redis, n: int, worker: common.Proc) -> float:
    deadline = time.monotonic() + 120
    while r.llen(QUEUE) >= n:
        if time.monotonic() > deadline or not worker.alive():
            raise RuntimeError(f"the worker consumed nothing:\n{worker.log()[-3000:]}")
        time.sleep(0.001)
    return time.monotonic()


def _start_spies(worker: common.Proc, prefix: Path) -> list[subprocess.Popen]:
    """py-spy on the worker's main process and each pool child (samples of threads not idle:
    what they work on; ``--timing`` shows what a slot waits for)."""
    import psutil

    spy = str(Path(sys.executable).parent / "py-spy")
    main = psutil.Process(worker.pid)
    # `celery` is the session leader; the worker's main process is that same pid.
    pids = [main.pid] + [c.pid for c in main.children(recursive=True)]
    spies = []
    for pid in pids:
        out = Path(f"{prefix}-{'main' if pid == main.pid else pid}.txt")
        spies.append(subprocess.Popen(
            [spy, "record", "--pid", str(pid), "--rate", "500", "--format", "raw",
             "--output", str(out), "--nonblocking"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return spies


def _fresh_dir(path: Path) -> Path:
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


def _budget_line(out: dict[str, Any]) -> str:
    ms = out["cpu_ms_per_execution"]
    slots = f"; {bench_timing.line(out['slot_cycle'])}" if "slot_cycle" in out else ""
    return (f"CPU per execution {ms['total']:.2f} ms (worker main {ms['worker_main']:.2f}, "
            f"pool {ms['worker_pool']:.2f}, PostgreSQL {ms['postgresql']:.2f}, "
            f"Redis {ms['redis']:.2f}){slots}")


def schedapp_ok(n: int) -> dict[str, int]:
    with common.connect(DB) as conn:
        rows = conn.execute(
            "SELECT status, count(*) FROM schedapp_jobrun GROUP BY status").fetchall()
    return {status: int(count) for status, count in rows}


def _schedapp_round(n: int, logs: Path, name: str, profile: bool,
                    ceiling: str | None = None, task: str = NOOP,
                    timing: bool = False, deadlines: bool = False) -> dict[str, Any]:
    reset()
    stage_schedapp(n, logs, task, deadlines)
    if ceiling is not None:
        admit_beforehand()
    out = drain(n, logs, name, profile, ceiling, timing)
    statuses = schedapp_ok(n)
    out["runs"] = statuses
    out["commits_per_execution"] = out["commits"] / n
    expected = "running" if ceiling == "no-writes" else "succeeded"
    if statuses.get(expected) != n:
        raise RuntimeError(f"{name}: expected {n} runs {expected}, found {statuses}")
    return out


def run(n: int = 3000, rounds: int = 3, profile: bool = False,
        ceilings: bool = False, task: str = NOOP, timing: bool = False,
        deadlines: bool = False) -> dict[str, Any]:
    setup()
    logs = common.run_dir("overhead")
    plain: list[dict[str, Any]] = []
    ours: list[dict[str, Any]] = []
    without: dict[str, list[dict[str, Any]]] = {c: [] for c in (CEILINGS if ceilings else ())}
    for i in range(rounds):
        reset()
        stage_plain(n, task)
        plain.append(drain(n, logs, f"plain{i}", profile and i == 0, timing=timing))
        print(f"  plain Celery round {i + 1}: {plain[-1]['per_s']:,.0f}/s, "
              f"{_budget_line(plain[-1])}", flush=True)
        ours.append(_schedapp_round(n, logs, f"schedapp{i}", profile and i == 0, task=task,
                                    timing=timing, deadlines=deadlines))
        print(f"  schedapp     round {i + 1}: {ours[-1]['per_s']:,.0f}/s, "
              f"{_budget_line(ours[-1])}, "
              f"{ours[-1]['commits_per_execution']:.2f} commits/execution", flush=True)
        for ceiling, results in without.items():
            results.append(_schedapp_round(n, logs, f"{ceiling}{i}", False, ceiling, task,
                                           timing, deadlines))
            print(f"  {ceiling:12s} round {i + 1}: {results[-1]['per_s']:,.0f}/s, "
                  f"{_budget_line(results[-1])}, "
                  f"{results[-1]['commits_per_execution']:.2f} commits/execution", flush=True)
    ratios = [o["per_s"] / p["per_s"] for o, p in zip(ours, plain, strict=True)]
    # Plain Celery's total CPU per execution over schedapp's, round by round: on a CPU-bound
    # machine the rate ratio follows it.
    cpu_ratios = [p["cpu_ms_per_execution"]["total"] / o["cpu_ms_per_execution"]["total"]
                  for o, p in zip(ours, plain, strict=True)]
    result = {
        "machine": common.machine(), "n": n, "rounds": rounds, "task": task,
        "deadlines": deadlines,
        "plain_per_s": statistics.median(p["per_s"] for p in plain),
        "schedapp_per_s": statistics.median(o["per_s"] for o in ours),
        "ratio_median": statistics.median(ratios), "ratios": ratios,
        "cpu_ratio_median": statistics.median(cpu_ratios), "cpu_ratios": cpu_ratios,
        "commits_per_execution": statistics.median(o["commits_per_execution"] for o in ours),
        "plain": plain, "schedapp": ours,
    }
    print(f"overhead: plain {result['plain_per_s']:,.0f}/s, schedapp "
          f"{result['schedapp_per_s']:,.0f}/s, ratio {result['ratio_median']:.2f} "
          f"(rounds {', '.join(f'{x:.2f}' for x in ratios)}), "
          f"{result['commits_per_execution']:.2f} commits/execution; total CPU per execution, "
          f"plain over schedapp: {result['cpu_ratio_median']:.2f} "
          f"(rounds {', '.join(f'{x:.2f}' for x in cpu_ratios)})", flush=True)
    for ceiling, results in without.items():
        side = [o["per_s"] / p["per_s"] for o, p in zip(results, plain, strict=True)]
        result[ceiling] = {"per_s": statistics.median(o["per_s"] for o in results),
                           "ratio_median": statistics.median(side), "ratios": side,
                           "rounds": results}
        print(f"ceiling {ceiling}: {result[ceiling]['per_s']:,.0f}/s, ratio "
              f"{result[ceiling]['ratio_median']:.2f} "
              f"(rounds {', '.join(f'{x:.2f}' for x in side)})", flush=True)
    name = ("overhead-ceilings" if ceilings else "overhead") + ("-deadlines" if deadlines else "")
    common.save(name if task == NOOP else f"{name}-{task.rsplit('.', 1)[-1]}", result)
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--ceilings", action="store_true",
                        help="also drain schedapp without the door, with an empty round trip "
                        "as the door, and without any write")
    parser.add_argument("--task", default=NOOP,
                        help="the task both sides run (default: project.tasks.noop; "
                        "project.tasks.wait_5ms waits 5 ms, as a task waiting on a network "
                        "call would)")
    parser.add_argument("--timing", action="store_true",
                        help="time each pool slot's cycle: in the task, the door, between "
                        "tasks (bench/timing.py)")
    parser.add_argument("--deadlines", action="store_true",
                        help="schedapp's jobs carry every deadline field (the door reads them)")
    args = parser.parse_args(argv)
    run(args.n, args.rounds, args.profile, args.ceilings, args.task, args.timing,
        args.deadlines)


if __name__ == "__main__":
    main()
