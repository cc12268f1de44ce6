"""Tags on jobs (``Job.tags``: a JSON list of labels), and on PostgreSQL a GIN index for the
jobs carrying a tag (``tags @> '["billing"]'``: the admin's filter, ``api.tagged``).

The column is added with a database default (an empty list): no rewrite or scan, and rows an
older release's processes insert during a rolling deploy get no tags. The index is built
CONCURRENTLY (the migration is not atomic), written out rather than through
``django.contrib.postgres``, which needs psycopg even where the database is SQLite; it is
PostgreSQL's alone and not in Django's model state (SQLite filters by scanning the demo's few
jobs). Partial, untagged jobs left out: GIN gives a row without keys an entry of its own, and
every claim and completion writes a new version of the job's row, so without the condition
every one of them would write to this index too. A build left invalid by an interruption is
dropped and built again.
"""

from django.db import migrations, models

CREATE = (
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS schedapp_job_tags "
    """ON schedapp_job USING gin ("tags" jsonb_path_ops) WHERE "tags" <> '[]'::jsonb"""
)
INVALID = (
    "SELECT 1 FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
    "WHERE c.relname = 'schedapp_job_tags' AND NOT i.indisvalid"
)
DROP = "DROP INDEX CONCURRENTLY IF EXISTS schedapp_job_tags"


def create(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(INVALID)
        if cursor.fetchone():
            cursor.execute(DROP)
        cursor.execute(CREATE)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(DROP)


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("schedapp", "0025_audit_trail")]

    operations = [
        migrations.AddField(
            model_name="job",
            name="tags",
            field=models.JSONField(blank=True, db_default=[], default=list),
        ),
        migrations.RunPython(create, drop, elidable=False),
    ]
