"""The admin's "needs attention" page: a proxy of ``Breach`` (listed on the admin index, no
table), the open breaches by kind and opening time, and the notifications that failed for good.

Both indexes partial (the open breaches; the failed deliveries), built CONCURRENTLY on
PostgreSQL (the migration is not atomic) so that beats, workers and delivery loops go on
writing; a build left invalid by an interruption is dropped and built again. Written out
rather than through ``django.contrib.postgres`` (which needs psycopg even on SQLite).
"""

from django.db import migrations, models

BREACH_INDEX = models.Index(
    condition=models.Q(("cleared_at__isnull", True)),
    fields=["kind", "opened_at", "id"],
    name="schedapp_breach_open_kind",
)
FAILED_INDEX = models.Index(
    condition=models.Q(("failed_at__isnull", False)),
    fields=["failed_at", "id"],
    name="schedapp_notification_failed",
)
INDEXES = [
    (
        "Breach",
        BREACH_INDEX,
        'ON schedapp_breach ("kind", "opened_at", "id") WHERE "cleared_at" IS NULL',
    ),
    (
        "Notification",
        FAILED_INDEX,
        'ON schedapp_notification ("failed_at", "id") WHERE "failed_at" IS NOT NULL',
    ),
]
INVALID = (
    "SELECT 1 FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
    "WHERE c.relname = %s AND NOT i.indisvalid"
)


def create(apps, schema_editor):
    for model, index, where in INDEXES:
        if schema_editor.connection.vendor != "postgresql":
            schema_editor.add_index(apps.get_model("schedapp", model), index)
            continue
        with schema_editor.connection.cursor() as cursor:
            cursor.execute(INVALID, [index.name])
            if cursor.fetchone():
                cursor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {index.name}")
            cursor.execute(f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {index.name} {where}")


def drop(apps, schema_editor):
    for model, index, _where in INDEXES:
        if schema_editor.connection.vendor != "postgresql":
            schema_editor.remove_index(apps.get_model("schedapp", model), index)
            continue
        with schema_editor.connection.cursor() as cursor:
            cursor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {index.name}")


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("schedapp", "0038_job_notify")]

    operations = [
        migrations.CreateModel(
            name="Attention",
            fields=[],
            options={
                "verbose_name": "needs attention",
                "verbose_name_plural": "needs attention",
                "proxy": True,
                "indexes": [],
                "constraints": [],
            },
            bases=("schedapp.breach",),
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddIndex(model_name="breach", index=BREACH_INDEX),
                migrations.AddIndex(model_name="notification", index=FAILED_INDEX),
            ],
            database_operations=[migrations.RunPython(create, drop, elidable=False)],
        ),
    ]
