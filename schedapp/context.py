"""What a running task can ask about its run, and the effectively-once helper."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

log = logging.getLogger("schedapp.context")
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class RunInfo:
    job_id: int
    run_id: int
    token: int
    scheduled_for: datetime
    attempt: int
    idempotency_key: str  # the same for every attempt and re-dispatch of one occurrence


def current_run() -> RunInfo | None:
    """The schedapp run of the task executing now, or None outside one (plain Celery call,
    direct call, eager mode)."""
    from celery import current_task

    from .dispatch import (
        HEADER_ATTEMPT,
        HEADER_JOB,
        HEADER_KEY,
        HEADER_RUN,
        HEADER_SCHEDULED_FOR,
        HEADER_TOKEN,
    )

    request = getattr(current_task, "request", None)
    if request is None:
        return None
    job_id = _header(request, HEADER_JOB)
    if job_id is None:
        return None
    return RunInfo(
        job_id=int(job_id),
        run_id=int(_header(request, HEADER_RUN)),
        token=int(_header(request, HEADER_TOKEN)),
        scheduled_for=datetime.fromisoformat(_header(request, HEADER_SCHEDULED_FOR)),
        attempt=int(_header(request, HEADER_ATTEMPT)),
        idempotency_key=str(_header(request, HEADER_KEY)),
    )


def _header(request: Any, name: str) -> Any:
    value = getattr(request, name, None)
    if value is None:
        headers = getattr(request, "headers", None) or {}
        value = headers.get(name)
    return value


def once(fn: F) -> F:
    """Make a task's database side effects happen once per occurrence.

    Wraps the task body in a transaction that first records the run's idempotency key; a
    second delivery of the same occurrence (a lost lease, a broker redelivery) finds the key
    and returns None without running the body. A failing body rolls the key back with its own
    writes, so a retry runs again. Only the body's writes to the same database are covered.
    """
    from django.db import IntegrityError, transaction

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from .models import OnceKey

        run = current_run()
        if run is None:
            return fn(*args, **kwargs)
        with transaction.atomic():
            try:
                with transaction.atomic():  # a savepoint: the insert may conflict
                    OnceKey.objects.create(
                        key=run.idempotency_key, job_id=run.job_id, run_id=run.run_id
                    )
            except IntegrityError:
                log.info(
                    "job %s occurrence %s already done: skipping duplicate",
                    run.job_id,
                    run.scheduled_for,
                    extra={"action": "once_duplicate", "job": run.job_id},
                )
                return None
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]
