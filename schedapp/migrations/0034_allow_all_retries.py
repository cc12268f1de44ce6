"""Retries of allow_all occurrences (``JobRun.retry_at``): a retry is a run of its own, written
when the attempt before it fails (or is lost) and waiting, with its due time, until a beat
claims it; the partial index holds only those waiting, so the claim's look costs nothing when
there are none. The column is added without a default (NULL: nothing waits), the index
CONCURRENTLY on PostgreSQL, as 0033's.
"""

from django.db import migrations, models

RETRY_DUE = models.Index(
    condition=models.Q(("retry_at__isnull", False)),
    fields=["retry_at"],
    name="schedapp_run_retry_due",
)


def create(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        schema_editor.add_index(apps.get_model("schedapp", "JobRun"), RETRY_DUE)
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "SELECT 1 FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE c.relname = 'schedapp_run_retry_due' AND NOT i.indisvalid"
        )
        if cursor.fetchone():
            cursor.execute("DROP INDEX CONCURRENTLY IF EXISTS schedapp_run_retry_due")
        cursor.execute(
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS schedapp_run_retry_due "
            'ON schedapp_jobrun ("retry_at") WHERE "retry_at" IS NOT NULL'
        )


def drop(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        schema_editor.remove_index(apps.get_model("schedapp", "JobRun"), RETRY_DUE)
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("DROP INDEX CONCURRENTLY IF EXISTS schedapp_run_retry_due")


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("schedapp", "0033_run_lease_indexes")]

    operations = [
        migrations.AddField(
            model_name="jobrun",
            name="retry_at",
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.AddIndex(model_name="jobrun", index=RETRY_DUE)],
            database_operations=[migrations.RunPython(create, drop, elidable=False)],
        ),
    ]
