"""PgProxy: a TCP proxy between PostgreSQL clients and a server that injects network faults at
message boundaries: a reply lost after its COMMIT landed, latency, a partition, a reset.

One accepting thread, and two threads per client connection (connection.py). The fault state
lives here; connections read it without a lock on their fast path (a reference check per
chunk) and take the lock only when a fault is armed.
"""

from __future__ import annotations

import itertools
import logging
import re
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from .connection import Connection

log = logging.getLogger("schedapp.testing.pgproxy")

Address = tuple[str, int]
Pattern = bytes | re.Pattern[bytes]

# The COMMIT statement itself. A plain b"COMMIT" is a substring match, and Django's default
# cursor inlines parameter values into the query text: it would also hit an INSERT of 'commit'.
COMMIT = re.compile(rb"^\s*commit\b", re.IGNORECASE)


@dataclass
class _Trigger:
    """A cut or a stall armed for the next ``remaining`` statements matching ``pattern``."""

    pattern: Pattern  # bytes: lower-cased
    remaining: int
    app: str | None
    seconds: float = 0.0  # a stall's length
    down: float = 0.0  # a cut's: the proxy then refuses that app's connections this long
    silent: bool = False  # a cut's: the connection is kept open, nothing more forwarded

    def matches(self, text: bytes) -> bool:
        if isinstance(self.pattern, bytes):
            return self.pattern in text.lower()
        return self.pattern.search(text) is not None


@dataclass(frozen=True)
class _Delay:
    seconds: float
    until: float | None  # time.monotonic(); None: until cleared
    app: str | None


@dataclass
class _Partition:
    until: float | None
    reset: bool
    app: str | None
    timer: threading.Timer | None = None

    def active(self, now: float) -> bool:
        # A partition that resets holds its traffic until its end has closed the connections.
        return self.until is None or now < self.until or self.reset


class PgProxy:
    """Forward ``listen`` to ``upstream`` (the PostgreSQL server) and inject faults on demand.

    Every fault takes ``app``: a glob matched against the application_name of the connection's
    StartupMessage (None: every connection; "" matches only connections without one).
    """

    def __init__(self, upstream: Address = ("127.0.0.1", 5432), listen: Address = ("127.0.0.1", 0)):
        self.upstream = upstream
        self._listen = listen
        self._listener: socket.socket | None = None
        self._accepter: threading.Thread | None = None
        self._cond = threading.Condition()
        self._conns: dict[int, Connection] = {}
        self._ids = itertools.count(1)
        self._cut: _Trigger | None = None
        self._delay: _Delay | None = None
        self._stall: _Trigger | None = None
        self._partition: _Partition | None = None
        self._down: tuple[float, str | None] | None = None  # (until, app): connections refused
        self._stats = dict.fromkeys(
            ("connections", "cuts", "delayed", "partitions", "held", "resets", "stalls"), 0
        )
        self._events: deque[dict[str, Any]] = deque(maxlen=10_000)
        self._seq = itertools.count(1)
        self.host, self.port = listen

    # -- life cycle ---------------------------------------------------------------------------
    def start(self) -> PgProxy:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(self._listen)
        listener.listen(128)
        self._listener = listener
        self.host, self.port = listener.getsockname()[:2]
        self._accepter = threading.Thread(
            target=self._accept_loop, name=f"pgproxy-{self.port}-accept", daemon=True
        )
        self._accepter.start()
        return self

    def stop(self) -> None:
        """Stop accepting, close every connection, wait for the threads."""
        listener, self._listener = self._listener, None
        if listener is not None:
            try:
                listener.shutdown(socket.SHUT_RDWR)  # wakes accept()
            except OSError:
                pass
            listener.close()
        if self._accepter is not None:
            self._accepter.join(5)
        self.clear()
        for conn in self._snapshot():
            conn.close()
        for conn in self._snapshot():
            conn.thread.join(5)

    def __enter__(self) -> PgProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    # -- faults -------------------------------------------------------------------------------
    def cut_after(
        self,
        pattern: Pattern = COMMIT,
        times: int = 1,
        app: str | None = None,
        down: float = 0.0,
        silent: bool = False,
    ) -> None:
        """Lose the reply of the next ``times`` statements that match ``pattern``.

        ``pattern``: bytes found anywhere in the statement text, case-insensitively, or a
        compiled bytes regex (searched); the default is the COMMIT statement. The matching
        Query/Parse (or Bind of a statement prepared from matching text) and the rest of its
        batch up to Sync are forwarded, the server's reply is read up to its ReadyForQuery and
        dropped, then the connection is closed on both sides: the server has done the work
        (committed), the client only sees a broken connection.

        ``down``: the cut then takes the database down for that client (``app``) for ``down``
        seconds (``down()``): its other connections are closed, new ones refused. ``silent``:
        the connection is not closed but goes silent, as behind a network black hole or a
        NAT that dropped its state: the client waits for a reply that never comes, with no
        reset, until it closes the connection itself.
        """
        if not pattern or times < 1:
            raise ValueError("cut_after needs a non-empty pattern and times >= 1")
        if isinstance(pattern, bytes):
            pattern = pattern.lower()
        with self._cond:
            self._cut = _Trigger(pattern, times, app, down=down, silent=silent)

    def down(self, duration: float, app: str | None = None) -> int:
        """The database is down for ``duration`` seconds, for the connections of ``app``: those
        open are closed now, new ones are refused with an error at once (as a stopped server
        refuses them). Returns how many were closed."""
        with self._cond:
            self._down = (time.monotonic() + duration, app)
            self._event("down", app=app, duration=duration)
        return self.reset_all(app=app)

    def refusing(self, conn: Connection) -> bool:
        """Whether a new connection ``conn`` is refused: the database is down for it."""
        down = self._down
        return down is not None and time.monotonic() < down[0] and conn.matches(down[1])

    def stall_after(
        self, pattern: Pattern, seconds: float, times: int = 1, app: str | None = None
    ) -> None:
        """Forward the next ``times`` statements matching ``pattern`` and their replies, then
        hold everything else that client sends for ``seconds``: the client is stopped right
        after that statement (e.g. a beat between its claim and its COMMIT, locks held)."""
        if not pattern or times < 1:
            raise ValueError("stall_after needs a non-empty pattern and times >= 1")
        if isinstance(pattern, bytes):
            pattern = pattern.lower()
        with self._cond:
            self._stall = _Trigger(pattern, times, app, seconds)

    def delay(self, seconds: float, duration: float | None = None, app: str | None = None) -> None:
        """Hold every client->server chunk of messages ``seconds`` for ``duration`` seconds.

        Client to server only, so one round trip gains ``seconds`` (not twice that).
        """
        until = None if duration is None else time.monotonic() + duration
        with self._cond:
            self._delay = _Delay(seconds, until, app)
            self._event("delay", app=app, seconds=seconds, duration=duration)
            self._cond.notify_all()

    def blackhole(
        self, duration: float | None, reset: bool = False, app: str | None = None
    ) -> None:
        """Forward nothing either way for ``duration`` seconds (None: until clear()).

        Connections stay open and new ones are accepted but not forwarded, as on a cut
        network; then traffic resumes, or with ``reset`` every matching connection is closed
        (as a NAT or firewall that dropped its state would).
        """
        now = time.monotonic()
        part = _Partition(None if duration is None else now + duration, reset, app)
        with self._cond:
            self._end_partition_timer()
            self._partition = part
            self._stats["partitions"] += 1
            self._event("partition", app=app, duration=duration, reset=reset)
            if duration is not None:
                part.timer = threading.Timer(duration, self._end_partition, (part,))
                part.timer.daemon = True
                part.timer.start()
            self._cond.notify_all()

    def reset_all(self, app: str | None = None) -> int:
        """Close every current (matching) connection now; returns how many."""
        conns = [c for c in self._snapshot() if c.matches(app)]
        with self._cond:  # all marked first: none forwards while the others are being shut
            for conn in conns:
                conn.closed = True
        for conn in conns:
            conn.close()
        with self._cond:
            self._stats["resets"] += len(conns)
            self._event("reset", app=app, connections=len(conns))
        return len(conns)

    def clear(self) -> None:
        """Disarm every fault: held messages go on, a pending partition reset is cancelled."""
        with self._cond:
            self._cut = None
            self._stall = None
            self._delay = None
            self._down = None
            self._end_partition_timer()
            self._partition = None
            self._event("clear")
            self._cond.notify_all()

    def stats(self) -> dict[str, int]:
        """Counters: connections accepted, open now, cuts fired, chunks delayed, partitions
        started, chunks held by a partition, connections reset."""
        with self._cond:
            return {**self._stats, "open": len(self._conns)}

    def events(self, since: int = 0) -> list[dict[str, Any]]:
        """What happened, oldest first (kind: cut, delay, partition, partition_end, reset,
        clear), each with ``seq`` and wall-clock ``time``, so that a chaos oracle can tie an
        anomaly to the fault that caused it. A cut names its statement and the lost reply."""
        with self._cond:
            return [e for e in self._events if e["seq"] > since]

    def database_url(self, url: str) -> str:
        """``url`` (postgresql://user@host:port/db?...) with its host and port replaced by ours."""
        return with_address(url, self.host, self.port)

    # -- internals ----------------------------------------------------------------------------
    def _event(self, kind: str, **detail: Any) -> None:  # call with self._cond held
        self._events.append({"seq": next(self._seq), "time": time.time(), "kind": kind, **detail})

    def _snapshot(self) -> list[Connection]:
        with self._cond:
            return list(self._conns.values())

    def _end_partition_timer(self) -> None:  # call with self._cond held
        if self._partition is not None and self._partition.timer is not None:
            self._partition.timer.cancel()

    def _end_partition(self, part: _Partition) -> None:
        with self._cond:
            if self._partition is not part:
                return
            victims = [c for c in self._conns.values() if part.reset and c.matches(part.app)]
            for conn in victims:
                conn.closed = True  # what they hold is dropped, never forwarded
            self._partition = None
            self._stats["resets"] += len(victims)
            self._event("partition_end", app=part.app, reset=len(victims))
            self._cond.notify_all()
        for conn in victims:
            conn.close()

    def _accept_loop(self) -> None:
        while (listener := self._listener) is not None:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = Connection(self, next(self._ids), client)
            with self._cond:
                self._conns[conn.id] = conn
                self._stats["connections"] += 1
            conn.thread.start()

    def _forget(self, conn: Connection) -> None:
        with self._cond:
            self._conns.pop(conn.id, None)

    def _take(self, kind: str, conn: Connection, text: bytes) -> _Trigger | None:
        """The armed ``_cut`` or ``_stall`` if ``text`` on ``conn`` fires it, counted down
        (disarmed at zero); call with ``self._cond`` held."""
        trigger: _Trigger | None = getattr(self, kind)
        if trigger is None or not trigger.matches(text) or not conn.matches(trigger.app):
            return None
        if trigger.remaining <= 0:
            return None
        trigger.remaining -= 1
        if trigger.remaining == 0:
            setattr(self, kind, None)
        return trigger

    def _claim_cut(self, conn: Connection, mtype: int, text: bytes) -> bool:
        if self._cut is None:  # the common case, without the lock
            return False
        with self._cond:
            cut = self._take("_cut", conn, text)
            if cut is None:
                return False
        conn.cut_down, conn.cut_silent = cut.down, cut.silent
        conn.cut_statement = f"{chr(mtype)}: {text[:200].decode('utf-8', 'replace')}"
        return True

    def _claim_stall(self, conn: Connection, text: bytes) -> float | None:
        """The stall's seconds if ``text`` on ``conn`` fires it (recorded as an event)."""
        if self._stall is None:
            return None
        with self._cond:
            stall = self._take("_stall", conn, text)
            if stall is None:
                return None
            self._stats["stalls"] += 1
            self._event(
                "stall",
                conn=conn.id,
                app=conn.app,
                seconds=stall.seconds,
                statement=text[:200].decode("utf-8", "replace"),
            )
        return stall.seconds

    def _hold(self, conn: Connection, seconds: float) -> None:
        """Wait ``seconds`` (less if the connection closes meanwhile)."""
        until = time.monotonic() + seconds
        with self._cond:
            while not conn.closed and (left := until - time.monotonic()) > 0:
                self._cond.wait(left)

    def _fire_cut(self, conn: Connection) -> None:
        with self._cond:
            self._stats["cuts"] += 1
            self._event(
                "cut",
                conn=conn.id,
                app=conn.app,
                statement=conn.cut_statement,
                reply=conn.cut_reply,
                silent=conn.cut_silent,
            )
        if conn.cut_down:
            self.down(conn.cut_down, app=conn.app)

    def _wait_to_forward(self, conn: Connection, received: float, to_server: bool) -> bool:
        """Hold a chunk while a partition or a delay applies to it; False if conn closed."""
        counted_hold = counted_delay = False
        with self._cond:
            while not conn.closed:
                now = time.monotonic()
                part = self._partition
                if part is not None and part.active(now) and conn.matches(part.app):
                    if not counted_hold:
                        counted_hold = True
                        self._stats["held"] += 1
                    # past `until`, a resetting partition waits for its end (a notify)
                    self._cond.wait(None if part.until is None else max(part.until - now, 0.05))
                    continue
                delay = self._delay
                if (
                    to_server
                    and delay is not None
                    and (delay.until is None or received < delay.until)
                    and now < received + delay.seconds
                    and conn.matches(delay.app)
                ):
                    if not counted_delay:
                        counted_delay = True
                        self._stats["delayed"] += 1
                    self._cond.wait(received + delay.seconds - now)
                    continue
                return True
        return False


def with_address(url: str, host: str, port: int) -> str:
    """A postgresql:// URL pointed at another host and port, everything else kept."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ValueError(f"not a URL: {url!r}")
    netloc, slash, tail = rest.partition("/")
    userinfo, at, _ = netloc.rpartition("@")
    return f"{scheme}://{userinfo}{at}{host}:{port}{slash}{tail}"
