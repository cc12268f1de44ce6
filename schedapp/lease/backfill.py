"""Backfill: the occurrences of a job's schedule in a past range run as if their time had just
passed. A ``Backfill`` row is shared by all beats: each tick a beat locks the running ones it
can (SKIP LOCKED: one beat at a time per backfill), decides the next occurrences after its
cursor, creates the runs it lets through and moves the cursor, all in one transaction, then
publishes those runs as it publishes its claim's. A beat that dies mid-batch rolls back the
runs with the cursor: the next beat decides them again. Every write is through the ORM, so
the portable store does the same.

Each run is a run of its own with its own lease (as under ``allow_all``): the door, renewals,
completions, retries and the reaper treat it as an allow_all run, and the job's own token,
lease and next run are left alone. Its token is negative (the next below the job's lowest,
drawn with the job row locked), so it never collides with the job's own tokens, which count
up.

The throttle is a token bucket in database time: ``allowance`` grows by ``max_per_second``
per second since ``refilled_at``, capped at one second's worth (at least 1); each run
dispatched (and, under overlap ``skip``, each occurrence decided) takes one. In any window of
t seconds a backfill dispatches at most ``max_per_second * t + bucket``.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from datetime import datetime, timedelta

from django.db.models import F

from .. import job_calendars, policies
from ..db import beat_transaction, db_now, notify_due
from ..message import task_id_for
from ..models import (
    ACTIVE_RUN_STATUSES,
    Backfill,
    BackfillFate,
    BackfillRange,
    BackfillState,
    Job,
    JobRun,
    JobState,
    RunKind,
    RunStatus,
)
from .claim import ClaimedRun
from .complete import next_token

MAX_OCCURRENCES = 100_000  # the most occurrences one backfill may cover
BATCH = 500  # the most occurrences one backfill decides in one transaction
LOOKAHEAD = 100  # occurrences walked beyond what the tokens allow (those that need none)
BACKFILL_OVERLAP = (policies.ALLOW_ALL, policies.BUFFER_ALL, policies.OVERLAP_SKIP)
DEFAULT_OVERLAP = policies.ALLOW_ALL
_TICK = timedelta(microseconds=1)


def bucket(max_per_second: float) -> float:
    """The most a backfill may dispatch at once after a pause: one second's worth, at least 1."""
    return max(1.0, max_per_second)


def occurrences(
    job: Job, after: datetime | None, start: datetime, end: datetime
) -> Iterator[datetime]:
    """The job's nominal occurrences in [start, end] strictly after ``after``, in order: its
    own schedule math (window, DST policy, calendar), as the beats compute its next run."""
    schedule = job.schedule
    calendar = job_calendars.for_job(job)
    at = after if after is not None and after >= start else start - _TICK
    while True:
        nxt = policies.next_run(schedule, at, calendar)[0]
        if nxt is None or nxt > end:
            return
        yield nxt
        at = nxt


def occurrence_basis(job: Job) -> tuple[object, object]:
    """What ``occurrences`` of a job depend on (its schedule, its calendar as attached): two
    equal bases give the same occurrences."""
    return job.schedule, job_calendars.for_job(job)


def count_occurrences(job: Job, start: datetime, end: datetime) -> tuple[int, datetime | None]:
    """How many occurrences [start, end] holds, and the last; raises ValueError past the cap."""
    count, last = 0, None
    for last in occurrences(job, None, start, end):  # noqa: B007 (the last one is kept)
        count += 1
        if count > MAX_OCCURRENCES:
            raise ValueError(
                f"the range holds more than {MAX_OCCURRENCES:,} occurrences of the job's "
                "schedule; backfill it in parts."
            )
    return count, last


def advance(
    beat: str, limit: int, started: float | None = None
) -> tuple[list[ClaimedRun], float | None]:
    """One step of every running backfill this beat can lock, up to ``limit`` runs in all,
    in one transaction: the runs to publish once it has committed, and the seconds until
    one of them may dispatch again (its next token; None: no backfill is running)."""
    runs: list[ClaimedRun] = []
    waits: list[float] = []
    with beat_transaction():
        ids = list(
            Backfill.objects.select_for_update(skip_locked=True)
            .filter(state=BackfillState.RUNNING)
            .order_by("id")
            .values_list("id", flat=True)[:20]
        )
        for backfill in Backfill.objects.filter(id__in=ids).order_by("id"):
            if len(runs) >= limit:
                break
            runs.extend(_advance_one(backfill, beat, limit - len(runs), started))
            if backfill.state == BackfillState.RUNNING:
                waits.append(_until_token(backfill))
    if not ids:
        return runs, None
    return runs, min(waits, default=MIN_WAIT)


MIN_WAIT = 0.05  # a backfill another beat holds, or one waiting for a slot: look again soon


def _until_token(bf: Backfill) -> float:
    return max(MIN_WAIT, (1.0 - bf.allowance) / bf.max_per_second)


def _advance_one(bf: Backfill, beat: str, limit: int, started: float | None) -> list[ClaimedRun]:
    job = Job.objects.select_for_update().filter(id=bf.job_id).first()
    now = db_now()
    if job is None or job.state == JobState.CANCELLED:
        _finish(bf, now, cancelled=True, job=job)
        return []
    if job.state == JobState.PAUSED:
        return []  # it waits for the job's resume
    rate = bf.max_per_second
    elapsed = max(0.0, (now - bf.refilled_at).total_seconds())
    allowance = min(bucket(rate), bf.allowance + rate * elapsed)
    tokens = min(math.floor(allowance), limit)
    # Walked: what the tokens can take, plus room for occurrences that need none (already
    # done, in flight), so a throttled tick does not compute a whole batch it cannot use.
    walk = min(BATCH, max(tokens, 0) + LOOKAHEAD)
    occs = []
    for occ in occurrences(job, bf.cursor, bf.start, bf.end):
        occs.append(occ)
        if len(occs) >= walk:
            break
    if not occs:
        _finish(bf, now)
        return []
    existing = list(
        JobRun.objects.filter(
            job_id=job.id, scheduled_for__gte=occs[0], scheduled_for__lte=occs[-1]
        ).values_list("scheduled_for", "status")
    )
    done = {at for at, status in existing if status == RunStatus.SUCCEEDED}
    active = {at for at, status in existing if status in ACTIVE_RUN_STATUSES}
    in_flight = JobRun.objects.filter(job_id=job.id, lease_expires_at__isnull=False).count()
    in_flight += JobRun.objects.filter(job_id=job.id, retry_at__isnull=False).count()
    if job.lease_expires_at is not None:
        in_flight += 1  # the job's own run
    if bf.overlap == policies.BUFFER_ALL:
        slots = 0 if in_flight else 1
    elif bf.overlap == policies.ALLOW_ALL:
        slots = max(1, job.max_concurrent) - in_flight
    else:
        slots = 1 << 30
    decided: list[tuple[datetime, str]] = []
    to_run: list[datetime] = []
    spent = 0
    for occ in occs:
        if occ in active:
            fate = BackfillFate.IN_FLIGHT
        elif occ in done and not bf.rerun:
            fate = BackfillFate.ALREADY_DONE
        elif bf.overlap == policies.OVERLAP_SKIP:
            if spent >= tokens:
                break
            spent += 1
            fate = BackfillFate.OVERLAPPED if in_flight else BackfillFate.DISPATCHED
        else:
            if spent >= tokens or len(to_run) >= slots:
                break
            spent += 1
            fate = BackfillFate.DISPATCHED
        if fate == BackfillFate.DISPATCHED:
            to_run.append(occ)
            in_flight += 1
        decided.append((occ, fate))
    runs = _create_runs(job, to_run, beat, now, started)
    _record(bf, decided)
    counts = {f: sum(1 for _, g in decided if g == f) for f in BackfillFate.values}
    bf.allowance = allowance - spent
    bf.refilled_at = now
    if decided:
        bf.cursor = decided[-1][0]
    bf.decided += len(decided)
    bf.dispatched += counts[BackfillFate.DISPATCHED]
    bf.already_done += counts[BackfillFate.ALREADY_DONE]
    bf.in_flight += counts[BackfillFate.IN_FLIGHT]
    bf.overlapped += counts[BackfillFate.OVERLAPPED]
    if len(decided) == len(occs) and len(occs) < walk:
        bf.state, bf.finished_at = BackfillState.DONE, now
    bf.save()
    return runs


def _create_runs(
    job: Job, times: list[datetime], beat: str, now: datetime, started: float | None
) -> list[ClaimedRun]:
    """The runs of ``times``, each with its own lease and a negative token of its own."""
    if not times:
        return []
    low = next_token(job.id)
    lease = now + timedelta(seconds=job.lease_seconds)
    rows = [
        JobRun(
            job_id=job.id,
            token=low - i,
            attempt=1,
            kind=RunKind.BACKFILL,
            scheduled_for=at,
            due_at=now,
            dispatched_at=now,
            claimed_by=beat,
            task_id=task_id_for(job.id, low - i),
            status=RunStatus.DISPATCHED,
            own_lease=True,
            lease_expires_at=lease,
        )
        for i, at in enumerate(times)
    ]
    created = JobRun.objects.bulk_create(rows)
    if created and created[0].pk is None:  # a database that returns no ids
        ids = dict(
            JobRun.objects.filter(
                job_id=job.id, token__lte=low, token__gt=low - len(rows)
            ).values_list("token", "id")
        )
        for run in created:
            run.pk = ids[run.token]
    return [_claimed(job, run, now, started) for run in created]


def _claimed(job: Job, run: JobRun, now: datetime, started: float | None) -> ClaimedRun:
    return ClaimedRun(
        run_id=run.pk,
        job_id=job.id,
        token=run.token,
        name=job.name,
        task=job.task,
        args_json=json.dumps(job.args),
        kwargs_json=json.dumps(job.kwargs),
        queue=job.queue,
        scheduled_for=run.scheduled_for,
        due_at=now,
        attempt=1,
        lease_seconds=job.lease_seconds,
        lateness=0.0,
        schedule=None,  # a backfilled run never moves its job on
        message_options=json.dumps(job.message_options),
        claimed_at=now,
        claimed_monotonic=started if started is not None else time.monotonic(),
        max_retries=job.max_retries,
        own_lease=True,
    )


def _record(bf: Backfill, decided: list[tuple[datetime, str]]) -> None:
    """The batch's fates as ranges, the first merged into the backfill's last range when it
    has the same fate."""
    if not decided:
        return
    ranges: list[list] = []
    for at, fate in decided:
        if ranges and ranges[-1][0] == fate:
            ranges[-1][2] = at
            ranges[-1][3] += 1
        else:
            ranges.append([fate, at, at, 1])
    last = BackfillRange.objects.filter(backfill=bf).order_by("-first").first()
    if last is not None and last.fate == ranges[0][0]:
        BackfillRange.objects.filter(id=last.id).update(
            last=ranges[0][2], count=F("count") + ranges[0][3]
        )
        ranges = ranges[1:]
    BackfillRange.objects.bulk_create(
        BackfillRange(backfill=bf, fate=f, first=a, last=b, count=n) for f, a, b, n in ranges
    )


def _finish(
    bf: Backfill, now: datetime, *, cancelled: bool = False, job: Job | None = None
) -> None:
    """Done, or cancelled: the occurrences not decided yet are recorded ``cancelled``."""
    if cancelled:
        rest = list(occurrences(job, bf.cursor, bf.start, bf.end)) if job is not None else []
        _record(bf, [(at, BackfillFate.CANCELLED) for at in rest])
        bf.cancelled_count += len(rest)
        bf.decided += len(rest)
    bf.state = BackfillState.CANCELLED if cancelled else BackfillState.DONE
    bf.finished_at = now
    bf.save()


def cancel_locked(bf: Backfill) -> None:
    """Stop a running backfill (its row locked by the caller): nothing new is dispatched; the
    runs already dispatched go on to their end."""
    job = Job.objects.filter(id=bf.job_id).first()
    _finish(bf, db_now(), cancelled=True, job=job)


def wake() -> None:
    """A new backfill: wake the beats now."""
    notify_due(None, 0.0)
