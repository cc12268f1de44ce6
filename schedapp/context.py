"""What a running task can ask about its run, and the effectively-once helper."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from .message import HEADER_ADMISSION, HEADER_LEASE, HEADER_RUN, RUN_HEADERS, RunHeaders

log = logging.getLogger("schedapp.context")
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class RunInfo:
    job_id: int
    run_id: int
    token: int
    scheduled_for: datetime  # the occurrence this run is for (its nominal time)
    attempt: int
    idempotency_key: str  # the same for every attempt and re-dispatch of one occurrence

    @functools.cached_property
    def data_interval(self) -> tuple[datetime, datetime]:
        """(the occurrence before this one, this one): what a run that processes "the data
        since the last run" covers, the same on every attempt. Read from the job's schedule
        when first asked (one query), not carried by every message."""
        from .explain import data_interval

        return data_interval(self.job_id, self.scheduled_for)

    @functools.cached_property
    def kind(self) -> str:
        """``scheduled``, ``retry`` (a later attempt) or ``manual`` (a run now), as the claim
        recorded it on the run. Read when first asked (one query)."""
        from .explain import run_kind
        from .models import JobRun

        recorded = JobRun.objects.filter(pk=self.run_id).values_list("kind", flat=True).first()
        return run_kind(self.job_id, self.scheduled_for, self.attempt, recorded)


def current_run() -> RunInfo | None:
    """The schedapp run of the task executing now, or None outside one (plain Celery call,
    direct call, eager mode)."""
    from celery import current_task

    headers = run_headers(getattr(current_task, "request", None))
    if headers is None:
        return None
    return RunInfo(
        job_id=headers.job_id,
        run_id=headers.run_id,
        token=headers.token,
        scheduled_for=headers.scheduled_for,
        attempt=headers.attempt,
        idempotency_key=headers.idempotency_key,
    )


def run_headers(request: Any) -> RunHeaders | None:
    """schedapp's headers of a Celery task request (custom headers become attributes of the
    request in the worker; they are also kept under ``headers`` by some code paths)."""
    if request is None:
        return None
    values = {name: _header(request, name) for name in RUN_HEADERS}
    try:
        return RunHeaders.read({k: v for k, v in values.items() if v is not None})
    except (KeyError, TypeError, ValueError):
        return None


def run_lease(request: Any) -> float | None:
    """The lease, in seconds, schedapp dispatched a task request with (None if it did not)."""
    try:
        value = _header(request, HEADER_LEASE) if request is not None else None
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def run_id_of(request: Any) -> int | None:
    """The id of the run schedapp dispatched a task request for (None if it did not): the
    door and the heartbeat read the run by its key."""
    return as_run_id(_header(request, HEADER_RUN) if request is not None else None)


def as_run_id(value: Any) -> int | None:
    """A run id header's value as an int; None if absent or unreadable (an older or foreign
    message), so the lease functions find the run by its claim instead."""
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def run_admission(request: Any) -> str | None:
    """The admission a replacement's message carries (``replacement_headers``), or the one the
    door let this request in with; None if neither."""
    value = _header(request, HEADER_ADMISSION) if request is not None else None
    return str(value) if value else None


def replacement_headers(request: Any) -> dict[str, Any]:
    """The headers of a task replacing this request's (``Task.replace``): the run's own, so
    the replacement is held, renewed and recorded as the run, and the admission that started
    the run, so its door admits it as the same run."""
    headers = {name: value for name in RUN_HEADERS if (value := _header(request, name)) is not None}
    headers[HEADER_ADMISSION] = run_admission(request)
    return headers


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
