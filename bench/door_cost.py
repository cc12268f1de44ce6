"""What one door costs, in one process and outside Celery: client CPU, PostgreSQL CPU and wall
time per execution.

    .venv/bin/python -m bench.door_cost --n 2000

N one-off runs are staged as for ``bench.overhead`` (dispatched by a real beat, messages left
in Redis), then taken in order, each through:

* ``select 1``: an empty statement on the door's own path to the database (``call_function``,
  as the ``round-trip`` ceiling of ``bench.overhead`` sends it), the floor of any door;
* ``hooks``: the pool process's path, ``WorkerHooks.admit`` (the door, carrying the previous
  run's success) and ``on_task_success``, as a prefork pool process runs them;

and, on a second staging, ``sql``: the same door and success as one raw statement on a
plain psycopg connection (no Django, no hooks); on a third, ``sql door`` and ``sql success``:
every door alone, then every success alone, as a pool process writes them after a task that
waited (the door in the slot, the success by its thread during the next body). The CPU of
the one backend serving the loop is read from /proc, as ``bench.overhead`` reads it. Nothing
here runs concurrently, so the figures are what a door costs without contention;
``bench.overhead`` measures it inside a worker.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import psycopg

from bench import common, overhead


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000)
    n = parser.parse_args(argv).n
    overhead.setup()
    results = {"n": n, "machine": common.machine()}
    results.update(through_hooks(n))
    results.update(as_raw_sql(n))
    results.update(apart(n))
    for name in ("select 1", "hooks", "sql", "sql door", "sql success"):
        r = results[name]
        print(f"{name:9s} wall {r['wall_ms']:.3f} ms, client CPU {r['client_ms']:.3f} ms, "
              f"PostgreSQL CPU {r['backend_ms']:.3f} ms per execution")
    common.save("door-cost", results)


def _stage(n: int) -> list[dict[str, Any]]:
    """N dispatched runs; their messages' headers, in queue order."""
    overhead.reset()
    overhead.stage_schedapp(n, common.run_dir("door-cost"))
    raw = overhead._redis().lrange(common.QUEUE, 0, -1)
    return [json.loads(m)["headers"] for m in raw]


def _timed(items: list[Any], step: Callable[[Any], None], backend_pid: int) -> dict[str, float]:
    c0, w0, b0 = time.process_time(), time.perf_counter(), overhead._cpu(backend_pid)
    for item in items:
        step(item)
    w1, c1, b1 = time.perf_counter(), time.process_time(), overhead._cpu(backend_pid)
    n = len(items)
    return {"wall_ms": 1000 * (w1 - w0) / n, "client_ms": 1000 * (c1 - c0) / n,
            "backend_ms": 1000 * (b1 - b0) / n}


def through_hooks(n: int) -> dict[str, Any]:
    from django.db import connection

    from project.celery import app
    from schedapp.store.postgresql import call_function
    from schedapp.worker import WorkerHooks

    app.loader.import_default_modules()
    task = app.tasks["project.tasks.noop"]
    hooks = WorkerHooks()
    hooks.completions.open_pending()
    messages = _stage(n)
    connection.ensure_connection()
    pid = connection.connection.info.backend_pid
    # The door's own path to the database (as the round-trip ceiling), with no work
    out = {"select 1": _timed(messages, lambda _: call_function("SELECT 1", []), pid)}

    def run(headers: dict[str, Any]) -> None:
        task.request_stack.push(SimpleNamespace(hostname="bench@door", **headers))
        try:
            hooks.door.admit(task, headers["id"])
            hooks.completions.on_task_success(sender=task, result=None)
        finally:
            task.request_stack.pop()

    out["hooks"] = _timed(messages, run, pid)
    hooks.completions.close_pending()
    _check(n, out, "hooks")
    return out


def _one_off_success(job: int, token: int, scheduled_for: Any, run: int) -> list[Any]:
    """``schedapp_succeed_run``'s arguments for a one-off (no next occurrence, no schedule)."""
    return [job, token, scheduled_for, None, True, "", "", None, None, run]


def _staged_runs(conn: psycopg.Connection) -> list[Any]:
    """The staged runs as (job, token, scheduled_for, run id), in queue order."""
    return conn.execute(
        "SELECT r.job_id, r.token, j.scheduled_for, r.id FROM schedapp_jobrun r "
        "JOIN schedapp_job j ON j.id = r.job_id ORDER BY r.id").fetchall()


def _door_args(row: Any) -> list[Any]:
    """``schedapp_admit_run``'s arguments for a staged run."""
    return [row[0], row[1], "bench@door", "a", row[3]]


def as_raw_sql(n: int) -> dict[str, Any]:
    from schedapp.sql import query

    _stage(n)
    with psycopg.connect(common.db_url(overhead.DB), autocommit=True) as conn:
        rows = _staged_runs(conn)
        previous: list[Any] = []

        def door(row: Any) -> None:
            admit = _door_args(row)
            if previous:
                conn.execute(query("succeed_run_then_admit"),
                             [*_one_off_success(*previous.pop()), *admit])
            else:
                conn.execute(query("admit_run"), admit)
            previous.append(row)

        out = {"sql": _timed(rows, door, conn.info.backend_pid)}
        conn.execute(query("succeed_run"), _one_off_success(*previous.pop()))
    _check(n, out, "sql")
    return out


def apart(n: int) -> dict[str, Any]:
    """Each door alone, then each success alone, timed apart."""
    from schedapp.sql import query

    _stage(n)
    with psycopg.connect(common.db_url(overhead.DB), autocommit=True) as conn:
        rows = _staged_runs(conn)
        pid = conn.info.backend_pid
        out = {
            "sql door": _timed(rows, lambda row: conn.execute(query("admit_run"), _door_args(row)),
                               pid),
            "sql success": _timed(rows, lambda row: conn.execute(
                query("succeed_run"), _one_off_success(*row)), pid),
        }
    _check(n, out, "sql door")
    return out


def _check(n: int, out: dict[str, Any], name: str) -> None:
    statuses = overhead.schedapp_ok(n)
    out[f"{name}_runs"] = statuses
    if statuses.get("succeeded") != n:
        raise RuntimeError(f"{name}: expected {n} runs succeeded, found {statuses}")


if __name__ == "__main__":
    main()
