"""Celery fidelity: Celery's day rule for crons, solar schedules, a start/expiry window and
per-job message options; the worker's fast success path learns the day rule and leaves
solar and windowed jobs to the general path (which computes their next occurrence)."""

import importlib

from django.db import migrations, models

_0006 = importlib.import_module("schedapp.migrations.0006_worker_functions")

# The same function, two more checks: ``p_cron`` is the cron the claim saw, prefixed with "&"
# under Celery's day rule (both day fields must match); a solar or windowed job is not the
# common case. Columns are resolved when the function runs, so 0006's text stays valid.
SUCCEED_RUN = _0006.SUCCEED_RUN.replace(
    "    ELSIF j.cron <> p_cron OR j.timezone <> p_timezone THEN",
    "    ELSIF (CASE WHEN j.cron_day_or THEN j.cron ELSE '&' || j.cron END) <> p_cron\n"
    "          OR j.timezone <> p_timezone THEN",
).replace(
    "       OR j.scheduled_for IS DISTINCT FROM p_scheduled_for THEN",
    "       OR j.scheduled_for IS DISTINCT FROM p_scheduled_for\n"
    "       OR j.solar_event <> '' OR j.not_before IS NOT NULL OR j.expires_at IS NOT NULL THEN",
)
assert SUCCEED_RUN.count("cron_day_or") == 1 and SUCCEED_RUN.count("solar_event") == 1
SUCCEED_RUN = SUCCEED_RUN.replace(
    '    SELECT token, state, scheduled_for, run_at, cron, timezone, "interval", interval_anchor,\n'
    "           jitter INTO j",
    '    SELECT token, state, scheduled_for, run_at, cron, timezone, "interval", interval_anchor,\n'
    "           jitter, cron_day_or, solar_event, not_before, expires_at INTO j",
)
assert "expires_at INTO j" in SUCCEED_RUN


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(SUCCEED_RUN)


def restore(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(_0006.SUCCEED_RUN)


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
