"""schedapp's hand-written SQL: named queries in ``queries.sql``, read once.

Everything schedapp says to the database in SQL rather than through the ORM is there, in one
file a reviewer can read top to bottom; code asks for a statement by name.
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


@cache
def queries() -> dict[str, str]:
    """Every named query, its comments stripped and ``{due_levels}``, ``{claim_rows}``, the
    priority bounds, the dispatch wait's cap and run_recent's lateness filled in."""
    text = (Path(__file__).parent / "queries.sql").read_text()
    parts = _NAME.split(text)[1:]
    raw = {
        name: "\n".join(
            line for line in body.splitlines() if line.strip() and not line.startswith("--")
        )
        for name, body in zip(parts[::2], parts[1::2], strict=True)
    }
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


def _fill(sql: str, values: dict[str, str]) -> str:
    for key, value in values.items():
        sql = sql.replace("{" + key + "}", value)
    return sql
