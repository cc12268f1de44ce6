"""Double firing: a few periodic tasks, one and two beats. Does a second beat duplicate runs?

django-celery-beat: ``TASKS`` interval tasks (every ``PERIOD`` seconds) for ``DURATION``
seconds with one beat, then with two; the watcher counts the messages per task. A fire of a
task within half a period of its previous fire is a duplicate.

Ours: the same interval jobs with two beats and a worker running ``project.tasks.record``
(recurring jobs need a worker: the next occurrence is scheduled when a run completes). A
duplicate is a second run, or a second execution, of the same job and occurrence.
"""

from __future__ import annotations

import json
import time
from datetime import timedelta
from typing import Any

from bench import burst, common

TASKS = 10
PERIOD = 2.0
DURATION = 30.0


def run_dcb(beats: int) -> dict[str, Any]:
    from django.db import connection, transaction
    from django_celery_beat.models import IntervalSchedule, PeriodicTask, PeriodicTasks

    burst.reset()
    logs = common.run_dir(f"doublefire-dcb-{beats}b")
    with transaction.atomic():
        every = IntervalSchedule.objects.create(every=int(PERIOD),
                                                period=IntervalSchedule.SECONDS)
        for i in range(1, TASKS + 1):
            PeriodicTask.objects.create(name=f"every-{i}", task="project.tasks.noop",
                                        interval=every, args=json.dumps([f"every-{i}"]))
        PeriodicTasks.update_changed()
    connection.close()
    env = common.bench_env(burst.DB, burst.REDIS_DB, common.BASELINE_SETTINGS)
    out = logs / "watcher.json"
    start = time.time()
    watcher = common.start_watcher(burst.REDIS_DB, out, expect=10**9,
                                   deadline=start + DURATION)
    procs = [common.start_beat(f"beat{i + 1}", common.DCB_SCHEDULER, env, logs)
             for i in range(beats)]
    try:
        seen = common.watcher_result(watcher, out, timeout=DURATION + 30)
    finally:
        common.stop_all(procs)
    last: dict[str, float] = {}
    duplicates = 0
    for key, at in sorted(zip(seen["keys"], seen["arrivals"], strict=True),
                          key=lambda pair: pair[1]):
        if key in last and at - last[key] < PERIOD / 2:
            duplicates += 1
        last[key] = at
    result = {"scheduler": "django-celery-beat", "beats": beats, "tasks": TASKS,
              "period_s": PERIOD, "seconds": DURATION, "published": seen["received"],
              "duplicates": duplicates}
    print(f"  double fire, django-celery-beat, {beats} beat(s): {seen['received']} messages, "
          f"{duplicates} duplicates", flush=True)
    return result


def run_ours(beats: int = 2) -> dict[str, Any]:
    from django.db import connection

    from schedapp import api

    burst.reset()
    logs = common.run_dir(f"doublefire-ours-{beats}b")
    env = common.bench_env(burst.DB, burst.REDIS_DB, common.OURS_SETTINGS,
                           {"CELERY_RESULT_BACKEND": ""})
    procs = [common.start_beat(f"beat{i + 1}", common.OURS_SCHEDULER, env, logs)
             for i in range(beats)]
    worker = common.start_worker("worker1", env, logs)
    try:
        for p in procs:
            p.wait_for("schedapp.beat: beat ", timeout=60)
        burst.wait_worker_ready()
        api.schedule_many([{"task": "project.tasks.record", "name": f"every-{i}",
                            "kwargs": {"label": f"every-{i}"},
                            "interval": timedelta(seconds=PERIOD)}
                           for i in range(1, TASKS + 1)])
        connection.close()
        time.sleep(DURATION)
    finally:
        worker.stop()
        common.stop_all(procs)
    with common.connect(burst.DB) as conn:
        runs, occurrences = conn.execute(
            "SELECT count(*), count(DISTINCT (job_id, scheduled_for)) FROM schedapp_jobrun"
        ).fetchone()
        executions, executed_occurrences = conn.execute(
            "SELECT count(*), count(DISTINCT (job_id, scheduled_for)) FROM project_execution"
        ).fetchone()
        by_beat = conn.execute("SELECT count(DISTINCT claimed_by) FROM schedapp_jobrun"
                               ).fetchone()[0]
    result = {"scheduler": "schedapp", "beats": beats, "tasks": TASKS, "period_s": PERIOD,
              "seconds": DURATION, "published": runs, "duplicates": runs - occurrences,
              "executions": executions,
              "duplicate_executions": executions - executed_occurrences,
              "beats_that_dispatched": by_beat}
    print(f"  double fire, schedapp, {beats} beats: {runs} runs over {occurrences} occurrences,"
          f" {executions} executions, duplicates {runs - occurrences} / "
          f"{executions - executed_occurrences}", flush=True)
    return result


def table(results: list[dict[str, Any]]) -> common.Table:
    t = common.Table(["scheduler", "beats", "periodic tasks", "every", "run for",
                      "published", "duplicate fires"])
    for r in results:
        t.add(r["scheduler"], r["beats"], r["tasks"], f"{r['period_s']:.0f} s",
              f"{r['seconds']:.0f} s", r["published"], r["duplicates"])
    return t


def main() -> list[dict[str, Any]]:
    burst.setup(recreate=False)
    return [run_dcb(1), run_dcb(2), run_ours(2)]
