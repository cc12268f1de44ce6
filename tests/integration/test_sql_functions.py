"""The functions the migrations build are the ones written in schedapp/sql/functions.sql.

The test database is migrated from zero, so this holds the whole chain of frozen copies
(0006-0012, then the versioned names) to the one file a reader trusts: a migration that
forgot a change, or a change to functions.sql without its migration, fails here. Every other
schedapp_* function must be on the retired list, which the next release drops.
"""

from __future__ import annotations

import difflib
import re

import pytest
from django.db import connection

from schedapp.sql import FUNCTIONS_FILE, RETIRED_FUNCTIONS

pytestmark = [pytest.mark.django_db, pytest.mark.postgresql]

SCRATCH = "schedapp_sql_file"

# Every function's full definition as PostgreSQL prints it: name, arguments, result, language
# and body byte for byte. Keyed by the signature, "name(arguments)".
DEFINITIONS = """
SELECT p.proname || '(' || pg_catalog.pg_get_function_identity_arguments(p.oid) || ')',
       pg_catalog.pg_get_functiondef(p.oid)
FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = %s AND p.proname LIKE 'schedapp\\_%%'
"""


def definitions(cursor, schema: str) -> dict[str, str]:
    """The schedapp_* functions of ``schema``, their schema's name taken out of the text."""
    cursor.execute(DEFINITIONS, [schema])
    return {sig: text.replace(f"{schema}.", "", 1) for sig, text in cursor.fetchall()}


def file_definitions(cursor) -> dict[str, str]:
    """functions.sql run as it stands, into a schema of its own (rolled back with the test)."""
    cursor.execute("SELECT current_setting('search_path')")
    (search_path,) = cursor.fetchone()
    cursor.execute(f"CREATE SCHEMA {SCRATCH}")
    cursor.execute(f"SET LOCAL search_path TO {SCRATCH}")
    try:
        cursor.execute(FUNCTIONS_FILE.read_text())
    finally:
        cursor.execute("SELECT set_config('search_path', %s, true)", [search_path])
    return definitions(cursor, SCRATCH)


def test_the_migrated_database_holds_exactly_the_functions_in_schedapp_sql():
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_schema()")
        (schema,) = cursor.fetchone()
        migrated = definitions(cursor, schema)
        written = file_definitions(cursor)

    # Given functions.sql, every function in it under a versioned name
    assert written, "functions.sql defines no function"
    assert all(re.fullmatch(r"schedapp_\w+_v\d+\(.*\)", sig) for sig in written), list(written)
    # Then the migrations built each of them with that very signature and text
    for signature, text in written.items():
        assert signature in migrated, f"no migration creates {signature}"
        diff = difflib.unified_diff(
            migrated[signature].splitlines(),
            text.splitlines(),
            "migrated",
            "functions.sql",
            lineterm="",
        )
        assert migrated[signature] == text, "\n".join(diff)
    # And every other schedapp function in the database is one the next release drops
    assert set(migrated) - set(written) == RETIRED_FUNCTIONS


def test_the_door_and_the_successes_run_generic_plans():
    """Over the partitioned run history PL/pgSQL's own choice stayed on custom plans, planning
    each statement against the partitioned table on every call (bench/README.md, "Generic
    plans for the worker's functions"); a generic plan prunes to the run's partition. The
    renewal keeps that choice: a generic plan cannot prune by its array of run ids
    (test_partitions.py's test of the worker's reads fails with it generic)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT proname, proconfig FROM pg_catalog.pg_proc "
            "WHERE proname LIKE 'schedapp\\_%%' AND pronamespace = current_schema()::regnamespace"
        )
        configs = dict(cursor.fetchall())
    generic = ["plan_cache_mode=force_generic_plan"]
    assert configs["schedapp_admit_run_v6"] == generic
    assert configs["schedapp_succeed_run_v5"] == generic
    assert configs["schedapp_succeed_runs_v4"] == generic
    assert configs["schedapp_renew_leases_v6"] is None
