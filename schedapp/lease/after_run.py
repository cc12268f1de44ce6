"""What every path that ends a run shares: the job row locked before the run row, the facts
the after-run rules (``policies``) read, and the one write that moves the job on."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import F, QuerySet
from django.db.models.functions import Now

from .. import job_calendars, ledger, policies
from ..db import notify_due
from ..models import Job, JobRun, JobState, RunStatus
from ..notify.outbox import dead_incident, enqueue
from ..schedules import Schedule
from .quarantine import ERROR_CHARS, storable


def job_schedule(job: Job) -> Schedule:
    return job.schedule


def run_of(job_id: int, token: int, run_id: int | None = None) -> QuerySet[JobRun]:
    """A claim's run: by its id as well when the caller knows it (a worker, from its message's
    headers), so that on partitioned history it is read in its own partition only; by
    (job, token) alone, one probe of each partition's unique index, otherwise."""
    runs = JobRun.objects.filter(job_id=job_id, token=token)
    return runs.filter(pk=run_id) if run_id is not None else runs


def lock_job_and_run(
    job_id: int, token: int, run_id: int | None = None
) -> tuple[Job | None, dict[str, Any] | None]:
    """The job row, locked first as everywhere, then what an outcome reads of its run."""
    # The database's now() read with the lock: what the overlap policy compares the next
    # occurrence with (``job_facts``), in the same round trip.
    job = Job.objects.select_for_update().annotate(database_now=Now()).filter(id=job_id).first()
    run = run_of(job_id, token, run_id).values("status", "scheduled_for", "own_lease")
    return job, run.first()


def job_facts(job: Job, ran_for: datetime | None = None) -> policies.JobFacts:
    """What the after-run rules read; ``ran_for`` is the occurrence the run was for (the job
    was rescheduled while the run was in flight if its ``scheduled_for`` differs). The
    database's clock as the run ends is what the job row was read with (``database_now``,
    annotated where it was locked: ``lock_job_and_run``, the reaper)."""
    if job.overlap not in policies.OVERLAP_POLICIES:  # written behind the API's back
        raise ValueError(
            f"overlap {job.overlap!r} is not one of {', '.join(policies.OVERLAP_POLICIES)}"
        )
    return policies.JobFacts(
        schedule=job_schedule(job),
        state=job.state,
        scheduled_for=job.scheduled_for or job.next_run_at,  # type: ignore[arg-type]
        next_run_at=job.next_run_at,
        ran_for=ran_for,
        retry_count=job.retry_count,
        max_retries=job.max_retries,
        retry_backoff=job.retry_backoff,
        retry_backoff_max=job.retry_backoff_max,
        jitter=job.jitter,
        when_retries_exhausted=job.when_retries_exhausted,
        now=getattr(job, "database_now", None),
        overlap=job.overlap,
        max_buffer=job.max_buffer,
        fixed_delay=job.fixed_delay,
        superseded=job.superseded,
        calendar=job_calendars.for_job(job),
    )


def write_after_run(
    job_id: int,
    token: int,
    plan: policies.AfterRun,
    *,
    status: str,
    error: str = "",
    bump_token: bool = False,
) -> None:
    next_run_at = (Now() + plan.delay) if plan.delay is not None else plan.next_run_at
    changes = {
        "state": plan.state,
        "scheduled_for": plan.scheduled_for,
        "next_run_at": next_run_at,
        "retry_count": plan.retry_count,
        "claimed_by": "",
        "lease_expires_at": None,
        "last_run_at": Now(),
        "last_status": status,
        "updated_at": Now(),
        "supersede_at": None,  # the run it was for has ended
        "superseded": False,
    }
    if status != RunStatus.SUCCEEDED:
        changes["last_error"] = storable(error, ERROR_CHARS)
    if bump_token:
        changes["token"] = F("token") + 1
    if plan.failed_occurrence:
        changes["failed_occurrences"] = F("failed_occurrences") + 1
    if plan.interval_anchor is not None:
        changes["interval_anchor"] = plan.interval_anchor
    updated = Job.objects.filter(id=job_id, token=token).update(**changes)
    assert updated == 1, "the row is locked by this transaction"
    ledger.record([(job_id, r) for r in plan.ranges], "run end")
    if plan.state == JobState.SCHEDULED:
        # Beats sleep until the next due time they know of; this one may be sooner.
        notify_due(plan.next_run_at, plan.delay.total_seconds() if plan.delay else None)


def notify_dead(job: Job, scheduled_for: datetime | None, error: str) -> None:
    """Queue the ``dead`` notification in the transaction that dead-letters the job: sent
    after it commits, never if it rolls back."""
    enqueue(
        "dead",
        job,
        scheduled_for=scheduled_for,
        detail=error.splitlines()[0] if error else "",
        incident=dead_incident(job.id),
    )


EXPIRED = "expired before a worker started it"
SUPERSEDED_UNSTARTED = "superseded by a later occurrence before a worker started it"
