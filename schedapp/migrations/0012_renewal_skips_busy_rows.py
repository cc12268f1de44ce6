"""A renewal never waits for a job row another transaction holds (a door, a completion, the
API): it renews the rows it can lock and reports the others ``busy``, to be renewed again a
moment later (``claims.renew_leases``). Waiting, it could deadlock with a pool process's door
that carries a success (that statement locks the success's job row, then the door's, not in id
order), and a long wait stalled every other lease of the heartbeat."""

from django.db import migrations

# Frozen: the text this migration has always run, written out whole. Never edited (a
# database that applied it keeps what it ran) and never imported; the function as it is
# today is in schedapp/sql/functions.sql.
RENEW_LEASES = r"""
CREATE OR REPLACE FUNCTION schedapp_renew_leases(p_jobs bigint[], p_tokens bigint[])
RETURNS TABLE (job_id bigint, token bigint, outcome text) LANGUAGE plpgsql AS $$
DECLARE
    locked bigint[];
    renewed bigint[];
BEGIN
    SELECT coalesce(array_agg(l.id), '{}') INTO locked FROM (
        SELECT j.id FROM schedapp_job j WHERE j.id = ANY (p_jobs)
        ORDER BY j.id FOR UPDATE SKIP LOCKED
    ) l;
    WITH done AS (
        UPDATE schedapp_job j SET lease_expires_at = now() + make_interval(secs => j.lease_seconds)
        FROM unnest(p_jobs, p_tokens) AS h (id, token)
        WHERE j.id = h.id AND j.id = ANY (locked) AND j.token = h.token
          AND j.lease_expires_at IS NOT NULL AND j.state IN ('running', 'paused')
        RETURNING j.id
    )
    SELECT coalesce(array_agg(id), '{}') INTO renewed FROM done;
    UPDATE schedapp_jobrun r SET heartbeats = r.heartbeats + 1, heartbeat_at = now()
    FROM unnest(p_jobs, p_tokens) AS h (id, token)
    WHERE r.job_id = h.id AND r.token = h.token AND r.job_id = ANY (renewed)
      AND r.status = 'running';
    -- A new snapshot: a completion that committed a moment ago is seen, so a run that simply
    -- finished is reported as finished, not as a lost lease.
    RETURN QUERY
    SELECT h.id, h.token,
           CASE WHEN h.id = ANY (renewed) THEN 'renewed'
                WHEN NOT h.id = ANY (locked)
                     AND EXISTS (SELECT FROM schedapp_job b WHERE b.id = h.id) THEN 'busy'
                WHEN r.status = 'cancelled' THEN 'cancelled'
                WHEN r.status IN ('succeeded', 'failed') AND NOT r.stale THEN 'finished'
                WHEN r.status IS NOT NULL AND r.started_at IS NULL THEN 'unstarted'
                ELSE 'lost' END
    FROM unnest(p_jobs, p_tokens) AS h (id, token)
    LEFT JOIN schedapp_jobrun r ON r.job_id = h.id AND r.token = h.token;
END
$$;
"""

# Frozen too: what reversing this migration puts back (migration 0011's text).
PREVIOUS_RENEW_LEASES = r"""
CREATE OR REPLACE FUNCTION schedapp_renew_leases(p_jobs bigint[], p_tokens bigint[])
RETURNS TABLE (job_id bigint, token bigint, outcome text) LANGUAGE plpgsql AS $$
DECLARE
    renewed bigint[];
BEGIN
    -- Rows locked in id order (as batched completions lock them): no deadlock between them.
    PERFORM 1 FROM schedapp_job j WHERE j.id = ANY (p_jobs) ORDER BY j.id FOR UPDATE;
    WITH done AS (
        UPDATE schedapp_job j SET lease_expires_at = now() + make_interval(secs => j.lease_seconds)
        FROM unnest(p_jobs, p_tokens) AS h (id, token)
        WHERE j.id = h.id AND j.token = h.token AND j.lease_expires_at IS NOT NULL
          AND j.state IN ('running', 'paused')
        RETURNING j.id
    )
    SELECT coalesce(array_agg(id), '{}') INTO renewed FROM done;
    UPDATE schedapp_jobrun r SET heartbeats = r.heartbeats + 1, heartbeat_at = now()
    FROM unnest(p_jobs, p_tokens) AS h (id, token)
    WHERE r.job_id = h.id AND r.token = h.token AND r.job_id = ANY (renewed)
      AND r.status = 'running';
    -- A new snapshot: a completion that committed while this waited for a row lock is seen,
    -- so a run that simply finished is reported as finished, not as a lost lease.
    RETURN QUERY
    SELECT h.id, h.token,
           CASE WHEN h.id = ANY (renewed) THEN 'renewed'
                WHEN r.status = 'cancelled' THEN 'cancelled'
                WHEN r.status IN ('succeeded', 'failed') AND NOT r.stale THEN 'finished'
                WHEN r.status IS NOT NULL AND r.started_at IS NULL THEN 'unstarted'
                ELSE 'lost' END
    FROM unnest(p_jobs, p_tokens) AS h (id, token)
    LEFT JOIN schedapp_jobrun r ON r.job_id = h.id AND r.token = h.token;
END
$$;
"""


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(RENEW_LEASES)


def restore(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PREVIOUS_RENEW_LEASES)


class Migration(migrations.Migration):
    dependencies = [("schedapp", "0011_renewal_cancelled")]

    operations = [migrations.RunPython(create, restore, elidable=False)]
