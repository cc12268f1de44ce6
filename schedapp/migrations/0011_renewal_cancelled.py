"""A renewal that finds the run it renews closed by a cancel (``api.cancel`` closes a run in
flight at once, and the task, revoked, may run on to its end) reports it ``cancelled``: the
operator's act, not the alarm of a lease lost to a reaper or another beat."""

import importlib

from django.db import migrations

_0009 = importlib.import_module("schedapp.migrations.0009_renewal_unstarted")

_FINISHED = "                WHEN r.status IN ('succeeded', 'failed') AND NOT r.stale THEN 'finished'\n"
RENEW_LEASES = _0009.RENEW_LEASES.replace(
    _FINISHED, "                WHEN r.status = 'cancelled' THEN 'cancelled'\n" + _FINISHED
)
assert RENEW_LEASES.count("THEN 'cancelled'") == 1, RENEW_LEASES


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(RENEW_LEASES)


def restore(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(_0009.RENEW_LEASES)


class Migration(migrations.Migration):
    dependencies = [("schedapp", "0010_retried_door_first")]

    operations = [migrations.RunPython(create, restore, elidable=False)]
