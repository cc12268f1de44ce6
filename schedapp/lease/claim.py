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

from django.db.models import F
from django.db.models.functions import Now

from .. import job_calendars, ledger, policies
from ..db import beat_transaction
from ..message import ScheduleRef, idempotency_key, task_id_for
from ..models import Job, JobRun, JobState, RunStatus, schedule_of
from ..schedules import DEFAULT_DST_POLICY, next_fire_time
from ..store import get_store, insert_runs, pairs
from .quarantine import (
    ROW_ERRORS,
    Quarantined,
    first_line,
    in_savepoint_or_quarantine,
    job_label,
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
) -> ClaimResult:
    """Claim up to ``limit`` due jobs for ``beat`` in ONE transaction; publish after it.

    With ``supersede``, also marks the runs a later occurrence supersedes (cancel_other,
    terminate_other: ``supersede_due``, one statement): a beat asks at most once a second.

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
        return _claim_due_jobs(beat, limit, rng, message_expiry, supersede, careful=False)
    except ROW_ERRORS as exc:
        log.warning(
            "a row failed the claim (%s: %s): claiming one row at a time",
            type(exc).__name__,
            first_line(exc),
            extra={"action": "claim_careful", "beat": beat},
        )
        return _claim_due_jobs(beat, limit, rng, message_expiry, supersede, careful=True)


def _claim_due_jobs(
    beat: str,
    limit: int,
    rng: policies.Rng,
    message_expiry: MessageExpiry | None,
    supersede: bool,
    *,
    careful: bool,
) -> ClaimResult:
    result = ClaimResult()
    store = get_store()
    started = time.monotonic()
    with beat_transaction():
        if careful:
            result.reap = reap_each(limit, rng, message_expiry)
            rows, now = _claim_each(store, beat, limit, result.quarantined)
        else:
            result.reap = reap_locked(limit, rng, message_expiry)
            rows, now = store.claim(beat, limit)
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
    for row in rows:
        if row["overlap"] not in policies.SUPERSEDING:
            continue
        try:
            nxt = next_fire_time(schedule_of(row), max(row["scheduled_for"], _claimed_at(row)))
        except Exception as exc:  # the end of the run will quarantine it: not the claim
            log.warning("job %s: no next occurrence to supersede its run: %s", row["id"], exc)
            nxt = None
        Job.objects.filter(id=row["id"], token=row["token"]).update(
            supersede_at=nxt, superseded=False
        )


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
