"""Tasks used by the demo and the tests. Each records its execution in ``Execution``."""

from __future__ import annotations

import os
import socket
import time

from celery import group, shared_task
from celery.exceptions import Ignore, Reject, SoftTimeLimitExceeded
from django.db import OperationalError, connection
from django.utils import timezone

import schedapp

from .models import Execution


def _record(task, label: str, finished: bool = True) -> Execution:  # type: ignore[no-untyped-def]
    run = schedapp.current_run()
    now = timezone.now()
    return Execution.objects.create(
        label=label,
        job_id=run.job_id if run else None,
        token=run.token if run else None,
        attempt=run.attempt if run else None,
        scheduled_for=run.scheduled_for if run else None,
        idempotency_key=run.idempotency_key if run else "",
        task_id=task.request.id or "",
        worker=task.request.hostname or socket.gethostname(),
        pid=os.getpid(),
        started_at=now,
        finished_at=now if finished else None,
    )


@shared_task(bind=True, name="project.tasks.record")
def record(self, label: str = "", sleep: float = 0.0, busy: bool = False) -> str:
    """Record that it started, optionally take ``sleep`` seconds (a long job; with ``busy``
    computing all along, never yielding to other threads or greenlets of its own accord),
    record that it finished: an execution killed midway leaves a row with no ``finished_at``."""
    execution = _record(self, label, finished=not sleep)
    if sleep:
        if busy:
            deadline = time.monotonic() + sleep
            while time.monotonic() < deadline:
                sum(range(1000))
        else:
            time.sleep(sleep)
        _finish(execution.pk)
    return f"{label} done"


def _finish(execution_id: int) -> None:
    """Mark the execution finished, reconnecting if the database restarted meanwhile (a
    long task's connection does not survive a restart; Django does not reconnect mid-task)."""
    for attempt in range(30):
        try:
            Execution.objects.filter(pk=execution_id).update(finished_at=timezone.now())
            return
        except OperationalError:
            connection.close()
            if attempt == 29:
                raise
            time.sleep(1)


@shared_task(bind=True, name="project.tasks.fail")
def fail(self, label: str = "") -> None:
    """Record the attempt, then fail: for retry and dead-letter behaviour."""
    _record(self, label)
    raise RuntimeError(f"{label} failed on purpose")


@shared_task(bind=True, name="project.tasks.flaky")
def flaky(self, label: str = "", failures: int = 2) -> str:
    """Fail the first ``failures`` attempts of each occurrence, then succeed (and record)."""
    run = schedapp.current_run()
    if run is not None and run.attempt <= failures:
        raise RuntimeError(f"{label} attempt {run.attempt} fails on purpose")
    _record(self, label)
    return f"{label} done"


@shared_task(bind=True, name="project.tasks.retry_self")
def retry_self(self, label: str = "", countdown: float = 1.0) -> None:
    """A task that asks Celery to retry it: schedapp turns that into its own retry."""
    _record(self, label)
    raise self.retry(countdown=countdown, exc=RuntimeError(f"{label} wants a retry"))


@shared_task(bind=True, name="project.tasks.retry_quietly")
def retry_quietly(self, label: str = "", countdown: float = 1.0, times: int = 2) -> str:
    """Ask Celery for a retry without raising it (``throw=False``) and return, for the first
    ``times`` attempts of each occurrence: under Celery each returns SUCCESS and its retry
    message runs the task again later, ``times`` + 1 executions in all."""
    _record(self, f"{label}:{self.request.retries}")
    if self.request.retries < times:
        self.retry(countdown=countdown, exc=RuntimeError(f"{label} wants a retry"), throw=False)
        return f"{label} retry requested"
    return f"{label} done"


@shared_task(
    bind=True,
    name="project.tasks.autoretry",
    autoretry_for=(RuntimeError,),
    retry_backoff=1,
    retry_jitter=False,
)
def autoretry(self, label: str = "") -> None:
    """Record the attempt with Celery's count of its retries, then fail: Celery's
    ``autoretry_for`` with ``retry_backoff`` (1, 2, 4 ... s, without jitter)."""
    _record(self, f"{label}:{self.request.retries}")
    raise RuntimeError(f"{label} fails on purpose")


@shared_task(bind=True, name="project.tasks.ignore_self")
def ignore_self(self, label: str = "", reject: str = "") -> None:
    """Record the attempt, then raise Celery's ``Ignore``, or ``Reject`` with requeue
    (``reject="requeue"``) or without (``reject="drop"``)."""
    _record(self, label)
    if reject:
        raise Reject(f"{label} rejected", requeue=reject == "requeue")
    raise Ignore(f"{label} ignored")


@shared_task(bind=True, name="project.tasks.replace_self")
def replace_self(self, label: str = "", into: str = "record", sleep: float = 0.0) -> object:
    """Record the attempt, then replace itself (Celery's ``Task.replace``) with
    ``project.tasks.record`` (``into="record"``, taking ``sleep`` seconds), with
    ``project.tasks.fail`` (``into="fail"``), or with a chain or a group of two records
    (``into="chain"``, ``into="group"``); each records its execution as ``<label>:<into>``."""
    _record(self, label)
    then = f"{label}:{into}"
    if into == "chain":
        return self.replace(record.si(label=then) | record.si(label=then))
    if into == "group":
        return self.replace(group(record.si(label=then), record.si(label=then)))
    if into == "fail":
        return self.replace(fail.si(label=then))
    return self.replace(record.si(label=then, sleep=sleep))


@shared_task(bind=True, name="project.tasks.limited", soft_time_limit=1, time_limit=2)
def limited(self, label: str = "", past_soft: bool = False) -> None:
    """Record the attempt, then sleep past the soft time limit (1 s), and with ``past_soft``
    on past the hard one (2 s), which kills the pool process."""
    _record(self, label, finished=False)
    try:
        time.sleep(10)
    except SoftTimeLimitExceeded:
        if not past_soft:
            raise
        time.sleep(10)


@shared_task(bind=True, name="project.tasks.record_once")
@schedapp.once
def record_once(self, label: str = "", sleep: float = 0.0) -> str:
    """Effectively once: the execution row and the idempotency key commit together."""
    if sleep:
        time.sleep(sleep)
    _record(self, label)
    return f"{label} done once"


@shared_task(name="project.tasks.nap", ignore_result=True)
def nap(seconds: float = 1.0) -> None:
    """Sleep ``seconds`` without touching the database, and keep no result: only its
    completion tells the database that it ended."""
    time.sleep(seconds)


@shared_task(name="project.tasks.noop")
def noop(*args: object, **kwargs: object) -> None:
    """Does nothing: for benchmarks."""


@shared_task(name="project.tasks.wait_5ms")
def wait_5ms(*args: object, **kwargs: object) -> None:
    """Waits 5 ms, as a task waiting on a network call would: for the overhead benchmark."""
    time.sleep(0.005)


@shared_task(name="project.tasks.add")
def add(x: int, y: int) -> int:
    """A plain Celery task that schedapp has nothing to do with."""
    return x + y


@shared_task(
    bind=True,
    name="project.tasks.routed",
    queue="slowq",
    priority=7,
    expires=30,
    time_limit=60,
    soft_time_limit=50,
)
def routed(self, label: str = "") -> str:
    """A task with its own routing and message options, as a Celery team declares them; it
    records where and how its message arrived."""
    info = self.request.delivery_info or {}
    seen = (
        f"{label}|{info.get('routing_key')}|{info.get('priority')}|"
        f"{self.request.expires is not None}|{list(self.request.timelimit or ())}"
    )
    _record(self, seen)
    return seen


@shared_task(bind=True, name="project.tasks.traced")
def traced(self, label: str = "") -> str:
    """Record the ``trace_id`` header a ``before_task_publish`` receiver added (tracing)."""
    trace = getattr(self.request, "trace_id", None) or (self.request.headers or {}).get(
        "trace_id", ""
    )
    _record(self, f"{label}:{trace}")
    return str(trace)

