"""The claim: a beat takes due jobs (lease, new fencing token, run rows) in one transaction,
applies late jobs' misfire policy, and gives back claims it could not publish.

The statements are in ``schedapp/sql/queries.sql`` (claim_due_jobs, next_due, restamp_leases);
the portable store says the same through the ORM.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db.models import F, Q
from django.db.models.functions import Now

from .. import job_calendars, ledger, policies
from ..db import beat_transaction, claim_transaction, notify_due
from ..message import ScheduleRef, idempotency_key, task_id_for
from ..models import Backfill, BackfillState, Job, JobRun, JobState, RunKind, RunStatus, schedule_of
from ..schedules import DEFAULT_DST_POLICY
from ..store import get_store, insert_runs, pairs
from .after_run import job_facts
from .quarantine import (
    ROW_ERRORS,
    Quarantined,
    first_line,
    in_savepoint_or_quarantine,
    job_label,
    no_partition,
    quarantine_locked,
    unschedulable,
)
from .reap import MessageExpiry, ReapResult, reap_each, reap_locked
from .supersede import Superseded, supersede_due

log = logging.getLogger(__name__)


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
    own_lease: bool = False  # allow_all: the run holds its lease; the job moved on at the claim

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
class Wake:
    """When a beat should claim again, as the claim's transaction read it (``next_due``):
    its now() and the earliest instant a job, a lease expiry or a run to supersede comes due
    (None: nothing), and the monotonic time of that now(), to tell how much of the wait has
    passed since."""

    now: datetime
    due: datetime | None
    read_at: float

    def until_due(self) -> tuple[datetime, float] | None:
        """The database's now, and seconds from it until the earliest due instant, as of the
        moment of the call."""
        if self.due is None:
            return None
        now = self.now + timedelta(seconds=time.monotonic() - self.read_at)
        return now, max(0.0, (self.due - now).total_seconds())


@dataclass
class ClaimResult:
    runs: list[ClaimedRun] = field(default_factory=list)
    claimed: int = 0  # jobs locked by this claim, including misfires that were skipped
    skipped_misfires: int = 0
    reap: ReapResult = field(default_factory=ReapResult)
    quarantined: list[Quarantined] = field(default_factory=list)
    restamped: bool = False  # the claim took long: leases were stamped again before commit
    # Runs a later occurrence superseded (cancel_other, terminate_other), marked in the claim's
    # transaction: the caller revokes their tasks after it committed.
    superseded: list[Superseded] = field(default_factory=list)
    # Asked with ``look_for_backfills``: whether a backfill was running (None: not asked).
    backfilling: bool | None = None
    # Asked with ``next_due`` when the batch was not full and no lease was reaped: when the
    # next job is due, read in the claim's transaction rather than by a transaction of its
    # own after it (``until_due``). None: the claim did not read it.
    wake: Wake | None = None

    @property
    def reaped(self) -> int:
        return self.reap.expired


# --- claim -----------------------------------------------------------------------------------
# The statements are in sql/queries.sql (claim_due_jobs, next_due, restamp_leases).


def claim_due_jobs(
    beat: str,
    limit: int,
    rng: policies.Rng = random.random,
    message_expiry: MessageExpiry | None = None,
    supersede: bool = True,
    look_for_backfills: bool = False,
    next_due: bool = False,
    claimed: list[ClaimedRun] | None = None,
) -> ClaimResult:
    """Claim up to ``limit`` due jobs for ``beat`` in ONE transaction; publish after it.

    With ``supersede``, also marks the runs a later occurrence supersedes (cancel_other,
    terminate_other: ``supersede_due``, one statement): a beat asks at most once a second.
    With ``look_for_backfills``, also reads whether any backfill is running
    (``ClaimResult.backfilling``, one statement): the beat's look rides in this transaction
    rather than paying one of its own (a commit, a timeout setting) when none is running.
    With ``next_due``, a claim that did not fill its batch nor reap a lease also reads when
    the next job is due (``ClaimResult.wake``, the ``next_due`` statement): at a steady stream
    a beat's claim is then one transaction, not a claim and a read.

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

    ``claimed`` (filled, when given) holds the claim's runs from just before its COMMIT: a
    caller cut short while the COMMIT is under way or after it (stopped by SIGTERM or Ctrl-C,
    the reply lost) knows what may have been claimed, and gives back what it did not send
    (``give_back``: a claim that did not commit has no token nor run to give back).
    """

    def attempt(careful: bool) -> ClaimResult:
        return _claim_due_jobs(
            beat,
            limit,
            rng,
            message_expiry,
            supersede,
            look_for_backfills,
            next_due,
            claimed,
            careful=careful,
        )

    try:
        return attempt(careful=False)
    except ROW_ERRORS as exc:
        if no_partition(exc):
            raise  # no row's fault: the beat makes the run history's partitions, claims again
        log.warning(
            "a row failed the claim (%s: %s): claiming one row at a time",
            type(exc).__name__,
            first_line(exc),
            extra={"action": "claim_careful", "beat": beat},
        )
        return attempt(careful=True)


def _claim_due_jobs(
    beat: str,
    limit: int,
    rng: policies.Rng,
    message_expiry: MessageExpiry | None,
    supersede: bool,
    look_for_backfills: bool,
    next_due: bool,
    claimed: list[ClaimedRun] | None,
    *,
    careful: bool,
) -> ClaimResult:
    result = ClaimResult()
    if claimed is not None:
        claimed.clear()  # a first attempt's, which did not commit
    store = get_store()
    started = time.monotonic()
    with claim_transaction() as probe:
        if careful:
            result.reap = reap_each(limit, rng, message_expiry)
        elif probe.job_leases_expired or probe.run_leases_expired:
            result.reap = reap_locked(
                limit,
                rng,
                message_expiry,
                jobs=probe.job_leases_expired,
                runs=probe.run_leases_expired,
            )
        # Retries of allow_all occurrences first: each is of an occurrence older than any the
        # job still has waiting. Claimed after them, a job whose runs keep every slot of
        # max_concurrent busy would give each slot that frees to its next occurrence, never
        # to a retry. The claim below counts the slots they take (this transaction's writes).
        retries = (
            _claim_due_retries(beat, limit, result.quarantined)
            if careful or probe.retries_due
            else []
        )
        if careful:
            rows, now = _claim_each(store, beat, limit - len(retries), result.quarantined)
        else:
            rows, now = store.claim(beat, limit - len(retries))
        result.claimed = len(rows)
        late = [r for r in rows if r["late"]]
        ready = [r for r in rows if not r["late"]]
        if late:
            now = now or store.now()  # the transaction's time, the same as the claim's now()
            if careful:
                for row in late:
                    in_savepoint_or_quarantine(
                        row["id"],
                        lambda row=row: _misfires_into(beat, [row], now, rng, result),
                        result.quarantined,
                        "its misfire policy cannot be applied",
                    )
            else:
                _misfires_into(beat, late, now, rng, result)
            ready.extend(r for r in late if r.get("run_id"))
        _arm_supersede(ready)
        if supersede:
            result.superseded = supersede_due()
        if look_for_backfills:
            result.backfilling = Backfill.objects.filter(state=BackfillState.RUNNING).exists()
        if ready and time.monotonic() - started > min(r["lease_seconds"] for r in ready) / 4:
            store.restamp_leases([r["id"] for r in ready])
            result.restamped = True
        # last: each allow_all run takes the lease its job was just given (restamped or not)
        ready = _start_own_leases(ready, rng, result.quarantined)
        ready.extend(retries)
        if next_due and result.claimed + len(retries) < limit and not result.reap.expired:
            result.wake = _wake(store, started)
        result.runs = [_claimed_run(r, started) for r in ready]
        if claimed is not None:
            claimed.extend(result.runs)  # before the COMMIT: see claim_due_jobs
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
        claimed = in_savepoint_or_quarantine(
            job_id,
            lambda job_id=job_id: store.claim(beat, 1, ids=[job_id]),
            quarantined,
            "the claim cannot take this row",
        )
        if claimed is not None:
            rows.extend(claimed[0])
            now = now or claimed[1]
    return rows, now


def _apply_misfires(
    beat: str, rows: list[dict], now: datetime, rng: policies.Rng
) -> tuple[int, list[Quarantined]]:
    """Apply each late job's misfire policy; returns how many were released without a run,
    and the jobs quarantined because their schedule could not be computed."""
    skipped = 0
    quarantined: list[Quarantined] = []
    to_run: list[dict] = []
    decided: list[tuple[int, policies.MissedRange]] = []
    read = job_calendars.for_rows(rows)  # the batch's calendars: one query, parsed once
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
                row["catchup_window"],
                calendar=job_calendars.for_row(row, read),
                start_deadline=row["start_deadline"] if row["skip_late"] else None,
            )
        except Exception as exc:  # a row the beat cannot understand: set it aside, go on
            quarantined.append(quarantine_locked(row["id"], unschedulable(exc)))
            continue
        log.info(
            "%s missed %d occurrence(s) (policy %s)",
            job_label(row["id"], row["name"]),
            plan.missed,
            row["misfire_policy"],
            extra={"action": "misfire", "job": row["id"]},
        )
        decided.extend((row["id"], r) for r in plan.ranges)
        if plan.run_for is None:
            # (with no next occurrence it is done: never an assertion failing every claim)
            state, occurrence, due = policies.waiting_after(
                plan, row["scheduled_for"], row["jitter"], rng
            )
            Job.objects.filter(id=row["id"], token=row["token"]).update(
                state=state,
                claimed_by="",
                lease_expires_at=None,
                scheduled_for=occurrence,
                next_run_at=due,
                missed_runs=F("missed_runs") + plan.missed,
            )
            skipped += 1
            continue
        Job.objects.filter(id=row["id"], token=row["token"]).update(
            scheduled_for=plan.run_for, missed_runs=F("missed_runs") + plan.missed
        )
        if plan.run_for != row["scheduled_for"]:
            row["manual"] = False  # an occurrence of the schedule runs instead
        row["scheduled_for"] = plan.run_for
        to_run.append(row)
    ledger.record(decided, beat)
    insert_runs(beat, to_run, now)
    return skipped, quarantined


def _arm_supersede(rows: list[dict]) -> None:
    """Under cancel_other and terminate_other, the run being claimed is cancelled when the
    next occurrence comes due while it is in flight: the first after the claim (those already
    due when it was claimed are its misfire policy's, then the end of the run's). That time,
    written with the claim, is what ``supersede_due`` looks for. Only those jobs pay: one
    statement each."""
    superseding = [row for row in rows if row["overlap"] in policies.SUPERSEDING]
    read = job_calendars.for_rows(superseding)  # their calendars: one query, parsed once
    for row in superseding:
        try:
            after = max(row["scheduled_for"], _claimed_at(row))
            calendar = job_calendars.for_row(row, read)
            nxt = policies.next_run(schedule_of(row), after, calendar)[0]
        except Exception as exc:  # the end of the run will quarantine it: not the claim
            log.warning("job %s: no next occurrence to supersede its run: %s", row["id"], exc)
            nxt = None
        Job.objects.filter(id=row["id"], token=row["token"]).update(
            supersede_at=nxt, superseded=False
        )


def _start_own_leases(
    rows: list[dict], rng: policies.Rng, quarantined: list[Quarantined]
) -> list[dict]:
    """allow_all: each claimed run takes its job's lease onto its own row, and the job moves
    on to its next occurrence in this same transaction (``policies.plan_at_start``, the
    schedule math of a success), so the next occurrence starts on time whether or not this
    run has ended. The bound is checked again here, under the job's lock, with a statement of
    its own (a snapshot taken after any claim that committed meanwhile): a run beyond
    ``max_concurrent`` is taken back (it was never published) and its occurrence waits for a
    slot. Other policies' rows pass through untouched; only allow_all jobs pay, each in a
    savepoint: a row the job's schedule or columns cannot be read from is quarantined, never
    allowed to fail the claim."""
    kept: list[dict] = []
    for row in rows:
        if row["overlap"] != policies.ALLOW_ALL or not row.get("run_id"):
            kept.append(row)
            continue
        started = in_savepoint_or_quarantine(
            row["id"],
            lambda row=row: _start_own_lease(row, rng),
            quarantined,
            "its run cannot take a lease of its own",
        )
        if started:
            kept.append(row)
    return kept


def _start_own_lease(row: dict, rng: policies.Rng) -> bool:
    in_flight = JobRun.objects.filter(job_id=row["id"], lease_expires_at__isnull=False).count()
    if in_flight >= max(1, row["max_concurrent"]):  # (a bound written behind the API: 1)
        JobRun.objects.filter(id=row["run_id"]).delete()
        Job.objects.filter(id=row["id"], token=row["token"]).update(
            state=JobState.SCHEDULED, claimed_by="", lease_expires_at=None
        )
        return False
    job = Job.objects.annotate(database_now=Now()).get(id=row["id"])
    try:
        plan = policies.plan_at_start(job_facts(job), rng=rng)
    except Exception as exc:  # a schedule the beat cannot follow: quarantined, with why
        raise ValueError(unschedulable(exc)) from exc
    JobRun.objects.filter(id=row["run_id"]).update(
        own_lease=True, lease_expires_at=job.lease_expires_at
    )
    Job.objects.filter(id=row["id"], token=row["token"]).update(
        state=plan.state,
        scheduled_for=plan.scheduled_for,
        next_run_at=plan.next_run_at,
        retry_count=0,
        claimed_by="",
        lease_expires_at=None,
        unstarted_dispatches=0,
    )
    if plan.state == JobState.SCHEDULED:
        notify_due(plan.next_run_at)
    row["own_lease"] = True
    return True


# What a claimed retry's row says, read from its job as the claim statement returns it.
_RETRY_JOB_FIELDS = (
    "name",
    "task",
    "queue",
    "max_retries",
    "lease_seconds",
    "jitter",
    "cron",
    "timezone",
    "interval",
    "interval_anchor",
    "overlap",
    "max_concurrent",
    "cron_day_or",
    "dst_policy",
    "solar_event",
    "not_before",
    "expires_at",
)


def due_retries() -> Any:
    """Retries of allow_all occurrences whose due time has passed (the claim probe's third
    EXISTS says the same in SQL)."""
    return JobRun.objects.filter(retry_at__lte=Now())


def _claim_due_retries(beat: str, limit: int, quarantined: list[Quarantined]) -> list[dict]:
    """Retries of allow_all occurrences whose due time has passed (``JobRun.retry_at``,
    written by ``complete.wait_for_retry``): each takes its lease now, as a claim's run does,
    while its job has a slot (``max_concurrent``) and is not paused, cancelled or dead (a
    requeue lets its retries go on). Job rows are locked before run rows, SKIP LOCKED both:
    another beat, a completion or the reaper holding one leaves it to a later tick. Costs one
    probe of an empty partial index when nothing waits."""
    rows_found = list(
        due_retries().order_by("retry_at").values_list("id", "job_id", "kind")[:limit]
    )
    if not rows_found:
        return []
    # A backfilled run's retry goes on whatever its job's own run is doing (running, dead):
    # only a paused or cancelled job holds it.
    backfilled = {job_id for _, job_id, kind in rows_found if kind == RunKind.BACKFILL}
    candidates = [(run_id, job_id) for run_id, job_id, _ in rows_found]
    free = (JobState.SCHEDULED, JobState.SUCCEEDED)
    jobs = dict(
        Job.objects.select_for_update(skip_locked=True)
        .filter(id__in={job_id for _, job_id in candidates})
        .filter(
            Q(state__in=free) | Q(id__in=backfilled, state__in=[JobState.RUNNING, JobState.DEAD])
        )
        .order_by("id")
        .values_list("id", "state")
    )
    runs = list(
        JobRun.objects.select_for_update(skip_locked=True)
        .filter(
            id__in=[
                run_id
                for run_id, job_id, kind in rows_found
                if job_id in jobs and (kind == RunKind.BACKFILL or jobs[job_id] in free)
            ],
            retry_at__lte=Now(),
            status=RunStatus.DISPATCHED,
        )
        .order_by("retry_at")
    )
    rows: list[dict] = []
    for run in runs:
        row = in_savepoint_or_quarantine(
            run.job_id,
            lambda run=run: _start_retry(beat, run.job_id, run),
            quarantined,
            "its retry cannot be sent",
        )
        if row is not None:
            rows.append(row)
    return rows


def _start_retry(beat: str, job_id: int, run: JobRun) -> dict | None:
    job = Job.objects.annotate(database_now=Now()).get(id=job_id)
    if JobRun.objects.filter(job_id=job.id, lease_expires_at__isnull=False).count() >= max(
        1, job.max_concurrent
    ):
        return None  # it waits for a slot, as an occurrence does
    JobRun.objects.filter(id=run.id).update(
        retry_at=None,
        claimed_by=beat,
        dispatched_at=Now(),
        lease_expires_at=Now() + timedelta(seconds=job.lease_seconds),
    )
    row = {field: getattr(job, field) for field in _RETRY_JOB_FIELDS}
    row.update(
        run_id=run.id,
        id=job.id,
        token=run.token,
        args=json.dumps(job.args),
        kwargs=json.dumps(job.kwargs),
        message_options=json.dumps(job.message_options),
        scheduled_for=run.scheduled_for,
        next_run_at=run.due_at,
        retry_count=run.attempt - 1,
        lateness=(job.database_now - run.due_at).total_seconds(),
        own_lease=True,
    )
    return row


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
        claimed_at=_claimed_at(row),
        claimed_monotonic=started,
        max_retries=row["max_retries"],
        own_lease=row.get("own_lease", False),
    )


def _claimed_at(row: dict) -> datetime:
    """The claim's now(), as the database read it: ``lateness`` is it less ``next_run_at``."""
    return row["next_run_at"] + timedelta(seconds=row["lateness"])


def _schedule_ref(row: dict) -> ScheduleRef | None:
    """What a worker needs to compute the next occurrence itself (the fast success path);
    None for a one-off, and for solar, windowed, calendar and non-default DST policy jobs,
    which take the general path (it reads the row, so a policy changed during the run is
    honoured)."""
    if row["solar_event"] or row["not_before"] is not None or row["expires_at"] is not None:
        return None
    if row.get("calendar_id") is not None:  # the worker does not read calendars
        return None
    if row.get("dst_policy", DEFAULT_DST_POLICY) != DEFAULT_DST_POLICY:
        return None
    if row["cron"]:
        return ScheduleRef(cron=row["cron"], timezone=row["timezone"], day_or=row["cron_day_or"])
    if row["interval"] is not None:
        return ScheduleRef(interval=row["interval"], anchor=row["interval_anchor"])
    return None


def seconds_until_due() -> tuple[datetime, float] | None:
    """The database's now, and seconds from it until the next due job, lease expiry or run
    to supersede."""
    return _wake(get_store(), time.monotonic()).until_due()


def _wake(store: Any, read_at: float) -> Wake:
    """``read_at``: the monotonic time of the transaction's now() (in a claim, its start)."""
    now, next_due, next_expiry = store.next_due()
    times = [t for t in (next_due, next_expiry) if t is not None]
    return Wake(now=now, due=min(times) if times else None, read_at=read_at)


# --- after publishing ------------------------------------------------------------------------


def give_back(runs: Sequence[ClaimedRun], reason: str) -> int:
    """Give back runs a beat claimed and did not publish, so they are claimed again at once;
    returns how many. Those under their job's lease: ``release_claims``. A run of an
    allow_all job holds a lease of its own (its job moved on at the claim): it is closed
    lost and its occurrence waits for a beat at once, the same attempt, as the reaper does
    once such a lease lapses unstarted, without waiting for the lapse."""
    released = release_claims([(r.job_id, r.token) for r in runs if not r.own_lease], reason)
    own = [(r.run_id, r.job_id) for r in runs if r.own_lease]
    return released + (_release_own_leases(own, reason) if own else 0)


def _release_own_leases(runs: Sequence[tuple[int, int]], reason: str) -> int:
    """``give_back`` of (run id, job id) of runs holding their own lease. Job rows are locked
    before run rows, as by the reaper (the retry's token is drawn from its job); the runs
    are locked as read, so a door cannot admit one between the check and the release."""
    from .complete import wait_for_retry

    with beat_transaction():
        list(
            Job.objects.select_for_update()
            .filter(id__in={job_id for _, job_id in runs})
            .order_by("id")
            .values_list("id", flat=True)
        )
        unstarted = list(
            JobRun.objects.select_for_update()
            .filter(
                id__in=[run_id for run_id, _ in runs],
                status=RunStatus.DISPATCHED,
                lease_expires_at__isnull=False,
            )
            .order_by("id")
            .values_list("id", "job_id", "scheduled_for", "attempt", "kind")
        )
        JobRun.objects.filter(id__in=[run[0] for run in unstarted]).update(
            status=RunStatus.LOST,
            finished_at=Now(),
            error=f"not published: {reason}",
            lease_expires_at=None,
        )
        for _, job_id, scheduled_for, attempt, kind in unstarted:
            wait_for_retry(job_id, scheduled_for, attempt, kind or RunKind.SCHEDULED, timedelta(0))
    return len(unstarted)


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
        unstarted = (
            list(
                JobRun.objects.filter(
                    pairs(locked, "job_id"), status=RunStatus.DISPATCHED
                ).values_list("job_id", "token")
            )
            if locked
            else []
        )
        if not unstarted:
            return 0
        released = Job.objects.filter(pairs(unstarted)).update(
            state=JobState.SCHEDULED, token=F("token") + 1, claimed_by="", lease_expires_at=None
        )
        JobRun.objects.filter(pairs(unstarted, "job_id"), status=RunStatus.DISPATCHED).update(
            status=RunStatus.LOST, finished_at=Now(), error=f"not published: {reason}"
        )
        return released
