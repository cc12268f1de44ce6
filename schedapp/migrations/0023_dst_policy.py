"""A job's DST policy (``dst_policy``): what a fixed-hour cron does with a wall time the clocks
skip or repeat, or ``celery`` for Celery beat's own reading.

The column is added with a database default of ``gap_end+first``, the rule every job followed
before there was a choice, so existing rows keep today's behaviour; PostgreSQL adds a column
with a constant default without rewriting the table. Its check (the value is one of the
policies, ``schedapp_job_dst_policy_valid``, as for ``misfire_policy``) is added NOT VALID on
PostgreSQL (a brief lock) and validated in its own transaction, so beats and workers go on
writing while the table is scanned. Not atomic; each step can be run again.
"""

from django.db import migrations, models, transaction

# Frozen here, as the policies were when this migration was written.
POLICIES = [
    ("gap_end+first", "Gap: at its end; repeated hour: first offset (default)"),
    ("gap_end+second", "Gap: at its end; repeated hour: second offset"),
    ("gap_end+both", "Gap: at its end; repeated hour: both offsets"),
    ("skip+first", "Gap: skipped; repeated hour: first offset"),
    ("skip+second", "Gap: skipped; repeated hour: second offset"),
    ("skip+both", "Gap: skipped; repeated hour: both offsets"),
    ("celery", "As Celery beat (gap: at the old offset; repeated hour: first offset)"),
]
DEFAULT = "gap_end+first"
HELP_TEXT = (
    "A cron's daylight-saving rule: a time the clocks skip runs at the gap's end or is "
    "skipped; one they repeat runs at the first offset, the second, or both; or 'celery': as "
    "Celery beat."
)
VALID = models.CheckConstraint(
    condition=models.Q(("dst_policy__in", [value for value, _ in POLICIES])),
    name="schedapp_job_dst_policy_valid",
    violation_error_message="dst_policy must be one of "
    + ", ".join(value for value, _ in POLICIES)
    + ".",
)


def _field():
    return models.CharField(
        choices=POLICIES,
        default=DEFAULT,
        db_default=DEFAULT,
        help_text=HELP_TEXT,
        max_length=16,
    )


def _column(model):
    """The field as the schema editor adds it: named, and bound to the (historical) model,
    which the database default's SQL is compiled against."""
    field = _field()
    field.set_attributes_from_name("dst_policy")
    field.model = model
    return field


def add_column(apps, schema_editor):
    model = apps.get_model("schedapp", "Job")
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        columns = connection.introspection.get_table_description(cursor, model._meta.db_table)
    if "dst_policy" not in {column.name for column in columns}:
        with transaction.atomic(using=connection.alias):
            schema_editor.add_field(model, _column(model))


def drop_column(apps, schema_editor):
    model = apps.get_model("schedapp", "Job")
    schema_editor.remove_field(model, _column(model))


def add_constraint(apps, schema_editor):
    """PostgreSQL: NOT VALID, then VALIDATE, each committed on its own; elsewhere as usual."""
    model = apps.get_model("schedapp", "Job")
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        with transaction.atomic(using=connection.alias):
            schema_editor.add_constraint(model, VALID)
        return
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT convalidated FROM pg_constraint WHERE conname = %s AND conrelid = %s::regclass",
            [VALID.name, model._meta.db_table],
        )
        found = cursor.fetchone()
    if found is None:
        with transaction.atomic(using=connection.alias):
            schema_editor.execute(f"{VALID.create_sql(model, schema_editor)} NOT VALID")
    if found is None or not found[0]:
        with transaction.atomic(using=connection.alias):
            schema_editor.execute(
                f"ALTER TABLE {schema_editor.quote_name(model._meta.db_table)} "
                f"VALIDATE CONSTRAINT {schema_editor.quote_name(VALID.name)}"
            )


def drop_constraint(apps, schema_editor):
    schema_editor.remove_constraint(apps.get_model("schedapp", "Job"), VALID)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("schedapp", "0022_supersede_index")]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(add_column, drop_column)],
            state_operations=[migrations.AddField(model_name="job", name="dst_policy", field=_field())],
        ),
        # Separate: the constraint's model (``apps``) must know the column.
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(add_constraint, drop_constraint)],
            state_operations=[migrations.AddConstraint(model_name="job", constraint=VALID)],
        ),
    ]
