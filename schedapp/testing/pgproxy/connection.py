"""One proxied client connection: its two pumps, the startup phase, and the cut's bookkeeping.

Each pump reads what is available, forwards the complete messages in it in one write and keeps
a partial one for the next read, so faults act on message boundaries. With no fault armed a
chunk costs a header scan (to count queries and ReadyForQuery replies, which a cut needs).
"""

from __future__ import annotations

import fnmatch
import logging
import socket
import threading
import time
from typing import Any

from .wire import (
    ANSWERED_BY_READY,
    BIND,
    CANCEL_REQUEST,
    COMMAND_COMPLETE,
    ERROR_RESPONSE,
    GSSENC_REQUEST,
    PARSE,
    PROTOCOL_MAJOR,
    QUERY,
    READY_FOR_QUERY,
    SSL_REQUEST,
    ProtocolError,
    cstring,
    error_response,
    message_length,
    read_startup_packet,
    startup_parameters,
)

log = logging.getLogger("schedapp.testing.pgproxy")

RECV_SIZE = 65536


class Connection:
    """One client connection and its upstream twin; the cut's bookkeeping lives here.

    ``answered`` counts ReadyForQuery replies forwarded and ``asked`` the client messages that
    each get one (Query, Sync, FunctionCall), so when a statement matches, the replies still
    owed to earlier statements are known and only the matched batch's reply is dropped.

    ``proxy`` is the ``PgProxy`` that accepted it (typed ``Any``: naming it here, even for the
    type checker only, is an import cycle that tests/unit/test_layers.py refuses).
    """

    def __init__(self, proxy: Any, cid: int, client: socket.socket) -> None:
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
        self.cut_down = 0.0  # the cut then takes the database down for this client
        self.cut_silent = False  # the cut leaves the connection open and silent
        self.prepared: dict[bytes, bytes] = {}  # named prepared statement -> its text
        self.stall_for = 0.0  # a stall fired: hold the client's next messages this long

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
        except (OSError, ProtocolError) as exc:
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
        except (OSError, ProtocolError) as exc:
            log.debug("pgproxy connection %d: %s", self.id, exc)
        finally:
            self.close()

    def _startup(self) -> bool:
        """Refuse SSL/GSS encryption ('N'), then connect upstream and pass the startup on."""
        while True:
            got = read_startup_packet(self.client)
            if got is None:
                return False
            code, packet = got
            if code in (SSL_REQUEST, GSSENC_REQUEST):
                self.client.sendall(b"N")
                continue
            if code == CANCEL_REQUEST:
                with socket.create_connection(self.proxy.upstream, timeout=10) as upstream:
                    upstream.sendall(packet)
                return False
            if code >> 16 != PROTOCOL_MAJOR:
                raise ProtocolError(f"unsupported protocol {code >> 16}.{code & 0xFFFF}")
            self.app = startup_parameters(packet).get("application_name", "")
            break
        if self.proxy.refusing(self):
            self.client.sendall(error_response("pgproxy: the database is down"))
            return False
        if not self.proxy._wait_to_forward(self, time.monotonic(), to_server=False):
            return False
        try:
            server = socket.create_connection(self.proxy.upstream, timeout=10)
        except OSError as exc:
            self.client.sendall(error_response(f"pgproxy: upstream unreachable: {exc}"))
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
                end = pos + 1 + message_length(buf, pos)
                if end > size:
                    break
                if not self.cut_sealed:
                    self._inspect_client(buf, pos, end)
                    send_end = end
                pos = end
            if send_end:
                if self.closed or (
                    (proxy._partition is not None or proxy._delay is not None)
                    and not proxy._wait_to_forward(self, received, to_server=True)
                ):
                    return  # closed (a partition's end marks it before shutting it): drop
                server.sendall(buf if send_end == size else buf[:send_end])
            del buf[:pos]
            if self.stall_for:
                stall, self.stall_for = self.stall_for, 0.0
                proxy._hold(self, stall)

    def _inspect_client(self, buf: bytearray, pos: int, end: int) -> None:
        mtype = buf[pos]
        if self.proxy._stall is not None and mtype in (QUERY, PARSE):
            text = bytes(buf[pos + 5 : end - 1])
            if mtype == PARSE:
                text = cstring(buf, cstring(buf, pos + 5, end)[1], end)[0]
            self.stall_for = self.proxy._claim_stall(self, text) or self.stall_for
        if mtype in ANSWERED_BY_READY:
            if mtype == QUERY and self.proxy._cut is not None:
                self._maybe_cut(mtype, bytes(buf[pos + 5 : end - 1]))
            self.asked += 1
            if self.cut_pending:
                self.cut_pending, self.cut_sealed = False, True
        elif mtype == PARSE:
            name, at = cstring(buf, pos + 5, end)
            if name or self.proxy._cut is not None:
                text, _ = cstring(buf, at, end)
                if name:
                    self.prepared[name] = text
                self._maybe_cut(mtype, text)
        elif mtype == BIND and self.proxy._cut is not None:
            _, at = cstring(buf, pos + 5, end)
            name, _ = cstring(buf, at, end)
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
                end = pos + 1 + message_length(buf, pos)
                if end > size:
                    break
                mtype = buf[pos]
                if self.cut_from is not None and self.answered >= self.cut_from:
                    self._note_reply(buf, pos, end)
                    if mtype == READY_FOR_QUERY:
                        cut_now = True
                        pos = end
                        break
                else:
                    if mtype == READY_FOR_QUERY:
                        self.answered += 1
                    send_end = end
                pos = end
            if send_end:
                if self.closed or (
                    proxy._partition is not None
                    and not proxy._wait_to_forward(self, received, to_server=False)
                ):
                    return
                client.sendall(buf if send_end == size else buf[:send_end])
            if cut_now:
                proxy._fire_cut(self)
                if self.cut_silent:  # keep it open; whatever the server sends is dropped,
                    while server.recv(RECV_SIZE):  # its end too: the client sees nothing
                        pass
                    with proxy._cond:  # until the client itself closes (close() notifies)
                        while not self.closed:
                            proxy._cond.wait()
                return  # _guard closes both sides
            del buf[:pos]

    def _note_reply(self, buf: bytearray, pos: int, end: int) -> None:
        """Keep what the client never saw: command tags and errors of the dropped reply."""
        mtype = buf[pos]
        if mtype == COMMAND_COMPLETE:
            tag, _ = cstring(buf, pos + 5, end)
            self.cut_reply.append(tag.decode("utf-8", "replace"))
        elif mtype == ERROR_RESPONSE:
            fields = bytes(buf[pos + 5 : end]).split(b"\0")
            message = next((f[1:] for f in fields if f[:1] == b"M"), b"")
            self.cut_reply.append("ERROR: " + message.decode("utf-8", "replace"))
