"""``python manage.py demo``: the whole fleet on one machine, printing runs as they happen.

Migrates, creates an admin user (printed), starts two beats, a worker and the admin site,
schedules a few sample jobs and prints every run as it finishes. Ctrl-C stops everything.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandParser
from django.db import connection

from schedapp import api
from schedapp.db import db_now
from schedapp.models import Job, JobRun
from schedapp.testing.processes import beat_args, worker_args

ROOT = Path(__file__).resolve().parents[3]
APP = "project"  # celery -A project

SAMPLES: list[dict[str, Any]] = [
    {
        "name": "demo: every 10 seconds (cron with seconds)",
        "task": "project.tasks.record",
        "cron": "*/10 * * * * *",
        "kwargs": {"label": "cron-10s"},
    },
    {
        "name": "demo: every 15 seconds (interval)",
        "task": "project.tasks.record",
        "interval": 15,
        "kwargs": {"label": "interval-15s"},
    },
    {
        "name": "demo: weekdays at 09:00 in Paris",
        "task": "project.tasks.record",
        "cron": "0 9 * * 1-5",
        "timezone": "Europe/Paris",
        "kwargs": {"label": "paris-9am"},
    },
    {
        "name": "demo: a long job renewing its lease",
        "task": "project.tasks.record",
        "interval": 30,
        "kwargs": {"label": "long", "sleep": 12},
        "lease_seconds": 6,
    },
    {
        "name": "demo: fails, retries with backoff, then dead-letters",
        "task": "project.tasks.fail",
        "interval": 25,
        "kwargs": {"label": "flaky"},
        "max_retries": 2,
        "retry_backoff": 2,
    },
]


class Command(BaseCommand):
    help = "Run the demo: two beats, a worker and the admin, printing runs as they happen."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
        parser.add_argument(
            "--seconds",
            type=float,
            default=0,
            help="stop after this many seconds (0: run until Ctrl-C)",
        )

    def handle(self, *args: Any, port: int, seconds: float, **options: Any) -> None:
        call_command("migrate", verbosity=0, interactive=False)
        self._admin_user()
        where = (
            f"{connection.vendor} ({settings.DATABASES['default']['NAME']}), "
            f"broker {settings.CELERY_BROKER_URL.split('@')[-1]}"
        )
        self.stdout.write(f"database and broker: {where}")
        # `timeout`, systemd, docker stop and Kubernetes stop with SIGTERM (and a closed
        # terminal with SIGHUP): stop the children then too, exactly as on Ctrl-C.
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, _interrupt)
        procs = self._start(port)
        try:
            self._schedule_samples()
            self.stdout.write(
                self.style.SUCCESS(
                    f"admin: http://127.0.0.1:{port}/admin/  (Ctrl-C stops everything)"
                )
            )
            self._follow(procs, seconds)
        except KeyboardInterrupt:
            pass
        finally:
            self._stop(procs)

    def _admin_user(self) -> None:
        password = os.environ.get("DEMO_ADMIN_PASSWORD") or secrets.token_urlsafe(9)
        user, _ = get_user_model().objects.get_or_create(
            username="admin", defaults={"is_staff": True, "is_superuser": True}
        )
        user.is_staff = user.is_superuser = True
        user.set_password(password)
        user.save()
        self.stdout.write(self.style.SUCCESS(f"admin user: admin / {password}"))

    def _start(self, port: int) -> list[subprocess.Popen]:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
        celery = [sys.executable, "-m", "celery"]
        log_dir = Path(settings.VAR_DIR) / "demo-logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        commands = {
            "beat-1": [*celery, *beat_args(log_dir / "beat-1.schedule", app=APP)],
            "beat-2": [*celery, *beat_args(log_dir / "beat-2.schedule", app=APP)],
            "worker": [*celery, *worker_args("demo-worker", app=APP, quiet=False)],
            "web": [sys.executable, "manage.py", "runserver", "--noreload", f"127.0.0.1:{port}"],
        }
        procs = []
        for name, argv in commands.items():
            log = open(log_dir / f"{name}.log", "ab")  # lives as long as the process
            procs.append(
                subprocess.Popen(
                    argv,
                    cwd=ROOT,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
            self.stdout.write(f"started {name} (pid {procs[-1].pid}), log: {log.name}")
        return procs

    def _schedule_samples(self) -> None:
        for sample in SAMPLES:
            spec = dict(sample)
            if Job.objects.filter(name=spec["name"]).exists():
                continue
            try:
                api.schedule(spec.pop("task"), **spec)
            except ValidationError as exc:
                self.stderr.write(f"could not schedule {sample['name']!r}: {exc}")
        one_off = f"demo: one-off at {time.strftime('%H:%M:%S')} + 20 s"
        api.schedule(
            "project.tasks.record",
            run_at=db_now() + timedelta(seconds=20),
            kwargs={"label": "one-off"},
            name=one_off,
        )
        self.stdout.write(
            f"scheduled {Job.objects.filter(name__startswith='demo:').count()} "
            "demo jobs; runs appear below as they finish:"
        )

    def _follow(self, procs: list[subprocess.Popen], seconds: float) -> None:
        last_id = JobRun.objects.order_by("-id").values_list("id", flat=True).first() or 0
        shown: set[int] = set()
        deadline = time.monotonic() + seconds if seconds else None
        while deadline is None or time.monotonic() < deadline:
            for proc in procs:
                if proc.poll() is not None:
                    raise SystemExit(f"a demo process exited (pid {proc.pid}); see its log")
            runs = (
                JobRun.objects.filter(id__gt=last_id, finished_at__isnull=False)
                .exclude(id__in=shown)
                .select_related("job")
                .order_by("id")[:200]
            )
            for run in runs:
                shown.add(run.pk)
                lag = ""
                if run.started_at and run.due_at:
                    lag = f" {(run.started_at - run.due_at).total_seconds() * 1000:.0f} ms late"
                self.stdout.write(
                    f"{run.finished_at:%H:%M:%S} {run.status:<9} {run.job.name} "
                    f"(attempt {run.attempt}, beat {run.claimed_by.split(':')[1]}, "
                    f"{run.worker or '-'}{lag}){' ' + run.error if run.error else ''}"
                )
            time.sleep(1)

    def _stop(self, procs: list[subprocess.Popen]) -> None:
        self.stdout.write("stopping ...")
        for proc in procs:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        self.stdout.write("stopped.")


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)
