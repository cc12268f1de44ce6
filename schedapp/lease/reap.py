"""The reaper: leases that expired make their jobs claimable again; a run that had started
counts as a failed attempt, one that never started is dispatched again (or dropped, when its
message expired meanwhile)."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import F, Value
from django.db.models.functions import Least, Now

from .. import policies
from ..db import notify_due
from ..models import ACTIVE_RUN_STATUSES, Job, JobRun, JobState, RunKind, RunStatus
from ..store import get_store, pairs
from .after_run import EXPIRED, SUPERSEDED_UNSTARTED, job_facts, notify_dead, write_after_run
from .quarantine import Quarantined, in_savepoint_or_quarantine, quarantine_locked, unschedulable

log = logging.getLogger(__name__)

ZERO = timedelta(0)


@dataclass
class ReapResult:
    expired: int = 0  # leases reaped
    started: int = 0  # ... whose run had started (a failed attempt)
    dead: int = 0  # ... which exhausted the job's retries
    carried_on: int = 0  # ... which exhausted them and went on with the next occurrence
    dropped: int = 0  # ... never started, their message expired: occurrence dropped
    quarantined: list[Quarantined] = field(default_factory=list)

    def add(self, other: ReapResult) -> None:
        """Count ``other``'s reaping in too (one row's, or the run leases'): every field."""
        self.expired += other.expired
        self.started += other.started
        self.dead += other.dead
        self.carried_on += other.carried_on
        self.dropped += other.dropped
        self.quarantined.extend(other.quarantined)


# --- reaping -------------------------------------------------------------------------------


# How many seconds a job's message lives once published (its ``expires``), None for ever: the
# beat's answer from the route it publishes the job with.
MessageExpiry = Callable[[Job], "float | None"]


def reap_expired_leases(
    limit: int, rng: policies.Rng = random.random, message_expiry: MessageExpiry | None = None
) -> ReapResult:
    """Make jobs whose lease expired claimable again, marking their runs ``lost``.

    A run that had started counts as a failed attempt (so a task that kills its worker every
    time ends dead instead of looping); one that never started (a beat died between claim and
    publish, a broker lost the message) is simply dispatched again, unless its message's
    ``expires`` (``message_expiry``) has passed since the claim: then no worker would run it
    (Celery discards it; RabbitMQ drops it unseen), and its occurrence is dropped as Celery
    beat's would be (``record_expired``) instead of being sent again with a fresh expiry.
    A paused job's lease is reaped too (its worker died mid-run): its run is closed and the
    job stays paused.
    """
    with transaction.atomic(savepoint=False):
        return reap_locked(limit, rng, message_expiry)


def expired_job_leases() -> Any:
    """Jobs whose lease expired (the claim probe's first EXISTS says the same in SQL)."""
    return Job.objects.filter(
        state__in=[JobState.RUNNING, JobState.PAUSED], lease_expires_at__lt=Now()
    )


def expired_run_leases() -> Any:
    """Runs whose own lease (allow_all) expired (the claim probe's second EXISTS)."""
    return JobRun.objects.filter(lease_expires_at__lt=Now())


def _expired() -> Any:
    """The leases that expired, oldest first, as a queryset that locks them (SKIP LOCKED)."""
    return (
        expired_job_leases()
        .select_for_update(skip_locked=True)
        .annotate(database_now=Now())  # what job_facts compares a next occurrence with
        .order_by("lease_expires_at")
    )


def reap_each(limit: int, rng: policies.Rng, message_expiry: MessageExpiry | None) -> ReapResult:
    """The reaper, one expired lease at a time, each in a savepoint: a job the reaper cannot
    read or write (a value written behind the API's back) is quarantined with the error."""
    result = ReapResult()
    for job_id in list(_expired().values_list("id", flat=True)[:limit]):
        one = in_savepoint_or_quarantine(
            job_id,
            lambda job_id=job_id: reap_locked(1, rng, message_expiry, ids=[job_id]),
            result.quarantined,
            "the reaper cannot take this row",
        )
        if one is not None:
            result.add(one)
    return result


def reap_locked(
    limit: int,
    rng: policies.Rng,
    message_expiry: MessageExpiry | None = None,
    ids: list[int] | None = None,
    *,
    jobs: bool = True,
    runs: bool = True,
) -> ReapResult:
    """The reaper inside the caller's transaction; ``jobs`` / ``runs`` False skip the look
    for job leases / runs' own leases (the claim's probe found none expired)."""
    result = _reap_job_leases(limit, rng, message_expiry, ids) if jobs else ReapResult()
    if ids is None and runs:
        result.add(_reap_run_leases(limit))
    return result


def _reap_run_leases(limit: int) -> ReapResult:
    """Runs with a lease of their own (allow_all) whose lease expired: each is marked lost on
    its own row, and only that run: its job moved on at the claim and its other runs in
    flight go on. A run that had started counts as a failed attempt (a retry of its
    occurrence if any is left, else ``when_retries_exhausted``); one that never started is
    sent again at once as the same attempt, a run of its own (its old message is refused at
    the door should it still arrive). Job rows are locked before run rows (SKIP LOCKED both: a
    row another transaction holds is reaped by a later tick), as the completion locks them;
    each run in a savepoint, so a job whose row cannot be read is quarantined, not left to
    fail every claim."""
    from .complete import wait_for_retry

    candidates = list(
        expired_run_leases()
        .order_by("lease_expires_at")
        .values_list("id", "job_id")[:limit]
    )
    if not candidates:
        return ReapResult()
    jobs = set(
        Job.objects.select_for_update(skip_locked=True)
        .filter(id__in={job_id for _, job_id in candidates})
        .order_by("id")
        .values_list("id", flat=True)
    )
    ids = [run_id for run_id, job_id in candidates if job_id in jobs]
    # A run skipped with its lease left set was refused by a door of the previous release
    # (schedapp_admit_run_v3 knows no run lease, and its job had moved on): nothing ran, so
    # it is sent again at once, the same attempt, and its lease no longer counts in flight.
    for job_id, scheduled_for, attempt, kind in JobRun.objects.filter(
        id__in=ids, status=RunStatus.SKIPPED, lease_expires_at__isnull=False
    ).values_list("job_id", "scheduled_for", "attempt", "kind"):
        wait_for_retry(job_id, scheduled_for, attempt, kind or RunKind.SCHEDULED, ZERO)
    JobRun.objects.filter(id__in=ids, lease_expires_at__isnull=False).exclude(
        status__in=ACTIVE_RUN_STATUSES
    ).update(lease_expires_at=None)
    runs = list(
        JobRun.objects.select_for_update(skip_locked=True)
        .filter(
            id__in=ids,
            lease_expires_at__lt=Now(),
            status__in=ACTIVE_RUN_STATUSES,
        )
        .order_by("id")
        .values_list("id", "job_id", "status", "attempt", "scheduled_for", "kind")
    )
    result = ReapResult(expired=len(runs))
    for run_id, job_id, status, attempt, scheduled_for, kind in runs:
        in_savepoint_or_quarantine(
            job_id,
            lambda r=(run_id, job_id, status, attempt, scheduled_for, kind): _reap_run(r, result),
            result.quarantined,
            "the reaper cannot take this run",
        )
    if runs:
        notify_due(None, 0.0)  # slots of max_concurrent are free
        log.warning(
            "reaped %d expired run lease(s) (%d had started)",
            len(runs),
            result.started,
            extra={"action": "reap_runs", "count": len(runs)},
        )
    return result


def _reap_run(run: tuple, result: ReapResult) -> None:
    """One expired run lease (``_reap_run_leases``), in the caller's savepoint."""
    from .complete import record_own_lease_outcome, wait_for_retry

    run_id, job_id, status, attempt, scheduled_for, kind = run
    started = status == RunStatus.RUNNING
    why = (
        "lease expired while running: the worker holding it stopped renewing it"
        if started
        else "lease expired before a worker started it"
    )
    JobRun.objects.filter(id=run_id).update(
        status=RunStatus.LOST, finished_at=Now(), error=why, lease_expires_at=None
    )
    if started:
        result.started += 1
        job = Job.objects.get(id=job_id)
        outcome = record_own_lease_outcome(
            job, RunStatus.LOST.value, why, attempt, scheduled_for, kind=kind
        )
        result.dead += outcome.dead
        result.carried_on += outcome.carried_on
    else:  # nothing ran: dispatched again at once, the same attempt (DESIGN 24)
        wait_for_retry(job_id, scheduled_for, attempt, kind or RunKind.SCHEDULED, ZERO)


def _reap_job_leases(
    limit: int,
    rng: policies.Rng,
    message_expiry: MessageExpiry | None,
    ids: list[int] | None,
) -> ReapResult:
    expired_leases = _expired()
    if ids is not None:
        expired_leases = expired_leases.filter(id__in=ids)
    expired = list(expired_leases[:limit])
    if not expired:
        return ReapResult()
    claims = [(j.id, j.token) for j in expired]
    started = dict(
        JobRun.objects.filter(pairs(claims, "job_id"), status=RunStatus.RUNNING).values_list(
            "job_id", "scheduled_for"
        )
    )
    unsent = _messages_expired([j for j in expired if j.id not in started], claims, message_expiry)
    # A run a later occurrence superseded before it started is not sent again: the job goes
    # on to the latest occurrence due, as when Celery drops a message past its expires.
    superseded = {
        j.id: j.scheduled_for
        for j in expired
        if j.id not in started and j.superseded and j.overlap in policies.SUPERSEDING
    }
    unsent.update(superseded)
    why = {job_id: SUPERSEDED_UNSTARTED if job_id in superseded else EXPIRED for job_id in unsent}
    for error in set(why.values()):
        JobRun.objects.filter(
            pairs([c for c in claims if why.get(c[0]) == error], "job_id"),
            status=RunStatus.DISPATCHED,
        ).update(status=RunStatus.SKIPPED, finished_at=Now(), error=error)
    JobRun.objects.filter(pairs(claims, "job_id"), status__in=ACTIVE_RUN_STATUSES).update(
        status=RunStatus.LOST,
        finished_at=Now(),
        error="lease expired: the worker or beat holding it stopped renewing it",
    )
    result = ReapResult(expired=len(expired), started=len(started), dropped=len(unsent))
    for job in expired:
        if job.id in unsent:
            try:
                plan = policies.plan_after_expiry(job_facts(job, ran_for=unsent[job.id]))
            except Exception as exc:
                result.quarantined.append(quarantine_locked(job.id, unschedulable(exc)))
                continue
            write_after_run(
                job.id,
                job.token,
                plan,
                status=RunStatus.SKIPPED,
                error=why[job.id],
                bump_token=True,
            )
            continue
        if job.id not in started:
            Job.objects.filter(id=job.id).update(
                state=JobState.SCHEDULED if job.state == JobState.RUNNING else JobState.PAUSED,
                token=F("token") + 1,
                claimed_by="",
                lease_expires_at=None,
                # the next copy waits longer (policies.dispatch_wait)
                unstarted_dispatches=Least(
                    F("unstarted_dispatches") + 1, Value(policies.MAX_WAIT_DOUBLINGS)
                ),
            )
            continue
        try:
            plan = policies.plan_after_failure(job_facts(job, ran_for=started[job.id]), rng=rng)
        except Exception as exc:
            result.quarantined.append(quarantine_locked(job.id, unschedulable(exc)))
            continue
        write_after_run(
            job.id,
            job.token,
            plan,
            status=RunStatus.LOST,
            error="lease expired while running",
            bump_token=True,
        )
        if plan.dead:
            notify_dead(job, started[job.id], "lease expired while running")
        result.dead += plan.dead
        result.carried_on += plan.failed_occurrence and not plan.dead
    dropped = f"; {len(unsent)} never started, their message expired: dropped" if unsent else ""
    log.warning(
        "reaped %d expired lease(s) (%d had started%s)",
        len(expired),
        len(started),
        dropped,
        extra={"action": "reap", "count": len(expired)},
    )
    return result


def _messages_expired(
    unstarted: list[Job], claims: list[tuple[int, int]], message_expiry: MessageExpiry | None
) -> dict[int, datetime]:
    """The unstarted jobs whose message is past its ``expires``, counted from the claim
    (``dispatched_at``; the message left moments after it) in the database's clock: job id ->
    the occurrence its run was for."""
    if message_expiry is None or not unstarted:
        return {}
    lives: dict[int, float] = {}
    for job in unstarted:
        try:
            seconds = message_expiry(job)
        except Exception:  # a route that no longer resolves: the publish will say so
            seconds = None
        if seconds is not None:
            lives[job.id] = seconds
    if not lives:
        return {}
    runs = JobRun.objects.filter(
        pairs([c for c in claims if c[0] in lives], "job_id"), status=RunStatus.DISPATCHED
    ).values_list("job_id", "dispatched_at", "scheduled_for")
    now = get_store().now()
    return {
        job_id: scheduled_for
        for job_id, sent, scheduled_for in runs
        if sent + timedelta(seconds=lives[job_id]) <= now
    }
