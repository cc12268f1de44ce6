"""Real local receivers for notifications: an HTTP server that checks the webhook's
signature on its own (the HMAC recomputed here, not by schedapp's code) and answers the
statuses it is told to, and an SMTP sink (aiosmtpd) that keeps what it is sent."""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from email import message_from_bytes
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

SECRET = "a-test-secret-of-some-length"


@dataclass
class Delivery:
    at: float  # monotonic, as received
    timestamp: int
    signed: bool  # the signature matched the body and timestamp
    body: dict[str, Any]
    status: int  # what the receiver answered


@dataclass
class Receiver:
    url: str
    statuses: list[int] = field(default_factory=list)  # answered in turn; then 200
    delay: float = 0.0  # seconds each answer waits
    received: list[Delivery] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def accepted(self) -> list[Delivery]:
        with self.lock:
            return [d for d in self.received if d.status == 200]

    def event_ids(self) -> list[int]:
        return [i for d in self.accepted() for i in d.body["event_ids"]]


def _signed(secret: str, timestamp: str, body: bytes, given: str) -> bool:
    expected = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return hmac.compare_digest("sha256=" + expected.hexdigest(), given or "")


@contextmanager
def webhook_receiver(
    statuses: list[int] | None = None, delay: float = 0.0, secret: str = SECRET
) -> Iterator[Receiver]:
    receiver: Receiver

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            stamp = self.headers.get("X-Schedapp-Timestamp", "")
            signed = _signed(secret, stamp, raw, self.headers.get("X-Schedapp-Signature", ""))
            time.sleep(receiver.delay)
            with receiver.lock:
                status = receiver.statuses.pop(0) if receiver.statuses else 200
                if not signed:
                    status = 401
                receiver.received.append(
                    Delivery(time.monotonic(), int(stamp or 0), signed, json.loads(raw), status)
                )
            self.send_response(status)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver = Receiver(f"http://127.0.0.1:{server.server_port}/hook", list(statuses or []), delay)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()


@dataclass
class Sink:
    host: str
    port: int
    messages: list[Message] = field(default_factory=list)


@contextmanager
def smtp_sink() -> Iterator[Sink]:
    from aiosmtpd.controller import Controller

    with socket.socket() as probe:  # aiosmtpd checks its server by connecting to the port
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    sink = Sink("127.0.0.1", port)

    class Handler:
        async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
            sink.messages.append(message_from_bytes(envelope.original_content))
            return "250 OK"

    controller = Controller(Handler(), hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield sink
    finally:
        controller.stop()
