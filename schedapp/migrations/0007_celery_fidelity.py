"""Celery fidelity: Celery's day rule for crons, solar schedules, a start/expiry window and
per-job message options; the worker's fast success path learns the day rule and leaves
solar and windowed jobs to the general path (which computes their next occurrence)."""

from django.db import migrations, models

# 0006's function, two more checks: ``p_cron`` is the cron the claim saw, prefixed with "&"
# under Celery's day rule (both day fields must match); a solar or windowed job is not the
# common case. Columns are resolved when the function runs, so 0006's text stays valid.
# Frozen: the text this migration has always run, written out whole. Never edited (a
# database that applied it keeps what it ran) and never imported; the function as it is
# today is in schedapp/sql/functions.sql.
SUCCEED_RUN = r"""
CREATE OR REPLACE FUNCTION schedapp_succeed_run(
    p_job bigint, p_token bigint, p_scheduled_for timestamptz, p_next timestamptz,
    p_once boolean, p_cron text, p_timezone text, p_interval interval,
    p_anchor timestamptz
) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    j record;
    next_run timestamptz;
BEGIN
    SELECT token, state, scheduled_for, run_at, cron, timezone, "interval", interval_anchor,
           jitter, cron_day_or, solar_event, not_before, expires_at INTO j
    FROM schedapp_job WHERE id = p_job FOR UPDATE;
    -- Anything but the common case (the run still running under the current token, the
    -- schedule the claim saw) goes to the general path, which tells them apart.
    IF NOT FOUND OR j.token <> p_token OR j.state NOT IN ('running', 'paused')
       OR j.scheduled_for IS DISTINCT FROM p_scheduled_for
       OR j.solar_event <> '' OR j.not_before IS NOT NULL OR j.expires_at IS NOT NULL THEN
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

# Frozen too: what reversing this migration puts back (migration 0006's text).
PREVIOUS_SUCCEED_RUN = r"""
CREATE OR REPLACE FUNCTION schedapp_succeed_run(
    p_job bigint, p_token bigint, p_scheduled_for timestamptz, p_next timestamptz,
    p_once boolean, p_cron text, p_timezone text, p_interval interval,
    p_anchor timestamptz
) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    j record;
    next_run timestamptz;
BEGIN
    SELECT token, state, scheduled_for, run_at, cron, timezone, "interval", interval_anchor,
           jitter INTO j
    FROM schedapp_job WHERE id = p_job FOR UPDATE;
    -- Anything but the common case (the run still running under the current token, the
    -- schedule the claim saw) goes to the general path, which tells them apart.
    IF NOT FOUND OR j.token <> p_token OR j.state NOT IN ('running', 'paused')
       OR j.scheduled_for IS DISTINCT FROM p_scheduled_for THEN
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
    ELSIF j.cron <> p_cron OR j.timezone <> p_timezone THEN
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


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(SUCCEED_RUN)


def restore(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PREVIOUS_SUCCEED_RUN)


class Migration(migrations.Migration):
    dependencies = [("schedapp", "0006_worker_functions")]

    operations = [
        migrations.RemoveConstraint(model_name="job", name="schedapp_job_one_schedule"),
        migrations.AddField(
            model_name="job",
            name="cron_day_or",
            field=models.BooleanField(
                db_default=True,
                default=True,
                help_text="When both day fields are restricted: fire on days matching either (cron) rather than both (Celery's crontab).",
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="expires_at",
            field=models.DateTimeField(
                blank=True,
                help_text="No occurrence after this instant: the job finishes.",
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="job", name="latitude", field=models.FloatField(blank=True, null=True)
        ),
        migrations.AddField(
            model_name="job", name="longitude", field=models.FloatField(blank=True, null=True)
        ),
        migrations.AddField(
            model_name="job",
            name="message_options",
            field=models.JSONField(
                blank=True,
                db_default=models.Value({}, output_field=models.JSONField()),
                default=dict,
                help_text="Celery message options: queue, routing_key, exchange, priority, expires, headers.",
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="not_before",
            field=models.DateTimeField(
                blank=True, help_text="Never fires before this instant.", null=True
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="solar_event",
            field=models.CharField(blank=True, db_default="", default="", max_length=32),
        ),
        migrations.AddConstraint(
            model_name="job",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    models.Q(
                        ("cron", ""),
                        ("interval__isnull", True),
                        ("run_at__isnull", False),
                        ("solar_event", ""),
                    ),
                    models.Q(
                        ("interval__isnull", True),
                        ("run_at__isnull", True),
                        ("solar_event", ""),
                        models.Q(("cron", ""), _negated=True),
                    ),
                    models.Q(
                        ("cron", ""),
                        ("interval__isnull", False),
                        ("run_at__isnull", True),
                        ("solar_event", ""),
                    ),
                    models.Q(
                        ("cron", ""),
                        ("interval__isnull", True),
                        ("run_at__isnull", True),
                        models.Q(("solar_event", ""), _negated=True),
                        ("latitude__isnull", False),
                        ("longitude__isnull", False),
                    ),
                    _connector="OR",
                ),
                name="schedapp_job_one_schedule",
                violation_error_message="A job needs exactly one of run_at, cron, interval or solar_event (with latitude and longitude).",
            ),
        ),
        migrations.RunPython(create, restore, elidable=False),
    ]
