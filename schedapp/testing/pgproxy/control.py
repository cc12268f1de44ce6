"""Standalone mode: the proxy in its own process, steered through a UNIX socket.

Protocol: the client connects to the socket, writes one JSON object per line
(``{"op": "cut_after", "pattern": "COMMIT", "times": 1, "app": null}``) and reads one JSON line
back per request: ``{"ok": true, "result": ...}`` or ``{"ok": false, "error": "..."}``.
Operations are PgProxy's methods (cut_after, stall_after, delay, blackhole, reset_all, clear, stats,
events) with the same keyword arguments; ``pattern`` travels as a latin-1 string, and
``"regex": <flags>`` makes it a regex compiled with those flags (absent: the default COMMIT
statement). The reply comes once the fault is armed, so the caller can act on it at once.
ProxyControl wraps all this.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .proxy import COMMIT, Address, Pattern, PgProxy, with_address

OPERATIONS = (
    "cut_after",
    "down",
    "stall_after",
    "delay",
    "blackhole",
    "reset_all",
    "clear",
    "stats",
    "events",
)


class ControlServer:
    """Serves the control protocol for ``proxy`` on a UNIX socket at ``path``."""

    def __init__(self, proxy: PgProxy, path: str | Path) -> None:
        self.proxy = proxy
        self.path = str(path)
        if len(os.fsencode(self.path)) > 100:
            raise ValueError(f"UNIX socket path too long: {self.path}")
        if os.path.exists(self.path):
            os.unlink(self.path)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(self.path)
        self._sock.listen(16)
        self._thread = threading.Thread(target=self._serve, name="pgproxy-control", daemon=True)
        self._thread.start()

    def close(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        self._thread.join(5)
        if os.path.exists(self.path):
            os.unlink(self.path)

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._session, args=(client,), daemon=True).start()

    def _session(self, client: socket.socket) -> None:
        try:
            with client, client.makefile("rwb") as stream:
                for line in stream:
                    stream.write(json.dumps(self.handle(line)).encode() + b"\n")
                    stream.flush()
        except OSError:  # the caller went away mid-reply: nothing to tell it
            pass

    def handle(self, line: bytes) -> dict[str, Any]:
        try:
            request = json.loads(line)
            op = request.pop("op")
            if op not in OPERATIONS:
                raise ValueError(f"unknown operation {op!r}")
            if "pattern" in request:
                pattern = request.pop("pattern").encode("latin-1")
                flags = request.pop("regex", None)
                request["pattern"] = pattern if flags is None else re.compile(pattern, flags)
            return {"ok": True, "result": getattr(self.proxy, op)(**request)}
        except Exception as exc:  # the caller gets the reason, the proxy goes on
            return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}


class ProxyControl:
    """The PgProxy fault API, for a proxy running in another process."""

    def __init__(self, path: str | Path, listen: Address | None = None) -> None:
        self.path = str(path)
        self.process: subprocess.Popen[bytes] | None = None
        self.host, self.port = listen or ("", 0)

    def call(self, op: str, **kwargs: Any) -> Any:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(10)
            sock.connect(self.path)
            sock.sendall(json.dumps({"op": op, **kwargs}).encode() + b"\n")
            with sock.makefile("rb") as stream:
                reply = json.loads(stream.readline())
        if not reply["ok"]:
            raise RuntimeError(f"pgproxy {op}: {reply['error']}")
        return reply["result"]

    def cut_after(
        self,
        pattern: Pattern = COMMIT,
        times: int = 1,
        app: str | None = None,
        down: float = 0.0,
        silent: bool = False,
    ) -> None:
        more = {"times": times, "app": app, "down": down, "silent": silent}
        if isinstance(pattern, bytes):
            self.call("cut_after", pattern=pattern.decode("latin-1"), **more)
            return
        text = pattern.pattern.decode("latin-1")
        self.call("cut_after", pattern=text, regex=pattern.flags, **more)

    def down(self, duration: float, app: str | None = None) -> int:
        return self.call("down", duration=duration, app=app)

    def stall_after(
        self, pattern: Pattern, seconds: float, times: int = 1, app: str | None = None
    ) -> None:
        if isinstance(pattern, bytes):
            self.call(
                "stall_after",
                pattern=pattern.decode("latin-1"),
                seconds=seconds,
                times=times,
                app=app,
            )
            return
        self.call(
            "stall_after",
            pattern=pattern.pattern.decode("latin-1"),
            regex=pattern.flags,
            seconds=seconds,
            times=times,
            app=app,
        )

    def delay(self, seconds: float, duration: float | None = None, app: str | None = None) -> None:
        self.call("delay", seconds=seconds, duration=duration, app=app)

    def blackhole(
        self, duration: float | None, reset: bool = False, app: str | None = None
    ) -> None:
        self.call("blackhole", duration=duration, reset=reset, app=app)

    def reset_all(self, app: str | None = None) -> int:
        return self.call("reset_all", app=app)

    def clear(self) -> None:
        self.call("clear")

    def stats(self) -> dict[str, int]:
        return self.call("stats")

    def events(self, since: int = 0) -> list[dict[str, Any]]:
        return self.call("events", since=since)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def database_url(self, url: str) -> str:
        return with_address(url, self.host, self.port)


@contextmanager
def spawn_proxy(
    control: str | Path,
    upstream: Address = ("127.0.0.1", 5432),
    listen: Address = ("127.0.0.1", 0),
    timeout: float = 15.0,
) -> Iterator[ProxyControl]:
    """Run ``python -m schedapp.testing.pgproxy`` as a child process; yield its control, stop
    it after."""
    argv = [
        sys.executable,
        "-m",
        "schedapp.testing.pgproxy",
        "--listen",
        f"{listen[0]}:{listen[1]}",
        "--upstream",
        f"{upstream[0]}:{upstream[1]}",
        "--control",
        str(control),
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], timeout)
        line = proc.stdout.readline() if ready else b""
        if not line:
            raise RuntimeError(f"pgproxy did not start (exit status {proc.poll()})")
        info = json.loads(line)
        ctl = ProxyControl(info["control"], parse_address(info["listen"]))
        ctl.process = proc
        yield ctl
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def parse_address(text: str) -> Address:
    host, _, port = text.rpartition(":")
    return host or "127.0.0.1", int(port)


def main(argv: list[str] | None = None) -> None:
    """Serve until SIGTERM/SIGINT; print one JSON line (listen address, control path) when
    ready, so that whoever started the process knows the port even with ``--listen :0``."""
    parser = argparse.ArgumentParser(prog="python -m schedapp.testing.pgproxy", description=__doc__)
    parser.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT (port 0: any)")
    parser.add_argument("--upstream", default="127.0.0.1:5432", help="PostgreSQL HOST:PORT")
    parser.add_argument("--control", required=True, help="path of the control UNIX socket")
    args = parser.parse_args(argv)

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    proxy = PgProxy(parse_address(args.upstream), parse_address(args.listen)).start()
    server = ControlServer(proxy, args.control)
    print(json.dumps({"listen": proxy.address, "control": server.path}), flush=True)
    try:
        while not stop.wait(1):
            pass
    finally:
        server.close()
        proxy.stop()
