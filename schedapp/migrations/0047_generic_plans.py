"""The door and the successes run generic plans: ``schedapp_admit_run_v6``,
``schedapp_succeed_run_v5`` and ``schedapp_succeed_runs_v4`` get
``SET plan_cache_mode = force_generic_plan``. Over the partitioned run history (0046)
PL/pgSQL kept custom plans, planning each statement against the partitioned table on every
call; a generic plan prunes to the run's partition at run time. Arguments and decisions are
unchanged, so the names stay (``schedapp/sql/functions.sql``, "A change that keeps both
arguments and meaning"). The renewal keeps PL/pgSQL's choice: it reads its runs by an array
of ids, which a generic plan cannot prune by.

The statements below are frozen: written for this migration, never read from that file.
"""

from django.db import migrations

SIGNATURES = [
    "schedapp_admit_run_v6(bigint, bigint, text, text, bigint)",
    "schedapp_succeed_run_v5(bigint, bigint, timestamptz, timestamptz, boolean, text, text,"
    " interval, timestamptz, bigint)",
    "schedapp_succeed_runs_v4(bigint[], bigint[], timestamptz[], timestamptz[], boolean[],"
    " text[], text[], interval[], timestamptz[], bigint[])",
]


def generic(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for signature in SIGNATURES:
            schema_editor.execute(
                f"ALTER FUNCTION {signature} SET plan_cache_mode = force_generic_plan"
            )


def plpgsql_choice(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for signature in SIGNATURES:
            schema_editor.execute(f"ALTER FUNCTION {signature} RESET plan_cache_mode")


class Migration(migrations.Migration):
    dependencies = [("schedapp", "0046_partitioned_runs")]

    operations = [migrations.RunPython(generic, plpgsql_choice, elidable=False)]
