"""What the partitioning migrations' tests watch: PostgreSQL's own word that an attach read no
row (its DEBUG1 notices, collected while migrating), and the files of a table and its indexes
(unchanged: nothing rewritten or built)."""

from __future__ import annotations

from django.db import connection
from django.db.migrations.executor import MigrationExecutor

FILES = """
SELECT c.relname, c.relfilenode FROM pg_class c
WHERE c.oid = %s::regclass
   OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = %s::regclass)
"""


def files(table: str) -> dict[str, int]:
    """The file of ``table`` and of each of its indexes, by name."""
    with connection.cursor() as cursor:
        cursor.execute(FILES, [table, table])
        return dict(cursor.fetchall())


def migrate_noting(target: tuple[str, str]) -> list[str]:
    """Migrate to ``target``; the notices PostgreSQL sent meanwhile, down to DEBUG1."""
    notices: list[str] = []
    connection.ensure_connection()
    raw = connection.connection

    def handler(diagnostic) -> None:  # type: ignore[no-untyped-def]
        notices.append(diagnostic.message_primary or "")

    raw.add_notice_handler(handler)
    with connection.cursor() as cursor:
        cursor.execute("SET client_min_messages = debug1")
    try:
        MigrationExecutor(connection).migrate([target])
    finally:
        raw.remove_notice_handler(handler)
        with connection.cursor() as cursor:
            cursor.execute("RESET client_min_messages")
    return notices
