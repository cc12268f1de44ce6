"""A fleet: real ``celery beat`` and ``celery worker`` processes on one database and broker,
started by name and stopped together (the end-to-end tests' fixtures and the chaos run).

They run exactly as a user runs them (``processes`` starts them), for the Celery app, directory
and settings module the caller names.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .processes import Proc, start_beat, start_worker, wait_until

__all__ = ["RABBITMQ", "Fleet", "Proc", "fleet_for", "wait_until"]

# The machine's RabbitMQ (the e2e tests that must hold on both brokers run on it too).
RABBITMQ = os.environ.get("SCHEDAPP_TEST_RABBITMQ", "amqp://guest:guest@127.0.0.1:5672//")


class Fleet:
    """Starts and tracks beats and workers of Celery app ``app`` (``-A``), run in ``cwd`` with
    ``env``; their logs go to ``tmp_path``. ``stop_all`` stops everything at the end."""

    def __init__(self, tmp_path: Path, env: dict[str, str], *, app: str, cwd: Path) -> None:
        self.tmp_path = tmp_path
        self.env = env
        self.app = app
        self.cwd = cwd
        self.procs: list[Proc] = []
        self._count = 0

    def _env(self, extra: dict[str, Any] | None, name: str = "") -> dict[str, str]:
        """The environment of process ``name``: its database connections carry its name as
        their application_name (libpq's PGAPPNAME), so a proxy fault can target it. A value of
        ``None`` takes the variable out (an empty one is not the same: prometheus-client then
        writes its files into the working directory)."""
        env = dict(self.env)
        if name:
            env.setdefault("PGAPPNAME", name)
        for key, value in (extra or {}).items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = str(value)
        return env

    def beat(self, settings: dict[str, Any] | None = None, wait: bool = True) -> Proc:
        """A beat with ``settings`` in its environment; ``wait``: until its first tick."""
        self._count += 1
        name = f"beat{self._count}"
        proc = start_beat(
            name, self._env(settings, name), self.tmp_path, app=self.app, cwd=self.cwd
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
        """A worker with ``settings`` in its environment; ``wait``: until it is ready."""
        self._count += 1
        name = f"worker{self._count}"
        proc = start_worker(
            name,
            self._env(settings, name),
            self.tmp_path,
            app=self.app,
            cwd=self.cwd,
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
    *,
    app: str,
    cwd: Path,
    settings_module: str,
) -> Iterator[Fleet]:
    """A fleet on database ``db_settings`` (a Django ``DATABASES`` entry) and ``broker_url``,
    its processes on Django settings ``settings_module`` and this process's ``TIME_ZONE``;
    ``cwd`` is also their ``PYTHONPATH`` (where ``app`` and the settings are found)."""
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
            "DJANGO_SETTINGS_MODULE": settings_module,
            "PYTHONPATH": str(cwd),
            "SCHEDAPP_VAR_DIR": str(tmp_path / "var"),
            "TIME_ZONE": settings.TIME_ZONE,
        }
    )
    env.update(extra_env or {})
    fleet = Fleet(tmp_path, env, app=app, cwd=cwd)
    try:
        yield fleet
    finally:
        fleet.stop_all()
