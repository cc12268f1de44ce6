"""schedapp's hand-written SQL: named queries in ``queries.sql``, read once, and the PL/pgSQL
functions some of them call, as they are today, in ``functions.sql``.

Everything schedapp says to the database in SQL rather than through the ORM is there, in two
files a reviewer can read top to bottom; code asks for a statement by name. Migrations create
the functions from frozen copies of their own, never from ``functions.sql``: a test holds the
database the migrations build to that file (``tests/integration/test_sql_functions.py``).
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

from ..policies import (
    MAX_PRIORITY,
    MAX_WAIT_DOUBLINGS,
    MIN_PRIORITY,
    RUN_RECENT,
    RUN_RECENT_LATE_AFTER,
)

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)

# Every function as it is today, under its versioned name (functions.sql's header has the rule).
FUNCTIONS_FILE = Path(__file__).parent / "functions.sql"

# Functions the previous release calls, kept for its processes during a rolling deploy; the
# next release drops them (a migration of its own) and takes them off this list. Signatures as
# PostgreSQL prints them (pg_get_function_identity_arguments).
RETIRED_FUNCTIONS = frozenset(
    {
        "schedapp_admit_run(p_job bigint, p_token bigint, p_worker text, p_admission text)",
        "schedapp_renew_leases(p_jobs bigint[], p_tokens bigint[])",
        "schedapp_succeed_run(p_job bigint, p_token bigint, p_scheduled_for timestamp with time"
        " zone, p_next timestamp with time zone, p_once boolean, p_cron text, p_timezone text,"
        " p_interval interval, p_anchor timestamp with time zone)",
        "schedapp_succeed_runs(p_jobs bigint[], p_tokens bigint[], p_scheduled_for timestamp"
        " with time zone[], p_next timestamp with time zone[], p_once boolean[], p_cron text[],"
        " p_timezone text[], p_interval interval[], p_anchor timestamp with time zone[])",
        "schedapp_succeed_run_v2(p_job bigint, p_token bigint, p_scheduled_for timestamp with"
        " time zone, p_next timestamp with time zone, p_once boolean, p_cron text, p_timezone"
        " text, p_interval interval, p_anchor timestamp with time zone)",
        "schedapp_admit_run_v3(p_job bigint, p_token bigint, p_worker text, p_admission text)",
        "schedapp_admit_run_v4(p_job bigint, p_token bigint, p_worker text, p_admission text)",
        "schedapp_renew_leases_v4(p_jobs bigint[], p_tokens bigint[])",
        "schedapp_succeed_runs_v1(p_jobs bigint[], p_tokens bigint[], p_scheduled_for timestamp"
        " with time zone[], p_next timestamp with time zone[], p_once boolean[], p_cron text[],"
        " p_timezone text[], p_interval interval[], p_anchor timestamp with time zone[])",
        "schedapp_succeed_run_v3(p_job bigint, p_token bigint, p_scheduled_for timestamp with"
        " time zone, p_next timestamp with time zone, p_once boolean, p_cron text, p_timezone"
        " text, p_interval interval, p_anchor timestamp with time zone)",
        "schedapp_succeed_runs_v2(p_jobs bigint[], p_tokens bigint[], p_scheduled_for timestamp"
        " with time zone[], p_next timestamp with time zone[], p_once boolean[], p_cron text[],"
        " p_timezone text[], p_interval interval[], p_anchor timestamp with time zone[])",
        "schedapp_admit_run_v5(p_job bigint, p_token bigint, p_worker text, p_admission text)",
        "schedapp_renew_leases_v5(p_jobs bigint[], p_tokens bigint[])",
        "schedapp_succeed_run_v4(p_job bigint, p_token bigint, p_scheduled_for timestamp with"
        " time zone, p_next timestamp with time zone, p_once boolean, p_cron text, p_timezone"
        " text, p_interval interval, p_anchor timestamp with time zone)",
        "schedapp_succeed_runs_v3(p_jobs bigint[], p_tokens bigint[], p_scheduled_for timestamp"
        " with time zone[], p_next timestamp with time zone[], p_once boolean[], p_cron text[],"
        " p_timezone text[], p_interval interval[], p_anchor timestamp with time zone[])",
    }
)


@cache
def queries() -> dict[str, str]:
    """Every named query, its comments stripped and ``{due_levels}``, ``{claim_rows}``, the
    priority bounds, the dispatch wait's cap and run_recent's lateness filled in."""
    raw = _blocks((Path(__file__).parent / "queries.sql").read_text())
    constants = {
        "MAX_PRIORITY": str(MAX_PRIORITY),
        "MIN_PRIORITY": str(MIN_PRIORITY),
        "MAX_WAIT_DOUBLINGS": str(MAX_WAIT_DOUBLINGS),
        "RUN_RECENT": RUN_RECENT,
        "RUN_RECENT_LATE_AFTER": str(RUN_RECENT_LATE_AFTER.total_seconds()),
    }
    # Blocks other blocks include, filled in first.
    parts = {name: _fill(raw[name], constants) for name in ("due_levels", "claim_rows")}
    return {name: _fill(sql, {**constants, **parts}) for name, sql in raw.items()}


def query(name: str) -> str:
    """The statement named ``name`` in queries.sql (KeyError for an unknown name)."""
    return queries()[name]


def _blocks(text: str) -> dict[str, str]:
    """A file's "-- name: <name>" blocks, each without its comment and blank lines."""
    parts = _NAME.split(text)[1:]
    return {
        name: "\n".join(
            line for line in body.splitlines() if line.strip() and not line.startswith("--")
        )
        for name, body in zip(parts[::2], parts[1::2], strict=True)
    }


def _fill(sql: str, values: dict[str, str]) -> str:
    for key, value in values.items():
        sql = sql.replace("{" + key + "}", value)
    return sql


# The job table's CHECK constraints that PostgreSQL holds in a shorter form than Django's, as
# they are today (checks.sql's header says why). Migrations apply frozen copies.
CHECKS_FILE = Path(__file__).parent / "checks.sql"


@cache
def job_checks() -> dict[str, str]:
    """Each constraint's name and condition, as checks.sql writes them (comments left out)."""
    return _blocks(CHECKS_FILE.read_text())
