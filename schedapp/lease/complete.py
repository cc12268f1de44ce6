"""Completions: a run's outcome recorded and, if the run is still its job's current one,
the job moved on (the next occurrence, a retry, dead). A stale completion is recorded on the
run only; a retried one changes nothing. Which outcome is accepted, and whether it moves the
job, is ``rules.completion``'s table (and ``schedapp_succeed_run`` applies only what
``rules.fast_success`` says); this module reads and writes.

Every write locks the job row before the run row (the reaper, the claim and the API do the
same), so the door, renewals, completions and the reaper serialise on the job row.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import F, Min
from django.db.models.functions import Now

from .. import deadlines, policies
from ..db import notify_due
from ..message import RunHeaders, task_id_for
from ..models import (
    ACTIVE_RUN_STATUSES,
    Breach,
    BreachKind,
    Job,
    JobRun,
    JobState,
    RunKind,
    RunStatus,
)
from ..schedules import Interval, Schedule, next_fire_time, parse_cron
from ..store import DoorVerdict, get_store
from .after_run import EXPIRED, job_facts, lock_job_and_run, notify_dead, run_of, write_after_run
from .quarantine import (
    ERROR_CHARS,
    ROW_ERRORS,
    TRACEBACK_CHARS,
    Quarantined,
    first_line,
    job_label,
    quarantine_locked,
    storable,
    unschedulable,
)
from .rules import ANY, STARTED, UNSTARTED_ONLY, Completion, LeaseJob, completion, run_completion

log = logging.getLogger(__name__)


# --- completion ------------------------------------------------------------------------------

SUCCEEDED = RunStatus.SUCCEEDED.value
FAILED = RunStatus.FAILED.value
SKIPPED = RunStatus.SKIPPED.value


@dataclass(frozen=True)
class CompletionResult:
    completion: Completion
    dead: bool = False  # this failure exhausted the job's retries
    quarantined: Quarantined | None = None
    # this failure exhausted them and the job went on with its next occurrence
    carried_on: bool = False

    @property
    def applied(self) -> bool:
        return self.completion is Completion.APPLIED


def complete_run(
    job_id: int,
    token: int,
    outcome: str,
    *,
    error: str = "",
    traceback: str = "",
    retry_delay: timedelta | None = None,
    headers: RunHeaders | None = None,
    allow_unstarted: bool = False,
    only_unstarted: bool = False,
    rng: policies.Rng = random.random,
    run_id: int | None = None,
) -> CompletionResult:
    """Record a run's outcome and move its job on.

    Only a run still ``running`` under the job's current token moves the job; a run whose job
    moved on (its lease was lost, it was cancelled) is recorded on the run only, flagged
    ``stale``; a run already finished (a retried completion) is left as it is.
    ``allow_unstarted`` lets a run that never passed the door fail too (a task terminated as
    it started). ``only_unstarted`` is for an outcome about a copy of the message that never
    reached a door (its task is not registered on the worker that received it, it arrived
    expired): it applies only while no door admitted the run, since another copy may be
    executing elsewhere. ``run_id`` (or the headers') finds the run in its own partition.
    """
    if outcome == SUCCEEDED and headers is not None:
        if _succeed_fast(job_id, token, headers):
            return CompletionResult(Completion.APPLIED)
    return _complete(
        job_id,
        token,
        outcome,
        error=error,
        traceback=traceback,
        retry_delay=retry_delay,
        accepted=UNSTARTED_ONLY if only_unstarted else ANY if allow_unstarted else STARTED,
        rng=rng,
        run_id=headers.run_id if run_id is None and headers is not None else run_id,
    )


def _succeed_fast(job_id: int, token: int, headers: RunHeaders) -> bool:
    """The common success in one call of ``schedapp_succeed_run_v5`` (sql/functions.sql): the next
    occurrence computed here from the schedule the claim saw. False: take the general path."""
    args = _success_args(job_id, token, headers)
    if args is None:
        return False
    return get_store().succeed_run(args)


def _success_args(job_id: int, token: int, headers: RunHeaders) -> list[Any] | None:
    """The arguments of ``schedapp_succeed_run_v5``; None if the schedule cannot be computed here
    (the general path then quarantines the job, with the reason)."""
    if headers.own_lease:
        return None  # fenced on its run row, not on the job: the general path
    ref = headers.schedule
    nxt = None
    if ref is not None:
        try:
            if ref.interval is not None:
                schedule: Schedule = Interval(ref.interval, ref.anchor)
            else:
                schedule = parse_cron(ref.cron, ref.timezone, day_or=ref.day_or)
            nxt = next_fire_time(schedule, headers.scheduled_for)
        except Exception:
            return None
        if nxt is None:
            return None
    return [
        job_id,
        token,
        headers.scheduled_for,
        nxt,
        ref is None,
        # Celery's day rule marked with "&", as schedapp_succeed_run_v5 compares it
        (ref.cron if ref.day_or else "&" + ref.cron) if ref else "",
        ref.timezone if ref else "",
        ref.interval if ref else None,
        ref.anchor if ref else None,
        headers.run_id,
    ]


def complete_successes(
    items: Sequence[tuple[int, int, RunHeaders]], rng: policies.Rng = random.random
) -> list[CompletionResult]:
    """Several successes at once (a pool process's, when no door came to carry them): the
    common case of all of them in one round trip and one commit (``schedapp_succeed_runs_v4``);
    any other case each on the general path."""
    columns, batch = _success_columns(items)
    rows = get_store().succeed_runs(columns) if batch else []
    return _success_results(items, batch, rows, rng)


def admit_run_after_successes(
    successes: Sequence[tuple[int, int, RunHeaders]],
    job_id: int,
    token: int,
    worker: str,
    admission: str,
    rng: policies.Rng = random.random,
    run_id: int | None = None,
) -> tuple[DoorVerdict, list[CompletionResult]]:
    """The door (``admit_run``) carrying the successes its process recorded since its last
    round trip: on PostgreSQL both in one statement and one commit, so a pool process working
    through a backlog makes one round trip per execution. Successes the common path does not
    take (stale, schedule changed) are then recorded one by one on the general path."""
    columns, batch = _success_columns(successes)
    rows, verdict = get_store().succeed_and_admit(columns, job_id, token, worker, admission, run_id)
    return verdict, _success_results(successes, batch, rows, rng)


def _success_columns(
    items: Sequence[tuple[int, int, RunHeaders]],
) -> tuple[list[list[Any]], list[tuple[int, list[Any]]]]:
    """``schedapp_succeed_runs_v4``'s arguments as columns, and the items they cover (index,
    arguments): those whose next occurrence could be computed here."""
    batch = [(i, _success_args(j, t, h)) for i, (j, t, h) in enumerate(items)]
    covered = [(i, a) for i, a in batch if a is not None]
    columns = [list(col) for col in zip(*(a for _, a in covered), strict=True)]
    return columns, covered  # type: ignore[return-value]


def _success_results(
    items: Sequence[tuple[int, int, RunHeaders]],
    batch: list[tuple[int, list[Any]]],
    rows: Sequence[tuple[int, bool]],
    rng: policies.Rng,
) -> list[CompletionResult]:
    applied = {batch[idx - 1][0] for idx, ok in rows if ok}
    return [
        CompletionResult(Completion.APPLIED)
        if i in applied
        else _complete(
            job_id,
            token,
            SUCCEEDED,
            error="",
            traceback="",
            retry_delay=None,
            accepted=STARTED,
            rng=rng,
            run_id=headers.run_id,
        )
        for i, (job_id, token, headers) in enumerate(items)
    ]


def _complete(
    job_id: int,
    token: int,
    outcome: str,
    *,
    error: str,
    traceback: str,
    retry_delay: timedelta | None,
    accepted: frozenset[str],
    rng: policies.Rng,
    run_id: int | None = None,
) -> CompletionResult:
    try:
        return _complete_locked(
            job_id,
            token,
            outcome,
            error=error,
            traceback=traceback,
            retry_delay=retry_delay,
            accepted=accepted,
            rng=rng,
            run_id=run_id,
        )
    except ROW_ERRORS as exc:  # the job row cannot be read or written as it is
        return _complete_and_quarantine(
            job_id,
            token,
            outcome,
            error=error,
            traceback=traceback,
            accepted=accepted,
            exc=exc,
            run_id=run_id,
        )


def _complete_and_quarantine(
    job_id: int,
    token: int,
    outcome: str,
    *,
    error: str,
    traceback: str,
    accepted: frozenset[str],
    exc: BaseException,
    run_id: int | None,
) -> CompletionResult:
    """An outcome whose job row could not be read or written (a value written behind the
    API's back): the run's outcome is recorded as usual, and the job, if the run was still
    its current one, is quarantined with the error instead of moving on. Only the columns
    every claim writes are read here."""
    with transaction.atomic():
        job = Job.objects.select_for_update().filter(id=job_id).values("token", "state").first()
        runs = run_of(job_id, token, run_id)
        run = runs.values("status").first()
        lease_job = LeaseJob(job["state"], job["token"]) if job is not None else None
        verdict = completion(lease_job, run and run["status"], token, accepted)
        if verdict is Completion.ALREADY_RECORDED:
            return CompletionResult(verdict)
        fresh = verdict is Completion.APPLIED
        runs.update(
            status=outcome,
            finished_at=Now(),
            error=storable(error, ERROR_CHARS),
            traceback=storable(traceback, TRACEBACK_CHARS),
            stale=not fresh,
        )
        if not fresh:
            return CompletionResult(Completion.STALE)
        reason = f"its run's outcome cannot be written ({type(exc).__name__}: {first_line(exc)})"
        quarantined = quarantine_locked(job_id, reason)
    return CompletionResult(Completion.APPLIED, dead=True, quarantined=quarantined)


def _stale(job: Job | None, job_id: int, token: int) -> CompletionResult:
    """A completion whose lease was lost (kept on its run, not applied to the job): said once,
    for the job and the run the worker held."""
    log.warning(
        "stale completion of %s token %s: not applied",
        job_label(job_id, job.name if job is not None else None),
        token,
        extra={"action": "stale_completion", "job": job_id, "token": token},
    )
    return CompletionResult(Completion.STALE)


def _complete_locked(
    job_id: int,
    token: int,
    outcome: str,
    *,
    error: str,
    traceback: str,
    retry_delay: timedelta | None,
    accepted: frozenset[str],
    rng: policies.Rng,
    run_id: int | None,
) -> CompletionResult:
    with transaction.atomic():
        job, run = lock_job_and_run(job_id, token, run_id)
        if run is not None and run["own_lease"]:
            return _complete_own_lease(
                job, job_id, token, outcome, error, traceback, accepted, retry_delay, rng, run_id
            )
        lease_job = LeaseJob(job.state, job.token) if job is not None else None
        verdict = completion(lease_job, run and run["status"], token, accepted)
        if verdict is Completion.ALREADY_RECORDED:
            return CompletionResult(verdict)
        assert run is not None
        fresh = verdict is Completion.APPLIED
        error, traceback = storable(error, ERROR_CHARS), storable(traceback, TRACEBACK_CHARS)
        run_of(job_id, token, run_id).update(
            status=outcome, finished_at=Now(), error=error, traceback=traceback, stale=not fresh
        )
        if not fresh:
            return _stale(job, job_id, token)
        assert job is not None
        try:
            facts = job_facts(job, ran_for=run["scheduled_for"])
            if outcome == SUCCEEDED:
                plan = policies.plan_after_success(facts, rng=rng)
            elif outcome == SKIPPED:
                plan = policies.plan_after_expiry(facts, rng=rng)
            else:
                plan = policies.plan_after_failure(facts, delay=retry_delay, rng=rng)
        except Exception as exc:  # written behind the API's back, or another croniter/tzdata
            quarantined = quarantine_locked(job_id, unschedulable(exc))
            return CompletionResult(Completion.APPLIED, dead=True, quarantined=quarantined)
        write_after_run(job_id, token, plan, status=outcome, error=error)
        if outcome == FAILED and job.alert_after_failures:
            # where the failure is written: N in a row make the job failing (one per incident)
            deadlines.record_failure(job, run["scheduled_for"])
        if plan.dead:
            notify_dead(job, run["scheduled_for"], error)
    if plan.dead:
        log.error(
            "%s is dead after %d attempt(s): %s",
            job_label(job_id, job.name),
            job.retry_count + 1,
            error.splitlines()[0] if error else "",
            extra={"action": "dead", "job": job_id},
        )
    elif plan.failed_occurrence:
        log.warning(
            "job %s: occurrence %s failed after %d attempt(s), going on with the next one "
            "(when_retries_exhausted=next_occurrence): %s",
            job_id,
            run["scheduled_for"].isoformat(),
            job.retry_count + 1,
            error.splitlines()[0] if error else "",
            extra={"action": "occurrence_failed", "job": job_id},
        )
    return CompletionResult(
        Completion.APPLIED, dead=plan.dead, carried_on=plan.failed_occurrence and not plan.dead
    )


def _complete_own_lease(
    job: Job | None,
    job_id: int,
    token: int,
    outcome: str,
    error: str,
    traceback: str,
    accepted: frozenset[str],
    retry_delay: timedelta | None,
    rng: policies.Rng,
    run_id: int | None,
) -> CompletionResult:
    """The outcome of a run with its own lease (allow_all), inside the caller's transaction,
    the job row locked: the run row is locked and decides (``rules.run_completion``); its job
    moved on at the claim, so only the job's own record changes (``record_own_lease_outcome``).
    A stale outcome (the reaper marked the run lost) is kept on the run only; a retried one
    changes nothing."""
    runs = run_of(job_id, token, run_id)
    run = runs.select_for_update().values("status", "attempt", "scheduled_for", "kind").first()
    verdict = run_completion(job is not None, run and run["status"], accepted)
    if verdict is Completion.ALREADY_RECORDED:
        return CompletionResult(verdict)
    fresh = verdict is Completion.APPLIED
    error, traceback = storable(error, ERROR_CHARS), storable(traceback, TRACEBACK_CHARS)
    runs.update(
        status=outcome,
        finished_at=Now(),
        error=error,
        traceback=traceback,
        stale=not fresh,
        lease_expires_at=None,
    )
    notify_due(None, 0.0)  # a slot of max_concurrent is free: an occurrence may be waiting
    if not fresh:
        return _stale(job, job_id, token)
    assert job is not None and run is not None
    return record_own_lease_outcome(
        job, outcome, error, run["attempt"], run["scheduled_for"], retry_delay, rng, run["kind"]
    )


def record_own_lease_outcome(
    job: Job,
    outcome: str,
    error: str,
    attempt: int,
    scheduled_for: datetime,
    retry_delay: timedelta | None = None,
    rng: policies.Rng = random.random,
    kind: str | None = None,
) -> CompletionResult:
    """What the end of an allow_all run (its completion, or the reaper's verdict: ``lost``)
    writes, the job row locked by the caller: the job's last status and error; a failure
    with attempts left becomes a retry, a run of its own waiting for its due time
    (``wait_for_retry``), the backoff as for any job (or the task's own ``self.retry``
    countdown, granted as ``policies.plan_after_failure`` grants it); a failure with none left
    counts a failed occurrence and follows ``when_retries_exhausted`` (dead, or simply on:
    the job has already moved on). A backfilled run (``kind`` backfill) retries as a
    backfilled run and never makes its job dead: the job's own schedule is not its."""
    changes: dict[str, Any] = {"last_run_at": Now(), "last_status": outcome, "updated_at": Now()}
    if outcome != SUCCEEDED:
        changes["last_error"] = error
    failed = outcome in (FAILED, RunStatus.LOST.value)
    task_retry = retry_delay is not None and job.when_retries_exhausted == policies.NEXT_OCCURRENCE
    retry = failed and (attempt - 1 < job.max_retries or task_retry)
    backfilled = kind == RunKind.BACKFILL
    dead = failed and not retry and job.when_retries_exhausted == policies.DEAD and not backfilled
    if failed and not retry:
        changes["failed_occurrences"] = F("failed_occurrences") + 1
    if dead and job.state not in (JobState.CANCELLED, JobState.DEAD):
        changes.update(state=JobState.DEAD, next_run_at=None)
    Job.objects.filter(id=job.id).update(**changes)
    if retry:
        wait = (
            policies.bounded_delay(retry_delay)
            if retry_delay is not None
            else policies.compute_backoff(attempt - 1, job.retry_backoff, job.retry_backoff_max)
        )
        wait += policies.compute_jitter(job.jitter, rng)
        wait_for_retry(
            job.id,
            scheduled_for,
            attempt + 1,
            RunKind.BACKFILL if backfilled else RunKind.RETRY,
            wait,
        )
    if dead:
        log.error(
            "%s is dead after %d attempt(s) of %s (overlap allow_all): %s",
            job_label(job.id, job.name),
            attempt,
            scheduled_for.isoformat(),
            error.splitlines()[0] if error else "",
            extra={"action": "dead", "job": job.id},
        )
    return CompletionResult(
        Completion.APPLIED, dead=dead, carried_on=failed and not retry and not dead
    )


def wait_for_retry(
    job_id: int, scheduled_for: datetime, attempt: int, kind: str, delay: timedelta
) -> None:
    """A run of an allow_all occurrence waiting ``delay`` from the database's now (its
    ``retry_at``) for a beat to claim it, under a token of its own drawn from its job (whose
    row the caller holds locked): the runs of a job keep one token each. Its lease is taken
    when it is claimed, and a pending retry holds no slot of ``max_concurrent`` until then.
    A backfilled run's takes a negative token (``backfill.next_token``): the job's own token,
    which may be fencing its own run in flight, is left alone."""
    if kind == RunKind.BACKFILL:
        token = next_token(job_id)
    else:
        Job.objects.filter(id=job_id).update(token=F("token") + 1)
        token = Job.objects.filter(id=job_id).values_list("token", flat=True).get()
    due = Now() + delay
    JobRun.objects.create(
        job_id=job_id,
        token=token,
        attempt=attempt,
        kind=kind,
        scheduled_for=scheduled_for,
        due_at=due,
        dispatched_at=due,
        task_id=task_id_for(job_id, token),
        status=RunStatus.DISPATCHED,
        own_lease=True,
        retry_at=due,
    )
    notify_due(None, delay.total_seconds())


def next_token(job_id: int) -> int:
    """The next negative token of a job's backfilled runs (the job row locked by the caller):
    below every token the job has, so never one of its own (they count up from 0)."""
    low = JobRun.objects.filter(job_id=job_id, token__lt=0).aggregate(low=Min("token"))["low"]
    return (low or 0) - 1


def record_expired(job_id: int, token: int, run_id: int | None = None) -> CompletionResult | None:
    """Celery discarded a schedapp message past its ``expires``, as it does any task's: the
    run is ``skipped`` and its occurrence dropped (``policies.plan_after_expiry``). A run a
    door already admitted (another copy is executing) is left alone. Returns the completion
    when the job moved on, None when only the run was closed or nothing changed."""
    with transaction.atomic():
        job, run = lock_job_and_run(job_id, token, run_id)
        runs = run_of(job_id, token, run_id)
        if run is not None and run["own_lease"]:  # its job moved on at the claim: the run only
            runs.filter(status=RunStatus.DISPATCHED).update(
                status=RunStatus.SKIPPED, finished_at=Now(), error=EXPIRED, lease_expires_at=None
            )
            return None
        lease_job = LeaseJob(job.state, job.token) if job is not None else None
        verdict = completion(lease_job, run and run["status"], token, UNSTARTED_ONLY)
        if verdict is Completion.ALREADY_RECORDED:
            return None
        runs.update(status=RunStatus.SKIPPED, finished_at=Now(), error=EXPIRED)
        if verdict is Completion.STALE:  # closed, and the run only: the job moved on
            return None
        assert job is not None and run is not None
        try:
            plan = policies.plan_after_expiry(job_facts(job, ran_for=run["scheduled_for"]))
        except Exception as exc:  # written behind the API's back, or another croniter/tzdata
            quarantined = quarantine_locked(job_id, unschedulable(exc))
            return CompletionResult(Completion.APPLIED, dead=True, quarantined=quarantined)
        write_after_run(job_id, token, plan, status=RunStatus.SKIPPED, error=EXPIRED)
    return CompletionResult(Completion.APPLIED)


def record_cancelled(
    job_id: int, token: int, *, terminated: bool, run_id: int | None = None
) -> CompletionResult | None:
    """A schedapp task was revoked. After ``api.cancel`` (which bumped the token) only the run
    is closed; a revoke from elsewhere (``celery control revoke``) counts as a failed attempt,
    so the job is retried or dead-lettered instead of waiting for its lease to expire.
    A copy revoked before it started here (not ``terminated``) says nothing of a run another
    worker admitted: that run is left to finish.
    Returns the completion when the revoke moved the job, None when it only closed the run."""
    how = "revoked and terminated" if terminated else "revoked"
    current = (
        Job.objects.filter(id=job_id, token=token, state=JobState.RUNNING)
        .values_list("superseded", flat=True)
        .first()
    )
    if current is not None:
        # A revoke from a beat, under cancel_other / terminate_other, or from elsewhere.
        why = "a later occurrence superseded it (overlap policy)" if current else "outside schedapp"
        if not current and _revoked_as_overrun(job_id):
            why = "it ran past its max_runtime (revoke_overrun)"
        result = complete_run(
            job_id,
            token,
            FAILED,
            error=f"task {how}: {why}",
            allow_unstarted=terminated,
            only_unstarted=not terminated,
            run_id=run_id,
        )
        if result.applied:
            with transaction.atomic():
                Job.objects.select_for_update().filter(id=job_id).values_list("id").first()
                run_of(job_id, token, run_id).update(status=RunStatus.CANCELLED)
        return result
    with transaction.atomic():
        Job.objects.select_for_update().filter(id=job_id).values_list("id").first()
        run_of(job_id, token, run_id).filter(status__in=ACTIVE_RUN_STATUSES).update(
            status=RunStatus.CANCELLED,
            finished_at=Now(),
            error=f"cancelled ({how})",
            lease_expires_at=None,
        )
    return None


def _revoked_as_overrun(job_id: int) -> bool:
    """Whether a revoke of the job's run is the deadline pass's (``revoke_overrun``): its
    overrunning breach is open. Read only when a run is revoked."""
    open_overrun = Breach.objects.filter(
        job_id=job_id, kind=BreachKind.OVERRUNNING, cleared_at__isnull=True
    )
    return open_overrun.filter(job__revoke_overrun=True).exists()
