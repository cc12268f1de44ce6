"""Real ``celery beat`` and ``celery worker`` processes for end-to-end tests.

They run against the test database (the one pytest-django created) and a Redis database of
their own, exactly as a user runs them (``project/harness.py`` starts them, for the
benchmarks and the demo too).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from project.harness import ROOT, Proc, start_beat, start_worker, wait_until

__all__ = ["RABBITMQ", "ROOT", "Fleet", "Proc", "fleet_for", "wait_until"]

# The machine's RabbitMQ (the e2e tests that must hold on both brokers run on it too).
RABBITMQ = os.environ.get("SCHEDAPP_TEST_RABBITMQ", "amqp://guest:guest@127.0.0.1:5672//")


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
        proc = start_beat(name, self._env(settings, name), self.tmp_path)
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
        proc = start_worker(
            name,
            self._env(settings, name),
            self.tmp_path,
            concurrency=concurrency,
            pool=pool,
            heartbeat=heartbeat,
            extra=extra_args,
        )
        self.procs.append(proc)
        if wait:
            proc.wait_for(" ready.", timeout=60)
        return proc

    def stop_all(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()

    def logs(self) -> str:
        return "\n".join(f"===== {p.name} =====\n{p.log()[-6000:]}" for p in self.procs)


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
