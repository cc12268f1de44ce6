"""Worker hooks: Celery signal receivers connected when the Django app is ready.

Where each runs, in a prefork worker:

* ``task_received`` (main process, before the task reaches a pool process): the door. The run
  starts only if its claim is still the job's current one; otherwise the request is revoked
  locally, so Celery acknowledges and discards it without running the task body.
* ``heartbeat_sent`` (main process, every worker heartbeat, 2 s by default): renews the leases
  of every schedapp task running in this worker with one statement, and notices lost ones.
  ``--without-heartbeat`` turns this off (then leases expire under long tasks: don't); a hung
  task is bounded by Celery's time limits, not by schedapp.
* ``task_success`` / ``task_failure`` / ``task_retry`` (pool process; ``task_failure`` also in
  the main process for lost workers and hard time limits): the completion, fenced by token.
* ``task_revoked`` (main process): a run cancelled by ``api.cancel(..., terminate=True)``.

Tasks that schedapp did not dispatch (their task id is not ``schedapp:<job>:<token>``) are
left alone by every hook.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from celery import signals

from . import metrics
from .models import parse_task_id

log = logging.getLogger("schedapp.worker")

_lease_renewed_at: dict[tuple[int, int], float] = {}
_lease_lost: set[tuple[int, int]] = set()
_node: dict[str, Any] = {"name": None, "started_at": None, "last": 0.0}
# Task ids this process refused at the door, so their revocation is not mistaken for a cancel.
_refused: set[str] = set()


def connect() -> None:
    """Connect the receivers (idempotent: dispatch_uid)."""
    signals.task_received.connect(on_task_received, weak=False, dispatch_uid="schedapp.door")
    signals.heartbeat_sent.connect(on_heartbeat, weak=False, dispatch_uid="schedapp.heartbeat")
    signals.task_success.connect(on_task_success, weak=False, dispatch_uid="schedapp.success")
    signals.task_failure.connect(on_task_failure, weak=False, dispatch_uid="schedapp.failure")
    signals.task_retry.connect(on_task_retry, weak=False, dispatch_uid="schedapp.retry")
    signals.task_revoked.connect(on_task_revoked, weak=False, dispatch_uid="schedapp.revoked")
    signals.worker_ready.connect(on_worker_ready, weak=False, dispatch_uid="schedapp.ready")
    signals.worker_process_shutdown.connect(
        on_process_shutdown, weak=False, dispatch_uid="schedapp.process_shutdown"
    )
    signals.worker_shutdown.connect(
        on_worker_shutdown, weak=False, dispatch_uid="schedapp.shutdown"
    )


# --- the door ----------------------------------------------------------------------------------


def on_task_received(sender: Any = None, request: Any = None, **_: Any) -> None:
    claim = parse_task_id(getattr(request, "id", None))
    if claim is None:
        return
    from .claims import START_OK, start_run
    from .db import with_retries

    job_id, token = claim
    worker = getattr(request, "hostname", None) or socket.gethostname()
    try:
        outcome = with_retries(lambda: start_run(job_id, token, worker), what="start", attempts=3)
    except Exception as exc:  # cannot check the token: do not run it
        outcome = f"could not check the claim ({exc})"
        log.error(
            "job %s token %s: %s; not executing (its lease will expire and it will be "
            "claimed again)",
            job_id,
            token,
            outcome,
            extra={"action": "door_error"},
        )
    if outcome == START_OK:
        return
    metrics.door_skipped(_reason_word(outcome))
    log.warning(
        "job %s token %s delivered but not executed: %s",
        job_id,
        token,
        outcome,
        extra={"action": "door_skip", "job": job_id, "token": token},
    )
    _refuse(request)


def _reason_word(outcome: str) -> str:
    """A fixed label for metrics: stale_token, job_state, duplicate, unknown or error."""
    if outcome == "stale token":
        return "stale_token"
    for prefix, word in (
        ("job is", "job_state"),
        ("run already", "duplicate"),
        ("unknown", "unknown"),
    ):
        if outcome.startswith(prefix):
            return word
    return "error"


def _refuse(request: Any) -> None:
    """Have Celery discard the request: it is acknowledged and never reaches the pool."""
    from celery.worker import state

    if len(_refused) > 100_000:
        _refused.clear()
    _refused.add(request.id)
    state.revoked.add(request.id)


# --- heartbeats ------------------------------------------------------------------------------


def on_heartbeat(sender: Any = None, **_: Any) -> None:
    from .db import CONNECTION_ERRORS, reset_connection

    try:
        _renew_active_leases()
        _record_worker_node()
    except CONNECTION_ERRORS as exc:
        reset_connection()
        log.warning("lease renewal failed: %s", exc, extra={"action": "renew_failed"})


def _renew_active_leases() -> None:
    from celery.worker import state

    from .claims import renew_leases
    from .dispatch import HEADER_LEASE

    now = time.monotonic()
    due: list[tuple[int, int, int]] = []
    active: set[tuple[int, int]] = set()
    for request in list(state.active_requests):
        claim = parse_task_id(request.id)
        if claim is None:
            continue
        active.add(claim)
        lease = int(request.request_dict.get(HEADER_LEASE) or 60)
        # Renew once a third of the lease has passed: often enough to survive two missed
        # heartbeats, rarely enough that a long lease costs almost nothing.
        if now - _lease_renewed_at.get(claim, 0.0) >= lease / 3.0 and claim not in _lease_lost:
            due.append((claim[0], claim[1], lease))
    for gone in set(_lease_renewed_at) - active:  # heartbeats stop when the task ends
        _lease_renewed_at.pop(gone, None)
        _lease_lost.discard(gone)
    if not due:
        return
    renewed = renew_leases(due)
    metrics.heartbeat("worker", renewed=len(renewed), lost=len(due) - len(renewed))
    for job_id, token, _lease in due:
        if (job_id, token) in renewed:
            _lease_renewed_at[(job_id, token)] = now
        else:
            _lease_lost.add((job_id, token))
            log.error(
                "job %s lost its lease (token %s is no longer current): its completion "
                "will be recorded as stale",
                job_id,
                token,
                extra={"action": "lease_lost", "job": job_id, "token": token},
            )


def on_worker_ready(sender: Any = None, **_: Any) -> None:
    metrics.start_metrics_server()
    _node["name"] = getattr(sender, "hostname", None) or f"{socket.gethostname()}:{os.getpid()}"
    _node["started_at"] = datetime.now(UTC)
    try:
        _record_worker_node(force=True)
    except Exception as exc:  # visibility only
        log.warning("could not record worker node: %s", exc)


def on_process_shutdown(pid: int | None = None, **_: Any) -> None:
    metrics.process_exited(pid or os.getpid())


def on_worker_shutdown(sender: Any = None, **_: Any) -> None:
    if _node["name"] is None:
        return
    try:
        from .models import Node

        Node.objects.filter(name=_node["name"]).delete()
    except Exception:  # shutting down
        pass


def _record_worker_node(force: bool = False) -> None:
    from celery.worker import state

    from .conf import get_settings
    from .nodes import record_node

    if _node["name"] is None:
        return
    now = time.monotonic()
    if not force and now - _node["last"] < get_settings().NODE_HEARTBEAT:
        return
    _node["last"] = now
    record_node(
        _node["name"],
        "worker",
        _node["started_at"],
        {"active": len(state.active_requests), "processed": sum(state.total_count.values())},
    )


# --- completion ------------------------------------------------------------------------------


def on_task_success(sender: Any = None, result: Any = None, **_: Any) -> None:
    request = getattr(sender, "request", None)
    _complete(getattr(request, "id", None), "succeeded")


def on_task_failure(
    sender: Any = None,
    task_id: str | None = None,
    exception: Any = None,
    einfo: Any = None,
    **_: Any,
) -> None:
    _complete(
        task_id,
        "failed",
        error=_describe(exception),
        traceback=str(getattr(einfo, "traceback", "") or ""),
    )


def on_task_retry(
    sender: Any = None, request: Any = None, reason: Any = None, einfo: Any = None, **_: Any
) -> None:
    """A task called ``self.retry()``: schedapp owns retries, so this counts as a failed
    attempt retried after the requested countdown (or the job's backoff), within the job's
    ``max_retries``. Celery's own retry message is refused at the door when it arrives."""
    delay = _retry_delay(getattr(reason, "when", None))
    exc = getattr(reason, "exc", None) or reason
    _complete(
        getattr(request, "id", None),
        "failed",
        error=f"retry requested: {_describe(exc)}",
        traceback=str(getattr(einfo, "traceback", "") or ""),
        retry_delay=delay,
    )


def on_task_revoked(
    sender: Any = None, request: Any = None, terminated: bool = False, **_: Any
) -> None:
    task_id = getattr(request, "id", None)
    claim = parse_task_id(task_id)
    if claim is None or task_id in _refused:
        _refused.discard(task_id)  # type: ignore[arg-type]
        return
    from .claims import record_cancelled
    from .db import with_retries

    with_retries(
        lambda: record_cancelled(claim[0], claim[1], terminated=terminated),
        what="revoked",
        attempts=3,
    )


def _complete(task_id: str | None, outcome: str, **kwargs: Any) -> None:
    claim = parse_task_id(task_id)
    if claim is None:
        return
    from .claims import complete_run
    from .db import with_retries

    job_id, token = claim
    try:
        # Long enough to ride out a database restart; after that the lease expires and the
        # job runs again (at-least-once), which is the safe failure.
        with_retries(
            lambda: complete_run(job_id, token, outcome, **kwargs), what="completion", attempts=10
        )
    except Exception as exc:  # never break the worker; the lease will expire
        log.exception(
            "could not record completion of job %s token %s: %s",
            job_id,
            token,
            exc,
            extra={"action": "completion_failed", "job": job_id},
        )


def _describe(exc: Any) -> str:
    if exc is None:
        return ""
    if isinstance(exc, BaseException):
        return f"{type(exc).__name__}: {exc}"
    return str(exc)


def _retry_delay(when: Any) -> timedelta | None:
    if when is None:
        return None
    if isinstance(when, int | float):
        return timedelta(seconds=max(0.0, float(when)))
    if isinstance(when, datetime):
        aware = when if when.tzinfo else when.replace(tzinfo=UTC)
        return max(timedelta(0), aware - datetime.now(UTC))
    return None
