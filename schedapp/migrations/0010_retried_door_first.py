"""The door recognises its own retried call before it looks at the job's state: a door whose
commit landed but whose reply was lost is admitted again even if the job was paused in
between (a pause lets a run in flight finish). Refusing it left the run ``running`` with
nothing running it, and the reaper counted the lease's expiry as a failed attempt."""

from django.db import migrations

# 0008's door with the retried-call check moved up, right after the token's.
# Frozen: the text this migration has always run, written out whole. Never edited (a
# database that applied it keeps what it ran) and never imported; the function as it is
# today is in schedapp/sql/functions.sql.
ADMIT_RUN = r"""
CREATE OR REPLACE FUNCTION schedapp_admit_run(
    p_job bigint, p_token bigint, p_worker text, p_admission text
) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    j record;
    r record;
    verdict text;
BEGIN
    -- The job row first, whatever its token: waiting here for a reaper, a cancel or a claim
    -- means deciding on what they committed.
    SELECT token, state, lease_expires_at > now() AS lease_valid,
           -- a lease with at least five sixths left is not rewritten: the run's first renewal
           -- (a third of a lease after the worker received it) still comes with half a lease
           -- to spare, and the job row, the costliest write of a run, is left alone
           (unstarted_dispatches > 0
            OR lease_expires_at < now() + make_interval(secs => lease_seconds * 5.0 / 6)
            OR lease_expires_at > now() + make_interval(secs => lease_seconds))
               AS lease_short INTO j
    FROM schedapp_job WHERE id = p_job FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 'unknown';
    END IF;
    SELECT status, admission INTO r FROM schedapp_jobrun
    WHERE job_id = p_job AND token = p_token;
    IF NOT FOUND THEN
        RETURN 'unknown';
    END IF;
    IF j.token <> p_token THEN
        verdict := 'stale_token';
    ELSIF r.status = 'running' AND r.admission = p_admission THEN
        verdict := 'admitted';  -- this same door call again: its commit landed, its reply did not
    ELSIF j.state = 'paused' THEN
        verdict := 'job_paused';
    ELSIF j.state <> 'running' THEN
        verdict := 'job_state';
    ELSIF r.status <> 'dispatched' THEN
        verdict := 'duplicate';
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
            UPDATE schedapp_job SET lease_expires_at = now() + make_interval(secs => lease_seconds),
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
                ELSE verdict END
        WHERE job_id = p_job AND token = p_token;
        IF verdict = 'job_paused' THEN
            UPDATE schedapp_job SET claimed_by = '', lease_expires_at = NULL WHERE id = p_job;
        END IF;
    END IF;
    RETURN verdict;
END
$$;
"""

# Frozen too: what reversing this migration puts back (migration 0008's text).
PREVIOUS_ADMIT_RUN = r"""
CREATE OR REPLACE FUNCTION schedapp_admit_run(
    p_job bigint, p_token bigint, p_worker text, p_admission text
) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    j record;
    r record;
    verdict text;
BEGIN
    -- The job row first, whatever its token: waiting here for a reaper, a cancel or a claim
    -- means deciding on what they committed.
    SELECT token, state, lease_expires_at > now() AS lease_valid,
           -- a lease with at least five sixths left is not rewritten: the run's first renewal
           -- (a third of a lease after the worker received it) still comes with half a lease
           -- to spare, and the job row, the costliest write of a run, is left alone
           (unstarted_dispatches > 0
            OR lease_expires_at < now() + make_interval(secs => lease_seconds * 5.0 / 6)
            OR lease_expires_at > now() + make_interval(secs => lease_seconds))
               AS lease_short INTO j
    FROM schedapp_job WHERE id = p_job FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 'unknown';
    END IF;
    SELECT status, admission INTO r FROM schedapp_jobrun
    WHERE job_id = p_job AND token = p_token;
    IF NOT FOUND THEN
        RETURN 'unknown';
    END IF;
    IF j.token <> p_token THEN
        verdict := 'stale_token';
    ELSIF j.state = 'paused' THEN
        verdict := 'job_paused';
    ELSIF j.state <> 'running' THEN
        verdict := 'job_state';
    ELSIF r.status = 'running' AND r.admission = p_admission THEN
        verdict := 'admitted';  -- this same door call again: its commit landed, its reply did not
    ELSIF r.status <> 'dispatched' THEN
        verdict := 'duplicate';
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
            UPDATE schedapp_job SET lease_expires_at = now() + make_interval(secs => lease_seconds),
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
                ELSE verdict END
        WHERE job_id = p_job AND token = p_token;
        IF verdict = 'job_paused' THEN
            UPDATE schedapp_job SET claimed_by = '', lease_expires_at = NULL WHERE id = p_job;
        END IF;
    END IF;
    RETURN verdict;
END
$$;
"""


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(ADMIT_RUN)


def restore(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PREVIOUS_ADMIT_RUN)


class Migration(migrations.Migration):
    dependencies = [("schedapp", "0009_renewal_unstarted")]

    operations = [migrations.RunPython(create, restore, elidable=False)]
