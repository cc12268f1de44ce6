-- schedapp's PL/pgSQL functions as they are today, each written out whole (PostgreSQL only; the
-- portable store says the same through the ORM). queries.sql calls them by these names.
--
-- Why functions: a worker writes twice per execution, the door and the completion. As plain
-- statements each was planned anew on every call (Django turns prepared statements off for the
-- sake of connection poolers); a function's statements are planned once per session and cached,
-- and a call works the same behind a transaction-pooling PgBouncer. Each function locks the job
-- row first, then reads and writes under that lock, so door, renewal, completion, reaper and API
-- serialise on the job row.
--
-- The door and the successes, once per execution, run generic plans (SET plan_cache_mode):
-- over the run history partitioned by id, PL/pgSQL's own choice stayed on custom plans, which
-- plan each statement again on every call, against the partitioned table. A generic plan
-- prunes at run time to the one partition the run's id names. A door-like function
-- (bench/README.md, "Generic plans for the worker's functions") cost 0.52-0.62 ms of
-- PostgreSQL CPU a call with custom plans over 2 to 60 partitions, 0.28-0.43 ms with generic
-- ones, 0.26-0.28 ms on one table. The renewal keeps PL/pgSQL's choice: it reads its runs by
-- an array of ids (id = ANY (runs)), which only a plan made for the values prunes by, and it
-- runs once a third of a lease per worker, not once per execution.
--
-- The rule: a function's name carries its version. A change to its arguments or its meaning
-- (what it decides or writes) gets a new name, the next version, so the processes of the
-- previous release, which call the old name during a rolling deploy, keep working:
--   1. here, rename the function to _v<N+1> and change it; queries.sql calls the new name;
--   2. a new migration creates it from its own literal copy of the new text (a migration never
--      reads this file: it changes later, the migration must not);
--   3. the old signature goes on schedapp.sql.RETIRED_FUNCTIONS; a migration of the next
--      release drops it and takes it off the list.
-- A change that keeps both arguments and meaning (a comment, a faster plan with the same
-- results) may replace a body in place, again through a migration with a literal copy.
-- tests/integration/test_sql_functions.py holds the database the migrations build to this file.
-- The numbers count each function's versions since it first appeared (migration 0006); the
-- versions before these names ran under bare names (schedapp_admit_run, ...), now retired.


-- The door: may this delivered run start? Job id, token, worker, admission (the door call's own
-- id). Returns the verdict: 'admitted', 'unknown', 'stale_token', 'job_paused', 'job_state',
-- 'duplicate', 'late' or 'lease_expired'. Admitting extends the lease in the same statement; a
-- run that will never start here is closed as skipped. v4: a run with a lease of its own
-- (overlap policy allow_all, schedapp_jobrun.own_lease) is decided on its run row, locked, not
-- on the job's lease and token (the job moved on at the claim); the job row is read, not
-- locked. v5: a first attempt of an occurrence of the schedule (not a retry, not run now)
-- arriving more than the job's start_deadline after its occurrence, under skip_late, is
-- 'late': closed as skipped, its occurrence recorded in the ledger with fate late, and a job
-- holding its lease handed back to the claim (scheduled, no lease, still due), which skips the
-- occurrence as late and moves the job on as it does any late occurrence. Also v5: a run with
-- a lease of its own refused because that lease ran out is left to the reaper, which sends its
-- occurrence again (v4 closed it as skipped, lease cleared: no reaper found it, and the
-- occurrence was lost, its job having moved on at the claim). v6: the run is found by its id
-- (p_run, from the message's headers) as well as its job and token, so that its read and
-- writes reach one partition of the history; a NULL p_run is looked up by job and token, and
-- a run id that is not that claim's is 'unknown'. The decision is v5's.
CREATE OR REPLACE FUNCTION schedapp_admit_run_v6(
    p_job bigint, p_token bigint, p_worker text, p_admission text, p_run bigint
) RETURNS text LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    j record;
    r record;
    verdict text;
BEGIN
    IF p_run IS NULL THEN  -- a caller that does not know the run's id: found by its claim
        SELECT id INTO p_run FROM schedapp_jobrun WHERE job_id = p_job AND token = p_token;
        IF NOT FOUND THEN
            RETURN 'unknown';
        END IF;
    END IF;
    IF EXISTS (SELECT FROM schedapp_jobrun
               WHERE id = p_run AND job_id = p_job AND token = p_token AND own_lease) THEN
        SELECT state, lease_seconds, skip_late, start_deadline INTO j
        FROM schedapp_job WHERE id = p_job;
        IF NOT FOUND THEN
            RETURN 'unknown';
        END IF;
        SELECT status, admission, scheduled_for, lease_expires_at > now() AS lease_valid,
               (j.skip_late AND attempt = 1 AND coalesce(kind, 'scheduled') = 'scheduled'
                AND now() - scheduled_for > j.start_deadline) IS TRUE AS late,
               -- the 5/6 rule of the job's lease, on the run's own
               (lease_expires_at < now() + make_interval(secs => j.lease_seconds * 5.0 / 6)
                OR lease_expires_at > now() + make_interval(secs => j.lease_seconds))
                   AS lease_short INTO r
        FROM schedapp_jobrun WHERE id = p_run AND job_id = p_job AND token = p_token FOR UPDATE;
        IF r.status IN ('lost', 'skipped', 'cancelled') THEN
            verdict := 'stale_token';
        ELSIF r.status = 'running' AND r.admission = p_admission THEN
            verdict := 'admitted';
        ELSIF j.state = 'paused' THEN
            verdict := 'job_paused';
        ELSIF j.state = 'cancelled' THEN
            verdict := 'job_state';
        ELSIF r.status <> 'dispatched' THEN
            verdict := 'duplicate';
        ELSIF r.late THEN
            verdict := 'late';
        ELSIF NOT coalesce(r.lease_valid, false) THEN
            verdict := 'lease_expired';
        ELSE
            verdict := 'admitted';
        END IF;
        IF verdict = 'admitted' THEN
            UPDATE schedapp_jobrun
            SET status = 'running', started_at = coalesce(started_at, now()), worker = p_worker,
                admission = p_admission,
                lease_expires_at = CASE WHEN r.lease_short
                    THEN now() + make_interval(secs => j.lease_seconds)
                    ELSE lease_expires_at END
            WHERE id = p_run AND job_id = p_job AND token = p_token;
        ELSIF r.status = 'dispatched' AND verdict <> 'lease_expired' THEN
            UPDATE schedapp_jobrun
            SET status = 'skipped', finished_at = now(), worker = p_worker, lease_expires_at = NULL,
                error = 'delivered but not executed: ' || CASE verdict
                    WHEN 'job_paused' THEN 'the job is paused'
                    WHEN 'job_state' THEN 'the job is no longer running'
                    WHEN 'lease_expired' THEN 'its lease expired before it arrived'
                    WHEN 'late' THEN 'it arrived past its start deadline (skip_late)'
                    ELSE verdict END
            WHERE id = p_run AND job_id = p_job AND token = p_token;
        END IF;
        IF verdict = 'late' THEN
            INSERT INTO schedapp_occurrence
                (job_id, scheduled_for, last, count, fate, detail, decided_by)
            VALUES (p_job, r.scheduled_for, r.scheduled_for, 1, 'late',
                    'delivered past its start deadline; skip_late: refused at the door',
                    left(p_worker, 200))
            ON CONFLICT DO NOTHING;
        END IF;
        RETURN verdict;
    END IF;

    -- The job row first, whatever its token: waiting here for a reaper, a cancel or a claim
    -- means deciding on what they committed.
    SELECT token, state, skip_late, start_deadline, next_run_at,
           lease_expires_at > now() AS lease_valid,
           -- an ordinary lease with at least five sixths left is not rewritten: the run's first
           -- renewal (a third of a lease after the worker received it) still comes with half a
           -- lease to spare, and the job row, the costliest write of a run, is left alone; a
           -- longer lease (a dispatch wait, doubled per unstarted dispatch) is cut back to one
           -- lease and the count of unstarted dispatches reset
           (unstarted_dispatches > 0
            OR lease_expires_at < now() + make_interval(secs => lease_seconds * 5.0 / 6)
            OR lease_expires_at > now() + make_interval(secs => lease_seconds))
               AS lease_short INTO j
    FROM schedapp_job WHERE id = p_job FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 'unknown';
    END IF;
    SELECT status, admission, scheduled_for,
           (j.skip_late AND attempt = 1 AND coalesce(kind, 'scheduled') = 'scheduled'
            AND now() - scheduled_for > j.start_deadline) IS TRUE AS late INTO r
    FROM schedapp_jobrun WHERE id = p_run AND job_id = p_job AND token = p_token;
    IF NOT FOUND THEN
        RETURN 'unknown';
    END IF;
    IF j.token <> p_token THEN
        verdict := 'stale_token';
    ELSIF r.status = 'running' AND r.admission = p_admission THEN
        -- this same door call again: its commit landed, its reply did not. Recognised before
        -- the job's state: a pause in between lets a run in flight finish.
        verdict := 'admitted';
    ELSIF j.state = 'paused' THEN
        verdict := 'job_paused';
    ELSIF j.state <> 'running' THEN
        verdict := 'job_state';
    ELSIF r.status <> 'dispatched' THEN
        verdict := 'duplicate';
    ELSIF r.late THEN
        verdict := 'late';
    ELSIF NOT j.lease_valid THEN
        verdict := 'lease_expired';
    ELSE
        verdict := 'admitted';
    END IF;

    IF verdict = 'admitted' THEN
        UPDATE schedapp_jobrun
        SET status = 'running', started_at = coalesce(started_at, now()), worker = p_worker,
            admission = p_admission
        WHERE id = p_run AND job_id = p_job AND token = p_token;
        IF j.lease_short THEN
            UPDATE schedapp_job
            SET lease_expires_at = now() + make_interval(secs => lease_seconds),
                unstarted_dispatches = 0
            WHERE id = p_job;
        END IF;
    ELSIF r.status = 'dispatched' THEN
        -- It will never start here. An expired lease is left to the reaper, which dispatches
        -- the occurrence again; a paused job gives its lease back, so resume is immediate.
        UPDATE schedapp_jobrun
        SET status = 'skipped', finished_at = now(), worker = p_worker,
            error = 'delivered but not executed: ' || CASE verdict
                WHEN 'stale_token' THEN 'its claim is no longer the job''s current one'
                WHEN 'job_paused' THEN 'the job is paused'
                WHEN 'job_state' THEN 'the job is no longer running'
                WHEN 'lease_expired' THEN 'its lease expired before it arrived'
                WHEN 'late' THEN 'it arrived past its start deadline (skip_late)'
                ELSE verdict END
        WHERE id = p_run AND job_id = p_job AND token = p_token;
        IF verdict = 'job_paused' THEN
            UPDATE schedapp_job SET claimed_by = '', lease_expires_at = NULL WHERE id = p_job;
        ELSIF verdict = 'late' THEN
            -- Late: recorded, and the job handed back to the claim, still due, which skips the
            -- occurrence as late (its record here stands) and moves the job on.
            INSERT INTO schedapp_occurrence
                (job_id, scheduled_for, last, count, fate, detail, decided_by)
            VALUES (p_job, r.scheduled_for, r.scheduled_for, 1, 'late',
                    'delivered past its start deadline; skip_late: refused at the door',
                    left(p_worker, 200))
            ON CONFLICT DO NOTHING;
            UPDATE schedapp_job
            SET state = 'scheduled', claimed_by = '', lease_expires_at = NULL,
                unstarted_dispatches = 0
            WHERE id = p_job;
            PERFORM pg_notify('schedapp', extract(epoch FROM j.next_run_at)::text);
        END IF;
    END IF;
    RETURN verdict;
END
$$;


-- One heartbeat for every lease a worker holds: job ids and tokens, in pairs. Returns each
-- pair's outcome: 'renewed'; 'busy' (another transaction holds the job row, or the run row of
-- a run with its own lease: renewed again a moment later, never waited for, so no deadlock
-- with a door and no stalled heartbeat); 'cancelled' (the operator's act); 'finished';
-- 'unstarted' (the door will refuse this copy: nothing ran); 'lost'. v5: a run with a lease
-- of its own (allow_all) is renewed on its run row while it is in flight; the job row is
-- neither locked nor written for it. v6: with each run's id (p_runs; NULL where the caller does
-- not know it), read by id as well as job and token; the outcomes are v5's.
CREATE OR REPLACE FUNCTION schedapp_renew_leases_v6(
    p_jobs bigint[], p_tokens bigint[], p_runs bigint[]
) RETURNS TABLE (job_id bigint, token bigint, outcome text) LANGUAGE plpgsql AS $$
DECLARE
    runs bigint[];
    own bigint[];
    locked bigint[];
    renewed bigint[];
    runs_locked bigint[];
    runs_renewed bigint[];
BEGIN
    -- Each held run by its id (a NULL id, from a caller that does not know it, found by its
    -- claim). Every read of a run below says "id = ANY (runs)" too: a value known as the
    -- statement starts, by which it reaches only the runs' partitions of the history (a join's
    -- condition alone does not prune them).
    runs := ARRAY(
        SELECT coalesce(h.run, (SELECT r.id FROM schedapp_jobrun r
                                WHERE r.job_id = h.id AND r.token = h.token))
        FROM unnest(p_jobs, p_tokens, p_runs) WITH ORDINALITY AS h (id, token, run, n)
        ORDER BY h.n
    );
    SELECT coalesce(array_agg(r.id), '{}') INTO own
    FROM unnest(p_jobs, p_tokens, runs) AS h (id, token, run)
    JOIN schedapp_jobrun r ON r.id = h.run AND r.job_id = h.id AND r.token = h.token
    WHERE r.id = ANY (runs) AND r.own_lease;
    SELECT coalesce(array_agg(l.id), '{}') INTO runs_locked FROM (
        SELECT r.id FROM schedapp_jobrun r WHERE r.id = ANY (own)
        ORDER BY r.id FOR UPDATE SKIP LOCKED
    ) l;
    WITH done AS (
        UPDATE schedapp_jobrun r
        SET lease_expires_at = now() + make_interval(secs => j.lease_seconds),
            heartbeats = r.heartbeats + CASE WHEN r.status = 'running' THEN 1 ELSE 0 END,
            heartbeat_at = CASE WHEN r.status = 'running' THEN now() ELSE r.heartbeat_at END
        FROM schedapp_job j
        WHERE r.id = ANY (runs_locked) AND j.id = r.job_id
          AND r.lease_expires_at IS NOT NULL AND r.status IN ('dispatched', 'running')
        RETURNING r.id
    )
    SELECT coalesce(array_agg(id), '{}') INTO runs_renewed FROM done;
    SELECT coalesce(array_agg(l.id), '{}') INTO locked FROM (
        SELECT j.id FROM schedapp_job j WHERE j.id = ANY (p_jobs)
          AND EXISTS (SELECT FROM unnest(p_jobs, p_tokens, runs) AS h (id, token, run)
                      LEFT JOIN schedapp_jobrun r
                          ON r.id = h.run AND r.job_id = h.id AND r.token = h.token
                             AND r.id = ANY (runs)
                      WHERE h.id = j.id AND NOT coalesce(r.id = ANY (own), false))
        ORDER BY j.id FOR UPDATE SKIP LOCKED
    ) l;
    WITH done AS (
        UPDATE schedapp_job j SET lease_expires_at = now() + make_interval(secs => j.lease_seconds)
        FROM unnest(p_jobs, p_tokens, runs) AS h (id, token, run)
        WHERE j.id = h.id AND j.id = ANY (locked) AND j.token = h.token
          AND j.lease_expires_at IS NOT NULL AND j.state IN ('running', 'paused')
        RETURNING j.id
    )
    SELECT coalesce(array_agg(id), '{}') INTO renewed FROM done;
    UPDATE schedapp_jobrun r SET heartbeats = r.heartbeats + 1, heartbeat_at = now()
    FROM unnest(p_jobs, p_tokens, runs) AS h (id, token, run)
    WHERE r.id = h.run AND r.job_id = h.id AND r.token = h.token AND r.job_id = ANY (renewed)
      AND r.id = ANY (runs) AND NOT r.own_lease AND r.status = 'running';
    -- A new snapshot: a completion that committed a moment ago is seen, so a run that simply
    -- finished is reported as finished, not as a lost lease. In the order the leases came
    -- (a join's order is its plan's: over a partitioned history it came out otherwise).
    RETURN QUERY
    SELECT h.id, h.token,
           CASE WHEN coalesce(r.id = ANY (own), false) THEN
                    CASE WHEN r.id = ANY (runs_renewed) THEN 'renewed'
                         WHEN NOT r.id = ANY (runs_locked) THEN 'busy'
                         WHEN r.status = 'cancelled' THEN 'cancelled'
                         WHEN r.status IN ('succeeded', 'failed') AND NOT r.stale THEN 'finished'
                         WHEN r.started_at IS NULL THEN 'unstarted'
                         ELSE 'lost' END
                WHEN h.id = ANY (renewed) THEN 'renewed'
                WHEN NOT h.id = ANY (locked)
                     AND EXISTS (SELECT FROM schedapp_job b WHERE b.id = h.id) THEN 'busy'
                WHEN r.status = 'cancelled' THEN 'cancelled'
                WHEN r.status IN ('succeeded', 'failed') AND NOT r.stale THEN 'finished'
                WHEN r.status IS NOT NULL AND r.started_at IS NULL THEN 'unstarted'
                ELSE 'lost' END
    FROM unnest(p_jobs, p_tokens, runs) WITH ORDINALITY AS h (id, token, run, n)
    LEFT JOIN schedapp_jobrun r
        ON r.id = h.run AND r.job_id = h.id AND r.token = h.token AND r.id = ANY (runs)
    ORDER BY h.n;
END
$$;


-- The common success in one call: job, token, the occurrence and schedule the claim saw, the
-- next occurrence (computed in Python), one-off?, cron (prefixed with "&" under Celery's day
-- rule: both day fields must match), timezone, interval, anchor. Returns false, writing
-- nothing, for anything but the common case: the general path tells those apart. Not common
-- (v3): a fixed-delay interval, a next occurrence that came due during the run of a job whose
-- overlap policy is not buffer_one (policies.plan_after_success decides those), and a DST
-- policy other than the default (a worker computes the next occurrence under the default only).
-- Not common (v4): a job following a calendar (its next run is the calendar's, which a worker
-- does not read) and one whose overlap is allow_all (its runs are not one after another);
-- policies.end_decides says the same, held to this by a differential test. v5: the run's id
-- last (p_run; NULL: found by job and token), the run written by id, job and token.
CREATE OR REPLACE FUNCTION schedapp_succeed_run_v5(
    p_job bigint, p_token bigint, p_scheduled_for timestamptz, p_next timestamptz,
    p_once boolean, p_cron text, p_timezone text, p_interval interval,
    p_anchor timestamptz, p_run bigint
) RETURNS boolean LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    j record;
    next_run timestamptz;
BEGIN
    SELECT token, state, scheduled_for, run_at, cron, timezone, "interval", interval_anchor,
           jitter, cron_day_or, solar_event, not_before, expires_at, overlap, fixed_delay,
           dst_policy, calendar_id INTO j
    FROM schedapp_job WHERE id = p_job FOR UPDATE;
    -- Anything but the common case (the run still running under the current token, the
    -- schedule the claim saw; not solar, no start or expiry window) goes to the general path.
    IF NOT FOUND OR j.token <> p_token OR j.state NOT IN ('running', 'paused')
       OR j.scheduled_for IS DISTINCT FROM p_scheduled_for
       OR j.solar_event <> '' OR j.not_before IS NOT NULL OR j.expires_at IS NOT NULL
       OR j.fixed_delay OR (j.overlap <> 'buffer_one' AND p_next <= now())
       OR j.dst_policy <> 'gap_end+first'
       OR j.calendar_id IS NOT NULL OR j.overlap = 'allow_all' THEN
        RETURN false;
    END IF;
    IF p_once THEN
        IF j.run_at IS NULL THEN
            RETURN false;
        END IF;
    ELSIF p_interval IS NOT NULL THEN
        IF j."interval" IS DISTINCT FROM p_interval
           OR j.interval_anchor IS DISTINCT FROM p_anchor THEN
            RETURN false;
        END IF;
    ELSIF (CASE WHEN j.cron_day_or THEN j.cron ELSE '&' || j.cron END) <> p_cron
          OR j.timezone <> p_timezone THEN
        RETURN false;
    END IF;
    IF p_run IS NULL THEN  -- a caller that does not know the run's id: found by its claim
        SELECT id INTO p_run FROM schedapp_jobrun WHERE job_id = p_job AND token = p_token;
    END IF;
    UPDATE schedapp_jobrun SET status = 'succeeded', finished_at = now()
    WHERE id = p_run AND job_id = p_job AND token = p_token AND status = 'running';
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    next_run := p_next + j.jitter * random() * interval '1 second';
    UPDATE schedapp_job
    SET state = CASE WHEN p_next IS NULL THEN 'succeeded'
                     WHEN j.state = 'paused' THEN 'paused' ELSE 'scheduled' END,
        scheduled_for = coalesce(p_next, j.scheduled_for), next_run_at = next_run,
        retry_count = 0, claimed_by = '', lease_expires_at = NULL, last_run_at = now(),
        last_status = 'succeeded', updated_at = now()
    WHERE id = p_job;
    IF next_run IS NOT NULL THEN
        -- Beats sleep until the next due time they know of; this one may be sooner.
        PERFORM pg_notify('schedapp', extract(epoch FROM next_run)::text);
    END IF;
    RETURN true;
END
$$;


-- Several successes in one call: the arguments of schedapp_succeed_run_v5, as arrays. Returns
-- each success's (1-based) index and whether the common path applied it.
CREATE OR REPLACE FUNCTION schedapp_succeed_runs_v4(
    p_jobs bigint[], p_tokens bigint[], p_scheduled_for timestamptz[], p_next timestamptz[],
    p_once boolean[], p_cron text[], p_timezone text[], p_interval interval[],
    p_anchor timestamptz[], p_runs bigint[]
) RETURNS TABLE (idx int, applied boolean) LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    i int;
BEGIN
    -- Several successes (of one pool process, gathered while the previous commit was under
    -- way) in one transaction: one round trip and one commit for all of them. Job rows are
    -- locked in id order, as renewals lock them, so two such transactions cannot deadlock.
    FOR i IN SELECT s.i FROM generate_subscripts(p_jobs, 1) AS s (i) ORDER BY p_jobs[s.i] LOOP
        idx := i;
        applied := schedapp_succeed_run_v5(
            p_jobs[i], p_tokens[i], p_scheduled_for[i], p_next[i], p_once[i], p_cron[i],
            p_timezone[i], p_interval[i], p_anchor[i], p_runs[i]
        );
        RETURN NEXT;
    END LOOP;
END
$$;
