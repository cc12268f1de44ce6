"""The job table's checks and partial indexes for deadlines (0035's columns), added without
stopping beats and workers on a large table: on PostgreSQL each check is added NOT VALID (a
brief lock, no scan) and validated in a transaction of its own (a scan that lets writes go on),
and each index is built CONCURRENTLY (the migration is not atomic; a build an interruption left
invalid is dropped and built again), as 0020's checks and 0022's indexes. Elsewhere (SQLite,
the demo) as usual. The two ``_readable`` checks keep a duration Python can read (PostgreSQL
only, as 0016 and 0020 add theirs). Written out rather than through ``django.contrib.postgres``.
"""

import datetime

from django.db import migrations, models

DURATION_MAX_DAYS = 900_000_000
READABLE = ("start_deadline", "max_runtime")

INDEXES = [
    models.Index(
        condition=models.Q(("start_deadline__isnull", False), ("state__in", ["scheduled", "running"])),
        fields=["scheduled_for"],
        name="schedapp_job_start_deadline",
    ),
    models.Index(
        condition=models.Q(("max_runtime__isnull", False), ("state", "running")),
        fields=["id"],
        name="schedapp_job_max_runtime",
    ),
    models.Index(
        condition=models.Q(("finish_by__isnull", False)),
        fields=["finish_by_at"],
        name="schedapp_job_finish_by",
    ),
]
CHECKS = [
    models.CheckConstraint(
        condition=models.Q(
            ("finish_by_at__isnull", True),
            models.Q(
                ("finish_by_at__gte", datetime.datetime(1, 1, 2, 0, 0, tzinfo=datetime.UTC)),
                ("finish_by_at__lte", datetime.datetime(9999, 12, 30, 0, 0, tzinfo=datetime.UTC)),
            ),
            _connector="OR",
        ),
        name="schedapp_job_finish_by_at_in_range",
        violation_error_message="finish_by_at must be a time between years 1 and 9999.",
    ),
    models.CheckConstraint(
        condition=models.Q(
            ("start_deadline__isnull", True),
            ("start_deadline__gt", datetime.timedelta(0)),
            _connector="OR",
        ),
        name="schedapp_job_start_deadline_in_range",
        violation_error_message="start_deadline must be more than 0.",
    ),
    models.CheckConstraint(
        condition=models.Q(
            ("max_runtime__isnull", True),
            ("max_runtime__gt", datetime.timedelta(0)),
            _connector="OR",
        ),
        name="schedapp_job_max_runtime_in_range",
        violation_error_message="max_runtime must be more than 0.",
    ),
]


def _readable_sql() -> list[tuple[str, str]]:
    return [
        (
            f"schedapp_job_{column}_readable",
            f"CHECK ({column} IS NULL OR {column} <= interval '{DURATION_MAX_DAYS} days')",
        )
        for column in READABLE
    ]


def create(apps, schema_editor):
    job = apps.get_model("schedapp", "Job")
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        for index in INDEXES:
            schema_editor.add_index(job, index)
        for check in CHECKS:
            schema_editor.add_constraint(job, check)
        return
    checks = [
        (c.name, str(c.constraint_sql(job, schema_editor)).split(" ", 2)[-1]) for c in CHECKS
    ]
    with connection.cursor() as cursor:
        for name, sql in checks + _readable_sql():
            cursor.execute(
                "SELECT 1 FROM pg_constraint WHERE conname = %s AND conrelid = 'schedapp_job'::regclass",
                [name],
            )
            if not cursor.fetchone():
                cursor.execute(f"ALTER TABLE schedapp_job ADD CONSTRAINT {name} {sql} NOT VALID")
            cursor.execute(f"ALTER TABLE schedapp_job VALIDATE CONSTRAINT {name}")
        for index in INDEXES:
            cursor.execute(
                "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
                "WHERE c.relname = %s",
                [index.name],
            )
            row = cursor.fetchone()
            if row and row[0]:
                continue
            if row:
                cursor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {index.name}")
            cursor.execute(str(index.create_sql(job, schema_editor, concurrently=True)))


def drop(apps, schema_editor):
    job = apps.get_model("schedapp", "Job")
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        for check in CHECKS:
            schema_editor.remove_constraint(job, check)
        for index in INDEXES:
            schema_editor.remove_index(job, index)
        return
    with connection.cursor() as cursor:
        for name, _ in [(c.name, "") for c in CHECKS] + _readable_sql():
            cursor.execute(f"ALTER TABLE schedapp_job DROP CONSTRAINT IF EXISTS {name}")
        for index in INDEXES:
            cursor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {index.name}")


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("schedapp", "0035_deadlines")]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                *(migrations.AddIndex(model_name="job", index=index) for index in INDEXES),
                *(migrations.AddConstraint(model_name="job", constraint=c) for c in CHECKS),
            ],
            database_operations=[migrations.RunPython(create, drop, elidable=False)],
        )
    ]
