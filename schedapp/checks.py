"""System checks: settings that would break schedapp's promises are reported at startup."""

from __future__ import annotations

from typing import Any

from django.core import checks
from django.db import connections

from .conf import get_settings
from .validation import celery_app


def register() -> None:
    checks.register(check_serialization, "schedapp")
    checks.register(check_crash_safety, "schedapp")
    checks.register(check_database, "schedapp", deploy=True)
    checks.register(check_allowlist, "schedapp", deploy=True)


def _celery_conf() -> Any:
    return celery_app().conf


def check_serialization(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    conf = _celery_conf()
    errors: list[checks.CheckMessage] = []
    accepted = set(conf.accept_content or [])
    if accepted - {"json", "application/json"}:
        errors.append(
            checks.Error(
                f"Celery accepts {sorted(accepted)}; schedapp needs JSON only (never pickle).",
                hint="Set CELERY_ACCEPT_CONTENT = ['json'].",
                id="schedapp.E001",
            )
        )
    if conf.task_serializer != "json":
        errors.append(
            checks.Error(
                f"CELERY_TASK_SERIALIZER is {conf.task_serializer!r}; schedapp publishes JSON.",
                hint="Set CELERY_TASK_SERIALIZER = 'json'.",
                id="schedapp.E002",
            )
        )
    return errors


def check_crash_safety(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    conf = _celery_conf()
    warnings: list[checks.CheckMessage] = []
    if not conf.task_acks_late:
        warnings.append(
            checks.Warning(
                "CELERY_TASK_ACKS_LATE is off: a worker that dies mid-task loses the message "
                "(schedapp still re-runs the job when its lease expires, but later).",
                hint="Set CELERY_TASK_ACKS_LATE = True.",
                id="schedapp.W001",
            )
        )
    if conf.task_acks_late and not conf.task_reject_on_worker_lost:
        warnings.append(
            checks.Warning(
                "CELERY_TASK_REJECT_ON_WORKER_LOST is off: a killed pool process's message is "
                "acknowledged as failed instead of requeued.",
                hint="Set CELERY_TASK_REJECT_ON_WORKER_LOST = True.",
                id="schedapp.W002",
            )
        )
    return warnings


def check_database(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    vendor = connections["default"].vendor
    if vendor != "postgresql":
        return [
            checks.Warning(
                f"The default database is {vendor}: fine for a demo, but several beats on several "
                "hosts need PostgreSQL (row locks with SKIP LOCKED, LISTEN/NOTIFY).",
                id="schedapp.W003",
            )
        ]
    return []


def check_allowlist(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    if "*" in get_settings().ALLOWED_TASKS:
        return [
            checks.Warning(
                "SCHEDAPP_ALLOWED_TASKS allows every registered task: anyone who may add a job "
                "(API, admin, imports) can schedule any task the app defines.",
                hint="List the tasks jobs may run: SCHEDAPP_ALLOWED_TASKS = ['myapp.tasks.*'].",
                id="schedapp.W004",
            )
        ]
    return []
