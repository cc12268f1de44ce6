"""PgProxy: a TCP proxy between PostgreSQL clients and a server that injects network faults at
message boundaries: a reply lost after its COMMIT landed, latency, a partition, a reset.

Two threads per client connection (one per direction) and one accepting thread. With no
fault armed each chunk of whole messages read is forwarded in one write after a scan of the
message headers (to keep count of queries and ReadyForQuery replies, which the cut needs).
"""

from __future__ import annotations

import fnmatch
import itertools
import logging
import re
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from . import wire

log = logging.getLogger("tests.pgproxy")

RECV_SIZE = 65536
Address = tuple[str, int]
Pattern = bytes | re.Pattern[bytes]

# The COMMIT statement itself. A plain b"COMMIT" is a substring match, and Django's default
# cursor inlines parameter values into the query text: it would also hit an INSERT of 'commit'.
COMMIT = re.compile(rb"^\s*commit\b", re.IGNORECASE)


@dataclass
class _Cut:
    pattern: Pattern  # bytes: lower-cased
    remaining: int
    app: str | None

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
        self._conns: dict[int, _Conn] = {}
        self._ids = itertools.count(1)
        self._cut: _Cut | None = None
        self._delay: _Delay | None = None
        self._partition: _Partition | None = None
        self._stats = dict.fromkeys(
            ("connections", "cuts", "delayed", "partitions", "held", "resets"), 0
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
    def cut_after(self, pattern: Pattern = COMMIT, times: int = 1, app: str | None = None) -> None:
        """Lose the reply of the next ``times`` statements that match ``pattern``.

        ``pattern``: bytes found anywhere in the statement text, case-insensitively, or a
        compiled bytes regex (searched); the default is the COMMIT statement. The matching
        Query/Parse (or Bind of a statement prepared from matching text) and the rest of its
        batch up to Sync are forwarded, the server's reply is read up to its ReadyForQuery and
        dropped, then the connection is closed on both sides: the server has done the work
        (committed), the client only sees a broken connection.
        """
        if not pattern or times < 1:
            raise ValueError("cut_after needs a non-empty pattern and times >= 1")
        if isinstance(pattern, bytes):
            pattern = pattern.lower()
        with self._cond:
            self._cut = _Cut(pattern, times, app)

    def delay(self, seconds: float, duration: float | None = None, app: str | None = None) -> None:
        """Hold every client->server chunk of messages ``seconds`` for ``duration`` seconds.

        Client to server only, so one round trip gains ``seconds`` (not twice that).
        """
        until = None if duration is None else time.monotonic() + duration
        with self._cond:
            self._delay = _Delay(seconds, until, app)
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
            self._delay = None
            self._end_partition_timer()
            self._partition = None
            self._cond.notify_all()

    def stats(self) -> dict[str, int]:
        """Counters: connections accepted, open now, cuts fired, chunks delayed, partitions
        started, chunks held by a partition, connections reset."""
        with self._cond:
            return {**self._stats, "open": len(self._conns)}

    def events(self, since: int = 0) -> list[dict[str, Any]]:
        """Faults that fired, oldest first, each with ``seq`` and wall-clock ``time``, so that a
        chaos oracle can tie an anomaly to the fault that caused it."""
        with self._cond:
            return [e for e in self._events if e["seq"] > since]

    def database_url(self, url: str) -> str:
        """``url`` (postgresql://user@host:port/db?...) with its host and port replaced by ours."""
        return with_address(url, self.host, self.port)

    # -- internals ----------------------------------------------------------------------------
    def _event(self, kind: str, **detail: Any) -> None:  # call with self._cond held
        self._events.append({"seq": next(self._seq), "time": time.time(), "kind": kind, **detail})

    def _snapshot(self) -> list[_Conn]:
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
            conn = _Conn(self, next(self._ids), client)
            with self._cond:
                self._conns[conn.id] = conn
                self._stats["connections"] += 1
            conn.thread.start()

    def _forget(self, conn: _Conn) -> None:
        with self._cond:
            self._conns.pop(conn.id, None)

    def _claim_cut(self, conn: _Conn, mtype: int, text: bytes) -> bool:
        cut = self._cut
        if cut is None or not cut.matches(text) or not conn.matches(cut.app):
            return False
        with self._cond:
            if self._cut is not cut or cut.remaining <= 0:
                return False
            cut.remaining -= 1
            if cut.remaining == 0:
                self._cut = None
        conn.cut_statement = f"{chr(mtype)}: {text[:200].decode('utf-8', 'replace')}"
        return True

    def _fire_cut(self, conn: _Conn) -> None:
        with self._cond:
            self._stats["cuts"] += 1
            self._event(
                "cut",
                conn=conn.id,
                app=conn.app,
                statement=conn.cut_statement,
                reply=conn.cut_reply,
            )

    def _wait_to_forward(self, conn: _Conn, received: float, to_server: bool) -> bool:
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


class _Conn:
    """One client connection and its upstream twin; the cut's bookkeeping lives here.

    ``answered`` counts ReadyForQuery replies forwarded and ``asked`` the client messages that
    each get one (Query, Sync, FunctionCall), so when a statement matches, the replies still
    owed to earlier statements are known and only the matched batch's reply is dropped.
    """

    def __init__(self, proxy: PgProxy, cid: int, client: socket.socket) -> None:
        self.proxy = proxy
        self.id = cid
        self.client = client
        self.server: socket.socket | None = None
        self.app: str | None = None
        self.closed = False
        self._lock = threading.Lock()
        self.thread = threading.Thread(
            target=self._run, name=f"pgproxy-{proxy.port}-c{cid}", daemon=True
        )
        self.asked = 0
        self.answered = -1  # the ReadyForQuery that ends authentication answers nothing
        self.cut_from: int | None = None  # drop replies once `answered` reaches this
        self.cut_pending = False  # matched; its batch's Sync not forwarded yet
        self.cut_sealed = False  # batch complete: forward nothing more from the client
        self.cut_statement = ""
        self.cut_reply: list[str] = []
        self.prepared: dict[bytes, bytes] = {}  # named prepared statement -> its text

    def matches(self, glob: str | None) -> bool:
        return glob is None or fnmatch.fnmatchcase(self.app or "", glob)

    def close(self) -> None:
        with self.proxy._cond:
            self.closed = True
            self.proxy._cond.notify_all()
        with self._lock:
            for sock in (self.client, self.server):
                if sock is not None and sock.fileno() >= 0:
                    try:
                        sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass

    def _run(self) -> None:
        pump: threading.Thread | None = None
        try:
            if self._startup():
                pump = threading.Thread(
                    target=self._guard,
                    args=(self._server_to_client,),
                    name=f"{self.thread.name}-s",
                    daemon=True,
                )
                pump.start()
                self._client_to_server()
        except (OSError, wire.ProtocolError) as exc:
            log.debug("pgproxy connection %d: %s", self.id, exc)
        finally:
            self.close()
            if pump is not None:
                pump.join()
            with self._lock:
                self.client.close()
                if self.server is not None:
                    self.server.close()
            self.proxy._forget(self)

    def _guard(self, pump: Any) -> None:
        try:
            pump()
        except (OSError, wire.ProtocolError) as exc:
            log.debug("pgproxy connection %d: %s", self.id, exc)
        finally:
            self.close()

    def _startup(self) -> bool:
        """Refuse SSL/GSS encryption ('N'), then connect upstream and pass the startup on."""
        while True:
            got = wire.read_startup_packet(self.client)
            if got is None:
                return False
            code, packet = got
            if code in (wire.SSL_REQUEST, wire.GSSENC_REQUEST):
                self.client.sendall(b"N")
                continue
            if code == wire.CANCEL_REQUEST:
                with socket.create_connection(self.proxy.upstream, timeout=10) as upstream:
                    upstream.sendall(packet)
                return False
            if code >> 16 != wire.PROTOCOL_MAJOR:
                raise wire.ProtocolError(f"unsupported protocol {code >> 16}.{code & 0xFFFF}")
            self.app = wire.startup_parameters(packet).get("application_name", "")
            break
        if not self.proxy._wait_to_forward(self, time.monotonic(), to_server=False):
            return False
        try:
            server = socket.create_connection(self.proxy.upstream, timeout=10)
        except OSError as exc:
            self.client.sendall(wire.error_response(f"pgproxy: upstream unreachable: {exc}"))
            return False
        server.settimeout(None)
        server.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._lock:
            self.server = server
        if self.closed:  # reset while connecting
            return False
        server.sendall(packet)
        return True

    def _client_to_server(self) -> None:
        proxy, server = self.proxy, self.server
        assert server is not None
        buf = bytearray()
        while data := self.client.recv(RECV_SIZE):
            received = time.monotonic()
            buf += data
            pos, send_end, size = 0, 0, len(buf)
            while size - pos >= 5:
                end = pos + 1 + wire.message_length(buf, pos)
                if end > size:
                    break
                if not self.cut_sealed:
                    self._inspect_client(buf, pos, end)
                    send_end = end
                pos = end
            if send_end:
                if (
                    proxy._partition is not None or proxy._delay is not None
                ) and not proxy._wait_to_forward(self, received, to_server=True):
                    return
                server.sendall(buf if send_end == size else buf[:send_end])
            del buf[:pos]

    def _inspect_client(self, buf: bytearray, pos: int, end: int) -> None:
        mtype = buf[pos]
        if mtype in wire.ANSWERED_BY_READY:
            if mtype == wire.QUERY and self.proxy._cut is not None:
                self._maybe_cut(mtype, bytes(buf[pos + 5 : end - 1]))
            self.asked += 1
            if self.cut_pending:
                self.cut_pending, self.cut_sealed = False, True
        elif mtype == wire.PARSE:
            name, at = wire.cstring(buf, pos + 5, end)
            if name or self.proxy._cut is not None:
                text, _ = wire.cstring(buf, at, end)
                if name:
                    self.prepared[name] = text
                self._maybe_cut(mtype, text)
        elif mtype == wire.BIND and self.proxy._cut is not None:
            _, at = wire.cstring(buf, pos + 5, end)
            name, _ = wire.cstring(buf, at, end)
            if name:  # the unnamed statement's Parse was matched already, if it matches
                self._maybe_cut(mtype, self.prepared.get(name, b""))

    def _maybe_cut(self, mtype: int, text: bytes) -> None:
        if (
            self.proxy._cut is not None
            and self.cut_from is None
            and self.proxy._claim_cut(self, mtype, text)
        ):
            self.cut_from = self.asked  # replies owed to earlier batches still go through
            self.cut_pending = True

    def _server_to_client(self) -> None:
        proxy, server, client = self.proxy, self.server, self.client
        assert server is not None
        buf = bytearray()
        while data := server.recv(RECV_SIZE):
            received = time.monotonic()
            buf += data
            pos, send_end, size, cut_now = 0, 0, len(buf), False
            while size - pos >= 5:
                end = pos + 1 + wire.message_length(buf, pos)
                if end > size:
                    break
                mtype = buf[pos]
                if self.cut_from is not None and self.answered >= self.cut_from:
                    self._note_reply(buf, pos, end)
                    if mtype == wire.READY_FOR_QUERY:
                        cut_now = True
                        pos = end
                        break
                else:
                    if mtype == wire.READY_FOR_QUERY:
                        self.answered += 1
                    send_end = end
                pos = end
            if send_end:
                if proxy._partition is not None and not proxy._wait_to_forward(
                    self, received, to_server=False
                ):
                    return
                client.sendall(buf if send_end == size else buf[:send_end])
            if cut_now:
                proxy._fire_cut(self)
                return  # _guard closes both sides
            del buf[:pos]

    def _note_reply(self, buf: bytearray, pos: int, end: int) -> None:
        """Keep what the client never saw: command tags and errors of the dropped reply."""
        mtype = buf[pos]
        if mtype == wire.COMMAND_COMPLETE:
            tag, _ = wire.cstring(buf, pos + 5, end)
            self.cut_reply.append(tag.decode("utf-8", "replace"))
        elif mtype == wire.ERROR_RESPONSE:
            fields = bytes(buf[pos + 5 : end]).split(b"\0")
            message = next((f[1:] for f in fields if f[:1] == b"M"), b"")
            self.cut_reply.append("ERROR: " + message.decode("utf-8", "replace"))
