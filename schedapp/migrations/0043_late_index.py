"""The deadline pass's index of pending jobs with a start deadline becomes (start_deadline,
scheduled_for): the pass reads, per distinct start deadline, the range of occurrences older
than it, instead of every pending job with a start deadline on every pass (issue 30: 100,000
jobs of a burst, 125-150 ms a pass). Built CONCURRENTLY before the old one is dropped, as
0036 built it (not atomic; a build an interruption left invalid is dropped and built again)."""

from django.db import migrations, models
from django.db.models import Q

PENDING = Q(start_deadline__isnull=False, state__in=["scheduled", "running"])
NEW = models.Index(
    fields=["start_deadline", "scheduled_for"], name="schedapp_job_late", condition=PENDING
)
OLD = models.Index(fields=["scheduled_for"], name="schedapp_job_start_deadline", condition=PENDING)


def _swap(apps, schema_editor, add: models.Index, remove: models.Index) -> None:
    job = apps.get_model("schedapp", "Job")
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        schema_editor.add_index(job, add)
        schema_editor.remove_index(job, remove)
        return
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE c.relname = %s",
            [add.name],
        )
        row = cursor.fetchone()
        if not (row and row[0]):
            if row:
                cursor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {add.name}")
            cursor.execute(str(add.create_sql(job, schema_editor, concurrently=True)))
        cursor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {remove.name}")


def forward(apps, schema_editor):
    _swap(apps, schema_editor, NEW, OLD)


def backward(apps, schema_editor):
    _swap(apps, schema_editor, OLD, NEW)


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("schedapp", "0042_backfill")]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveIndex(model_name="job", name=OLD.name),
                migrations.AddIndex(model_name="job", index=NEW),
            ],
            database_operations=[migrations.RunPython(forward, backward, elidable=False)],
        )
    ]
