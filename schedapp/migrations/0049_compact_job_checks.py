"""The job table's CHECK constraints that cost the most to check, held by PostgreSQL in a
shorter form of the same rules (``schedapp/sql/checks.sql``, whose header says why: each
statement that writes a job row rebuilds every constraint from its stored tree, and a success
writes one per execution). SQLite and Django's model state are unchanged.

Without downtime beyond a short lock: one transaction under ACCESS EXCLUSIVE (waiting at most
``LOCK_TIMEOUT`` for it, and trying again) adds each new form ``NOT VALID`` under a temporary
name, drops the old one and gives the new one its name: catalog changes only, and a row
written from then on is checked by the new forms. Then each is validated in its own
transaction (SHARE UPDATE EXCLUSIVE: beats, workers and the API go on writing while the table
is read). Every row already passed the old form of each rule, so none fails. The migration is
not atomic; interrupted, it is run again from the start (the swap of a new form for itself
changes nothing). Backwards, the same steps put Django's forms back."""

import time

from django.db import OperationalError, migrations, transaction

TABLE = "schedapp_job"
LOCK_TIMEOUT = "5s"
LOCK_TRIES = 20

# Frozen here: checks.sql as this migration wrote it.
COMPACT = {
    "schedapp_job_one_schedule": (
        "num_nonnulls(run_at, \"interval\", nullif(cron, ''), nullif(solar_event, '')) = "
        "1 AND (solar_event = '' OR (latitude IS NOT NULL AND longitude IS NOT NULL))"
    ),
    "schedapp_job_state_valid": (
        "state::text = ANY ('{scheduled,running,paused,succeeded,dead,cancelled}'::text[])"
    ),
    "schedapp_job_misfire_policy_valid": (
        "misfire_policy::text = ANY ('{run_once,skip,run_all,run_recent}'::text[])"
    ),
    "schedapp_job_dst_policy_valid": (
        "dst_policy::text = ANY "
        "('{gap_end+first,gap_end+second,gap_end+both,skip+first,skip+second,skip+both,celery}'::text[])"
    ),
    "schedapp_job_latitude_in_range": ("latitude >= '-90'::float8 AND latitude <= '90'::float8"),
    "schedapp_job_longitude_in_range": (
        "longitude >= '-180'::float8 AND longitude <= '180'::float8"
    ),
    "schedapp_job_run_at_in_range": (
        "run_at <@ '[0001-01-02 00:00:00+00,9999-12-30 00:00:00+00]'::tstzrange"
    ),
    "schedapp_job_interval_anchor_in_range": (
        "interval_anchor <@ '[0001-01-02 00:00:00+00,9999-12-30 00:00:00+00]'::tstzrange"
    ),
    "schedapp_job_not_before_in_range": (
        "not_before <@ '[0001-01-02 00:00:00+00,9999-12-30 00:00:00+00]'::tstzrange"
    ),
    "schedapp_job_expires_at_in_range": (
        "expires_at <@ '[0001-01-02 00:00:00+00,9999-12-30 00:00:00+00]'::tstzrange"
    ),
    "schedapp_job_next_run_at_in_range": (
        "next_run_at <@ '[0001-01-02 00:00:00+00,9999-12-30 00:00:00+00]'::tstzrange"
    ),
    "schedapp_job_scheduled_for_in_range": (
        "scheduled_for <@ '[0001-01-02 00:00:00+00,9999-12-30 00:00:00+00]'::tstzrange"
    ),
    "schedapp_job_lease_expires_at_in_range": (
        "lease_expires_at <@ '[0001-01-02 00:00:00+00,9999-12-30 00:00:00+00]'::tstzrange"
    ),
    "schedapp_job_last_run_at_in_range": (
        "last_run_at <@ '[0001-01-02 00:00:00+00,9999-12-30 00:00:00+00]'::tstzrange"
    ),
    "schedapp_job_created_at_in_range": (
        "created_at <@ '[0001-01-02 00:00:00+00,9999-12-30 00:00:00+00]'::tstzrange"
    ),
    "schedapp_job_updated_at_in_range": (
        "updated_at <@ '[0001-01-02 00:00:00+00,9999-12-30 00:00:00+00]'::tstzrange"
    ),
    "schedapp_job_finish_by_at_in_range": (
        "finish_by_at <@ '[0001-01-02 00:00:00+00,9999-12-30 00:00:00+00]'::tstzrange"
    ),
    "schedapp_job_interval_in_range": ("\"interval\" > '0'::interval"),
    "schedapp_job_interval_readable": ("\"interval\" <= '900000000 days'::interval"),
    "schedapp_job_retry_backoff_in_range": ("retry_backoff >= '0'::interval"),
    "schedapp_job_retry_backoff_readable": ("retry_backoff <= '900000000 days'::interval"),
    "schedapp_job_retry_backoff_max_in_range": ("retry_backoff_max >= '0'::interval"),
    "schedapp_job_retry_backoff_max_readable": ("retry_backoff_max <= '900000000 days'::interval"),
    "schedapp_job_misfire_grace_in_range": ("misfire_grace >= '0'::interval"),
    "schedapp_job_misfire_grace_readable": ("misfire_grace <= '900000000 days'::interval"),
    "schedapp_job_catchup_window_in_range": ("catchup_window > '0'::interval"),
    "schedapp_job_catchup_window_readable": ("catchup_window <= '900000000 days'::interval"),
    "schedapp_job_start_deadline_in_range": ("start_deadline > '0'::interval"),
    "schedapp_job_start_deadline_readable": ("start_deadline <= '900000000 days'::interval"),
    "schedapp_job_max_runtime_in_range": ("max_runtime > '0'::interval"),
    "schedapp_job_max_runtime_readable": ("max_runtime <= '900000000 days'::interval"),
}

# Frozen here: the same constraints as Django's constraints and migrations 0016-0036 wrote
# them (PostgreSQL's own rendering), for going back.
DJANGO = {
    "schedapp_job_one_schedule": (
        "((((cron)::text = ''::text) AND (\"interval\" IS NULL) AND (run_at IS NOT NULL) "
        "AND ((solar_event)::text = ''::text)) OR ((\"interval\" IS NULL) AND (run_at IS "
        "NULL) AND ((solar_event)::text = ''::text) AND (NOT ((cron)::text = ''::text))) "
        "OR (((cron)::text = ''::text) AND (\"interval\" IS NOT NULL) AND (run_at IS NULL) "
        "AND ((solar_event)::text = ''::text)) OR (((cron)::text = ''::text) AND "
        '("interval" IS NULL) AND (run_at IS NULL) AND (NOT ((solar_event)::text = '
        "''::text)) AND (latitude IS NOT NULL) AND (longitude IS NOT NULL)))"
    ),
    "schedapp_job_state_valid": (
        "((state)::text = ANY ((ARRAY['scheduled'::character varying, 'running'::character "
        "varying, 'paused'::character varying, 'succeeded'::character varying, "
        "'dead'::character varying, 'cancelled'::character varying])::text[]))"
    ),
    "schedapp_job_misfire_policy_valid": (
        "((misfire_policy)::text = ANY ((ARRAY['run_once'::character varying, "
        "'skip'::character varying, 'run_all'::character varying, 'run_recent'::character "
        "varying])::text[]))"
    ),
    "schedapp_job_dst_policy_valid": (
        "((dst_policy)::text = ANY ((ARRAY['gap_end+first'::character varying, "
        "'gap_end+second'::character varying, 'gap_end+both'::character varying, "
        "'skip+first'::character varying, 'skip+second'::character varying, "
        "'skip+both'::character varying, 'celery'::character varying])::text[]))"
    ),
    "schedapp_job_latitude_in_range": (
        "((latitude IS NULL) OR ((latitude >= ('-90.0'::numeric)::double precision) AND "
        "(latitude <= (90.0)::double precision)))"
    ),
    "schedapp_job_longitude_in_range": (
        "((longitude IS NULL) OR ((longitude >= ('-180.0'::numeric)::double precision) AND "
        "(longitude <= (180.0)::double precision)))"
    ),
    "schedapp_job_run_at_in_range": (
        "((run_at IS NULL) OR ((run_at >= '0001-01-02 00:00:00+00'::timestamp with time "
        "zone) AND (run_at <= '9999-12-30 00:00:00+00'::timestamp with time zone)))"
    ),
    "schedapp_job_interval_anchor_in_range": (
        "((interval_anchor IS NULL) OR ((interval_anchor >= '0001-01-02 "
        "00:00:00+00'::timestamp with time zone) AND (interval_anchor <= '9999-12-30 "
        "00:00:00+00'::timestamp with time zone)))"
    ),
    "schedapp_job_not_before_in_range": (
        "((not_before IS NULL) OR ((not_before >= '0001-01-02 00:00:00+00'::timestamp with "
        "time zone) AND (not_before <= '9999-12-30 00:00:00+00'::timestamp with time "
        "zone)))"
    ),
    "schedapp_job_expires_at_in_range": (
        "((expires_at IS NULL) OR ((expires_at >= '0001-01-02 00:00:00+00'::timestamp with "
        "time zone) AND (expires_at <= '9999-12-30 00:00:00+00'::timestamp with time "
        "zone)))"
    ),
    "schedapp_job_next_run_at_in_range": (
        "((next_run_at IS NULL) OR ((next_run_at >= '0001-01-02 00:00:00+00'::timestamp "
        "with time zone) AND (next_run_at <= '9999-12-30 00:00:00+00'::timestamp with time "
        "zone)))"
    ),
    "schedapp_job_scheduled_for_in_range": (
        "((scheduled_for IS NULL) OR ((scheduled_for >= '0001-01-02 "
        "00:00:00+00'::timestamp with time zone) AND (scheduled_for <= '9999-12-30 "
        "00:00:00+00'::timestamp with time zone)))"
    ),
    "schedapp_job_lease_expires_at_in_range": (
        "((lease_expires_at IS NULL) OR ((lease_expires_at >= '0001-01-02 "
        "00:00:00+00'::timestamp with time zone) AND (lease_expires_at <= '9999-12-30 "
        "00:00:00+00'::timestamp with time zone)))"
    ),
    "schedapp_job_last_run_at_in_range": (
        "((last_run_at IS NULL) OR ((last_run_at >= '0001-01-02 00:00:00+00'::timestamp "
        "with time zone) AND (last_run_at <= '9999-12-30 00:00:00+00'::timestamp with time "
        "zone)))"
    ),
    "schedapp_job_created_at_in_range": (
        "((created_at IS NULL) OR ((created_at >= '0001-01-02 00:00:00+00'::timestamp with "
        "time zone) AND (created_at <= '9999-12-30 00:00:00+00'::timestamp with time "
        "zone)))"
    ),
    "schedapp_job_updated_at_in_range": (
        "((updated_at IS NULL) OR ((updated_at >= '0001-01-02 00:00:00+00'::timestamp with "
        "time zone) AND (updated_at <= '9999-12-30 00:00:00+00'::timestamp with time "
        "zone)))"
    ),
    "schedapp_job_finish_by_at_in_range": (
        "((finish_by_at IS NULL) OR ((finish_by_at >= '0001-01-02 00:00:00+00'::timestamp "
        "with time zone) AND (finish_by_at <= '9999-12-30 00:00:00+00'::timestamp with "
        "time zone)))"
    ),
    "schedapp_job_interval_in_range": (
        '(("interval" IS NULL) OR ("interval" > \'00:00:00\'::interval))'
    ),
    "schedapp_job_interval_readable": (
        '(("interval" IS NULL) OR ("interval" <= \'900000000 days\'::interval))'
    ),
    "schedapp_job_retry_backoff_in_range": (
        "((retry_backoff IS NULL) OR (retry_backoff >= '00:00:00'::interval))"
    ),
    "schedapp_job_retry_backoff_readable": (
        "((retry_backoff IS NULL) OR (retry_backoff <= '900000000 days'::interval))"
    ),
    "schedapp_job_retry_backoff_max_in_range": (
        "((retry_backoff_max IS NULL) OR (retry_backoff_max >= '00:00:00'::interval))"
    ),
    "schedapp_job_retry_backoff_max_readable": (
        "((retry_backoff_max IS NULL) OR (retry_backoff_max <= '900000000 days'::interval))"
    ),
    "schedapp_job_misfire_grace_in_range": (
        "((misfire_grace IS NULL) OR (misfire_grace >= '00:00:00'::interval))"
    ),
    "schedapp_job_misfire_grace_readable": (
        "((misfire_grace IS NULL) OR (misfire_grace <= '900000000 days'::interval))"
    ),
    "schedapp_job_catchup_window_in_range": (
        "((catchup_window IS NULL) OR (catchup_window > '00:00:00'::interval))"
    ),
    "schedapp_job_catchup_window_readable": (
        "((catchup_window IS NULL) OR (catchup_window <= '900000000 days'::interval))"
    ),
    "schedapp_job_start_deadline_in_range": (
        "((start_deadline IS NULL) OR (start_deadline > '00:00:00'::interval))"
    ),
    "schedapp_job_start_deadline_readable": (
        "((start_deadline IS NULL) OR (start_deadline <= '900000000 days'::interval))"
    ),
    "schedapp_job_max_runtime_in_range": (
        "((max_runtime IS NULL) OR (max_runtime > '00:00:00'::interval))"
    ),
    "schedapp_job_max_runtime_readable": (
        "((max_runtime IS NULL) OR (max_runtime <= '900000000 days'::interval))"
    ),
}


def swap(connection, forms: dict[str, str]) -> None:
    """Each constraint in ``forms`` replaced by its form there, NOT VALID, under one short
    lock; tried again when the lock is not had within LOCK_TIMEOUT."""
    for attempt in range(LOCK_TRIES):
        try:
            with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
                cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
                cursor.execute(f"LOCK TABLE {TABLE} IN ACCESS EXCLUSIVE MODE")
                for name, condition in forms.items():
                    cursor.execute(
                        f"ALTER TABLE {TABLE} ADD CONSTRAINT {name}_new CHECK ({condition}) "
                        f"NOT VALID, DROP CONSTRAINT {name}"
                    )
                    cursor.execute(f"ALTER TABLE {TABLE} RENAME CONSTRAINT {name}_new TO {name}")
            return
        except OperationalError as exc:
            timed_out = getattr(exc.__cause__, "sqlstate", None) == "55P03"  # lock_timeout
            if not timed_out or attempt == LOCK_TRIES - 1:
                raise
            time.sleep(1)


def validate(connection, forms: dict[str, str]) -> None:
    """Each constraint read against every row, in its own transaction; writers go on."""
    for name in forms:
        with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
            cursor.execute(f"ALTER TABLE {TABLE} VALIDATE CONSTRAINT {name}")


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        swap(schema_editor.connection, COMPACT)
        validate(schema_editor.connection, COMPACT)


def backward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        swap(schema_editor.connection, DJANGO)
        validate(schema_editor.connection, DJANGO)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("schedapp", "0048_partitioned_ledger")]

    operations = [migrations.RunPython(forward, backward, elidable=False)]
