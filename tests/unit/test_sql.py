"""The named queries: every name the code asks for is in queries.sql, and every query there is
asked for (a statement nobody runs is dead text a reviewer still has to read)."""

from __future__ import annotations

import re
from pathlib import Path

from schedapp.sql import queries

ROOT = Path(__file__).resolve().parents[2]


def asked_for() -> set[str]:
    names: set[str] = set()
    for folder in ("schedapp", "bench", "tests"):
        for path in (ROOT / folder).rglob("*.py"):
            names.update(re.findall(r"""\bquery\(["'](\w+)["']\)""", path.read_text()))
    return names


def test_every_query_asked_for_exists_and_every_query_is_asked_for():
    known = set(queries())
    assert asked_for() - known == set()
    # due_levels and claim_rows are parts of others
    assert known - asked_for() - {"due_levels", "claim_rows"} == set()


def test_queries_are_filled_in():
    for name, sql in queries().items():
        assert "{" not in sql and "--" not in sql, name
    assert "generate_series(9, 0, -1)" in queries()["claim_due_jobs"]
