"""Private PostgreSQL, Redis and PgBouncer servers that a test (or a chaos run) may stop, kill and
restart at will, without disturbing the machine's shared servers (or anyone else's tests)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

PG_BIN = (
    Path("/usr/lib/postgresql")
    / (
        sorted(os.listdir("/usr/lib/postgresql"))[-1]
        if os.path.isdir("/usr/lib/postgresql")
        else "15"
    )
    / "bin"
)


def free_port() -> int:
    """A TCP port free on loopback now (the OS picks it), for a server of the test's own."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, up: bool, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                if up:
                    return
        except OSError:
            if not up:
                return
        time.sleep(0.05)
    raise TimeoutError(f"port {port} did not go {'up' if up else 'down'} in {timeout}s")


class PrivateRedis:
    """A redis-server of our own: no persistence, so a restart loses every message."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--loglevel",
                "warning",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        _wait_port(self.port, up=True)

    def stop(self, kill: bool = False) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
            self.proc.wait(timeout=10)
        _wait_port(self.port, up=False)

    def restart(self, down_for: float = 0.0) -> None:
        self.stop(kill=True)
        time.sleep(down_for)
        self.start()


class PrivatePostgres:
    """A throwaway PostgreSQL cluster (initdb in a temporary directory) on its own port."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="schedapp-pg-"))
        self.data = self.dir / "data"
        self.log = self.dir / "postgres.log"

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/schedapp"

    def _run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        return subprocess.run([*prefix, *argv], check=check, capture_output=True, text=True)

    def init(self) -> None:
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres")
        self._run(
            str(PG_BIN / "initdb"),
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "--auth=trust",
            "--no-sync",
            "-E",
            "UTF8",
        )
        self.start()
        self._run(
            str(PG_BIN / "createdb"),
            "-h",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-U",
            "postgres",
            "schedapp",
        )

    def start(self) -> None:
        # fsync off is safe against what the tests do (they kill PostgreSQL's processes, not
        # the machine: the page cache survives). synchronous_commit stays on: with it off, an
        # immediate shutdown drops commits already acknowledged, and a task's side effect that
        # its worker saw committed vanished (the chaos check then reports it never ran).
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.dir} "
            "-c fsync=off -c full_page_writes=off "
            "-c max_connections=200"
        )
        self._run(
            str(PG_BIN / "pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.log),
            "-o",
            options,
            "-w",
            "start",
        )
        _wait_port(self.port, up=True)

    def stop(self, mode: str = "fast") -> None:
        self._run(
            str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop", check=False
        )
        _wait_port(self.port, up=False)

    def restart(self, down_for: float = 0.0, mode: str = "immediate") -> None:
        self.stop(mode=mode)
        time.sleep(down_for)
        self.start()

    def destroy(self) -> None:
        self.stop(mode="immediate")
        shutil.rmtree(self.dir, ignore_errors=True)


PGBOUNCER = shutil.which("pgbouncer") or (
    "/usr/sbin/pgbouncer" if os.path.exists("/usr/sbin/pgbouncer") else None
)


class PgBouncer:
    """A PgBouncer of our own in transaction pooling mode (``pool_mode = transaction``, what
    production Celery/Django fleets often put in front of PostgreSQL), in front of
    ``upstream``, on a free port. Its server connections (``pool_size`` per database and user)
    are shared by every client: a small pool makes clients take turns on the same server
    sessions, so whatever one of them leaves on a session is seen by the next.

    PgBouncer refuses to run as root: as root, it runs as ``postgres`` (as PrivatePostgres does).
    """

    def __init__(self, upstream: tuple[str, int], user: str = "postgres") -> None:
        self.host = "127.0.0.1"
        self.port = free_port()
        self.upstream = upstream
        self.user = user
        self.dir = Path(tempfile.mkdtemp(prefix="schedapp-pgbouncer-"))
        self.log = self.dir / "pgbouncer.log"
        self.proc: subprocess.Popen | None = None

    def start(self, pool_size: int = 4, **settings: object) -> PgBouncer:
        """Start it with ``pool_size`` server connections and any other ``[pgbouncer]``
        setting (``server_lifetime=1``: server connections replaced after a second)."""
        if PGBOUNCER is None:
            raise RuntimeError("pgbouncer is not installed (Debian: apt-get install pgbouncer)")
        host, port = self.upstream
        ini = self.dir / "pgbouncer.ini"
        ini.write_text(
            "[databases]\n"
            f"* = host={host} port={port}\n"
            "[pgbouncer]\n"
            f"listen_addr = {self.host}\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {self.dir / 'users.txt'}\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {pool_size}\n"
            "max_client_conn = 500\n"
            f"logfile = {self.log}\n"
            "log_connections = 0\n"
            "log_disconnections = 0\n"
            + "".join(f"{key} = {value}\n" for key, value in settings.items())
        )
        (self.dir / "users.txt").write_text(f'"{self.user}" ""\n')  # trust: names, no secrets
        argv = [PGBOUNCER, str(ini)]
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres")
            argv = ["runuser", "-u", "postgres", "--", *argv]
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        try:
            _wait_port(self.port, up=True, timeout=10)
        except TimeoutError:
            raise RuntimeError(f"pgbouncer did not start:\n{self.log_text()}") from None
        return self

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # runuser's group: pgbouncer with it
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        shutil.rmtree(self.dir, ignore_errors=True)
