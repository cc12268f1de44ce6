-- schedapp's hand-written SQL, one named query a block, read by schedapp/sql/__init__.py.
-- A block starts with "-- name: <name>"; the comment lines right after it say what it is for.
-- {due_levels} and {claim_rows} stand for those blocks, {MAX_PRIORITY}/{MIN_PRIORITY} for the bounds
-- of a job's priority, {MAX_WAIT_DOUBLINGS} for the cap of policies.dispatch_wait and
-- {RUN_RECENT}/{RUN_RECENT_LATE_AFTER} for policies.misfire_after's policy and its seconds
-- (schedapp.policies). Parameters are Django's: %s or %(name)s.
-- PostgreSQL only: the portable store (SQLite) says the same through the ORM. The PL/pgSQL
-- functions some of these call are in functions.sql.

-- name: due_levels
-- A CTE levels(priority): the bounded range of priority levels, highest first. A btree cannot
-- deliver "priority DESC, next_run_at" restricted to next_run_at <= now() as one range, so the
-- due slice is read as one range scan per level (ten probes at most, however many jobs).
levels(priority) AS (SELECT generate_series({MAX_PRIORITY}, {MIN_PRIORITY}, -1))

-- name: claim_due_jobs
-- The due slice, highest priority first, earliest first within a priority, until the batch is
-- full. An allow_all job with max_concurrent runs in flight (runs holding a lease of their
-- own, counted on the partial index schedapp_run_in_flight) waits for a slot. Rows are locked as they are read (SKIP LOCKED: other beats take the next ones); the
-- MATERIALIZED CTE pins the chosen ids so the UPDATE cannot re-run the sub-select (PostgreSQL
-- bug #15715). Claim, lease, fencing token and run rows: one statement ({claim_rows}).
WITH {due_levels},
due AS MATERIALIZED (
    SELECT d.id
    FROM (SELECT priority FROM levels ORDER BY priority DESC) AS l
    CROSS JOIN LATERAL (
        SELECT j.id FROM schedapp_job j
        WHERE j.state = 'scheduled' AND j.priority = l.priority AND j.next_run_at <= now()
          AND (j.overlap <> 'allow_all' OR (SELECT count(*) FROM schedapp_jobrun r
               WHERE r.job_id = j.id AND r.lease_expires_at IS NOT NULL) < greatest(j.max_concurrent, 1))
        ORDER BY j.next_run_at
        LIMIT %(limit)s
        FOR UPDATE OF j SKIP LOCKED
    ) AS d
    LIMIT %(limit)s
),
{claim_rows}

-- name: due_ids
-- The ids claim_due_jobs would claim, in its order, locked: a claim taken one row at a time
-- (claims.claim_due_jobs, when a row fails the batch statement) claims them one by one.
WITH {due_levels}
SELECT d.id
FROM (SELECT priority FROM levels ORDER BY priority DESC) AS l
CROSS JOIN LATERAL (
    SELECT j.id, j.next_run_at FROM schedapp_job j
    WHERE j.state = 'scheduled' AND j.priority = l.priority AND j.next_run_at <= now()
      AND (j.overlap <> 'allow_all' OR (SELECT count(*) FROM schedapp_jobrun r
           WHERE r.job_id = j.id AND r.lease_expires_at IS NOT NULL) < greatest(j.max_concurrent, 1))
    ORDER BY j.next_run_at
    LIMIT %(limit)s
    FOR UPDATE OF j SKIP LOCKED
) AS d
LIMIT %(limit)s

-- name: claim_job_ids
-- claim_due_jobs for given ids (the rows due_ids locked), still due and scheduled.
WITH due AS MATERIALIZED (
    SELECT j.id FROM schedapp_job j
    WHERE j.id = ANY(%(ids)s) AND j.state = 'scheduled' AND j.next_run_at <= now()
    FOR UPDATE OF j
),
{claim_rows}

-- name: claim_rows
-- The part of a claim after the due ids (a CTE "due"): lease, token, run rows, the rows read.
-- The ids are an array, so the rows are reached by their primary key however many the table
-- holds: joined to "due", whose row count is planned as its LIMIT (the batch), the update was
-- planned as a hash join over a scan of every job once the table was small enough (40,000
-- jobs: 5.5 of a claim's 6.5 ms, for 6 rows).
-- A row is late (no run: its misfire policy decides in Python) beyond its misfire grace, or
-- beyond its start deadline when the job skips late occurrences (policies.is_late).
claimed AS (
    UPDATE schedapp_job AS j
    SET state = 'running', token = j.token + 1, claimed_by = %(beat)s,
        lease_expires_at = now() + make_interval(
            secs => j.lease_seconds * 2 ^ least(j.unstarted_dispatches, {MAX_WAIT_DOUBLINGS})),
        claimed_at = now(), updated_at = now()
    WHERE j.id = ANY(ARRAY(SELECT id FROM due))
    RETURNING j.id, j.token, j.name, j.task, j.args::text AS args, j.kwargs::text AS kwargs,
              j.queue, j.scheduled_for, j.next_run_at, j.retry_count, j.max_retries,
              j.lease_seconds, j.jitter,
              j.cron, j.timezone, j.interval, j.interval_anchor, j.misfire_policy,
              j.misfire_max_catchup, j.misfire_grace, j.catchup_window, j.overlap, j.priority,
              j.cron_day_or, j.dst_policy, j.solar_event, j.max_concurrent,
              j.latitude, j.longitude, j.not_before, j.expires_at,
              j.calendar_id, j.calendar_mode, j.calendar_roll,
              j.message_options::text AS message_options,
              extract(epoch FROM now() - j.next_run_at)::float8 AS lateness,
              coalesce(j.manual_at = j.scheduled_for, false) AS manual,
              j.skip_late, j.start_deadline,
              (j.run_at IS NULL AND j.retry_count = 0 AND NOT j.fixed_delay
               AND (now() - j.next_run_at > CASE WHEN j.misfire_policy = '{RUN_RECENT}'
                   THEN least(j.misfire_grace, make_interval(secs => {RUN_RECENT_LATE_AFTER}))
                   ELSE j.misfire_grace END
                    OR coalesce(j.skip_late AND now() - j.scheduled_for > j.start_deadline,
                                false))) AS late
),
runs AS (
    INSERT INTO schedapp_jobrun (job_id, token, attempt, kind, scheduled_for, due_at,
                                 claimed_by, dispatched_at, task_id, status, heartbeats, stale,
                                 worker, admission, error, traceback)
    SELECT c.id, c.token, c.retry_count + 1,
           CASE WHEN c.retry_count > 0 THEN 'retry' WHEN c.manual THEN 'manual'
                ELSE 'scheduled' END,
           c.scheduled_for, c.next_run_at, %(beat)s, now(),
           'schedapp:' || c.id || ':' || c.token, 'dispatched', 0, false, '', '', '', ''
    FROM claimed c WHERE NOT c.late
    RETURNING id, job_id
)
SELECT r.id AS run_id, c.* FROM claimed c LEFT JOIN runs r ON r.job_id = c.id
ORDER BY c.priority DESC, c.next_run_at

-- name: next_due
-- The database's now, the earliest next_run_at of a scheduled job, and the earliest of a lease
-- expiry (a job's, or an allow_all run's own), an allow_all retry's due time and a run's
-- supersede_at (overlap policies cancel_other, terminate_other): each an
-- index's first entry, past those of allow_all jobs with no slot free (max_concurrent runs in
-- flight: the end of one of them wakes the beats) and retries of paused or dead jobs, so a
-- job waiting for a slot does not keep beats ticking. supersede_at is clamped into what Python holds: a row written behind
-- the API's back must not stop every beat's tick (a late or early wake-up is all it costs).
-- The jobs' two reads are written so that only their partial index can serve them (the
-- leased index's predicate repeated; the supersede read fenced by OFFSET 0): right after a
-- burst's claims the statistics still see few running jobs, and the planner read every
-- running job through (state, task) instead (100,000: 170 ms a look).
WITH {due_levels}
SELECT now(),
       (SELECT min(x.next_run_at) FROM levels l CROSS JOIN LATERAL (
            SELECT j.next_run_at FROM schedapp_job j
            WHERE j.state = 'scheduled' AND j.priority = l.priority
              AND (j.overlap <> 'allow_all' OR (SELECT count(*) FROM schedapp_jobrun r
                   WHERE r.job_id = j.id AND r.lease_expires_at IS NOT NULL) < greatest(j.max_concurrent, 1))
            ORDER BY j.next_run_at LIMIT 1) x
        WHERE l.priority IS NOT NULL),
       least((SELECT lease_expires_at FROM schedapp_job
              WHERE state IN ('running', 'paused') AND state = 'running'
              ORDER BY lease_expires_at LIMIT 1),
             (SELECT least(greatest(s.supersede_at, '0001-01-02'::timestamptz),
                           '9999-12-30'::timestamptz)
              FROM (SELECT supersede_at, state FROM schedapp_job WHERE supersede_at IS NOT NULL
                    ORDER BY supersede_at OFFSET 0) s
              WHERE s.state = 'running' LIMIT 1),
             (SELECT lease_expires_at FROM schedapp_jobrun WHERE lease_expires_at IS NOT NULL
              ORDER BY lease_expires_at LIMIT 1),
             (SELECT r.retry_at FROM schedapp_jobrun r JOIN schedapp_job j ON j.id = r.job_id
              WHERE r.retry_at IS NOT NULL AND j.state IN ('scheduled', 'succeeded')
                AND (SELECT count(*) FROM schedapp_jobrun f
                     WHERE f.job_id = j.id AND f.lease_expires_at IS NOT NULL)
                    < greatest(j.max_concurrent, 1)
              ORDER BY r.retry_at LIMIT 1))

-- name: restamp_leases
-- Leases from the clock now (not from the transaction's start), just before the claim commits.
UPDATE schedapp_job SET lease_expires_at = clock_timestamp() + make_interval(
    secs => lease_seconds * 2 ^ least(unstarted_dispatches, {MAX_WAIT_DOUBLINGS}))
WHERE id = ANY(%s) AND state = 'running'

-- name: now
SELECT now()

-- name: admit_run
-- The door (functions.sql): job id, token, worker, admission, run id.
SELECT schedapp_admit_run_v6(%s, %s, %s, %s, %s)

-- name: renew_leases
-- One heartbeat for every lease a worker holds (functions.sql): job ids, tokens, run ids.
SELECT job_id, token, outcome FROM schedapp_renew_leases_v6(%s, %s, %s)

-- name: succeed_run
-- The common success in one call (functions.sql): job, token, scheduled_for, next occurrence,
-- one-off?, cron, timezone, interval, anchor, run id.
SELECT schedapp_succeed_run_v5(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)

-- name: succeed_runs
-- Several successes in one call: the arguments of succeed_run, as arrays.
SELECT idx, applied FROM schedapp_succeed_runs_v4(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)

-- name: succeed_run_then_admit
-- The same for the common case of one success: the arguments of succeed_run, then of admit_run.
SELECT schedapp_succeed_run_v5(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s),
       schedapp_admit_run_v6(%s, %s, %s, %s, %s)

-- name: succeed_runs_then_admit
-- A pool process's successes since its last round trip, then the door of its next run, in one
-- statement and one commit: the arguments of succeed_runs, then those of admit_run. Returns
-- the (1-based) indexes of the successes applied on the common path, and the door's verdict.
SELECT (SELECT coalesce(array_agg(idx) FILTER (WHERE applied), ARRAY[]::int[])
        FROM schedapp_succeed_runs_v4(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)),
       schedapp_admit_run_v6(%s, %s, %s, %s, %s)

-- name: notify_at
-- Wake sleeping beats (sent at commit): channel, the due time as epoch seconds.
SELECT pg_notify(%s, %s)

-- name: notify_after
-- Wake sleeping beats (sent at commit): channel, seconds from the database's now.
SELECT pg_notify(%s, extract(epoch FROM now() + make_interval(secs => %s))::text)

-- name: idle_transaction_timeout
-- End the current transaction if it stalls idle longer than this (e.g. '30000ms'): SET LOCAL,
-- so nothing stays on a server session that a transaction pooler hands to other clients.
SELECT set_config('idle_in_transaction_session_timeout', %s, true)

-- name: claim_probe
-- The claim's first statement: its transaction's idle limit (as idle_transaction_timeout, e.g.
-- '30000ms'), and whether the reaper or the allow_all retries have anything to do, read from
-- their partial indexes: a quiet tick pays one round trip for the three, not four. Each answer
-- is the predicate of the query it gates (schedapp.lease.reap.expired_job_leases,
-- expired_run_leases; schedapp.lease.claim.due_retries): tests/integration/test_claim_probe.py
-- holds them equal. Each asks for the earliest instant rather than EXISTS, which only the
-- index's first entry answers: an EXISTS on a run table not yet analyzed (a fresh install, a
-- stream's first minutes) was planned as a scan of every run, 2-10 ms a claim.
SELECT set_config('idle_in_transaction_session_timeout', %s, true),
       coalesce((SELECT min(lease_expires_at) FROM schedapp_job
                 WHERE state IN ('running', 'paused')) < now(), false),
       coalesce((SELECT min(lease_expires_at) FROM schedapp_jobrun
                 WHERE lease_expires_at IS NOT NULL) < now(), false),
       coalesce((SELECT min(retry_at) FROM schedapp_jobrun WHERE retry_at IS NOT NULL) <= now(),
                false)

-- name: advisory_lock
-- A transaction-scoped lock on one key (declared jobs' sync: one beat at a time; calendar
-- saves: one at a time).
SELECT pg_advisory_xact_lock(%s)

-- name: backlog
-- Due jobs, counted per priority level in the due index's order up to %(cap)s rows, and the
-- oldest next_run_at.
WITH {due_levels}
SELECT
    (SELECT count(*) FROM (
        SELECT 1 FROM levels l CROSS JOIN LATERAL (
            SELECT 1 FROM schedapp_job j
            WHERE j.state = 'scheduled' AND j.priority = l.priority AND j.next_run_at <= now()
            LIMIT %(cap)s) x
        WHERE l.priority IS NOT NULL LIMIT %(cap)s) due),
    (SELECT min(x.next_run_at) FROM levels l CROSS JOIN LATERAL (
        SELECT j.next_run_at FROM schedapp_job j
        WHERE j.state = 'scheduled' AND j.priority = l.priority
        ORDER BY j.next_run_at LIMIT 1) x
     WHERE l.priority IS NOT NULL)

-- name: dispatch_lag
-- Dispatch lag (dispatched_at - due_at) per minute over the newest %(sample)s runs.
SELECT date_trunc('minute', r.dispatched_at) AS minute,
       count(*),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY lag),
       percentile_cont(0.95) WITHIN GROUP (ORDER BY lag),
       max(lag)
FROM (SELECT dispatched_at,
             extract(epoch FROM dispatched_at - due_at) AS lag
      FROM schedapp_jobrun
      ORDER BY id DESC LIMIT %(sample)s) r
WHERE r.dispatched_at >= now() - make_interval(mins => %(minutes)s) AND r.lag IS NOT NULL
GROUP BY ROLLUP (minute)
ORDER BY minute NULLS FIRST

-- name: recent_statuses
-- Runs claimed in the last %(minutes)s minutes by status, from the newest %(sample)s runs.
SELECT r.status, count(*)
FROM (SELECT status, dispatched_at FROM schedapp_jobrun ORDER BY id DESC LIMIT %(sample)s) r
WHERE r.dispatched_at >= now() - make_interval(mins => %(minutes)s)
GROUP BY r.status ORDER BY r.status

-- name: bulk_last_row
-- The last job id this session drew (a COPY draws ids in row order) and its transaction id.
SELECT id, xmin::text FROM schedapp_job
WHERE id = (SELECT currval(pg_get_serial_sequence('schedapp_job', 'id')))

-- name: bulk_names_taken
-- Jobs holding any of these names, with the transaction that wrote each.
SELECT name, id, xmin::text FROM schedapp_job WHERE name = ANY(%s)

-- name: audit_created
-- The audit trail's "created" record of each job of these names (schedapp.audit): source,
-- actor, reason, names.
INSERT INTO schedapp_jobchange (job_id, job_name, at, action, source, actor, reason)
SELECT id, name, now(), 'created', %s, %s, %s FROM schedapp_job WHERE name = ANY(%s)

-- name: bulk_rows_of_chunk
-- How many jobs from this id to a chunk's last one that chunk's savepoint wrote.
SELECT count(*) FROM schedapp_job WHERE id BETWEEN %s AND %s AND xmin::text = %s
