"""The index of runs in flight a later occurrence is to cancel (``Job.supersede_at``, set by
the claim for overlap policies cancel_other and terminate_other): each beat's tick asks it.

Built CONCURRENTLY on PostgreSQL (the migration is not atomic): beats and workers go on writing
while the table is read; a build left invalid by an interruption is dropped and built again.
Partial (only rows with a time): it stays as small as the runs in flight under those policies.
Written out rather than through ``django.contrib.postgres`` (which needs psycopg even where
the database is SQLite, the demo's).
"""

from django.db import migrations, models

INDEX = models.Index(
    condition=models.Q(("supersede_at__isnull", False)),
    fields=["supersede_at"],
    name="schedapp_job_supersede",
)
CREATE = (
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS schedapp_job_supersede "
    'ON schedapp_job ("supersede_at") WHERE "supersede_at" IS NOT NULL'
)
INVALID = (
    "SELECT 1 FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
    "WHERE c.relname = 'schedapp_job_supersede' AND NOT i.indisvalid"
)
DROP = "DROP INDEX CONCURRENTLY IF EXISTS schedapp_job_supersede"


def create(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        schema_editor.add_index(apps.get_model("schedapp", "Job"), INDEX)
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(INVALID)
        if cursor.fetchone():
            cursor.execute(DROP)
        cursor.execute(CREATE)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        schema_editor.remove_index(apps.get_model("schedapp", "Job"), INDEX)
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(DROP)


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("schedapp", "0021_overlap_policies")]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.AddIndex(model_name="job", index=INDEX)],
            database_operations=[migrations.RunPython(create, drop, elidable=False)],
        )
    ]
