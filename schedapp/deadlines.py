"""Deadline breaches (docs/semantics.md, Deadlines): a job's occurrence late to start, a run
overrunning, the day's occurrence not done by ``finish_by``, failed attempts in a row, a dead
job; each recorded once per incident (``Breach``) and cleared with a ``recovered`` when it
ends; its signal sent after the recording commits.

Off the hot path: a beat's deadline pass (``check_deadlines``, every
``SCHEDAPP_DEADLINE_CHECK`` seconds) asks one bounded statement per kind, each on a partial
index holding only the jobs with that deadline (or the open breaches), and reads into Python
only what breaches or recovers; ``failing`` is decided where the failure is written (the
completion, ``record_failure``). Jobs without deadlines cost nothing. Two beats may run the
pass at once: the partial unique constraint on open breaches lets one of them record an
incident, the other's insert is refused in its savepoint and sends nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, time, timedelta
from types import SimpleNamespace

from django.db import DEFAULT_DB_ALIAS, IntegrityError, connections, transaction
from django.db.models import DurationField, Exists, ExpressionWrapper, F, OuterRef, Q
from django.db.models.functions import Coalesce, Now

from .message import task_id_for
from .models import Breach, BreachKind, Job, JobRun, JobState, RunStatus, schedule_of
from .notify.channels import RECOVERED
from .notify.outbox import breach_incident, configured_channels, dead_incident, enqueue
from .policies import next_finish_by
from .schedules import next_fire_time
from .signals import BREACH_SIGNALS, job_recovered
from .store import PortableStore, PostgreSQLStore

log = logging.getLogger("schedapp.deadlines")

PASS_LIMIT = 500  # rows each statement of a pass reads at most; the next pass goes on
_TICK = timedelta(microseconds=1)
PENDING = (JobState.SCHEDULED, JobState.RUNNING)
#: What an overrunning breach's detail adds when schedapp revoked the run, for the people who
#: read it; the pass itself reads ``Breach.revoked`` (its recovery then never withdraws the
#: alert: see ``_notify``).
REVOKED = "; revoked (revoke_overrun)"


@dataclass(frozen=True)
class BreachEvent:
    """What a deadline signal carries: one breach opened, or one that recovered."""

    breach_id: int
    job_id: int
    job_name: str
    tags: tuple[str, ...]
    kind: str
    scheduled_for: datetime
    detail: str
    recovered: bool = False


@dataclass
class DeadlineResult:
    opened: list[BreachEvent] = field(default_factory=list)
    recovered: list[BreachEvent] = field(default_factory=list)
    # Tasks of overrunning runs whose job asks for them to be revoked (revoke_overrun): the
    # beat revokes them (terminate) after the pass committed.
    to_revoke: list[str] = field(default_factory=list)


def _since(column: str) -> ExpressionWrapper:
    """How long ago a time column was, in the database's clock: compared with a duration
    column as an interval (``now() - t > d``), never as ``now() - d``, which a duration
    written behind the API's back (a million years) would take out of a timestamp's range and
    fail the whole pass with."""
    return ExpressionWrapper(Now() - F(column), output_field=DurationField())


def check_deadlines(using: str = DEFAULT_DB_ALIAS, limit: int = PASS_LIMIT) -> DeadlineResult:
    """One deadline pass: clear what ended, then record what breaches (clearing first, so an
    incident that ended and began again in one interval is two). Signals go after commit."""
    result = DeadlineResult()
    with transaction.atomic(using=using):
        _clear(using, limit, result)
        _open_late(using, limit, result)
        _open_overrunning(using, limit, result)
        _arm_finish_by(using, limit)
        _open_missed_finish_by(using, limit, result)
        _open_dead(using, limit, result)
        _after_commit(result.opened + result.recovered, using)
    return result


def record_failure(job: Job, scheduled_for: datetime, using: str = DEFAULT_DB_ALIAS) -> bool:
    """At a failed attempt's completion, in its transaction: ``alert_after_failures`` failed
    attempts in a row (this one the last) make the job failing. Only jobs with the setting
    pay, one read of their latest runs (the (job, -id) index)."""
    wanted = job.alert_after_failures
    if not wanted:
        return False
    latest = list(
        JobRun.objects.using(using)
        .filter(job_id=job.pk)
        .exclude(status__in=(RunStatus.DISPATCHED, RunStatus.RUNNING))
        .order_by("-id")
        .values_list("status", flat=True)[:wanted]
    )
    if len(latest) < wanted or any(s != RunStatus.FAILED for s in latest):
        return False
    detail = f"{wanted} failed attempt(s) in a row (alert_after_failures)"
    event = _insert(using, job.pk, job.name, job.tags, BreachKind.FAILING, scheduled_for, detail)
    if event is None:
        return False
    _after_commit([event], using)
    return True


# --- opening ---------------------------------------------------------------------------------


#: Distinct start deadlines the late look reads one range each; those beyond share one look.
LATE_DEADLINES = 8
#: Added to each look's bound (``now - start_deadline``, ``now - max_runtime``): the bound is
#: read from the transaction's clock, the exact test (``waited > start_deadline``, ``ran >
#: max_runtime``) from the statement's, a little later.
_SLACK = timedelta(seconds=5)


def _open_late(using: str, limit: int, result: DeadlineResult) -> None:
    """Pending occurrences (scheduled, or claimed and waiting at a worker's door) whose first
    attempt has not started within the job's start deadline.

    Read per distinct start deadline ``d`` (the index on (start_deadline, scheduled_for)),
    each the range of occurrences older than ``now - d``: a burst of 100,000 jobs due now
    with an hour's deadline is not read on every pass (it was: 125-150 ms a pass). Past
    ``LATE_DEADLINES`` distinct deadlines, the rest are read in one look bounded by the
    smallest of them. Each row still passes the exact test."""
    started = JobRun.objects.using(using).filter(
        job_id=OuterRef("pk"), scheduled_for=OuterRef("scheduled_for"), started_at__isnull=False
    )
    pending = Job.objects.using(using).filter(start_deadline__isnull=False, state__in=PENDING)
    now = None
    deadline = pending.order_by("start_deadline").values_list("start_deadline", flat=True).first()
    looks = 0
    while deadline is not None and limit > 0:
        now = now or _now(using)
        try:
            bound = now - deadline + _SLACK
        except OverflowError:  # longer than any occurrence can be old: nor are those after it
            return
        looks += 1
        last = looks >= LATE_DEADLINES
        in_range = (
            pending.filter(start_deadline__gte=deadline)
            if last
            else pending.filter(start_deadline=deadline)
        )
        rows = list(
            in_range.alias(waited=_since("scheduled_for"))
            .filter(scheduled_for__lt=bound, retry_count=0, waited__gt=F("start_deadline"))
            .exclude(Exists(started))
            .exclude(Exists(_open(using, BreachKind.LATE)))
            .values_list("id", "name", "tags", "scheduled_for", "start_deadline")[:limit]
        )
        limit -= len(rows)
        for job_id, name, tags, occurrence, job_deadline in rows:
            detail = f"not started within its start deadline ({job_deadline})"
            event = _insert(using, job_id, name, tags, BreachKind.LATE, occurrence, detail)
            _collect(result, event)
        if last:
            return
        deadline = (
            pending.filter(start_deadline__gt=deadline)
            .order_by("start_deadline")
            .values_list("start_deadline", flat=True)
            .first()
        )


def _open_overrunning(using: str, limit: int, result: DeadlineResult) -> None:
    """Runs still running longer than their job's max runtime, from the start the door
    recorded (the lease heartbeats keep the run's lease; the start says how long it runs).

    Only the running jobs claimed longer ago than the smallest max runtime among them are
    read (a run starts after its claim; ``schedapp_job_overrun`` on ``claimed_at``), each
    held to its own: a burst's 100,000 jobs in flight were all read and their runs probed on
    every pass (130-215 ms). A job claimed by a release before 0044 (``claimed_at`` NULL) is
    read as before. The bound is on the job row, which the claim writes anyway: an index on
    the runs' start would cost every door and completion its heap-only update."""
    running = Job.objects.using(using).filter(state=JobState.RUNNING, max_runtime__isnull=False)
    smallest = running.order_by("max_runtime").values_list("max_runtime", flat=True).first()
    if smallest is None:
        return
    try:
        bound = _now(using) - smallest + _SLACK
    except OverflowError:  # longer than any run can have run: nothing overruns
        return
    overrun = (
        JobRun.objects.using(using)
        .alias(ran=_since("started_at"))
        .filter(
            job_id=OuterRef("pk"),
            token=OuterRef("token"),
            status=RunStatus.RUNNING,
            ran__gt=OuterRef("max_runtime"),
        )
    )
    rows = (
        running.filter(Q(claimed_at__lt=bound) | Q(claimed_at__isnull=True))
        .filter(Exists(overrun))
        .exclude(Exists(_open(using, BreachKind.OVERRUNNING)))
        .values_list(
            "id", "name", "tags", "scheduled_for", "max_runtime", "token", "revoke_overrun"
        )[:limit]
    )
    for job_id, name, tags, occurrence, runtime, token, revoke in rows:
        detail = f"running longer than its max runtime ({runtime})"
        if revoke:
            detail += REVOKED
        event = _insert(
            using, job_id, name, tags, BreachKind.OVERRUNNING, occurrence, detail, revoked=revoke
        )
        _collect(result, event)
        if event is not None and revoke:
            result.to_revoke.append(task_id_for(job_id, token))


def _arm_finish_by(using: str, limit: int) -> None:
    """Jobs given a finish_by (new, or changed: the API clears finish_by_at) get the first
    deadline after now. Once per job and change, not per pass."""
    jobs = (
        Job.objects.using(using)
        .select_for_update(skip_locked=True)
        .filter(finish_by__isnull=False, finish_by_at__isnull=True)
        .filter(finish_by__lte=time.max)  # (PostgreSQL's 24:00:00 is no Python time)
        .values_list("id", "finish_by", "timezone")[:limit]
    )
    now = _now(using)
    # One UPDATE per deadline instant, not per job: a bulk schedule of 100,000 jobs sharing a
    # few (finish_by, zone) pairs is armed in a few statements, not 100,000 beside the claim.
    armed: dict[datetime, list[int]] = {}
    for job_id, finish_by, zone in jobs:
        try:
            at, _ = next_finish_by(finish_by, zone, now)
        except Exception as exc:  # a zone written behind the API's back: the job is not armed
            log.warning("job %s: finish_by not armed: %s", job_id, exc)
            continue
        armed.setdefault(at, []).append(job_id)
    for at, ids in armed.items():
        Job.objects.using(using).filter(id__in=ids).update(finish_by_at=at)


def _open_missed_finish_by(using: str, limit: int, result: DeadlineResult) -> None:
    """Jobs whose finish_by instant passed: missed if the schedule had an occurrence that
    day, before the deadline, and no run of one succeeded by then. The next deadline is armed
    in the same transaction, so each day is judged once."""
    jobs = list(
        Job.objects.using(using)
        .select_for_update(skip_locked=True)
        .filter(finish_by__isnull=False, finish_by_at__lte=Now(), finish_by__lte=time.max)
        .exclude(state__in=(JobState.PAUSED, JobState.CANCELLED))[:limit]
    )
    now = _now(using)
    for job in jobs:
        deadline = job.finish_by_at
        assert deadline is not None and job.finish_by is not None
        try:
            _, day_start = next_finish_by(job.finish_by, job.timezone, deadline - _TICK)
            first = next_fire_time(schedule_of(job.__dict__), day_start - _TICK)
            upcoming, _ = next_finish_by(job.finish_by, job.timezone, now)
        except Exception as exc:  # the row cannot be followed: disarm it, say so
            log.warning("job %s: finish_by cannot be judged: %s", job.pk, exc)
            Job.objects.using(using).filter(id=job.pk).update(finish_by_at=None, finish_by=None)
            continue
        Job.objects.using(using).filter(id=job.pk).update(finish_by_at=upcoming)
        if first is None or first > deadline:
            continue  # no occurrence that day before the deadline: nothing was due
        done = (
            JobRun.objects.using(using)
            .filter(
                job_id=job.pk,
                status=RunStatus.SUCCEEDED,
                scheduled_for__gte=day_start,
                scheduled_for__lte=deadline,
                finished_at__lte=deadline,
            )
            .exists()
        )
        if not done:
            local = job.finish_by.isoformat(timespec="minutes")
            detail = f"the occurrence due by {local} ({job.timezone}) had not succeeded"
            event = _insert(
                using, job.pk, job.name, job.tags, BreachKind.MISSED_FINISH_BY, deadline, detail
            )
            _collect(result, event)


def _open_dead(using: str, limit: int, result: DeadlineResult) -> None:
    """Dead jobs (retries exhausted or quarantined) without an open ``dead`` breach."""
    rows = (
        Job.objects.using(using)
        .filter(state=JobState.DEAD)
        .exclude(Exists(_open(using, BreachKind.DEAD)))
        .annotate(occurrence=Coalesce("scheduled_for", "updated_at"))
        .values_list("id", "name", "tags", "occurrence", "last_error")[:limit]
    )
    for job_id, name, tags, occurrence, error in rows:
        detail = "dead: " + (error.splitlines()[0] if error else "retries exhausted")
        _collect(result, _insert(using, job_id, name, tags, BreachKind.DEAD, occurrence, detail))


# --- clearing --------------------------------------------------------------------------------


def _clear(using: str, limit: int, result: DeadlineResult) -> None:
    """Open breaches that ended, each kind by its own end (one statement a kind, on the open
    breaches' index), cleared with why. With none open (the common pass), one statement."""
    if not Breach.objects.using(using).filter(cleared_at__isnull=True).exists():
        return
    started = JobRun.objects.using(using).filter(
        job_id=OuterRef("job_id"), scheduled_for=OuterRef("scheduled_for"), started_at__isnull=False
    )
    running = JobRun.objects.using(using).filter(
        job_id=OuterRef("job_id"), token=OuterRef("job__token"), status=RunStatus.RUNNING
    )
    succeeded_since = Q(job__last_status=RunStatus.SUCCEEDED, job__last_run_at__gte=F("opened_at"))
    ends: list[tuple[str, Q | Exists, str | Callable[[Breach], str]]] = [
        (BreachKind.LATE, Exists(started), "started"),
        (
            BreachKind.LATE,
            ~Q(job__scheduled_for=F("scheduled_for")) | ~Q(job__state__in=PENDING),
            _moved_on,
        ),
        (BreachKind.OVERRUNNING, ~Exists(running), "the run ended"),
        (BreachKind.MISSED_FINISH_BY, succeeded_since, "succeeded"),
        (BreachKind.FAILING, succeeded_since, "succeeded"),
        (BreachKind.DEAD, ~Q(job__state=JobState.DEAD), "no longer dead"),
    ]
    for kind, ended, why in ends:
        breaches = list(
            Breach.objects.using(using)
            .select_for_update(skip_locked=True, of=("self",))
            .filter(kind=kind, cleared_at__isnull=True)
            .filter(ended)
            .select_related("job")[:limit]
        )
        for breach in breaches:
            said = why if isinstance(why, str) else why(breach)
            cleared = (
                Breach.objects.using(using)
                .filter(id=breach.pk, cleared_at__isnull=True)
                .update(cleared_at=Now(), cleared_detail=said)
            )
            if cleared:
                event = _event(breach, breach.job, said, recovered=True)
                _notify(event, using, withdraw=not breach.revoked)
                result.recovered.append(event)


def _moved_on(breach: Breach) -> str:
    job = breach.job
    if job.state not in PENDING:
        return f"the job is {job.state}"
    return "the occurrence will not run (the job moved on)"


# --- helpers ---------------------------------------------------------------------------------


def _open(using: str, kind: str) -> Breach:
    return Breach.objects.using(using).filter(
        job_id=OuterRef("pk"), kind=kind, cleared_at__isnull=True
    )


def _insert(
    using: str,
    job_id: int,
    name: str,
    tags: Iterable[str],
    kind: str,
    occurrence: datetime,
    detail: str,
    *,
    revoked: bool = False,
) -> BreachEvent | None:
    """The breach, or None when one of this kind is open for the job already (another beat
    recorded it first): the constraint decides, in a savepoint. ``revoked``: an overrun
    schedapp revokes (``Breach.revoked``)."""
    try:
        with transaction.atomic(using=using):
            breach = Breach.objects.using(using).create(
                job_id=job_id,
                kind=kind,
                scheduled_for=occurrence,
                detail=detail[:2000],
                revoked=revoked,
            )
            event = BreachEvent(breach.pk, job_id, name, _tags(tags), kind, occurrence, detail)
            _notify(event, using)
    except IntegrityError:
        return None
    log.warning(
        "job %s (%s): %s at %s: %s",
        job_id,
        name,
        kind,
        occurrence.isoformat(),
        detail,
        extra={"action": f"breach_{kind}", "job": job_id},
    )
    return event


def _notify(event: BreachEvent, using: str, *, withdraw: bool = True) -> None:
    """The breach's notification (``schedapp.notify``), queued in the transaction that records
    it or its recovery, so it is sent if and only if that commits. A job's dead-lettering
    queues its own ``dead`` where it happens (``lease.after_run.notify_dead``): a dead breach
    queues only its recovery, under that incident. ``withdraw=False``: the recovery of an
    overrun schedapp revoked, which ends within a pass or two, usually before the channel's
    group_wait; the team must still hear that a run was killed, so the alert stays and the
    recovery follows it."""
    dead = event.kind == BreachKind.DEAD
    channels = configured_channels()
    if (dead and not event.recovered) or not channels:
        return  # no channel: not even the job's own channels are read
    notify = Job.objects.using(using).filter(pk=event.job_id).values_list("notify", flat=True)
    job = SimpleNamespace(
        id=event.job_id, name=event.job_name, tags=event.tags, notify=notify.first()
    )
    enqueue(
        RECOVERED if event.recovered else event.kind,
        job,
        scheduled_for=event.scheduled_for,
        detail=event.detail,
        incident=dead_incident(event.job_id) if dead else breach_incident(event.breach_id),
        withdraw=withdraw,
        using=using,
    )


def _event(breach: Breach, job: Job, detail: str, *, recovered: bool) -> BreachEvent:
    return BreachEvent(
        breach.pk,
        job.pk,
        job.name,
        _tags(job.tags),
        breach.kind,
        breach.scheduled_for,
        detail,
        recovered,
    )


def _tags(value: object) -> tuple[str, ...]:
    """A job's tags as a tuple (a value written behind the API's back gives none)."""
    if isinstance(value, list):
        return tuple(t for t in value if isinstance(t, str))
    return ()


def _collect(result: DeadlineResult, event: BreachEvent | None) -> None:
    if event is not None:
        result.opened.append(event)


def _now(using: str) -> datetime:
    """The database's clock (PostgreSQL's transaction time; the portable store's host)."""
    if connections[using].vendor == "postgresql":
        return PostgreSQLStore(using=using).now()
    return PortableStore(using=using).now()


def _after_commit(events: list[BreachEvent], using: str) -> None:
    if events:
        transaction.on_commit(lambda: send(events), using=using)


def send(events: Iterable[BreachEvent]) -> None:
    """Each event's signal; a receiver's exception is logged, never raised (the beat or
    worker that recorded the breach goes on)."""
    for event in events:
        signal = job_recovered if event.recovered else BREACH_SIGNALS[event.kind]
        for receiver, answer in signal.send_robust(sender=Breach, breach=event):
            if isinstance(answer, Exception):
                log.error(
                    "a %s receiver (%r) failed: %s",
                    "recovered" if event.recovered else event.kind,
                    receiver,
                    answer,
                    exc_info=answer,
                    extra={"action": "breach_signal_failed", "job": event.job_id},
                )


def open_breaches(
    max_tags: int, using: str = DEFAULT_DB_ALIAS
) -> tuple[dict[str, int], dict[tuple[str, str], int]]:
    """(open breaches by kind, by kind and tag): the tags beyond the ``max_tags`` most common
    summed as ``_other``. Reads the open breaches only (their partial unique index)."""
    by_kind: dict[str, int] = dict.fromkeys(BreachKind.values, 0)
    per_tag: dict[tuple[str, str], int] = {}
    tag_totals: dict[str, int] = {}
    rows = Breach.objects.using(using).filter(cleared_at__isnull=True)
    for kind, tags in rows.values_list("kind", "job__tags").iterator():
        by_kind[kind] = by_kind.get(kind, 0) + 1
        for tag in _tags(tags) or ("",):
            per_tag[(kind, tag)] = per_tag.get((kind, tag), 0) + 1
            tag_totals[tag] = tag_totals.get(tag, 0) + 1
    kept = set(sorted(tag_totals, key=lambda t: (-tag_totals[t], t))[:max_tags])
    by_tag: dict[tuple[str, str], int] = {}
    for (kind, tag), count in per_tag.items():
        key = (kind, tag if tag in kept else "_other")
        by_tag[key] = by_tag.get(key, 0) + count
    return by_kind, by_tag
