"""Setting aside a job schedapp cannot understand, so one bad row never stops a beat or a
worker (DESIGN 19): the errors a row can raise, the quarantine itself, and what a run or a
job keeps of an error."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError, DataError, IntegrityError, transaction
from django.db.models import F
from django.db.models.functions import Now

from .. import ledger
from ..db import beat_transaction
from ..models import ACTIVE_RUN_STATUSES, Job, JobRun, JobState, RunStatus
from ..policies import QUARANTINED

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Quarantined:
    """A job set aside because schedapp could not understand it: it is ``dead`` with the
    reason, out of the due slice, and the beat or worker that found it goes on."""

    job_id: int
    reason: str


# What one row can raise on its way through a claim, a reap or a completion: the database
# refusing a value (out of range, a constraint) or failing to hand it to Python, and Python's
# arithmetic or parsing failing on it. Connection errors and timeouts are no row's fault, and
# neither are the errors a bug raises for every row alike (TypeError, KeyError...): those fail
# the tick as before, rather than quarantine every job the claim meets.
ROW_ERRORS: tuple[type[BaseException], ...] = (
    DataError,
    IntegrityError,
    ArithmeticError,
    ValueError,
    RecursionError,
)


def no_partition(exc: BaseException) -> bool:
    """A run whose id no partition of the run history covers (PostgreSQL, schedapp.partitions):
    the fleet's fault (the beats make partitions ahead), not the row's, so never a reason to
    quarantine. PostgreSQL says it as a check violation naming no constraint."""
    cause = exc.__cause__
    if getattr(cause, "sqlstate", None) != "23514":
        return False
    diag = getattr(cause, "diag", None)
    return diag is not None and diag.constraint_name is None


def in_savepoint_or_quarantine(
    job_id: int, work: Callable[[], Any], quarantined: list[Quarantined], what: str
) -> Any:
    """``work()`` in a savepoint; if one of ``ROW_ERRORS`` comes out of it, its writes are
    undone and the job is quarantined with the error (None is returned). A quarantine that
    fails too is logged: the row stays as it was, and the caller goes on without it."""
    try:
        with transaction.atomic():
            return work()
    except ROW_ERRORS as exc:
        if no_partition(exc):
            raise  # the claim fails; the beat makes the partitions and claims again
        reason = f"{what} ({type(exc).__name__}: {first_line(exc)})"
    try:
        with transaction.atomic():
            quarantined.append(quarantine_locked(job_id, reason))
    except ROW_ERRORS as exc:
        log.error(
            "job %s cannot be quarantined either (%s): left as it is",
            job_id,
            first_line(exc),
            extra={"action": "quarantine_failed", "job": job_id},
        )
    return None


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def job_label(job_id: int, name: str | None) -> str:
    """A job as logs name it: ``job 'nightly-report' (id 31)``, its name for people and its id
    for the admin's URL and the task ids (``schedapp:31:<token>``)."""
    return f"job {name!r} (id {job_id})" if name else f"job {job_id}"


def unschedulable(exc: BaseException) -> str:
    return f"its schedule cannot be computed here ({type(exc).__name__}: {exc})"


def quarantine_locked(job_id: int, reason: str) -> Quarantined:
    """Set a job aside as ``dead`` with ``reason``, in the caller's transaction, which holds
    the job row's lock. The token moves on, so nothing in flight can change it later."""
    Job.objects.filter(id=job_id).update(
        state=JobState.DEAD,
        token=F("token") + 1,
        claimed_by="",
        lease_expires_at=None,
        next_run_at=None,
        last_status="quarantined",
        last_error=storable(f"quarantined: {reason}", ERROR_CHARS),
        updated_at=Now(),
    )
    in_flight = JobRun.objects.filter(job_id=job_id, status__in=ACTIVE_RUN_STATUSES).update(
        status=RunStatus.FAILED,
        finished_at=Now(),
        error=storable(f"quarantined: {reason}", ERROR_CHARS),
        lease_expires_at=None,  # an allow_all run's own lease, and a retry waiting
        retry_at=None,
    )
    name = Job.objects.filter(id=job_id).values_list("name", flat=True).first()
    if not in_flight:  # with a run in flight, the occurrence's fate is that run's
        _record_pending(job_id, reason)
    log.error(
        "%s quarantined (now dead): %s",
        job_label(job_id, name),
        reason,
        extra={"action": "quarantine", "job": job_id},
    )
    return Quarantined(job_id, reason)


def _record_pending(job_id: int, reason: str) -> None:
    """The occurrence the job was waiting for, in the ledger as quarantined: unless its
    stored time is what cannot be read (then there is no occurrence to name)."""
    try:
        at = Job.objects.filter(id=job_id).values_list("scheduled_for", flat=True).first()
    except Exception:  # a value Python cannot read: no occurrence to name
        return
    if at is None:
        return
    try:
        with transaction.atomic():  # a savepoint: the quarantine stands if this cannot land
            ledger.record_one(job_id, at, QUARANTINED, storable(reason, 2000), "quarantine")
    except DatabaseError as exc:
        log.warning("job %s: its pending occurrence not recorded (%s)", job_id, first_line(exc))


def quarantine_job(job_id: int, reason: str, token: int | None = None) -> Quarantined | None:
    """Quarantine a job in a transaction of its own (None if ``token`` is no longer its)."""
    with beat_transaction():
        job = Job.objects.select_for_update().filter(id=job_id).values("token").first()
        if job is None or (token is not None and job["token"] != token):
            return None
        return quarantine_locked(job_id, reason)


ERROR_CHARS, TRACEBACK_CHARS = 10000, 50000  # what a run (and a job) keeps of them


def storable(text: str, limit: int) -> str:
    """At most ``limit`` characters of ``text``, as a PostgreSQL text column takes them: a
    task's error may hold a NUL or a lone surrogate (a file name decoded with
    surrogateescape), which PostgreSQL refuses, and then no outcome would be recorded."""
    text = text[:limit]
    if text.isascii() and "\x00" not in text:
        return text
    text = text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")
    return text[:limit]
