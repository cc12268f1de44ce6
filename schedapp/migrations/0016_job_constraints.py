"""Constraints on what a job's columns can never hold (schedapp.models._value_constraints):
a time outside Python's years, or infinite; a negative duration, or (PostgreSQL) one Python
cannot hold; a zero interval; a next_run_at without its occurrence (scheduled_for); a running
job without its lease (never reaped); a token, retry count or missed count with no room left
to be added to; a latitude or longitude off the globe (NaN included); a state or misfire
policy that is none of the choices; args that are not a JSON array, kwargs or message options
that are not a JSON object. Written behind the API's back, most of them stopped every beat's
claim, or the reaper inside it, or a worker's completion; the others left a job that would
never run, or never run as configured, with nothing to say so.

Rows already holding such a value are quarantined first (``dead``, the value in last_error,
its runs in flight closed) and the value brought into range (a time, duration or coordinate
to the nearest end of its range, a JSON value of the wrong shape emptied, a misfire policy to
skip), so that the constraint can hold. Then, on PostgreSQL, each constraint is added NOT
VALID (a brief lock) and validated in its own transaction, which lets beats and workers go on
writing while the table is scanned: the migration is not atomic, and each step can be run
again (a constraint already there is skipped). A row that an older release writes out of
range between the two steps fails the validation: running the migration again quarantines it
and goes on."""

import datetime

import django.db.models.lookups
from django.db import migrations, models, transaction
from django.db.models import Value
from django.db.models.functions import Cast, Coalesce, Concat, Greatest, Least, Left, Now

import schedapp.models

# Frozen here, as the constraints were when this migration was written.
TIME_MIN = datetime.datetime(1, 1, 2, tzinfo=datetime.timezone.utc)
TIME_MAX = datetime.datetime(9999, 12, 30, tzinfo=datetime.timezone.utc)
DURATION_MAX = datetime.timedelta(days=900_000_000)
COUNTER_MAX = 2**62
TIMES = (
    "run_at",
    "interval_anchor",
    "not_before",
    "expires_at",
    "next_run_at",
    "scheduled_for",
    "lease_expires_at",
    "last_run_at",
    "created_at",
    "updated_at",
)
DURATIONS = ("interval", "retry_backoff", "retry_backoff_max", "misfire_grace")


def _repairs():
    """Per constraint: the column it is about, and the value that brings a row into range."""
    repairs = {
        "schedapp_job_occurrence_known": ("scheduled_for", {}),  # next_run_at goes NULL
        "schedapp_job_running_has_lease": ("lease_expires_at", {}),  # the job goes dead
        "schedapp_job_token_in_range": (
            "token",
            {"token": Least(Greatest("token", Value(0)), Value(COUNTER_MAX - 1))},
        ),
        "schedapp_job_retry_count_in_range": (
            "retry_count",
            {"retry_count": Least("retry_count", Value(2**31 - 2))},
        ),
        "schedapp_job_missed_runs_in_range": (
            "missed_runs",
            {"missed_runs": Least("missed_runs", Value(COUNTER_MAX - 1))},
        ),
    }
    for column, bound in (("latitude", 90), ("longitude", 180)):  # NaN: LEAST(NaN, x) is x
        clamped = Greatest(Least(column, Value(float(bound))), Value(float(-bound)))
        repairs[f"schedapp_job_{column}_in_range"] = (column, {column: clamped})
    repairs["schedapp_job_state_valid"] = ("state", {})  # the quarantine makes it dead
    repairs["schedapp_job_misfire_policy_valid"] = ("misfire_policy", {"misfire_policy": "skip"})
    for column, empty in (("args", []), ("kwargs", {}), ("message_options", {})):
        shape = "array" if column == "args" else "object"
        value = Value(empty, output_field=models.JSONField())
        repairs[f"schedapp_job_{column}_{shape}"] = (column, {column: value})
    for column in TIMES:
        clamped = Greatest(Least(column, Value(TIME_MAX)), Value(TIME_MIN))
        repairs[f"schedapp_job_{column}_in_range"] = (column, {column: clamped})
    for column in DURATIONS:
        low = datetime.timedelta(seconds=1 if column == "interval" else 0)
        repairs[f"schedapp_job_{column}_in_range"] = (
            column,
            {column: Greatest(column, Value(low))},
        )
        longest = Least(column, Value(DURATION_MAX))
        repairs[f"schedapp_job_{column}_readable"] = (column, {column: longest})
    return repairs


# PostgreSQL's alone, outside Django's constraints: a duration Python's timedelta can hold
# (psycopg reads an interval into one; at most 999,999,999 days, and PostgreSQL compares a month
# as 30 days where psycopg reads a year as 365: hence the margin). SQLite stores a duration as
# 64-bit microseconds (106,751,991 days at most) and could not even be given this bound.
POSTGRESQL_ONLY = [
    models.CheckConstraint(
        name=f"schedapp_job_{column}_readable",
        condition=models.Q(
            (f"{column}__isnull", True), (f"{column}__lte", DURATION_MAX), _connector="OR"
        ),
    )
    for column in DURATIONS
]


def _constraints(connection):
    """The constraints this migration adds on ``connection``'s database."""
    added = [op.constraint for op in ADDED]
    return added + POSTGRESQL_ONLY if connection.vendor == "postgresql" else added


def quarantine_violations(apps, schema_editor):
    """Quarantine every row that breaks one of the constraints, and bring its value in range."""
    alias = schema_editor.connection.alias
    Job = apps.get_model("schedapp", "Job").objects.using(alias)
    JobRun = apps.get_model("schedapp", "JobRun").objects.using(alias)
    repairs = _repairs()
    with transaction.atomic(using=alias):
        for constraint in _constraints(schema_editor.connection):
            column, repair = repairs[constraint.name]
            bad = Job.exclude(constraint.condition)
            ids = list(bad.values_list("id", flat=True))
            if not ids:
                continue
            reason = Concat(
                Value(f"quarantined: {column} held "),
                Coalesce(Left(Cast(column, models.TextField()), 200), Value("NULL")),
                Value(
                    f", which breaks {constraint.name} (migration 0016): "
                    "no beat or worker could go on from it"
                ),
                output_field=models.TextField(),
            )
            Job.filter(id__in=ids).update(
                state="dead",
                claimed_by="",
                lease_expires_at=None,
                next_run_at=None,
                last_status="quarantined",
                last_error=reason,
                updated_at=Now(),
            )
            Job.filter(id__in=ids).update(**repair)
            JobRun.filter(job_id__in=ids, status__in=["dispatched", "running"]).update(
                status="failed",
                finished_at=Now(),
                error=f"quarantined: its job broke {constraint.name} (migration 0016)",
            )


def add_constraints(apps, schema_editor):
    """PostgreSQL: NOT VALID, then VALIDATE, each committed on its own; elsewhere as usual."""
    model = apps.get_model("schedapp", "Job")
    connection = schema_editor.connection
    for constraint in _constraints(connection):
        name = constraint.name
        if connection.vendor != "postgresql":
            with transaction.atomic(using=connection.alias):
                schema_editor.add_constraint(model, constraint)
            continue
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT convalidated FROM pg_constraint WHERE conname = %s "
                "AND conrelid = %s::regclass",
                [name, model._meta.db_table],
            )
            found = cursor.fetchone()
        if found is None:
            with transaction.atomic(using=connection.alias):
                schema_editor.execute(f"{constraint.create_sql(model, schema_editor)} NOT VALID")
        if found is None or not found[0]:
            with transaction.atomic(using=connection.alias):
                schema_editor.execute(
                    f"ALTER TABLE {schema_editor.quote_name(model._meta.db_table)} "
                    f"VALIDATE CONSTRAINT {schema_editor.quote_name(name)}"
                )


def drop_constraints(apps, schema_editor):
    model = apps.get_model("schedapp", "Job")
    for constraint in reversed(_constraints(schema_editor.connection)):
        schema_editor.remove_constraint(model, constraint)


ADDED = [
    migrations.AddConstraint(
        model_name="job",
        constraint=models.CheckConstraint(
            condition=models.Q(
                ("next_run_at__isnull", True), ("scheduled_for__isnull", False), _connector="OR"
            ),
            name="schedapp_job_occurrence_known",
            violation_error_message="A job with a next_run_at needs the occurrence it is for "
            "(scheduled_for).",
        ),
    ),
    migrations.AddConstraint(
        model_name="job",
        constraint=models.CheckConstraint(
            condition=models.Q(
                models.Q(("state", "running"), _negated=True),
                ("lease_expires_at__isnull", False),
                _connector="OR",
            ),
            name="schedapp_job_running_has_lease",
            violation_error_message="A running job needs its lease (lease_expires_at): without "
            "it, it would never be reaped.",
        ),
    ),
    migrations.AddConstraint(
        model_name="job",
        constraint=models.CheckConstraint(
            condition=models.Q(("token__gte", 0), ("token__lt", 4611686018427387904)),
            name="schedapp_job_token_in_range",
        ),
    ),
    migrations.AddConstraint(
        model_name="job",
        constraint=models.CheckConstraint(
            condition=models.Q(("retry_count__lt", 2147483647)),
            name="schedapp_job_retry_count_in_range",
        ),
    ),
    migrations.AddConstraint(
        model_name="job",
        constraint=models.CheckConstraint(
            condition=models.Q(("missed_runs__lt", 4611686018427387904)),
            name="schedapp_job_missed_runs_in_range",
        ),
    ),
    migrations.AddConstraint(
        model_name="job",
        constraint=models.CheckConstraint(
            condition=models.Q(
                ("latitude__isnull", True),
                models.Q(("latitude__gte", -90), ("latitude__lte", 90)),
                _connector="OR",
            ),
            name="schedapp_job_latitude_in_range",
            violation_error_message="latitude must be -90 to 90 degrees.",
        ),
    ),
    migrations.AddConstraint(
        model_name="job",
        constraint=models.CheckConstraint(
            condition=models.Q(
                ("longitude__isnull", True),
                models.Q(("longitude__gte", -180), ("longitude__lte", 180)),
                _connector="OR",
            ),
            name="schedapp_job_longitude_in_range",
            violation_error_message="longitude must be -180 to 180 degrees.",
        ),
    ),
    migrations.AddConstraint(
        model_name="job",
        constraint=models.CheckConstraint(
            condition=models.Q(
                ("state__in", ["scheduled", "running", "paused", "succeeded", "dead", "cancelled"])
            ),
            name="schedapp_job_state_valid",
            violation_error_message="state must be one of scheduled, running, paused, succeeded, "
            "dead, cancelled.",
        ),
    ),
    migrations.AddConstraint(
        model_name="job",
        constraint=models.CheckConstraint(
            condition=models.Q(
                ("misfire_policy__in", ["run_once", "skip", "run_all", "run_recent"])
            ),
            name="schedapp_job_misfire_policy_valid",
            violation_error_message="misfire_policy must be one of run_once, skip, run_all, "
            "run_recent.",
        ),
    ),
    migrations.AddConstraint(
        model_name="job",
        constraint=models.CheckConstraint(
            condition=django.db.models.lookups.Exact(schedapp.models.JSONType("args"), "array"),
            name="schedapp_job_args_array",
            violation_error_message="args must be a JSON array.",
        ),
    ),
    migrations.AddConstraint(
        model_name="job",
        constraint=models.CheckConstraint(
            condition=django.db.models.lookups.Exact(schedapp.models.JSONType("kwargs"), "object"),
            name="schedapp_job_kwargs_object",
            violation_error_message="kwargs must be a JSON object.",
        ),
    ),
    migrations.AddConstraint(
        model_name="job",
        constraint=models.CheckConstraint(
            condition=django.db.models.lookups.Exact(
                schedapp.models.JSONType("message_options"), "object"
            ),
            name="schedapp_job_message_options_object",
            violation_error_message="message_options must be a JSON object.",
        ),
    ),
    migrations.AddConstraint(
        model_name="job",
        constraint=models.CheckConstraint(
            condition=models.Q(
                ("run_at__isnull", True),
                models.Q(
                    ("run_at__gte", datetime.datetime(1, 1, 2, 0, 0, tzinfo=datetime.timezone.utc)),
                    (
                        "run_at__lte",
                        datetime.datetime(9999, 12, 30, 0, 0, tzinfo=datetime.timezone.utc),
                    ),
                ),
                _connector="OR",
            ),
            name="schedapp_job_run_at_in_range",
            violation_error_message="run_at must be a time between years 1 and 9999.",
        ),
    ),
    migrations.AddConstraint(
        model_name="job",
        constraint=models.CheckConstraint(
            condition=models.Q(
                ("interval_anchor__isnull", True),
                models.Q(
                    (
                        "interval_anchor__gte",
                        datetime.datetime(1, 1, 2, 0, 0, tzinfo=datetime.timezone.utc),
                    ),
                    (
                        "interval_anchor__lte",
                        datetime.datetime(9999, 12, 30, 0, 0, tzinfo=datetime.timezone.utc),
                    ),
                ),
                _connector="OR",
            ),
            name="schedapp_job_interval_anchor_in_range",
            violation_error_message="interval_anchor must be a time between years 1 and 9999.",
        ),
    ),
    migrations.AddConstraint(
        model_name="job",
        constraint=models.CheckConstraint(
            condition=models.Q(
                ("not_before__isnull", True),
                models.Q(
                    (
                        "not_before__gte",
                        datetime.datetime(1, 1, 2, 0, 0, tzinfo=datetime.timezone.utc),
                    ),
                    (
                        "not_before__lte",
                        datetime.datetime(9999, 12, 30, 0, 0, tzinfo=datetime.timezone.utc),
                    ),
                ),
                _connector="OR",
            ),
            name="schedapp_job_not_before_in_range",
            violation_error_message="not_before must be a time between years 1 and 9999.",
        ),
    ),
    migrations.AddConstraint(
        model_name="job",
        constraint=models.CheckConstraint(
            condition=models.Q(
                ("expires_at__isnull", True),
                models.Q(
                    (
                        "expires_at__gte",
                        datetime.datetime(1, 1, 2, 0, 0, tzinfo=datetime.timezone.utc),
                    ),
                    (
                        "expires_at__lte",
                        datetime.datetime(9999, 12, 30, 0, 0, tzinfo=datetime.timezone.utc),
                    ),
                ),
                _connector="OR",
            ),
            name="schedapp_job_expires_at_in_range",
            violation_error_message="expires_at must be a time between years 1 and 9999.",
        ),
    ),
    migrations.AddConstraint(
        model_name="job",
        constraint=models.CheckConstraint(
            condition=models.Q(
                ("next_run_at__isnull", True),
                models.Q(
                    (
                        "next_run_at__gte",
                        datetime.datetime(1, 1, 2, 0, 0, tzinfo=datetime.timezone.utc),
                    ),
                    (
                        "next_run_at__lte",
                        datetime.datetime(9999, 12, 30, 0, 0, tzinfo=datetime.timezone.utc),
                    ),
                ),
                _connector="OR",
            ),
            name="schedapp_job_next_run_at_in_range",
            violation_error_message="next_run_at must be a time between years 1 and 9999.",
        ),
    ),
    migrations.AddConstraint(
        model_name="job",
        constraint=models.CheckConstraint(
            condition=models.Q(
                ("scheduled_for__isnull", True),
                models.Q(
                    (
                        "scheduled_for__gte",
                        datetime.datetime(1, 1, 2, 0, 0, tzinfo=datetime.timezone.utc),
                    ),
                    (
                        "scheduled_for__lte",
                        datetime.datetime(9999, 12, 30, 0, 0, tzinfo=datetime.timezone.utc),
                    ),
                ),
                _connector="OR",
            ),
            name="schedapp_job_scheduled_for_in_range",
            violation_error_message="scheduled_for must be a time between years 1 and 9999.",
        ),
    ),
    migrations.AddConstraint(
        model_name="job",
        constraint=models.CheckConstraint(
            condition=models.Q(
                ("lease_expires_at__isnull", True),
                models.Q(
                    (
                        "lease_expires_at__gte",
                        datetime.datetime(1, 1, 2, 0, 0, tzinfo=datetime.timezone.utc),
                    ),
                    (
                        "lease_expires_at__lte",
                        datetime.datetime(9999, 12, 30, 0, 0, tzinfo=datetime.timezone.utc),
                    ),
                ),
                _connector="OR",
            ),
            name="schedapp_job_lease_expires_at_in_range",
            violation_error_message="lease_expires_at must be a time between years 1 and 9999.",
        ),
    ),
    migrations.AddConstraint(
        model_name="job",
        constraint=models.CheckConstraint(
            condition=models.Q(
                ("last_run_at__isnull", True),
                models.Q(
                    (
                        "last_run_at__gte",
                        datetime.datetime(1, 1, 2, 0, 0, tzinfo=datetime.timezone.utc),
                    ),
                    (
                        "last_run_at__lte",
                        datetime.datetime(9999, 12, 30, 0, 0, tzinfo=datetime.timezone.utc),
                    ),
                ),
                _connector="OR",
            ),
            name="schedapp_job_last_run_at_in_range",
            violation_error_message="last_run_at must be a time between years 1 and 9999.",
        ),
    ),
    migrations.AddConstraint(
        model_name="job",
        constraint=models.CheckConstraint(
            condition=models.Q(
                ("created_at__isnull", True),
                models.Q(
                    (
                        "created_at__gte",
                        datetime.datetime(1, 1, 2, 0, 0, tzinfo=datetime.timezone.utc),
                    ),
                    (
                        "created_at__lte",
                        datetime.datetime(9999, 12, 30, 0, 0, tzinfo=datetime.timezone.utc),
                    ),
                ),
                _connector="OR",
            ),
            name="schedapp_job_created_at_in_range",
            violation_error_message="created_at must be a time between years 1 and 9999.",
        ),
    ),
    migrations.AddConstraint(
        model_name="job",
        constraint=models.CheckConstraint(
            condition=models.Q(
                ("updated_at__isnull", True),
                models.Q(
                    (
                        "updated_at__gte",
                        datetime.datetime(1, 1, 2, 0, 0, tzinfo=datetime.timezone.utc),
                    ),
                    (
                        "updated_at__lte",
                        datetime.datetime(9999, 12, 30, 0, 0, tzinfo=datetime.timezone.utc),
                    ),
                ),
                _connector="OR",
            ),
            name="schedapp_job_updated_at_in_range",
            violation_error_message="updated_at must be a time between years 1 and 9999.",
        ),
    ),
    migrations.AddConstraint(
        model_name="job",
        constraint=models.CheckConstraint(
            condition=models.Q(
                ("interval__isnull", True), ("interval__gt", datetime.timedelta(0)), _connector="OR"
            ),
            name="schedapp_job_interval_in_range",
            violation_error_message="interval must be more than 0.",
        ),
    ),
    migrations.AddConstraint(
        model_name="job",
        constraint=models.CheckConstraint(
            condition=models.Q(
                ("retry_backoff__isnull", True),
                ("retry_backoff__gte", datetime.timedelta(0)),
                _connector="OR",
            ),
            name="schedapp_job_retry_backoff_in_range",
            violation_error_message="retry_backoff must be a duration, not negative.",
        ),
    ),
    migrations.AddConstraint(
        model_name="job",
        constraint=models.CheckConstraint(
            condition=models.Q(
                ("retry_backoff_max__isnull", True),
                ("retry_backoff_max__gte", datetime.timedelta(0)),
                _connector="OR",
            ),
            name="schedapp_job_retry_backoff_max_in_range",
            violation_error_message="retry_backoff_max must be a duration, not negative.",
        ),
    ),
    migrations.AddConstraint(
        model_name="job",
        constraint=models.CheckConstraint(
            condition=models.Q(
                ("misfire_grace__isnull", True),
                ("misfire_grace__gte", datetime.timedelta(0)),
                _connector="OR",
            ),
            name="schedapp_job_misfire_grace_in_range",
            violation_error_message="misfire_grace must be a duration, not negative.",
        ),
    ),
]


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("schedapp", "0015_declaration_sets")]

    operations = [
        migrations.RunPython(quarantine_violations, migrations.RunPython.noop),
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(add_constraints, drop_constraints)],
            state_operations=ADDED,
        ),
    ]
