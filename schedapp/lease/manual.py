"""A person's actions that touch a job's lease, token or dispatch counter: resume, run now,
requeue and cancel. ``api`` checks the job's state and the allowlist and calls these with the
job row locked, in its transaction; every write to those columns stays in this package."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from django.db.models.functions import Now

from .. import job_calendars, ledger, policies
from ..db import notify_due
from ..models import ACTIVE_RUN_STATUSES, Job, JobRun, JobState, RunStatus


def resume_locked(job: Job, now: datetime, first_run: Callable[[Job, datetime], None]) -> None:
    """Claimable again. A live lease: a run in flight when the job was paused goes on under
    it. An expired one over a run that had started (its worker died meanwhile) is the
    reaper's, which closes the run as lost and counts the attempt, as for any dead worker.
    ``first_run`` sets the occurrence of a job that has none (``api``'s rule)."""
    lease = job.lease_expires_at
    in_flight = lease is not None and (
        lease > now
        or JobRun.objects.filter(job=job, token=job.token, status=RunStatus.RUNNING).exists()
    )
    job.state = JobState.RUNNING if in_flight else JobState.SCHEDULED
    if job.state == JobState.SCHEDULED:
        job.claimed_by, job.lease_expires_at = "", None
        job.unstarted_dispatches = 0  # a person's action: an ordinary wait again
        if job.next_run_at is None:
            first_run(job, now)
        else:
            _decide_paused(job, now)
    job.save(
        update_fields=[
            "state",
            "claimed_by",
            "lease_expires_at",
            "unstarted_dispatches",
            "next_run_at",
            "scheduled_for",
            "missed_runs",
            "updated_at",
        ]
    )
    if job.state == JobState.SCHEDULED:
        notify_due(job.next_run_at)
    elif lease is not None and lease <= now:
        notify_due(now)  # wake a beat to reap it


def _decide_paused(job: Job, now: datetime) -> None:
    """Occurrences that passed while the job was paused, decided now by its misfire policy
    (and catch-up window) and recorded as ``paused``, so the ledger says why they did not
    run. The claim would decide the same a moment later, recorded only as ``misfired``. A
    schedule that cannot be computed is left to the claim, which quarantines it."""
    if job.scheduled_for is None or job.next_run_at is None or job.run_at is not None:
        return
    late = policies.misfire_after(job.misfire_policy, job.misfire_grace)
    if job.retry_count or now - job.next_run_at <= late:
        return  # not a misfire (a retry waits for its backoff, as in the claim)
    try:
        plan = policies.plan_misfire(
            job.schedule,
            job.scheduled_for,
            now,
            job.misfire_policy,
            job.misfire_max_catchup,
            job.misfire_grace,
            job.catchup_window,
            fate=policies.PAUSED,
            calendar=job_calendars.for_job(job),
        )
    except Exception:  # the claim quarantines what cannot be computed
        return
    job.missed_runs += plan.missed
    if plan.run_for is None:
        job.state, job.scheduled_for, job.next_run_at = policies.waiting_after(
            plan, job.scheduled_for, job.jitter
        )
    else:
        job.scheduled_for = job.next_run_at = plan.run_for
    ledger.record([(job.pk, r) for r in plan.ranges], "resume")


def run_now_locked(job: Job, now: datetime) -> None:
    """An extra occurrence "now", with a fresh retry count and an ordinary dispatch wait."""
    job.state = JobState.SCHEDULED
    job.scheduled_for = job.next_run_at = job.manual_at = now
    job.retry_count = job.unstarted_dispatches = 0
    job.save(
        update_fields=[
            "state",
            "scheduled_for",
            "manual_at",
            "next_run_at",
            "retry_count",
            "unstarted_dispatches",
            "updated_at",
        ]
    )
    notify_due(now)


def requeue_locked(job: Job, now: datetime) -> None:
    """A dead job's failed occurrence again, now, with a fresh retry count."""
    job.state = JobState.SCHEDULED
    job.retry_count = job.unstarted_dispatches = 0
    job.next_run_at = now
    if job.scheduled_for is None:
        job.scheduled_for = now
    job.save(
        update_fields=[
            "state",
            "retry_count",
            "unstarted_dispatches",
            "next_run_at",
            "scheduled_for",
            "updated_at",
        ]
    )
    notify_due(now)


def cancel_locked(job: Job, *, terminate: bool) -> list[str]:
    """No further run: the token moves on, so a run in flight can no longer change the job,
    and its run is closed ``cancelled`` now, not when (or if) its worker reports. Returns the
    Celery task ids of the runs that were in flight, for the caller to revoke after commit."""
    active = list(
        JobRun.objects.filter(job=job, status__in=ACTIVE_RUN_STATUSES).values_list(
            "task_id", flat=True
        )
    )
    JobRun.objects.filter(job=job, status=RunStatus.DISPATCHED).update(
        status=RunStatus.CANCELLED,
        finished_at=Now(),
        error="cancelled before it started",
        lease_expires_at=None,
        retry_at=None,
    )
    JobRun.objects.filter(job=job, status=RunStatus.RUNNING).update(
        status=RunStatus.CANCELLED,
        finished_at=Now(),
        lease_expires_at=None,
        error="cancelled while running: its task was revoked and "
        + ("terminated (SIGTERM)" if terminate else "may run on to its end"),
    )
    if not active and job.next_run_at is not None and job.scheduled_for is not None:
        ledger.record_one(
            job.pk, job.scheduled_for, policies.CANCELLED, "the job was cancelled", "cancel"
        )
    job.state = JobState.CANCELLED
    job.token += 1
    job.claimed_by, job.lease_expires_at, job.next_run_at = "", None, None
    job.save(
        update_fields=[
            "state",
            "token",
            "claimed_by",
            "lease_expires_at",
            "next_run_at",
            "updated_at",
        ]
    )
    return active
