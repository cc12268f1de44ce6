"""The reset after a test that commits (``transactional_db``, ``django_db(transaction=True)``).

Django empties the database after such a test with ``flush``: on PostgreSQL one ``TRUNCATE`` of
every table (each table and index gets a new file: about 0.17 s on 2 cores, whatever the tables
hold), then the ``post_migrate`` signal writes the content types and permissions again. The
suite's transactional tests (about 400) leave a few rows each: ``DELETE`` of every table in one
transaction, with the checks below, takes about 6 ms. What ``post_migrate`` wrote is left in
place while it is exactly what the last full flush left; any other difference, and a delete
the database refuses, takes Django's own flush again. Every test starts from the rows Django's
flush leaves (only the content types' ids stay put where a flush would renumber them, and the
tables keep their dead rows until autovacuum, which no test of plans depends on: they turn
sequential scans off).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from django.core.management import call_command
from django.db import DatabaseError, connections, transaction
from django.test import TransactionTestCase


class FastReset:
    """Per database alias: the rows ``post_migrate`` wrote after the last full flush, by table.
    ``None`` until the alias was flushed once the full way."""

    def __init__(self, full_flush: Callable[[Any], None]) -> None:
        self._full_flush = full_flush
        self._after_flush: dict[str, dict[str, list[tuple]] | None] = {}
        self.fast = 0  # how many resets were deletes (the test of this module reads it)
        self.full = 0

    def teardown(self, case: TransactionTestCase) -> None:
        """What ``TransactionTestCase._fixture_teardown`` does, per database the test used."""
        if case.available_apps is not None or case.serialized_rollback or case.reset_sequences:
            # Options this suite does not use: Django's own way, which knows them.
            self._full_flush(case)
            return
        for alias in case._databases_names(include_mirrors=False):
            self.reset(alias)

    def reset(self, alias: str) -> None:
        """Leave ``alias`` as Django's flush leaves it."""
        if not self._delete_all(alias):
            self._flush(alias)

    def _flush(self, alias: str) -> None:
        """Django's flush of one alias as ``TransactionTestCase`` calls it, then a note of
        what ``post_migrate`` wrote."""
        call_command("flush", verbosity=0, interactive=False, database=alias, reset_sequences=False)
        tables = _tables(alias)
        self._after_flush[alias] = {t: rows for t in tables if (rows := _rows(alias, t))}
        self.full += 1

    def _delete_all(self, alias: str) -> bool:
        """Empty every table but those ``post_migrate`` filled, if they are as it left them;
        False (nothing done) when they are not, or when a delete was refused."""
        kept = self._after_flush.get(alias)
        if kept is None or any(_rows(alias, t) != rows for t, rows in kept.items()):
            return False
        connection = connections[alias]
        quote = connection.ops.quote_name
        try:
            with transaction.atomic(using=alias), connection.cursor() as cursor:
                deletes = [f"DELETE FROM {quote(t)}" for t in _tables(alias) if t not in kept]
                if connection.vendor == "postgresql":
                    # Django's foreign keys are deferrable: checked at commit, in any order.
                    # One round trip for all the statements (some 35: 15 ms one by one).
                    cursor.execute("; ".join(["SET CONSTRAINTS ALL DEFERRED", *deletes]))
                else:
                    for delete in deletes:
                        cursor.execute(delete)
        except DatabaseError:
            return False  # a foreign key that is not deferrable, say: the full flush
        self.fast += 1
        return True


def _tables(alias: str) -> list[str]:
    """The tables of the installed models, as ``flush`` finds them."""
    return sorted(
        connections[alias].introspection.django_table_names(only_existing=True, include_views=False)
    )


def _rows(alias: str, table: str) -> list[tuple]:
    connection = connections[alias]
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT * FROM {connection.ops.quote_name(table)} ORDER BY 1")
        return cursor.fetchall()


@contextmanager
def installed() -> Iterator[FastReset]:
    """``TransactionTestCase`` resets with a ``FastReset`` while the context is open."""
    original = TransactionTestCase._fixture_teardown
    reset = FastReset(original)

    def _fixture_teardown(case: TransactionTestCase) -> None:
        reset.teardown(case)

    TransactionTestCase._fixture_teardown = _fixture_teardown  # type: ignore[method-assign]
    try:
        yield reset
    finally:
        TransactionTestCase._fixture_teardown = original  # type: ignore[method-assign]
