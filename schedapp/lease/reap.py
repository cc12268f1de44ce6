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
from ..models import ACTIVE_RUN_STATUSES, Job, JobRun, JobState, RunStatus
from ..store import get_store, pairs
from .after_run import EXPIRED, SUPERSEDED_UNSTARTED, job_facts, write_after_run
from .quarantine import Quarantined, in_savepoint_or_quarantine, quarantine_locked, unschedulable

log = logging.getLogger(__name__)


@dataclass
class ReapResult:
    expired: int = 0  # leases reaped
    started: int = 0  # ... whose run had started (a failed attempt)
    dead: int = 0  # ... which exhausted the job's retries
    carried_on: int = 0  # ... which exhausted them and went on with the next occurrence
    dropped: int = 0  # ... never started, their message expired: occurrence dropped
    quarantined: list[Quarantined] = field(default_factory=list)


# --- reaping -------------------------------------------------------------------------------


# How many seconds a job's message lives once published (its ``expires``), None for ever: the
# beat's answer from the route it publishes the job with.
MessageExpiry = Callable[[Job], "float | None"]


def reap_expired_leases(
    limit: int,
    rng: policies.Rng = random.random,
    message_expiry: MessageExpiry | None = None,
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


def _expired() -> Any:
    """The leases that expired, oldest first, as a queryset that locks them (SKIP LOCKED)."""
    return (
        Job.objects.select_for_update(skip_locked=True)
        .annotate(database_now=Now())  # what job_facts compares a next occurrence with
        .filter(state__in=[JobState.RUNNING, JobState.PAUSED], lease_expires_at__lt=Now())
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
            result.expired += one.expired
            result.started += one.started
            result.dead += one.dead
            result.dropped += one.dropped
            result.quarantined.extend(one.quarantined)
    return result


def reap_locked(
    limit: int,
    rng: policies.Rng,
    message_expiry: MessageExpiry | None = None,
    ids: list[int] | None = None,
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
    unsent = _messages_expired(
        [j for j in expired if j.id not in started], claims, message_expiry
    )
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
