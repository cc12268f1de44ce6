"""The index of the jobs following a calendar (``Job.calendar``, 0029): what the ORM's PROTECT
asks when a calendar is deleted.

Built CONCURRENTLY on PostgreSQL (the migration is not atomic): beats and workers go on writing
while the table is read; a build left invalid by an interruption is dropped and built again.
Partial (only rows with a calendar): most jobs follow none.
Written out rather than through ``django.contrib.postgres`` (which needs psycopg even where
the database is SQLite, the demo's).
"""

from django.db import migrations, models

INDEX = models.Index(
    condition=models.Q(("calendar__isnull", False)),
    fields=["calendar"],
    name="schedapp_job_calendar",
)
CREATE = (
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS schedapp_job_calendar "
    'ON schedapp_job ("calendar_id") WHERE "calendar_id" IS NOT NULL'
)
INVALID = (
    "SELECT 1 FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
    "WHERE c.relname = 'schedapp_job_calendar' AND NOT i.indisvalid"
)
DROP = "DROP INDEX CONCURRENTLY IF EXISTS schedapp_job_calendar"


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
    dependencies = [("schedapp", "0029_job_calendars")]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.AddIndex(model_name="job", index=INDEX)],
            database_operations=[migrations.RunPython(create, drop, elidable=False)],
        )
    ]
