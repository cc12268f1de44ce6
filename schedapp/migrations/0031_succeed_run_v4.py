"""The one-call success as ``schedapp_succeed_run_v4`` / ``schedapp_succeed_runs_v3``: v4 also
declines a job that follows a calendar (0029's ``calendar_id``: its next run is the calendar's,
which a worker does not read; the general path computes it) and one whose overlap is
``allow_all`` (no value a job can hold today: the condition is there for the policy that
adds it). v3 and ``schedapp_succeed_runs_v2`` stay for the previous release's workers
(``schedapp.sql.RETIRED_FUNCTIONS``): a worker of that release declines calendar jobs
itself (its claim gives them no schedule to compute), so v3 never sees one from it.

The function text below is frozen: a copy of ``schedapp/sql/functions.sql`` as this migration
wrote it, never read from that file.
"""

from django.db import migrations

SUCCEED_RUN_V4 = r"""
CREATE OR REPLACE FUNCTION schedapp_succeed_run_v4(
    p_job bigint, p_token bigint, p_scheduled_for timestamptz, p_next timestamptz,
    p_once boolean, p_cron text, p_timezone text, p_interval interval,
    p_anchor timestamptz
) RETURNS boolean LANGUAGE plpgsql AS $$
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
    UPDATE schedapp_jobrun SET status = 'succeeded', finished_at = now()
    WHERE job_id = p_job AND token = p_token AND status = 'running';
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
"""

SUCCEED_RUNS_V3 = r"""
CREATE OR REPLACE FUNCTION schedapp_succeed_runs_v3(
    p_jobs bigint[], p_tokens bigint[], p_scheduled_for timestamptz[], p_next timestamptz[],
    p_once boolean[], p_cron text[], p_timezone text[], p_interval interval[],
    p_anchor timestamptz[]
) RETURNS TABLE (idx int, applied boolean) LANGUAGE plpgsql AS $$
DECLARE
    i int;
BEGIN
    -- Several successes (of one pool process, gathered while the previous commit was under
    -- way) in one transaction: one round trip and one commit for all of them. Job rows are
    -- locked in id order, as renewals lock them, so two such transactions cannot deadlock.
    FOR i IN SELECT s.i FROM generate_subscripts(p_jobs, 1) AS s (i) ORDER BY p_jobs[s.i] LOOP
        idx := i;
        applied := schedapp_succeed_run_v4(
            p_jobs[i], p_tokens[i], p_scheduled_for[i], p_next[i], p_once[i], p_cron[i],
            p_timezone[i], p_interval[i], p_anchor[i]
        );
        RETURN NEXT;
    END LOOP;
END
$$;
"""

FUNCTIONS = (SUCCEED_RUN_V4, SUCCEED_RUNS_V3)
DROP = (
    "DROP FUNCTION IF EXISTS schedapp_succeed_runs_v3(bigint[], bigint[], timestamptz[], "
    "timestamptz[], boolean[], text[], text[], interval[], timestamptz[])",
    "DROP FUNCTION IF EXISTS schedapp_succeed_run_v4(bigint, bigint, timestamptz, timestamptz, "
    "boolean, text, text, interval, timestamptz)",
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
    dependencies = [("schedapp", "0030_job_calendar_index")]

    operations = [migrations.RunPython(create, drop, elidable=False)]
