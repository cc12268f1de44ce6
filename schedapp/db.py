"""Database plumbing shared by beats and worker hooks: the clock, and surviving outages
(what differs between databases is in ``schedapp.store``).

Every time a lease or a due check compares with comes from the database server, so beats and
workers on different hosts never disagree about what is due or expired.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import socket
import stat
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from datetime import datetime
from typing import Any, TypeVar

from django.db import (
    DEFAULT_DB_ALIAS,
    DatabaseError,
    InterfaceError,
    OperationalError,
    connection,
    connections,
    transaction,
)

from .conf import get_settings
from .store import get_store
from .store.base import ClaimProbe

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


@contextmanager
def claim_transaction() -> Iterator[ClaimProbe]:
    """``beat_transaction`` for a claim: the same idle limit, set by the statement that also
    says whether the claim's reaper and allow_all retries have anything to look at. A tick
    that finds nothing expired pays one round trip for the four, not four (the claim runs
    back to back at a steady stream's rate: its round trips are fire lag)."""
    with transaction.atomic():
        yield get_store().begin_claim(get_settings().BEAT_TRANSACTION_TIMEOUT)


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
    attempt_timeout: float | None = None,
) -> T:
    """Run ``fn``, reconnecting and retrying with backoff while the database is unreachable
    (or aborts the statement to break a deadlock: retried without reconnecting).

    Used where giving up early loses information (a completion, a heartbeat); after the last
    attempt the error propagates and the lease is left to expire, which is safe. Retries go
    on past ``attempts`` until ``at_least`` seconds have passed: a completion keeps trying for
    as long as its lease could still be alive, since once the database is back within the
    lease it must land before the lease expires, or the occurrence runs again.
    ``attempt_timeout``: an attempt still waiting for the server's reply after that many
    seconds has its connection given up (``bounded_wait``) and counts as failed: a reply
    that never comes (a network black hole) would otherwise hold the caller for ever.
    """
    delay = first_delay
    started = time.monotonic()
    attempt = 0
    while True:
        attempt += 1
        try:
            with bounded_wait(attempt_timeout, what) if attempt_timeout else nullcontext():
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


# --- bounded waits ---------------------------------------------------------------------------
#
# libpq waits for a reply for as long as the socket stays open, and a network that drops
# packets without a reset (a black hole, a NAT or firewall that lost its state) keeps it open
# for hours: TCP keepalives do not fire while a request is unanswered, and a proxy or
# PgBouncer in the way answers them anyway. So beats and workers bound each wait themselves:
# a watchdog thread gives up the connection of a statement that waits too long.


class _Watchdog:
    """One daemon thread per process that gives up (shuts down the socket of) the
    connection of a watched block still waiting for a statement's reply past its deadline:
    the blocked call then fails as on a lost connection, and its caller's retries take a
    new one. Only a statement in flight is cut (the connection is ``ACTIVE``), never an
    idle connection or one inside a transaction waiting for its client."""

    TICK = 0.1

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watched: dict[int, list[Any]] = {}  # [deadline, seconds, wrapper, what]
        self._ids = itertools.count()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.given_up = 0  # connections given up, for tests and logs

    @contextmanager
    def watch(self, seconds: float, what: str) -> Iterator[None]:
        key = next(self._ids)
        wrapper = connections[DEFAULT_DB_ALIAS]  # this thread's
        with self._lock:
            self._watched[key] = [time.monotonic() + seconds, seconds, wrapper, what]
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="schedapp-db-watchdog", daemon=True
                )
                self._thread.start()
        self._wake.set()
        try:
            yield
        finally:
            with self._lock:
                del self._watched[key]

    def _run(self) -> None:
        while True:
            self._wake.wait()
            time.sleep(self.TICK)
            with self._lock:
                if not self._watched:
                    self._wake.clear()
                    continue
                now = time.monotonic()
                for entry in self._watched.values():
                    deadline, seconds, wrapper, what = entry
                    if now < deadline or not _give_up_if_waiting(wrapper):
                        continue
                    entry[0] = math.inf  # once: the blocked call fails now
                    self.given_up += 1
                    log.warning(
                        "no reply from the database during %s within %.1fs: its connection "
                        "is given up",
                        what,
                        seconds,
                        extra={"action": "db_wait_bounded", "what": what},
                    )


def _give_up_if_waiting(wrapper: Any) -> bool:
    """Shut down the socket of ``wrapper``'s connection if a statement is in flight on it."""
    raw = getattr(wrapper, "connection", None)
    pgconn = getattr(raw, "pgconn", None)
    if pgconn is None:  # not connected (connect_timeout bounds a connect), or not psycopg
        return False
    try:
        if pgconn.transaction_status != 1:  # psycopg.pq.TransactionStatus.ACTIVE
            return False
        sock = socket.socket(fileno=os.dup(pgconn.socket))
    except Exception:  # closed meanwhile
        return False
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        return False
    finally:
        sock.close()
    return True


_watchdog = _Watchdog()


def _new_watchdog_after_fork() -> None:
    global _watchdog
    _watchdog = _Watchdog()  # the parent's thread did not come along


os.register_at_fork(after_in_child=_new_watchdog_after_fork)


def bounded_wait(seconds: float | None, what: str) -> Any:
    """A block in which this thread's statements wait for their reply at most ``seconds``
    (None: ``SCHEDAPP_DB_TIMEOUT``); past that the connection is given up and the statement
    fails as on a lost connection (an ``OperationalError``)."""
    return _watchdog.watch(seconds or get_settings().DB_TIMEOUT, what)


def watchdog_given_up() -> int:
    """How many connections this process's watchdog gave up."""
    return _watchdog.given_up


def bound_connection_waits(alias: str = DEFAULT_DB_ALIAS) -> dict[str, Any]:
    """Bound how long a beat's or worker's connection may take to open, and have the kernel
    find a dead idle connection (a LISTEN connection waiting for notifications), by
    defaulting libpq's ``connect_timeout`` (``SCHEDAPP_DB_TIMEOUT``) and TCP keepalives in
    this process's ``DATABASES[alias]["OPTIONS"]``: only those the project did not set, and
    only in the beat and worker processes (the web's connections are left as they are).
    Returns the options added. Applies to connections opened from now on."""
    settings_dict = connections.settings[alias]
    if settings_dict.get("ENGINE") != "django.db.backends.postgresql":
        return {}
    options = settings_dict.setdefault("OPTIONS", {})
    wanted = {
        "connect_timeout": max(2, math.ceil(get_settings().DB_TIMEOUT)),
        "keepalives": 1,
        "keepalives_idle": 30,
        "keepalives_interval": 10,
        "keepalives_count": 3,
    }
    added = {k: v for k, v in wanted.items() if k not in options}
    options.update(added)
    return added


def notify_due(when: datetime | None = None, delay_seconds: float | None = None) -> None:
    """Wake sleeping beats (PostgreSQL NOTIFY, sent when the transaction commits).

    The payload is the due time as epoch seconds in the database's clock, so a beat can ignore
    jobs due after it would wake anyway. A no-op on databases without LISTEN/NOTIFY.
    """
    get_store().notify(when, delay_seconds)
