"""A message no worker started within its lease is sent again with twice the wait, up to 16
leases (``policies.dispatch_wait``): the job counts such dispatches in a row, and the door
gives an admitted run an ordinary lease and resets the count."""

import importlib

from django.db import migrations, models

_0006 = importlib.import_module("schedapp.migrations.0006_worker_functions")

# 0006's door, two changes: it reads the count, and it rewrites the job row whenever the lease
# it finds is not an ordinary one with at least five sixths left (a long dispatch wait is cut
# back to one lease) or the count is not zero.
ADMIT_RUN = _0006.ADMIT_RUN.replace(
    "           lease_expires_at < now() + make_interval(secs => lease_seconds * 5.0 / 6)\n"
    "               AS lease_short INTO j",
    "           (unstarted_dispatches > 0\n"
    "            OR lease_expires_at < now() + make_interval(secs => lease_seconds * 5.0 / 6)\n"
    "            OR lease_expires_at > now() + make_interval(secs => lease_seconds))\n"
    "               AS lease_short INTO j",
).replace(
    "            UPDATE schedapp_job SET lease_expires_at = now() + make_interval(secs => lease_seconds)\n"
    "            WHERE id = p_job;",
    "            UPDATE schedapp_job SET lease_expires_at = now() + make_interval(secs => lease_seconds),\n"
    "                                    unstarted_dispatches = 0\n"
    "            WHERE id = p_job;",
)
assert ADMIT_RUN.count("unstarted_dispatches") == 2, ADMIT_RUN


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(ADMIT_RUN)


def restore(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(_0006.ADMIT_RUN)


class Migration(migrations.Migration):
    dependencies = [("schedapp", "0007_celery_fidelity")]

    operations = [
        migrations.AddField(
            model_name="job",
            name="unstarted_dispatches",
            field=models.PositiveSmallIntegerField(
                db_default=0,
                default=0,
                help_text="Times in a row the current attempt was sent and no worker started it within its lease; each new copy waits twice as long (schedapp.policies.dispatch_wait).",
            ),
        ),
        migrations.RunPython(create, restore, elidable=False),
    ]
