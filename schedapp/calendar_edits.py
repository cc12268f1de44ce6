"""A calendar edited after jobs follow it (issue 31): the next runs of those jobs, computed
under the old definition, are computed again under the new one.

Eagerly, once the save commits (``transaction.on_commit``), in batches: each batch is one short
transaction that locks its jobs ``FOR UPDATE SKIP LOCKED`` (a beat claiming one of them is never
waited on, and never waits on us for long: DESIGN 23); the jobs it skipped are tried again after
a pause, a few times. Eager rather than lazily in the claim: a lazy check only sees a job when
its old run comes due, so it could not move a run earlier (a holiday removed), and it would
put a calendar comparison into every claim for an event that happens a few times a year.

Only a job waiting for its occurrence is moved (``scheduled``, no retry pending, not a
person's "run now"): a run in flight is left to its completion, which reads the new
definition (``job_calendars``' cache is keyed by ``updated_at``); a paused job is decided
again by its resume. What the new definition excluded or merged on the way is recorded in the
ledger (``decided_by`` names the calendar); the job's audit trail is not written (its own
fields did not change), the edit is logged once on the calendar side.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import F, Q

from . import job_calendars, ledger, policies
from .db import db_now, notify_due
from .exceptions import ScheduleError
from .lease.quarantine import ROW_ERRORS, quarantine_locked, unschedulable
from .models import CalendarReference, Job, JobState
from .policies import MissedRange

log = logging.getLogger(__name__)

BATCH_SIZE = 100  # jobs locked at once: one short transaction each
RETRIES = 5  # rounds for jobs that were locked (a claim in progress) when their batch ran
RETRY_PAUSE = timedelta(milliseconds=200)
_TICK = timedelta(microseconds=1)


@dataclass(frozen=True)
class Recomputed:
    """What an edit did to the jobs following the calendar: ``moved`` got another next run,
    ``busy`` were still locked after every retry (they keep the run they had), and
    ``unschedulable`` were quarantined (the new definition leaves them no run within its
    bounds, which the beat would have found at their next run)."""

    moved: int
    busy: tuple[int, ...]
    unschedulable: tuple[int, ...]


def affected_calendars(calendar_id: int) -> set[int]:
    """``calendar_id`` and every calendar that refers to it, directly or through others."""
    found = {calendar_id}
    frontier = {calendar_id}
    while frontier:
        referring = set(
            CalendarReference.objects.filter(target_id__in=frontier).values_list(
                "calendar_id", flat=True
            )
        )
        frontier = referring - found
        found |= frontier
    return found


def _waiting(calendar_ids: Iterable[int]) -> Q:
    """Jobs waiting for an occurrence under one of these calendars, none of it begun."""
    return (
        Q(calendar_id__in=list(calendar_ids), state=JobState.SCHEDULED, retry_count=0)
        & ~Q(scheduled_for__isnull=True)
        & (Q(manual_at__isnull=True) | ~Q(manual_at=F("scheduled_for")))
    )


def after_edit(calendar_id: int, name: str) -> None:
    """``recompute_following`` once the calendar's save has committed (a job must never be
    moved by a definition that was rolled back)."""
    # robust: the save has committed, whatever befalls the jobs (logged) is not its failure
    transaction.on_commit(lambda: _after_commit(calendar_id, name), robust=True)


def _after_commit(calendar_id: int, name: str) -> None:
    done = recompute_following(calendar_id, name)
    log.info(
        "calendar %s edited: %d jobs moved, %d busy, %d unschedulable",
        name,
        done.moved,
        len(done.busy),
        len(done.unschedulable),
        extra={"action": "calendar_edited", "calendar": name, "moved": done.moved},
    )
    if done.busy:
        log.warning(
            "calendar %s edited: jobs %s stayed locked; their next run after this one follows "
            "the new definition",
            name,
            list(done.busy),
            extra={"action": "calendar_edit_busy", "calendar": name},
        )


def recompute_following(
    calendar_id: int,
    name: str = "",
    *,
    batch_size: int = BATCH_SIZE,
    retries: int = RETRIES,
    pause: timedelta = RETRY_PAUSE,
) -> Recomputed:
    """The next run of every job waiting under ``calendar_id`` (or a calendar referring to
    it), computed again under the calendars as stored now; batches of ``batch_size`` jobs,
    the locked ones tried again ``retries`` times ``pause`` apart."""
    calendar_ids = affected_calendars(calendar_id)
    pending = list(
        Job.objects.filter(_waiting(calendar_ids)).order_by("id").values_list("id", flat=True)
    )
    moved = 0
    unschedulable: list[int] = []
    for attempt in range(retries + 1):
        busy: list[int] = []
        for start in range(0, len(pending), batch_size):
            batch = pending[start : start + batch_size]
            done, skipped, failed = _batch(batch, calendar_ids, name)
            moved += done
            busy.extend(skipped)
            unschedulable.extend(failed)
        pending = busy
        if not pending or attempt == retries:
            break
        time.sleep(pause.total_seconds())
    return Recomputed(moved, tuple(pending), tuple(unschedulable))


def _batch(ids: list[int], calendar_ids: set[int], name: str) -> tuple[int, list[int], list[int]]:
    """One transaction: (jobs moved, ids found locked, ids the calendar leaves no run)."""
    with transaction.atomic():
        jobs = list(
            Job.objects.select_for_update(skip_locked=True, of=("self",))
            .filter(_waiting(calendar_ids), pk__in=ids)
            .order_by("id")
        )
        locked = {j.pk for j in jobs}
        # the rest still waiting were locked (a claim in progress); gone ones are not busy
        others = [i for i in ids if i not in locked]
        skipped = (
            list(
                Job.objects.filter(_waiting(calendar_ids), pk__in=others).values_list(
                    "id", flat=True
                )
            )
            if others
            else []
        )
        read = job_calendars.for_rows([{"calendar_id": j.calendar_id} for j in jobs])
        now = db_now()
        changed: list[Job] = []
        decided: list[tuple[int, MissedRange]] = []
        failed: list[int] = []
        # jobs alike (schedule, occurrence, calendar and its options) share one answer
        answers: dict[tuple, tuple[datetime | None, tuple[MissedRange, ...]]] = {}
        for job in jobs:
            try:
                key = (
                    job.schedule,
                    job.scheduled_for,
                    job.calendar_id,
                    job.calendar_mode,
                    job.calendar_roll,
                    job.timezone,
                )
                if key not in answers:
                    answers[key] = _next(job, read, now)
                at, ranges = answers[key]
            except ROW_ERRORS as exc:  # the beat would quarantine it at its next run: now
                reason = exc.message if isinstance(exc, ScheduleError) else unschedulable(exc)
                quarantine_locked(job.pk, f"calendar {name!r} edited: {reason}")
                failed.append(job.pk)
                continue
            if at is None or at == job.scheduled_for:
                continue
            job.scheduled_for = at
            job.next_run_at = at + policies.compute_jitter(job.jitter, random.random)
            changed.append(job)
            decided.extend((job.pk, r) for r in ranges)
        if changed:
            Job.objects.bulk_update(changed, ["scheduled_for", "next_run_at"])
            # a run brought forward wakes the beats sleeping until the old one (at commit)
            notify_due(min(j.next_run_at for j in changed if j.next_run_at is not None))
        if decided:
            ledger.record(decided, f"calendar {name} edited" if name else "calendar edited")
    return len(changed), skipped, failed


def _next(job: Job, read: dict, now: datetime) -> tuple[datetime | None, tuple[MissedRange, ...]]:
    """The job's occurrence under the new definition: the first it allows from the one the job
    waits for (an occurrence the edit excludes is recorded as such), or, when that is still
    ahead, an earlier one the edit allows from now (a holiday removed brings the run forward,
    as attaching the calendar would)."""
    cal = job_calendars.for_row(
        {
            "calendar_id": job.calendar_id,
            "calendar_mode": job.calendar_mode,
            "calendar_roll": job.calendar_roll,
            "timezone": job.timezone or "UTC",
        },
        read,
    )
    waited = job.scheduled_for
    assert waited is not None  # _waiting
    at, ranges = policies.next_run(job.schedule, waited - _TICK, cal)
    if waited > now:
        early, early_ranges = policies.next_run(job.schedule, now - _TICK, cal)
        if early is not None and (at is None or early < at):
            return early, early_ranges
    return at, ranges
