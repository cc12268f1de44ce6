"""The door recognises its own retried call before it looks at the job's state: a door whose
commit landed but whose reply was lost is admitted again even if the job was paused in
between (a pause lets a run in flight finish). Refusing it left the run ``running`` with
nothing running it, and the reaper counted the lease's expiry as a failed attempt."""

import importlib

from django.db import migrations

_0008 = importlib.import_module("schedapp.migrations.0008_dispatch_wait")

_RETRIED = (
    "    ELSIF r.status = 'running' AND r.admission = p_admission THEN\n"
    "        verdict := 'admitted';  -- this same door call again: its commit landed, its reply did not\n"
)
_TOKEN = "    IF j.token <> p_token THEN\n        verdict := 'stale_token';\n"
ADMIT_RUN = _0008.ADMIT_RUN.replace(_RETRIED, "").replace(_TOKEN, _TOKEN + _RETRIED)
assert ADMIT_RUN.index(_RETRIED) < ADMIT_RUN.index("'job_paused'"), ADMIT_RUN


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(ADMIT_RUN)


def restore(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(_0008.ADMIT_RUN)


class Migration(migrations.Migration):
    dependencies = [("schedapp", "0009_renewal_unstarted")]

    operations = [migrations.RunPython(create, restore, elidable=False)]
