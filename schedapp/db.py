"""Database plumbing shared by beats and worker hooks: the clock, and surviving outages
(what differs between databases is in ``schedapp.store``).

Every time a lease or a due check compares with comes from the database server, so beats and
workers on different hosts never disagree about what is due or expired.
"""

from __future__ import annotations

import logging
import os
import stat
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any, TypeVar

from django.db import (
    DatabaseError,
    InterfaceError,
    OperationalError,
    connection,
    connections,
    transaction,
)

from .conf import get_settings
from .store import get_store

log = logging.getLogger("schedapp.db")
T = TypeVar("T")

# Errors after which the connection is thrown away and the work tried again later.
CONNECTION_ERRORS = (OperationalError, InterfaceError)


def is_postgresql() -> bool:
    """Whether the store is PostgreSQL's (code that differs by database belongs in
    ``schedapp.store``; this is for what only shows it, such as the admin)."""
    return get_store().name == "postgresql"


def db_now() -> datetime:
    """The database server's current time (transaction time on PostgreSQL)."""
    return get_store().now()


@contextmanager
def beat_transaction() -> Iterator[None]:
    """A transaction of a beat's (a claim, a release, a quarantine, the declared jobs' sync)
    that the server ends if it stalls idle longer than ``SCHEDAPP_BEAT_TRANSACTION_TIMEOUT``:
    a beat stopped inside one (SIGSTOP, a stalled VM) would otherwise hold row locks that hide
    those jobs from every other beat and from the reaper until it woke.

    The limit is the transaction's own (``SET LOCAL``), never the session's: behind a
    transaction-pooling PgBouncer a client's transactions run on whichever server session is
    free, so a session setting would miss the beat's later transactions and stay behind for
    the next clients of that session (a web request, a task), whose transactions it would end.
    """
    with transaction.atomic():
        get_store().limit_idle_transaction(get_settings().BEAT_TRANSACTION_TIMEOUT)
        yield


# The connections this process got from its parent over fork(): their sockets are the parent's
# (``celery worker -B`` forks its beat from a worker that may hold one).
_inherited: weakref.WeakSet[Any] = weakref.WeakSet()


def _note_inherited_connections() -> None:
    try:
        _inherited.update(
            c.connection for c in connections.all(initialized_only=True) if c.connection
        )
    except Exception:  # Django not configured in this process: nothing to note
        pass


os.register_at_fork(after_in_child=_note_inherited_connections)


def forget_inherited_connections() -> int:
    """Drop the Django connections this process inherited over fork, without a word to the
    server, so that its first query opens a connection of its own; returns how many.

    An inherited connection's socket is its parent's: a statement sent on it mixes with the
    parent's, and closing it as usual tells the server to end the parent's session. So this
    process's copy of the socket is closed first (as Celery closes it in a pool process), and
    the connection's goodbye goes nowhere. Celery's embedded beat has closed every inherited
    descriptor already: a number that is no longer a socket is left alone."""
    forgotten = 0
    for conn in connections.all(initialized_only=True):
        raw = conn.connection
        if raw is None or raw not in _inherited:
            continue
        try:
            fd = raw.fileno()
            if stat.S_ISSOCK(os.fstat(fd).st_mode):
                os.close(fd)
        except (OSError, DatabaseError, ValueError):
            pass  # closed already
        try:
            conn.close()
        except Exception:  # its socket is gone: what matters is that Django forgets it
            conn.connection = None
        forgotten += 1
    return forgotten


def reset_connection() -> None:
    """Drop a connection that may be broken, so the next query opens a fresh one."""
    try:
        connection.close()
    except DatabaseError:
        pass


# Statements PostgreSQL aborted to break a lock conflict (Django raises them as the
# OperationalError of a lost connection): retried as well, on the same connection, and logged
# as what they are.
_LOCK_CONFLICTS = {"40P01": "deadlock detected", "40001": "serialization failure"}


def with_retries(
    fn: Callable[[], T],
    *,
    what: str,
    attempts: int = 8,
    first_delay: float = 0.2,
    max_delay: float = 5.0,
    at_least: float = 0.0,
) -> T:
    """Run ``fn``, reconnecting and retrying with backoff while the database is unreachable
    (or aborts the statement to break a deadlock: retried without reconnecting).

    Used where giving up early loses information (a completion, a heartbeat); after the last
    attempt the error propagates and the lease is left to expire, which is safe. Retries go
    on past ``attempts`` until ``at_least`` seconds have passed: a completion keeps trying for
    as long as its lease could still be alive, since once the database is back within the
    lease it must land before the lease expires, or the occurrence runs again.
    """
    delay = first_delay
    started = time.monotonic()
    attempt = 0
    while True:
        attempt += 1
        try:
            return fn()
        except CONNECTION_ERRORS as exc:
            conflict = _LOCK_CONFLICTS.get(getattr(exc.__cause__, "sqlstate", None) or "")
            if conflict is None:
                reset_connection()
            if attempt >= attempts and time.monotonic() - started >= at_least:
                raise
            log.warning(
                "database %s during %s (attempt %d): %s; retrying in %.1fs",
                f"conflict ({conflict})" if conflict else "unavailable",
                what,
                attempt,
                exc,
                delay,
                extra={"action": "db_retry", "what": what},
            )
            time.sleep(delay)
            delay = min(delay * 2, max_delay)


def notify_due(when: datetime | None = None, delay_seconds: float | None = None) -> None:
    """Wake sleeping beats (PostgreSQL NOTIFY, sent when the transaction commits).

    The payload is the due time as epoch seconds in the database's clock, so a beat can ignore
    jobs due after it would wake anyway. A no-op on databases without LISTEN/NOTIFY.
    """
    get_store().notify(when, delay_seconds)
