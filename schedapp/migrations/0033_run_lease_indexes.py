"""The indexes of runs in flight under a lease of their own (0032's ``JobRun.lease_expires_at``,
set on allow_all runs only, cleared when they end): per job, what the claim counts against
``max_concurrent``; by expiry, what the reaper looks for. Partial, so they hold only runs in
flight, and only that column: the other runs' admission and completion updates stay
heap-only.

Built CONCURRENTLY on PostgreSQL (the migration is not atomic), as 0022's: the run table is
the largest, and beats and workers go on writing while it is read; a build left invalid by an
interruption is dropped and built again.
"""

from django.db import migrations, models

IN_FLIGHT = models.Index(
    condition=models.Q(("lease_expires_at__isnull", False)),
    fields=["job", "lease_expires_at"],
    name="schedapp_run_in_flight",
)
LEASED = models.Index(
    condition=models.Q(("lease_expires_at__isnull", False)),
    fields=["lease_expires_at"],
    name="schedapp_run_leased",
)
COLUMNS = {"schedapp_run_in_flight": '"job_id", "lease_expires_at"', "schedapp_run_leased": '"lease_expires_at"'}


def create(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        for index in (IN_FLIGHT, LEASED):
            schema_editor.add_index(apps.get_model("schedapp", "JobRun"), index)
        return
    with schema_editor.connection.cursor() as cursor:
        for name, columns in COLUMNS.items():
            cursor.execute(
                "SELECT 1 FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
                "WHERE c.relname = %s AND NOT i.indisvalid",
                [name],
            )
            if cursor.fetchone():
                cursor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
            cursor.execute(
                f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON schedapp_jobrun ({columns}) "
                'WHERE "lease_expires_at" IS NOT NULL'
            )


def drop(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        for index in (IN_FLIGHT, LEASED):
            schema_editor.remove_index(apps.get_model("schedapp", "JobRun"), index)
        return
    with schema_editor.connection.cursor() as cursor:
        for name in COLUMNS:
            cursor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("schedapp", "0032_allow_all")]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddIndex(model_name="jobrun", index=IN_FLIGHT),
                migrations.AddIndex(model_name="jobrun", index=LEASED),
            ],
            database_operations=[migrations.RunPython(create, drop, elidable=False)],
        )
    ]
