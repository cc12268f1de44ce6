"""The only place that writes lease state: claim, start, renew, complete, release, reap.

Vocabulary: a beat *claims* due jobs (lease + new fencing token + a run row, in one
transaction), a worker *starts* a run at its door, *renews* leases while it works and
*completes* the run; a beat *releases* claims it could not publish and *reaps* leases that
expired. Every write after a claim is fenced by ``(job_id, token)`` and its row count checked:
no row means the lease was lost, and nothing newer is ever overwritten.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from django.db import DataError, IntegrityError, transaction
from django.db.models import F, Value
from django.db.models.functions import Least, Now

from . import policies
from .db import beat_transaction, notify_due
from .message import RunHeaders, ScheduleRef, idempotency_key, task_id_for
from .models import ACTIVE_RUN_STATUSES, Job, JobRun, JobState, RunStatus, schedule_of
from .schedules import Interval, Schedule, next_fire_time, parse_cron
from .store import DoorVerdict, get_store, insert_runs, pairs

log = logging.getLogger("schedapp.claims")


@dataclass
class ClaimedRun:
    """One claimed job, ready to publish. ``args_json``/``kwargs_json`` are JSON text."""

    run_id: int
    job_id: int
    token: int
    name: str
    task: str
    args_json: str
    kwargs_json: str
    queue: str
    scheduled_for: datetime
    due_at: datetime
    attempt: int
    lease_seconds: int
    lateness: float = 0.0  # seconds between due_at and the claim, in the database clock
    schedule: ScheduleRef | None = None  # a recurring job's schedule, as the claim read it
    message_options: str = "{}"  # the job's Celery message options, as JSON text
    max_retries: int = 0  # the job's, for the beat's log line ("retry 2/3")
    # The database's now() at the claim, and this process's monotonic clock then: what a
    # dispatch dates a message's ``expires`` from (``database_now``), not the host's clock.
    claimed_at: datetime | None = None
    claimed_monotonic: float | None = None

    def database_now(self) -> datetime | None:
        """The database's clock now, read as the claim's now() plus the time since on this
        process's monotonic clock (None for a run not from a claim)."""
        if self.claimed_at is None or self.claimed_monotonic is None:
            return None
        return self.claimed_at + timedelta(seconds=time.monotonic() - self.claimed_monotonic)

    @property
    def task_id(self) -> str:
        return task_id_for(self.job_id, self.token)

    @property
    def idempotency_key(self) -> str:
        return idempotency_key(self.job_id, self.scheduled_for)

    @property
    def args(self) -> list:
        return json.loads(self.args_json)

    @property
    def kwargs(self) -> dict:
        return json.loads(self.kwargs_json)


@dataclass(frozen=True)
class Quarantined:
    """A job set aside because schedapp could not understand it: it is ``dead`` with the
    reason, out of the due slice, and the beat or worker that found it goes on."""

    job_id: int
    reason: str


@dataclass
class ReapResult:
    expired: int = 0  # leases reaped
    started: int = 0  # ... whose run had started (a failed attempt)
    dead: int = 0  # ... which exhausted the job's retries
    carried_on: int = 0  # ... which exhausted them and went on with the next occurrence
    dropped: int = 0  # ... never started, their message expired: occurrence dropped
    quarantined: list[Quarantined] = field(default_factory=list)


@dataclass
class ClaimResult:
    runs: list[ClaimedRun] = field(default_factory=list)
    claimed: int = 0  # jobs locked by this claim, including misfires that were skipped
    skipped_misfires: int = 0
    reap: ReapResult = field(default_factory=ReapResult)
    quarantined: list[Quarantined] = field(default_factory=list)
    restamped: bool = False  # the claim took long: leases were stamped again before commit

    @property
    def reaped(self) -> int:
        return self.reap.expired


def job_schedule(job: Job) -> Schedule:
    return job.schedule


# --- claim -----------------------------------------------------------------------------------
# The statements are in sql/queries.sql (claim_due_jobs, next_due, restamp_leases).


def claim_due_jobs(
    beat: str,
    limit: int,
    rng: policies.Rng = random.random,
    message_expiry: MessageExpiry | None = None,
) -> ClaimResult:
    """Claim up to ``limit`` due jobs for ``beat`` in ONE transaction; publish after it.

    Also reaps leases that expired, so their jobs are claimable again (in this same claim when
    they fit). Late recurring jobs get their misfire policy applied here: this is the one place
    that decides misfires. A job whose stored schedule cannot be understood is quarantined,
    never allowed to fail the claim. If the transaction ran long enough to eat into the leases
    it granted, they are stamped again from the clock just before it commits: a lease is never
    already expired when it is granted. ``message_expiry`` is the reaper's (see
    ``reap_expired_leases``).

    A row the batch statements cannot take (a value written behind the API's back that the
    database or Python refuses on the way: ``ROW_ERRORS``) would fail every beat's claim,
    every tick: the transaction is then done again one row at a time, each in a savepoint,
    and each row that fails alone is quarantined with the error (DESIGN 19). The ordinary
    claim pays nothing for this.
    """
    try:
        return _claim_due_jobs(beat, limit, rng, message_expiry, careful=False)
    except ROW_ERRORS as exc:
        log.warning(
            "a row failed the claim (%s: %s): claiming one row at a time",
            type(exc).__name__,
            _first_line(exc),
            extra={"action": "claim_careful", "beat": beat},
        )
        return _claim_due_jobs(beat, limit, rng, message_expiry, careful=True)


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


def _claim_due_jobs(
    beat: str, limit: int, rng: policies.Rng, message_expiry: MessageExpiry | None, *, careful: bool
) -> ClaimResult:
    result = ClaimResult()
    store = get_store()
    started = time.monotonic()
    with beat_transaction():
        if careful:
            result.reap = _reap_each(limit, rng, message_expiry)
            rows, now = _claim_each(store, beat, limit, result.quarantined)
        else:
            result.reap = _reap(limit, rng, message_expiry)
            rows, now = store.claim(beat, limit)
        result.claimed = len(rows)
        late = [r for r in rows if r["late"]]
        ready = [r for r in rows if not r["late"]]
        if late:
            now = now or store.now()  # the transaction's time, the same as the claim's now()
            if careful:
                for row in late:
                    _in_savepoint_or_quarantine(
                        row["id"],
                        lambda row=row: _misfires_into(beat, [row], now, rng, result),
                        result.quarantined,
                        "its misfire policy cannot be applied",
                    )
            else:
                _misfires_into(beat, late, now, rng, result)
            ready.extend(r for r in late if r.get("run_id"))
        if ready and time.monotonic() - started > min(r["lease_seconds"] for r in ready) / 4:
            store.restamp_leases([r["id"] for r in ready])
            result.restamped = True
    result.runs = [_claimed_run(r, started) for r in ready]
    return result


def _misfires_into(
    beat: str, rows: list[dict], now: datetime, rng: policies.Rng, result: ClaimResult
) -> None:
    skipped, quarantined = _apply_misfires(beat, rows, now, rng)
    result.skipped_misfires += skipped
    result.quarantined.extend(quarantined)


def _claim_each(
    store: Any, beat: str, limit: int, quarantined: list[Quarantined]
) -> tuple[list[dict], datetime | None]:
    """The claim, one due row at a time, each in a savepoint: a row whose claim fails is
    quarantined with the error, the others are claimed as the batch statement claims them."""
    rows: list[dict] = []
    now = None
    for job_id in store.due_ids(limit):
        claimed = _in_savepoint_or_quarantine(
            job_id,
            lambda job_id=job_id: store.claim(beat, 1, ids=[job_id]),
            quarantined,
            "the claim cannot take this row",
        )
        if claimed is not None:
            rows.extend(claimed[0])
            now = now or claimed[1]
    return rows, now


def _in_savepoint_or_quarantine(
    job_id: int, work: Callable[[], Any], quarantined: list[Quarantined], what: str
) -> Any:
    """``work()`` in a savepoint; if one of ``ROW_ERRORS`` comes out of it, its writes are
    undone and the job is quarantined with the error (None is returned). A quarantine that
    fails too is logged: the row stays as it was, and the caller goes on without it."""
    try:
        with transaction.atomic():
            return work()
    except ROW_ERRORS as exc:
        reason = f"{what} ({type(exc).__name__}: {_first_line(exc)})"
    try:
        with transaction.atomic():
            quarantined.append(_quarantine_locked(job_id, reason))
    except ROW_ERRORS as exc:
        log.error(
            "job %s cannot be quarantined either (%s): left as it is",
            job_id,
            _first_line(exc),
            extra={"action": "quarantine_failed", "job": job_id},
        )
    return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _apply_misfires(
    beat: str, rows: list[dict], now: datetime, rng: policies.Rng
) -> tuple[int, list[Quarantined]]:
    """Apply each late job's misfire policy; returns how many were released without a run,
    and the jobs quarantined because their schedule could not be computed."""
    skipped = 0
    quarantined: list[Quarantined] = []
    to_run: list[dict] = []
    for row in rows:
        try:
            schedule = schedule_of(row)
            plan = policies.plan_misfire(
                schedule,
                row["scheduled_for"],
                now,
                row["misfire_policy"],
                row["misfire_max_catchup"],
                row["misfire_grace"],
            )
        except Exception as exc:  # a row the beat cannot understand: set it aside, go on
            quarantined.append(_quarantine_locked(row["id"], _unschedulable(exc)))
            continue
        log.info(
            "%s missed %d occurrence(s) (policy %s)",
            job_label(row["id"], row["name"]),
            plan.missed,
            row["misfire_policy"],
            extra={"action": "misfire", "job": row["id"]},
        )
        if plan.run_for is None:
            assert plan.next_due is not None
            Job.objects.filter(id=row["id"], token=row["token"]).update(
                state=JobState.SCHEDULED,
                claimed_by="",
                lease_expires_at=None,
                scheduled_for=plan.next_due,
                next_run_at=plan.next_due + policies.compute_jitter(row["jitter"], rng),
                missed_runs=F("missed_runs") + plan.missed,
            )
            skipped += 1
            continue
        Job.objects.filter(id=row["id"], token=row["token"]).update(
            scheduled_for=plan.run_for, missed_runs=F("missed_runs") + plan.missed
        )
        row["scheduled_for"] = plan.run_for
        to_run.append(row)
    insert_runs(beat, to_run, now)
    return skipped, quarantined


def job_label(job_id: int, name: str | None) -> str:
    """A job as logs name it: ``job 'nightly-report' (id 31)``, its name for people and its id
    for the admin's URL and the task ids (``schedapp:31:<token>``)."""
    return f"job {name!r} (id {job_id})" if name else f"job {job_id}"


def _unschedulable(exc: BaseException) -> str:
    return f"its schedule cannot be computed here ({type(exc).__name__}: {exc})"


def _quarantine_locked(job_id: int, reason: str) -> Quarantined:
    """Set a job aside as ``dead`` with ``reason``, in the caller's transaction, which holds
    the job row's lock. The token moves on, so nothing in flight can change it later."""
    Job.objects.filter(id=job_id).update(
        state=JobState.DEAD,
        token=F("token") + 1,
        claimed_by="",
        lease_expires_at=None,
        next_run_at=None,
        last_status="quarantined",
        last_error=_storable(f"quarantined: {reason}", ERROR_CHARS),
        updated_at=Now(),
    )
    JobRun.objects.filter(job_id=job_id, status__in=ACTIVE_RUN_STATUSES).update(
        status=RunStatus.FAILED,
        finished_at=Now(),
        error=_storable(f"quarantined: {reason}", ERROR_CHARS),
    )
    name = Job.objects.filter(id=job_id).values_list("name", flat=True).first()
    log.error(
        "%s quarantined (now dead): %s",
        job_label(job_id, name),
        reason,
        extra={"action": "quarantine", "job": job_id},
    )
    return Quarantined(job_id, reason)


def quarantine_job(job_id: int, reason: str, token: int | None = None) -> Quarantined | None:
    """Quarantine a job in a transaction of its own (None if ``token`` is no longer its)."""
    with beat_transaction():
        job = Job.objects.select_for_update().filter(id=job_id).values("token").first()
        if job is None or (token is not None and job["token"] != token):
            return None
        return _quarantine_locked(job_id, reason)


def _claimed_run(row: dict, started: float | None = None) -> ClaimedRun:
    """``started``: the monotonic time the claim's transaction began, when its now() was
    read (``lateness`` is that now() less ``next_run_at``)."""
    return ClaimedRun(
        run_id=row["run_id"],
        job_id=row["id"],
        token=row["token"],
        name=row["name"],
        task=row["task"],
        args_json=row["args"],
        kwargs_json=row["kwargs"],
        queue=row["queue"],
        scheduled_for=row["scheduled_for"],
        due_at=row["next_run_at"],
        attempt=row["retry_count"] + 1,
        lease_seconds=row["lease_seconds"],
        lateness=row["lateness"],
        schedule=_schedule_ref(row),
        message_options=row["message_options"],
        claimed_at=row["next_run_at"] + timedelta(seconds=row["lateness"]),
        claimed_monotonic=started,
        max_retries=row["max_retries"],
    )


def _schedule_ref(row: dict) -> ScheduleRef | None:
    """What a worker needs to compute the next occurrence itself (the fast success path);
    None for a one-off, and for solar and windowed jobs, which take the general path."""
    if row["solar_event"] or row["not_before"] is not None or row["expires_at"] is not None:
        return None
    if row["cron"]:
        return ScheduleRef(cron=row["cron"], timezone=row["timezone"], day_or=row["cron_day_or"])
    if row["interval"] is not None:
        return ScheduleRef(interval=row["interval"], anchor=row["interval_anchor"])
    return None


def seconds_until_due() -> tuple[datetime, float] | None:
    """The database's now, and seconds from it until the next due job or lease expiry."""
    now, next_due, next_expiry = get_store().next_due()
    times = [t for t in (next_due, next_expiry) if t is not None]
    if not times:
        return None
    return now, max(0.0, (min(times) - now).total_seconds())


# --- after publishing ------------------------------------------------------------------------


def release_claims(claims: Sequence[tuple[int, int]], reason: str) -> int:
    """Give back claims whose messages could not be published, so they are claimed again.

    The token is bumped: if a message did reach the broker after all, it is stale at the door.
    A run a worker already admitted (its message did go out: a beat stopped part-way through a
    batch, a publish error raised after the broker took the message) keeps its claim, or a
    second beat would run it again beside it. Job rows are locked before run rows are read,
    as at the door, so a door cannot admit between the check and the release.
    """
    if not claims:
        return 0
    with beat_transaction():
        locked = list(
            Job.objects.select_for_update()
            .filter(pairs(claims), state=JobState.RUNNING)
            .order_by("id")
            .values_list("id", "token")
        )
        unstarted = list(
            JobRun.objects.filter(pairs(locked, "job_id"), status=RunStatus.DISPATCHED)
            .values_list("job_id", "token")
        ) if locked else []
        if not unstarted:
            return 0
        released = Job.objects.filter(pairs(unstarted)).update(
            state=JobState.SCHEDULED, token=F("token") + 1, claimed_by="", lease_expires_at=None
        )
        JobRun.objects.filter(pairs(unstarted, "job_id"), status=RunStatus.DISPATCHED).update(
            status=RunStatus.LOST, finished_at=Now(), error=f"not published: {reason}"
        )
        return released


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
        return _reap(limit, rng, message_expiry)


def _expired() -> Any:
    """The leases that expired, oldest first, as a queryset that locks them (SKIP LOCKED)."""
    return (
        Job.objects.select_for_update(skip_locked=True)
        .filter(state__in=[JobState.RUNNING, JobState.PAUSED], lease_expires_at__lt=Now())
        .order_by("lease_expires_at")
    )


def _reap_each(limit: int, rng: policies.Rng, message_expiry: MessageExpiry | None) -> ReapResult:
    """The reaper, one expired lease at a time, each in a savepoint: a job the reaper cannot
    read or write (a value written behind the API's back) is quarantined with the error."""
    result = ReapResult()
    for job_id in list(_expired().values_list("id", flat=True)[:limit]):
        one = _in_savepoint_or_quarantine(
            job_id,
            lambda job_id=job_id: _reap(1, rng, message_expiry, ids=[job_id]),
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


def _reap(
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
    if unsent:
        JobRun.objects.filter(
            pairs([c for c in claims if c[0] in unsent], "job_id"), status=RunStatus.DISPATCHED
        ).update(status=RunStatus.SKIPPED, finished_at=Now(), error=EXPIRED)
    JobRun.objects.filter(pairs(claims, "job_id"), status__in=ACTIVE_RUN_STATUSES).update(
        status=RunStatus.LOST,
        finished_at=Now(),
        error="lease expired: the worker or beat holding it stopped renewing it",
    )
    result = ReapResult(expired=len(expired), started=len(started), dropped=len(unsent))
    for job in expired:
        if job.id in unsent:
            try:
                plan = policies.plan_after_expiry(_facts(job, ran_for=unsent[job.id]))
            except Exception as exc:
                result.quarantined.append(_quarantine_locked(job.id, _unschedulable(exc)))
                continue
            _write_after_run(
                job.id, job.token, plan, status=RunStatus.SKIPPED, error=EXPIRED, bump_token=True
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
            plan = policies.plan_after_failure(_facts(job, ran_for=started[job.id]), rng=rng)
        except Exception as exc:
            result.quarantined.append(_quarantine_locked(job.id, _unschedulable(exc)))
            continue
        _write_after_run(
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


# --- worker side -----------------------------------------------------------------------------
#
# Every write below locks the job row before the run row (the reaper, the claim and the API
# do the same), so the door, renewals, completions and the reaper serialise on the job row: a
# run cannot be both "admitted" and "reaped as never started". Each write is idempotent: when
# its COMMIT lands but the reply is lost and the caller tries again, the second attempt finds
# its own work done and changes nothing.


def admit_run(job_id: int, token: int, worker: str, admission: str) -> DoorVerdict:
    """The door: start the run if its claim is current and its lease has not expired,
    extending the lease unless five sixths of it are left (the job row is then not written);
    otherwise say why not (and close the run if it never will start).

    ``admission`` identifies this door call: a retry of the same call (its first commit landed,
    the reply was lost) is admitted again; another delivery of the same message is not.
    On PostgreSQL this is the function ``schedapp_admit_run`` (migration 0006).
    """
    return get_store().admit(job_id, token, worker, admission)


def admit_replacement(
    job_id: int, token: int, worker: str, carried: str, admission: str
) -> DoorVerdict:
    """The door of a task that replaced the run's task (``Task.replace``): it goes on with the
    run that the ``carried`` admission started, and takes it over under an ``admission`` of
    its own, so another delivery of its message (which carries the same ``carried`` one: a
    broker redelivery while it runs) is refused as a duplicate, as any second delivery is.
    A retry of this same call (its commit landed, its reply was lost) is admitted again.
    Rare, so written through the ORM on every database, with the job row locked first."""
    with transaction.atomic():
        job, run = _lock_job_and_run(job_id, token)
        if job is None or run is None:
            return DoorVerdict.UNKNOWN
        if job.token != token:
            return DoorVerdict.STALE_TOKEN
        if job.state not in (JobState.RUNNING, JobState.PAUSED):  # paused: it runs on
            return DoorVerdict.JOB_STATE
        taken = JobRun.objects.filter(
            job_id=job_id, token=token, status=RunStatus.RUNNING, admission__in=(carried, admission)
        )
        if not taken.exists():
            return DoorVerdict.DUPLICATE
        if not Job.objects.filter(id=job_id, lease_expires_at__gt=Now()).exists():
            return DoorVerdict.LEASE_EXPIRED
        taken.update(admission=admission, worker=worker)
    return DoorVerdict.ADMITTED


@dataclass(frozen=True)
class Renewal:
    """What one lease heartbeat found: leases renewed, runs that finished normally since (the
    worker has not noticed yet), runs closed by a cancel (the task may run on; nothing it
    reports changes the job), runs that moved on before they ever started (a message that
    arrived after its lease expired: the door will refuse it), and leases lost while running
    (reclaimed or reaped)."""

    renewed: set[tuple[int, int]] = field(default_factory=set)
    finished: set[tuple[int, int]] = field(default_factory=set)
    cancelled: set[tuple[int, int]] = field(default_factory=set)
    unstarted: set[tuple[int, int]] = field(default_factory=set)
    lost: set[tuple[int, int]] = field(default_factory=set)
    busy: set[tuple[int, int]] = field(default_factory=set)  # still held: renew next time


# A job row held by a door, a completion or the API is held for about a millisecond.
_BUSY_ATTEMPTS = 4
_BUSY_PAUSE = 0.02


def renew_leases(held: Sequence[tuple[int, int]]) -> Renewal:
    """Extend every lease ``(job_id, token)`` a worker holds from now, in one statement.

    A lease that can no longer be renewed is *lost* only if its run had started and did not
    simply finish: a run whose completion committed a moment ago (the worker's main process
    has not seen it yet) is reported as finished, one a cancel closed as cancelled, and one
    that never started anywhere (its message waited in this worker while the job moved on) as
    unstarted, not as an alarm. A renewal never waits for a job row another transaction holds
    (waiting, it could deadlock with a door carrying a success): such leases are tried again
    a moment later, and any still busy are left ``busy`` for the next heartbeat. On
    PostgreSQL this is the function ``schedapp_renew_leases`` (migration 0012).
    """
    result = Renewal()
    sets = {
        "renewed": result.renewed,
        "finished": result.finished,
        "cancelled": result.cancelled,
        "unstarted": result.unstarted,
        "lost": result.lost,
        "busy": result.busy,
    }
    pending = list(held)
    for attempt in range(_BUSY_ATTEMPTS):
        if not pending:
            break
        if attempt:
            time.sleep(_BUSY_PAUSE)
        result.busy.clear()
        for job_id, token, outcome in get_store().renew(pending):
            sets[outcome].add((job_id, token))
        pending = sorted(result.busy)
    return result


# --- completion ------------------------------------------------------------------------------

SUCCEEDED = RunStatus.SUCCEEDED.value
FAILED = RunStatus.FAILED.value
SKIPPED = RunStatus.SKIPPED.value


class Completion(StrEnum):
    APPLIED = "applied"  # the run's outcome moved its job on
    STALE = "stale"  # recorded on the run only: the job had moved on (lease lost, cancelled)
    ALREADY_RECORDED = "already_recorded"  # a retried completion whose first attempt landed


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
) -> CompletionResult:
    """Record a run's outcome and move its job on.

    Only a run still ``running`` under the job's current token moves the job; a run whose job
    moved on (its lease was lost, it was cancelled) is recorded on the run only, flagged
    ``stale``; a run already finished (a retried completion) is left as it is.
    ``allow_unstarted`` lets a run that never passed the door fail too (a task terminated as
    it started). ``only_unstarted`` is for an outcome about a copy of the message that never
    reached a door (its task is not registered on the worker that received it, it arrived
    expired): it applies only while no door admitted the run, since another copy may be
    executing elsewhere.
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
        accepted=_UNSTARTED if only_unstarted else _ANY if allow_unstarted else _STARTED,
        rng=rng,
    )


_STARTED = frozenset({RunStatus.RUNNING, RunStatus.LOST})
_UNSTARTED = frozenset({RunStatus.DISPATCHED})
_ANY = _STARTED | _UNSTARTED


def _succeed_fast(job_id: int, token: int, headers: RunHeaders) -> bool:
    """The common success in one call of ``schedapp_succeed_run`` (migration 0006): the next
    occurrence computed here from the schedule the claim saw. False: take the general path."""
    args = _success_args(job_id, token, headers)
    if args is None:
        return False
    return get_store().succeed_run(args)


def _success_args(job_id: int, token: int, headers: RunHeaders) -> list[Any] | None:
    """The arguments of ``schedapp_succeed_run``; None if the schedule cannot be computed here
    (the general path then quarantines the job, with the reason)."""
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
        # Celery's day rule marked with "&", as the function compares it (migration 0007)
        (ref.cron if ref.day_or else "&" + ref.cron) if ref else "",
        ref.timezone if ref else "",
        ref.interval if ref else None,
        ref.anchor if ref else None,
    ]


def complete_successes(
    items: Sequence[tuple[int, int, RunHeaders]], rng: policies.Rng = random.random
) -> list[CompletionResult]:
    """Several successes at once (a pool process's, when no door came to carry them): the
    common case of all of them in one round trip and one commit (``schedapp_succeed_runs``);
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
) -> tuple[DoorVerdict, list[CompletionResult]]:
    """The door (``admit_run``) carrying the successes its process recorded since its last
    round trip: on PostgreSQL both in one statement and one commit, so a pool process working
    through a backlog makes one round trip per execution. Successes the common path does not
    take (stale, schedule changed) are then recorded one by one on the general path."""
    columns, batch = _success_columns(successes)
    rows, verdict = get_store().succeed_and_admit(columns, job_id, token, worker, admission)
    return verdict, _success_results(successes, batch, rows, rng)


def _success_columns(
    items: Sequence[tuple[int, int, RunHeaders]],
) -> tuple[list[list[Any]], list[tuple[int, list[Any]]]]:
    """``schedapp_succeed_runs``'s arguments as columns, and the items they cover (index,
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
            accepted=_STARTED,
            rng=rng,
        )
        for i, (job_id, token, _h) in enumerate(items)
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
        )
    except ROW_ERRORS as exc:  # the job row cannot be read or written as it is
        return _complete_and_quarantine(
            job_id, token, outcome, error=error, traceback=traceback, accepted=accepted, exc=exc
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
) -> CompletionResult:
    """An outcome whose job row could not be read or written (a value written behind the
    API's back): the run's outcome is recorded as usual, and the job, if the run was still
    its current one, is quarantined with the error instead of moving on. Only the columns
    every claim writes are read here."""
    with transaction.atomic():
        job = Job.objects.select_for_update().filter(id=job_id).values("token", "state").first()
        run = JobRun.objects.filter(job_id=job_id, token=token).values("status").first()
        if run is None or run["status"] not in accepted:
            return CompletionResult(Completion.ALREADY_RECORDED)
        fresh = (
            job is not None
            and job["token"] == token
            and job["state"] in (JobState.RUNNING, JobState.PAUSED)
            and run["status"] != RunStatus.LOST
        )
        JobRun.objects.filter(job_id=job_id, token=token).update(
            status=outcome,
            finished_at=Now(),
            error=_storable(error, ERROR_CHARS),
            traceback=_storable(traceback, TRACEBACK_CHARS),
            stale=not fresh,
        )
        if not fresh:
            return CompletionResult(Completion.STALE)
        reason = f"its run's outcome cannot be written ({type(exc).__name__}: {_first_line(exc)})"
        quarantined = _quarantine_locked(job_id, reason)
    return CompletionResult(Completion.APPLIED, dead=True, quarantined=quarantined)


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
) -> CompletionResult:
    with transaction.atomic():
        job, run = _lock_job_and_run(job_id, token)
        if run is None or run["status"] not in accepted:
            return CompletionResult(Completion.ALREADY_RECORDED)
        fresh = (
            job is not None
            and job.token == token
            and job.state in (JobState.RUNNING, JobState.PAUSED)
            and run["status"] != RunStatus.LOST
        )
        error, traceback = _storable(error, ERROR_CHARS), _storable(traceback, TRACEBACK_CHARS)
        JobRun.objects.filter(job_id=job_id, token=token).update(
            status=outcome,
            finished_at=Now(),
            error=error,
            traceback=traceback,
            stale=not fresh,
        )
        if not fresh:
            log.warning(
                "stale completion of %s token %s: not applied",
                job_label(job_id, job.name if job is not None else None),
                token,
                extra={"action": "stale_completion", "job": job_id, "token": token},
            )
            return CompletionResult(Completion.STALE)
        assert job is not None
        try:
            facts = _facts(job, ran_for=run["scheduled_for"])
            if outcome == SUCCEEDED:
                plan = policies.plan_after_success(facts, rng=rng)
            elif outcome == SKIPPED:
                plan = policies.plan_after_expiry(facts, rng=rng)
            else:
                plan = policies.plan_after_failure(facts, delay=retry_delay, rng=rng)
        except Exception as exc:  # written behind the API's back, or another croniter/tzdata
            quarantined = _quarantine_locked(job_id, _unschedulable(exc))
            return CompletionResult(Completion.APPLIED, dead=True, quarantined=quarantined)
        _write_after_run(job_id, token, plan, status=outcome, error=error)
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


ERROR_CHARS, TRACEBACK_CHARS = 10000, 50000  # what a run (and a job) keeps of them


def _storable(text: str, limit: int) -> str:
    """At most ``limit`` characters of ``text``, as a PostgreSQL text column takes them: a
    task's error may hold a NUL or a lone surrogate (a file name decoded with
    surrogateescape), which PostgreSQL refuses, and then no outcome would be recorded."""
    text = text[:limit]
    if text.isascii() and "\x00" not in text:
        return text
    text = text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")
    return text[:limit]


def _lock_job_and_run(job_id: int, token: int) -> tuple[Job | None, dict[str, Any] | None]:
    """The job row, locked first as everywhere, then what an outcome reads of its run."""
    job = Job.objects.select_for_update().filter(id=job_id).first()
    run = JobRun.objects.filter(job_id=job_id, token=token).values("status", "scheduled_for")
    return job, run.first()


def _facts(job: Job, ran_for: datetime | None = None) -> policies.JobFacts:
    """What the after-run rules read; ``ran_for`` is the occurrence the run was for (the job
    was rescheduled while the run was in flight if its ``scheduled_for`` differs)."""
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
    )


def _write_after_run(
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
    }
    if status != SUCCEEDED:
        changes["last_error"] = _storable(error, ERROR_CHARS)
    if bump_token:
        changes["token"] = F("token") + 1
    if plan.failed_occurrence:
        changes["failed_occurrences"] = F("failed_occurrences") + 1
    updated = Job.objects.filter(id=job_id, token=token).update(**changes)
    assert updated == 1, "the row is locked by this transaction"
    if plan.state == JobState.SCHEDULED:
        # Beats sleep until the next due time they know of; this one may be sooner.
        notify_due(plan.next_run_at, plan.delay.total_seconds() if plan.delay else None)


EXPIRED = "expired before a worker started it"


def record_expired(job_id: int, token: int) -> CompletionResult | None:
    """Celery discarded a schedapp message past its ``expires``, as it does any task's: the
    run is ``skipped`` and its occurrence dropped (``policies.plan_after_expiry``). A run a
    door already admitted (another copy is executing) is left alone. Returns the completion
    when the job moved on, None when only the run was closed or nothing changed."""
    with transaction.atomic():
        job, run = _lock_job_and_run(job_id, token)
        if run is None or run["status"] != RunStatus.DISPATCHED:
            return None
        JobRun.objects.filter(job_id=job_id, token=token).update(
            status=RunStatus.SKIPPED, finished_at=Now(), error=EXPIRED
        )
        live = (JobState.RUNNING, JobState.PAUSED)
        if job is None or job.token != token or job.state not in live:
            return None
        try:
            plan = policies.plan_after_expiry(_facts(job, ran_for=run["scheduled_for"]))
        except Exception as exc:  # written behind the API's back, or another croniter/tzdata
            quarantined = _quarantine_locked(job_id, _unschedulable(exc))
            return CompletionResult(Completion.APPLIED, dead=True, quarantined=quarantined)
        _write_after_run(job_id, token, plan, status=RunStatus.SKIPPED, error=EXPIRED)
    return CompletionResult(Completion.APPLIED)


def record_cancelled(job_id: int, token: int, *, terminated: bool) -> CompletionResult | None:
    """A schedapp task was revoked. After ``api.cancel`` (which bumped the token) only the run
    is closed; a revoke from elsewhere (``celery control revoke``) counts as a failed attempt,
    so the job is retried or dead-lettered instead of waiting for its lease to expire.
    A copy revoked before it started here (not ``terminated``) says nothing of a run another
    worker admitted: that run is left to finish.
    Returns the completion when the revoke moved the job, None when it only closed the run."""
    how = "revoked and terminated" if terminated else "revoked"
    current = Job.objects.filter(id=job_id, token=token, state=JobState.RUNNING).exists()
    if current:
        result = complete_run(
            job_id,
            token,
            FAILED,
            error=f"task {how} outside schedapp",
            allow_unstarted=terminated,
            only_unstarted=not terminated,
        )
        if result.applied:
            with transaction.atomic():
                Job.objects.select_for_update().filter(id=job_id).values_list("id").first()
                JobRun.objects.filter(job_id=job_id, token=token).update(status=RunStatus.CANCELLED)
        return result
    with transaction.atomic():
        Job.objects.select_for_update().filter(id=job_id).values_list("id").first()
        JobRun.objects.filter(job_id=job_id, token=token, status__in=ACTIVE_RUN_STATUSES).update(
            status=RunStatus.CANCELLED, finished_at=Now(), error=f"cancelled ({how})"
        )
    return None
