"""The few pieces of the PostgreSQL v3 wire protocol the proxy needs to see message boundaries.

Only framing and the startup phase are understood; message contents are looked at solely to
match a fault's pattern (Query, Parse, Bind) and to summarise a discarded reply.
"""

from __future__ import annotations

import socket
import struct

SSL_REQUEST = 80877103
GSSENC_REQUEST = 80877104
CANCEL_REQUEST = 80877102
PROTOCOL_MAJOR = 3

# Bigger than any startup packet a driver sends; protects against garbage on the port.
MAX_STARTUP_PACKET = 10_000
# PostgreSQL refuses messages over 1 GB; anything larger here is a framing bug or garbage.
MAX_MESSAGE = (1 << 30) + 1024

# Message type bytes (as ints, as indexing a bytearray yields them).
QUERY = ord("Q")
PARSE = ord("P")
BIND = ord("B")
SYNC = ord("S")
FUNCTION_CALL = ord("F")
READY_FOR_QUERY = ord("Z")
COMMAND_COMPLETE = ord("C")
ERROR_RESPONSE = ord("E")

# Client messages that the server answers with exactly one ReadyForQuery.
ANSWERED_BY_READY = frozenset((QUERY, SYNC, FUNCTION_CALL))

_INT32 = struct.Struct("!I")
_HEADER = struct.Struct("!II")


class ProtocolError(Exception):
    """Bytes that are not the protocol we expect: the connection is dropped."""


def recv_exact(sock: socket.socket, n: int) -> bytes | None:
    """Exactly ``n`` bytes, or None if the peer closed first."""
    chunks = bytearray()
    while len(chunks) < n:
        data = sock.recv(n - len(chunks))
        if not data:
            return None
        chunks += data
    return bytes(chunks)


def read_startup_packet(sock: socket.socket) -> tuple[int, bytes] | None:
    """One untyped startup-phase packet: (request code or protocol version, whole packet)."""
    head = recv_exact(sock, 8)
    if head is None:
        return None
    if head[0] == 0x16:
        raise ProtocolError("direct TLS handshake (sslnegotiation=direct) is not supported")
    length, code = _HEADER.unpack(head)
    if not 8 <= length <= MAX_STARTUP_PACKET:
        raise ProtocolError(f"startup packet of {length} bytes")
    rest = recv_exact(sock, length - 8)
    if rest is None:
        return None
    return code, head + rest


def startup_parameters(packet: bytes) -> dict[str, str]:
    """The key/value pairs of a StartupMessage (user, database, application_name...)."""
    fields = packet[8:].split(b"\0")
    params: dict[str, str] = {}
    for key, value in zip(fields[0::2], fields[1::2], strict=False):
        if not key:
            break
        params[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return params


def message_length(buf: bytearray, pos: int) -> int:
    """The length field of the typed message starting at ``pos`` (which includes itself)."""
    length = _INT32.unpack_from(buf, pos + 1)[0]
    if not 4 <= length <= MAX_MESSAGE:
        raise ProtocolError(f"message {chr(buf[pos])!r} with length {length}")
    return length


def cstring(buf: bytearray, start: int, end: int) -> tuple[bytes, int]:
    """The NUL-terminated string at ``start`` and the offset just after its NUL."""
    nul = buf.find(b"\0", start, end)
    if nul < 0:
        raise ProtocolError("unterminated string")
    return bytes(buf[start:nul]), nul + 1


def error_response(message: str, sqlstate: str = "08006") -> bytes:
    """A FATAL ErrorResponse, so a client the proxy cannot serve gets a readable error."""
    body = b"".join(
        (
            b"SFATAL\0VFATAL\0C",
            sqlstate.encode(),
            b"\0M",
            message.encode("utf-8", "replace"),
            b"\0\0",
        )
    )
    return b"E" + _INT32.pack(len(body) + 4) + body
