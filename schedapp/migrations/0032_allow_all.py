"""allow_all (overlap policy) with a lease per run: ``Job.max_concurrent`` (10: the bound of
runs in flight at once, checked by the API from 1 to 1,000), ``JobRun.own_lease`` and
``JobRun.lease_expires_at`` (a run whose door, renewals, completion and reaper decide on its
own row), and the functions that know them: ``schedapp_admit_run_v4`` and
``schedapp_renew_leases_v5``. v3 and v4 of those stay for the previous release's workers
(``schedapp.sql.RETIRED_FUNCTIONS``); an older door refuses an allow_all run (its job moved on
at the claim: 'job_state'), so nothing runs twice during a rolling deploy. The indexes over
runs in flight are 0033's.

The columns are added with constant database defaults and no check constraint: PostgreSQL
adds each without rewriting or scanning the table, and an older release's inserts get today's
behaviour. The function text below is frozen: a copy of ``schedapp/sql/functions.sql`` as
this migration wrote it, never read from that file.
"""

from django.db import migrations, models

ADMIT_RUN_V4 = r"""
CREATE OR REPLACE FUNCTION schedapp_admit_run_v4(
    p_job bigint, p_token bigint, p_worker text, p_admission text
) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    j record;
    r record;
    verdict text;
BEGIN
    IF EXISTS (SELECT FROM schedapp_jobrun
               WHERE job_id = p_job AND token = p_token AND own_lease) THEN
        SELECT state, lease_seconds INTO j FROM schedapp_job WHERE id = p_job;
        IF NOT FOUND THEN
            RETURN 'unknown';
        END IF;
        SELECT status, admission, lease_expires_at > now() AS lease_valid,
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
        ELSIF r.status = 'dispatched' THEN
            UPDATE schedapp_jobrun
            SET status = 'skipped', finished_at = now(), worker = p_worker, lease_expires_at = NULL,
                error = 'delivered but not executed: ' || CASE verdict
                    WHEN 'job_paused' THEN 'the job is paused'
                    WHEN 'job_state' THEN 'the job is no longer running'
                    WHEN 'lease_expired' THEN 'its lease expired before it arrived'
                    ELSE verdict END
            WHERE job_id = p_job AND token = p_token;
        END IF;
        RETURN verdict;
    END IF;

    -- The job row first, whatever its token: waiting here for a reaper, a cancel or a claim
    -- means deciding on what they committed.
    SELECT token, state, lease_expires_at > now() AS lease_valid,
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
    SELECT status, admission INTO r FROM schedapp_jobrun
    WHERE job_id = p_job AND token = p_token;
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

RENEW_LEASES_V5 = r"""
CREATE OR REPLACE FUNCTION schedapp_renew_leases_v5(p_jobs bigint[], p_tokens bigint[])
RETURNS TABLE (job_id bigint, token bigint, outcome text) LANGUAGE plpgsql AS $$
DECLARE
    own bigint[];
    locked bigint[];
    renewed bigint[];
    runs_locked bigint[];
    runs_renewed bigint[];
BEGIN
    SELECT coalesce(array_agg(r.id), '{}') INTO own
    FROM unnest(p_jobs, p_tokens) AS h (id, token)
    JOIN schedapp_jobrun r ON r.job_id = h.id AND r.token = h.token
    WHERE r.own_lease;
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
          AND EXISTS (SELECT FROM unnest(p_jobs, p_tokens) AS h (id, token)
                      LEFT JOIN schedapp_jobrun r ON r.job_id = h.id AND r.token = h.token
                      WHERE h.id = j.id AND NOT coalesce(r.id = ANY (own), false))
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
      AND NOT r.own_lease AND r.status = 'running';
    -- A new snapshot: a completion that committed a moment ago is seen, so a run that simply
    -- finished is reported as finished, not as a lost lease.
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
    FROM unnest(p_jobs, p_tokens) AS h (id, token)
    LEFT JOIN schedapp_jobrun r ON r.job_id = h.id AND r.token = h.token;
END
$$;
"""

FUNCTIONS = (ADMIT_RUN_V4, RENEW_LEASES_V5)
DROP = (
    "DROP FUNCTION IF EXISTS schedapp_admit_run_v4(bigint, bigint, text, text)",
    "DROP FUNCTION IF EXISTS schedapp_renew_leases_v5(bigint[], bigint[])",
)


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for sql in FUNCTIONS:
            schema_editor.execute(sql)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for sql in DROP:
            schema_editor.execute(sql)


class Migration(migrations.Migration):
    dependencies = [("schedapp", "0031_succeed_run_v4")]

    operations = [
        migrations.AddField(
            model_name="job",
            name="max_concurrent",
            field=models.IntegerField(
                db_default=10,
                default=10,
                help_text="allow_all: at most this many runs of the job in flight at once; an "
                "occurrence waits for a slot (then the misfire policy applies).",
            ),
        ),
        migrations.AlterField(
            model_name="job",
            name="overlap",
            field=models.CharField(
                choices=[
                    ("skip", "Skip occurrences that come due while a run is in flight"),
                    ("buffer_one", "Buffer one: it waits for the run (then the misfire policy)"),
                    ("buffer_all", "Buffer all (up to max_buffer): each runs after the run"),
                    (
                        "cancel_other",
                        "Cancel the run in flight (revoke); the latest then runs",
                    ),
                    (
                        "terminate_other",
                        "Terminate the run in flight (SIGTERM); the latest runs",
                    ),
                    (
                        "allow_all",
                        "Allow all (up to max_concurrent): each starts on time, own lease",
                    ),
                ],
                db_default="buffer_one",
                default="buffer_one",
                help_text="What becomes of occurrences that come due while a run of this job is "
                "in flight (decided when it ends).",
                max_length=16,
            ),
        ),
        migrations.AddField(
            model_name="jobrun",
            name="own_lease",
            field=models.BooleanField(db_default=False, default=False, editable=False),
        ),
        migrations.AddField(
            model_name="jobrun",
            name="lease_expires_at",
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
        migrations.RunPython(create, drop, elidable=False),
    ]
