"""Database plumbing shared by beats and worker hooks: the clock, and surviving outages.

Every time a lease or a due check compares with comes from the database server, so beats and
workers on different hosts never disagree about what is due or expired.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any, TypeVar
from weakref import WeakKeyDictionary

from django.db import (
    DEFAULT_DB_ALIAS,
    DatabaseError,
    InterfaceError,
    OperationalError,
    connection,
    connections,
)

from .sql import query

try:  # PostgreSQL's driver: an extra (schedapp[postgres]); SQLite needs none
    import psycopg
except ImportError:  # pragma: no cover - exercised by the packaging check
    psycopg = None  # type: ignore[assignment]

log = logging.getLogger("schedapp.db")
T = TypeVar("T")

# Errors after which the connection is thrown away and the work tried again later.
CONNECTION_ERRORS = (OperationalError, InterfaceError)


def is_postgresql() -> bool:
    return _vendor() == "postgresql"


@lru_cache(maxsize=1)
def _vendor() -> str:
    """The default database's vendor, read once: it is fixed for the process, and every
    access to ``django.db.connection`` goes through a thread-local proxy (the worker's hot
    path asks several times per execution)."""
    return connection.vendor


def db_now() -> datetime:
    """The database server's current time (transaction time on PostgreSQL)."""
    with connection.cursor() as cursor:
        if is_postgresql():
            cursor.execute(query("now"))
            value = cursor.fetchone()[0]
        else:  # SQLite: one machine, so its clock is the only clock there is
            return datetime.now(UTC)
    return value.astimezone(UTC)


def call_function(sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
    """Run one of schedapp's hot statements (a PL/pgSQL function call) on Django's connection,
    through a plain psycopg cursor kept per connection: the worker makes two such calls per
    execution, and Django's cursor wrapper would cost more than the call itself. Errors are
    Django's, as from any other query (``with_retries`` reconnects on them)."""
    db = connections[DEFAULT_DB_ALIAS]  # one thread-local lookup, then plain attributes
    db.ensure_connection()
    raw = db.connection
    with db.wrap_database_errors:
        cursor = _hot_cursors.get(raw)
        if cursor is None or cursor.closed:
            cursor = _hot_cursors[raw] = psycopg.Cursor(raw)
        cursor.execute(sql, params)
        return cursor.fetchall()


# One plain cursor per psycopg connection (weak keys: a closed connection takes its cursor).
_hot_cursors: WeakKeyDictionary[Any, Any] = WeakKeyDictionary()


def reset_connection() -> None:
    """Drop a connection that may be broken, so the next query opens a fresh one."""
    try:
        connection.close()
    except DatabaseError:
        pass


def with_retries(
    fn: Callable[[], T],
    *,
    what: str,
    attempts: int = 8,
    first_delay: float = 0.2,
    max_delay: float = 5.0,
) -> T:
    """Run ``fn``, reconnecting and retrying with backoff while the database is unreachable.

    Used where giving up early loses information (a completion, a heartbeat); after the last
    attempt the error propagates and the lease is left to expire, which is safe.
    """
    delay = first_delay
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except CONNECTION_ERRORS as exc:
            reset_connection()
            if attempt == attempts:
                raise
            log.warning(
                "database unavailable during %s (attempt %d/%d): %s; retrying in %.1fs",
                what,
                attempt,
                attempts,
                exc,
                delay,
                extra={"action": "db_retry", "what": what},
            )
            time.sleep(delay)
            delay = min(delay * 2, max_delay)
    raise AssertionError("unreachable")


NOTIFY_CHANNEL = "schedapp"


def notify_due(when: datetime | None = None, delay_seconds: float | None = None) -> None:
    """Wake sleeping beats (PostgreSQL NOTIFY, sent when the transaction commits).

    The payload is the due time as epoch seconds in the database's clock, so a beat can ignore
    jobs due after it would wake anyway. A no-op on databases without LISTEN/NOTIFY.
    """
    if not is_postgresql():
        return
    with connection.cursor() as cursor:
        if when is not None:
            cursor.execute(query("notify_at"), [NOTIFY_CHANNEL, f"{when.timestamp():.6f}"])
        else:
            cursor.execute(
                query("notify_after"), [NOTIFY_CHANNEL, float(delay_seconds or 0.0)]
            )
