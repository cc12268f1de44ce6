"""The deadline pass's overrun look reads only the running jobs claimed longer ago than the
smallest max runtime among them (issue 30: it read all 100,000 jobs of a burst in flight and
probed each one's run, 130-215 ms a pass). The claim stamps ``Job.claimed_at`` (a new nullable
column: no table rewrite); two partial indexes of the running jobs with a max runtime serve
the look, keyed on max_runtime and on claimed_at, and replace the one keyed on id. The
indexes are built CONCURRENTLY and the old one dropped after, as 0043 swapped the late look's
(not atomic; a build an interruption left invalid is dropped and built again). A job claimed
by the previous release during a rolling deploy has no claimed_at: the look reads it as
before."""

from django.db import migrations, models
from django.db.models import Q

RUNNING = Q(max_runtime__isnull=False, state="running")
RUNTIMES = models.Index(fields=["max_runtime"], name="schedapp_job_runtimes", condition=RUNNING)
OVERRUN = models.Index(fields=["claimed_at"], name="schedapp_job_overrun", condition=RUNNING)
OLD = models.Index(fields=["id"], name="schedapp_job_max_runtime", condition=RUNNING)


def _build(schema_editor, model, index: models.Index) -> None:
    """``index``, CONCURRENTLY on PostgreSQL, unless a valid one of that name is there."""
    if schema_editor.connection.vendor != "postgresql":
        schema_editor.add_index(model, index)
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE c.relname = %s",
            [index.name],
        )
        row = cursor.fetchone()
        if row and row[0]:
            return
        if row:
            cursor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {index.name}")
        cursor.execute(str(index.create_sql(model, schema_editor, concurrently=True)))


def _drop(schema_editor, model, index: models.Index) -> None:
    if schema_editor.connection.vendor != "postgresql":
        schema_editor.remove_index(model, index)
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {index.name}")


def forward(apps, schema_editor):
    job = apps.get_model("schedapp", "Job")
    _build(schema_editor, job, RUNTIMES)
    _build(schema_editor, job, OVERRUN)
    _drop(schema_editor, job, OLD)


def backward(apps, schema_editor):
    job = apps.get_model("schedapp", "Job")
    _build(schema_editor, job, OLD)
    _drop(schema_editor, job, OVERRUN)
    _drop(schema_editor, job, RUNTIMES)


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("schedapp", "0043_late_index")]

    operations = [
        migrations.AddField(
            model_name="job",
            name="claimed_at",
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveIndex(model_name="job", name=OLD.name),
                migrations.AddIndex(model_name="job", index=RUNTIMES),
                migrations.AddIndex(model_name="job", index=OVERRUN),
            ],
            database_operations=[migrations.RunPython(forward, backward, elidable=False)],
        ),
    ]
