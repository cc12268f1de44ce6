"""Jobs and runs generated inside PostgreSQL (one ``INSERT ... SELECT generate_series`` each),
for what measures the admin at scale: tests/integration/test_admin_scale.py and
bench/admin_changelist.py fill their tables with the same rows.

Jobs mix every state, schedule kind, zone, queue and priority (per 1,000: 10 running, 1 dead,
10 paused, 20 succeeded, 5 cancelled; a thousandth already due); runs spread over the jobs
(the ``n``-th run belongs to the ``n % jobs``-th job, counted from the lowest id), a fifth
failed with a traceback.
"""

from __future__ import annotations

from typing import Any

FILL_JOBS = """
INSERT INTO schedapp_job (
    name, task, args, kwargs, run_at, cron, timezone, interval, state, priority, queue,
    max_retries, retry_backoff, retry_backoff_max, jitter, lease_seconds, misfire_policy,
    misfire_grace, misfire_max_catchup, next_run_at, scheduled_for, retry_count, missed_runs,
    claimed_by, lease_expires_at, token, source, last_run_at, last_status, last_error,
    created_at, updated_at)
SELECT
    'job-' || i,
    (ARRAY['project.tasks.record', 'project.tasks.noop', 'project.tasks.add'])[1 + i %% 3],
    '[]', '{"label": "bench"}', NULL,
    CASE WHEN i %% 2 = 0 THEN (ARRAY['0 0 * * 1-5', '*/5 * * * *', '30 2 * * *'])[1 + i %% 3]
         ELSE '' END,
    (ARRAY['Europe/Paris', 'UTC', 'America/New_York'])[1 + i %% 3],
    CASE WHEN i %% 2 = 1 THEN make_interval(secs => 60 + i %% 600) END,
    -- per 1,000 jobs: 10 running, 1 dead, 10 paused, 20 succeeded, 5 cancelled; rest scheduled
    CASE WHEN i %% 100 = 0 THEN 'running' WHEN i %% 1000 = 1 THEN 'dead'
         WHEN i %% 100 = 2 THEN 'paused' WHEN i %% 50 = 3 THEN 'succeeded'
         WHEN i %% 200 = 4 THEN 'cancelled' ELSE 'scheduled' END,
    i %% 3, (ARRAY['', 'reports', 'low', 'high'])[1 + i %% 4], 3, interval '10 seconds',
    interval '1 hour', 0, 60, 'run_once', interval '60 seconds', 100,
    -- a thousand jobs already due, the rest over the next days
    now() + make_interval(secs => CASE WHEN i %% 1000 = 7 THEN -30 ELSE i %% 259200 END),
    now() + make_interval(secs => i %% 259200), i %% 4, 0,
    CASE WHEN i %% 100 = 0 THEN 'beat-' || (i %% 7) ELSE '' END,
    CASE WHEN i %% 100 = 0 THEN now() + interval '60 seconds' END,
    i %% 50, 'api', now() - interval '1 hour',
    CASE WHEN i %% 4 = 0 THEN 'failed' ELSE 'succeeded' END,
    CASE WHEN i %% 1000 = 1 THEN 'RuntimeError: boom ' || i ELSE '' END,
    now(), now()
FROM generate_series(%(start)s, %(stop)s) AS i
"""

FILL_RUNS = """
INSERT INTO schedapp_jobrun (
    job_id, token, attempt, scheduled_for, due_at, claimed_by, dispatched_at,
    started_at, finished_at, heartbeat_at, heartbeats, worker, admission, task_id, status,
    stale, error, traceback)
SELECT
    (SELECT min(id) FROM schedapp_job) + n %% %(jobs)s, 1000 + n, 1,
    now() - make_interval(secs => (%(total)s - n) * 0.01),
    now() - make_interval(secs => (%(total)s - n) * 0.01),
    'beat-' || n %% 7,
    now() - make_interval(secs => (%(total)s - n) * 0.01 - (n %% 50) * 0.002),
    now() - make_interval(secs => (%(total)s - n) * 0.01),
    now() - make_interval(secs => (%(total)s - n) * 0.01 - 1.5), NULL, 0,
    'worker' || n %% 16 || '@host', '',
    'schedapp:' || ((SELECT min(id) FROM schedapp_job) + n %% %(jobs)s) || ':' || (1000 + n),
    (ARRAY['succeeded', 'failed', 'lost', 'succeeded', 'succeeded'])[1 + n %% 5], false,
    CASE WHEN n %% 5 = 1 THEN 'RuntimeError: boom' ELSE '' END,
    CASE WHEN n %% 5 = 1 THEN repeat('  File "tasks.py", line 1, in run' || chr(10), 20)
         ELSE '' END
FROM generate_series(%(start)s, %(stop)s) AS n
"""



def fill(cursor: Any, start: int, stop: int, *, jobs: int, runs_total: int | None = None) -> None:
    """Jobs ``job-<start>`` to ``job-<stop>``, and runs ``start`` to ``stop`` spread over the
    first ``jobs`` jobs; ``runs_total`` sets the runs' time spread (default: ``stop``)."""
    fill_jobs(cursor, start, stop)
    fill_runs(cursor, start, stop, jobs=jobs, runs_total=runs_total)


def fill_jobs(cursor: Any, start: int, stop: int) -> None:
    cursor.execute(FILL_JOBS, {"start": start, "stop": stop})


def fill_runs(
    cursor: Any, start: int, stop: int, *, jobs: int, runs_total: int | None = None
) -> None:
    params = {"start": start, "stop": stop, "jobs": jobs, "total": runs_total or stop}
    cursor.execute(FILL_RUNS, params)
