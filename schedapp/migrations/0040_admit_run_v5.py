"""The door refuses a late run under ``skip_late``: ``schedapp_admit_run_v5``. A first
attempt of an occurrence of the schedule (not a retry, not run now) arriving more than its
job's ``start_deadline`` after the occurrence is refused as 'late': closed as skipped, recorded
in the ledger with fate late, and a job holding its lease handed back to the claim, which skips
the occurrence as late and moves the job on. v4 stays for the previous release's workers
(``schedapp.sql.RETIRED_FUNCTIONS``): it admits such a run, as that release did.

The function text below is frozen: a copy of ``schedapp/sql/functions.sql`` as this migration
wrote it, never read from that file.
"""

from django.db import migrations

ADMIT_RUN_V5 = r"""
CREATE OR REPLACE FUNCTION schedapp_admit_run_v5(
    p_job bigint, p_token bigint, p_worker text, p_admission text
) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    j record;
    r record;
    verdict text;
BEGIN
    IF EXISTS (SELECT FROM schedapp_jobrun
               WHERE job_id = p_job AND token = p_token AND own_lease) THEN
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
        FROM schedapp_jobrun WHERE job_id = p_job AND token = p_token FOR UPDATE;
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
            WHERE job_id = p_job AND token = p_token;
        ELSIF r.status = 'dispatched' AND verdict <> 'lease_expired' THEN
            UPDATE schedapp_jobrun
            SET status = 'skipped', finished_at = now(), worker = p_worker, lease_expires_at = NULL,
                error = 'delivered but not executed: ' || CASE verdict
                    WHEN 'job_paused' THEN 'the job is paused'
                    WHEN 'job_state' THEN 'the job is no longer running'
                    WHEN 'lease_expired' THEN 'its lease expired before it arrived'
                    WHEN 'late' THEN 'it arrived past its start deadline (skip_late)'
                    ELSE verdict END
            WHERE job_id = p_job AND token = p_token;
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
    FROM schedapp_jobrun WHERE job_id = p_job AND token = p_token;
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
        WHERE job_id = p_job AND token = p_token;
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
        WHERE job_id = p_job AND token = p_token;
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
"""

DROP = "DROP FUNCTION IF EXISTS schedapp_admit_run_v5(bigint, bigint, text, text)"


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(ADMIT_RUN_V5)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):
    dependencies = [("schedapp", "0039_attention")]

    operations = [migrations.RunPython(create, drop, elidable=False)]
