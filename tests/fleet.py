"""Real ``celery beat`` and ``celery worker`` processes for end-to-end tests.

They run against the test database (the one pytest-django created) and a Redis database of
their own, exactly as a user runs them: ``celery -A project beat -S schedapp.beat:...``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CELERY = str(Path(sys.executable).parent / "celery")


class Proc:
    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_path: Path) -> None:
        self.name = name
        self.argv = argv
        self.env = env
        self.log_path = log_path
        self._log = open(log_path, "ab")  # closed in stop()
        self.popen = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: kill() reaches pool children
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.popen.poll() is None

    def wait_for(self, text: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.log():
                return
            if not self.alive():
                raise RuntimeError(f"{self.name} exited early:\n{self.log()[-4000:]}")
            time.sleep(0.1)
        raise TimeoutError(f"{self.name}: {text!r} not seen in {timeout}s:\n{self.log()[-4000:]}")

    def signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.popen.pid, sig)
        except ProcessLookupError:
            pass

    def signal_main(self, sig: int) -> None:
        """Signal the main process only (e.g. SIGSTOP: pool children keep running)."""
        self.popen.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL the whole process group: main process and pool children, no cleanup."""
        self.signal_group(signal.SIGKILL)
        self.popen.wait(timeout=10)

    def stop(self, timeout: float = 15.0) -> None:
        if self.alive():
            self.signal_group(signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self._log.close()


class Fleet:
    """Starts and tracks beats and workers; everything is stopped at the end of the test."""

    def __init__(self, tmp_path: Path, env: dict[str, str]) -> None:
        self.tmp_path = tmp_path
        self.env = env
        self.procs: list[Proc] = []
        self._count = 0

    def _env(self, extra: dict[str, Any] | None, name: str = "") -> dict[str, str]:
        """The environment of process ``name``: its database connections carry its name as
        their application_name (libpq's PGAPPNAME), so a proxy fault can target it."""
        env = dict(self.env)
        if name:
            env.setdefault("PGAPPNAME", name)
        for key, value in (extra or {}).items():
            env[key] = str(value)
        return env

    def beat(self, settings: dict[str, Any] | None = None, wait: bool = True) -> Proc:
        self._count += 1
        name = f"beat{self._count}"
        proc = Proc(
            name,
            [
                CELERY,
                "-A",
                "project",
                "beat",
                "-S",
                "schedapp.beat:LeaseScheduler",
                "-l",
                "INFO",
                "-s",
                str(self.tmp_path / f"{name}.db"),
            ],
            self._env(settings, name),
            self.tmp_path / f"{name}.log",
        )
        self.procs.append(proc)
        if wait:
            proc.wait_for("schedapp.beat: beat ", timeout=30)
        return proc

    def worker(
        self,
        concurrency: int = 2,
        pool: str = "prefork",
        heartbeat: int = 1,
        settings: dict[str, Any] | None = None,
        wait: bool = True,
        extra_args: list[str] | None = None,
    ) -> Proc:
        self._count += 1
        name = f"worker{self._count}"
        argv = [
            CELERY,
            "-A",
            "project",
            "worker",
            "-l",
            "INFO",
            "-n",
            f"{name}@%h",
            "-P",
            pool,
            "-c",
            str(concurrency),
            f"--heartbeat-interval={heartbeat}",
            "--without-gossip",
            "--without-mingle",
            *(extra_args or []),
        ]
        proc = Proc(name, argv, self._env(settings, name), self.tmp_path / f"{name}.log")
        self.procs.append(proc)
        if wait:
            proc.wait_for(" ready.", timeout=60)
        return proc

    def stop_all(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()

    def logs(self) -> str:
        return "\n".join(f"===== {p.name} =====\n{p.log()[-6000:]}" for p in self.procs)


def wait_until(
    predicate: Callable[[], Any], timeout: float, interval: float = 0.2, message: str = "condition"
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{message} not reached within {timeout}s (last: {value!r})")
        time.sleep(interval)


@contextmanager
def fleet_for(
    tmp_path: Path,
    db_settings: dict[str, Any],
    broker_url: str,
    extra_env: dict[str, str] | None = None,
) -> Iterator[Fleet]:
    from django.conf import settings

    name = db_settings["NAME"]
    user = db_settings.get("USER") or "postgres"
    host = db_settings.get("HOST") or "127.0.0.1"
    port = db_settings.get("PORT") or 5432
    password = db_settings.get("PASSWORD") or ""
    auth = f"{user}:{password}@" if password else f"{user}@"
    env = dict(os.environ)
    env.update(
        {
            "DATABASE_URL": f"postgresql://{auth}{host}:{port}/{name}",
            "CELERY_BROKER_URL": broker_url,
            "DJANGO_SETTINGS_MODULE": "project.settings_test",
            "PYTHONPATH": str(ROOT),
            "SCHEDAPP_VAR_DIR": str(tmp_path / "var"),
            "TIME_ZONE": settings.TIME_ZONE,
        }
    )
    env.update(extra_env or {})
    fleet = Fleet(tmp_path, env)
    try:
        yield fleet
    finally:
        fleet.stop_all()
