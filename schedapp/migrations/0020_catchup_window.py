"""A job's catch-up window (``catchup_window``): an occurrence missed longer ago than it is
recorded as missed and not run. NULL means no window, today's behaviour.

The column is added NULL and without a default, whatever ``SCHEDAPP_DEFAULT_CATCHUP_WINDOW``
says at migrate time: every existing job keeps no window (the setting is a default for new
jobs), and PostgreSQL adds the column without rewriting the table. Its constraints are 0016's
for a duration: more than 0 (``schedapp_job_catchup_window_in_range``, as for an interval) and,
on PostgreSQL only, one Python's timedelta can hold (``schedapp_job_catchup_window_readable``,
outside Django's constraints as 0016's are). On PostgreSQL each is added NOT VALID (a brief
lock) and validated in its own transaction, so beats and workers go on writing while the table
is scanned. Every row holds NULL when they are added, so none needs the quarantine 0016 had.
The migration is not atomic, and each step can be run again (a column or constraint already
there is kept).
"""

import datetime

from django.db import migrations, models, transaction

import schedapp.models

# Frozen here, as the constraints were when this migration was written.
DURATION_MAX = datetime.timedelta(days=900_000_000)

IN_RANGE = models.CheckConstraint(
    condition=models.Q(
        ("catchup_window__isnull", True),
        ("catchup_window__gt", datetime.timedelta(0)),
        _connector="OR",
    ),
    name="schedapp_job_catchup_window_in_range",
    violation_error_message="catchup_window must be more than 0.",
)
READABLE = models.CheckConstraint(
    condition=models.Q(
        ("catchup_window__isnull", True),
        ("catchup_window__lte", DURATION_MAX),
        _connector="OR",
    ),
    name="schedapp_job_catchup_window_readable",
)
HELP_TEXT = (
    "An occurrence missed longer ago than this is recorded as missed and not run, whatever "
    "the misfire policy; at least the misfire grace. Empty: no window."
)


def _bare_column():
    """The column as the database gets it: no default, so existing rows stay NULL."""
    field = models.DurationField(null=True, blank=True, help_text=HELP_TEXT)
    field.set_attributes_from_name("catchup_window")
    return field


def add_column(apps, schema_editor):
    model = apps.get_model("schedapp", "Job")
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        columns = connection.introspection.get_table_description(cursor, model._meta.db_table)
    if "catchup_window" not in {column.name for column in columns}:
        with transaction.atomic(using=connection.alias):
            schema_editor.add_field(model, _bare_column())


def drop_column(apps, schema_editor):
    schema_editor.remove_field(apps.get_model("schedapp", "Job"), _bare_column())


def _constraints(connection):
    return [IN_RANGE, READABLE] if connection.vendor == "postgresql" else [IN_RANGE]


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


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("schedapp", "0019_occurrence_ledger")]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(add_column, drop_column)],
            state_operations=[
                migrations.AddField(
                    model_name="job",
                    name="catchup_window",
                    field=models.DurationField(
                        blank=True,
                        default=schedapp.models._default_catchup_window,
                        help_text=HELP_TEXT,
                        null=True,
                    ),
                ),
            ],
        ),
        # Separate: the constraints' model (``apps``) must know the column.
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(add_constraints, drop_constraints)],
            state_operations=[migrations.AddConstraint(model_name="job", constraint=IN_RANGE)],
        ),
    ]
