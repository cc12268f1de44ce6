"""The door moved from the worker's consumer loop to the process that runs the task, so a
worker now holds (and renews) messages it has not admitted yet. A renewal that finds such a
run's job moved on (the message arrived after its lease expired and the occurrence was
dispatched again) reports it ``unstarted``: the door will refuse that copy, nothing ran, and
it is not the alarm a lease lost while running is."""

import importlib

from django.db import migrations

_0006 = importlib.import_module("schedapp.migrations.0006_worker_functions")

RENEW_LEASES = _0006.RENEW_LEASES.replace(
    "                WHEN r.status IN ('succeeded', 'failed') AND NOT r.stale THEN 'finished'\n",
    "                WHEN r.status IN ('succeeded', 'failed') AND NOT r.stale THEN 'finished'\n"
    "                WHEN r.status IS NOT NULL AND r.started_at IS NULL THEN 'unstarted'\n",
)
assert RENEW_LEASES.count("'unstarted'") == 1, RENEW_LEASES


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(RENEW_LEASES)


def restore(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(_0006.RENEW_LEASES)


class Migration(migrations.Migration):
    dependencies = [("schedapp", "0008_dispatch_wait")]

    operations = [migrations.RunPython(create, restore, elidable=False)]
