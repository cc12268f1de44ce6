"""The public Python API. The admin, the management commands and imports call it too.

Every function accepts a ``Job`` or its id, validates before writing, and writes in one
transaction: bad input raises ``ValidationError`` naming the field and leaves nothing behind;
an operation that does not fit the job's state raises ``JobStateError``.
"""

from __future__ import annotations

import logging
import os
import random
import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any, Unpack

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import QuerySet

from . import (
    audit,
    bulk,
    calendar_edits,
    calendars,
    display,
    job_calendars,
    lease,
    ledger,
    policies,
    schedules,
)
from .bulk import CHUNK_SIZE
from .celeryapp import celery_app, task_not_allowed
from .db import db_now, notify_due
from .exceptions import JobStateError, ScheduleError
from .fields import (
    CALENDAR_FIELDS,
    JOB_FIELDS,
    NONE_IS_A_VALUE,
    SCHEDULE_DETAIL_FIELDS,
    SCHEDULE_FIELDS,
    JobChanges,
    JobOptions,
    changed_fields,
    with_defaults,
)
from .lease import backfill as backfills
from .models import (
    Backfill,
    BackfillState,
    Calendar,
    CalendarReference,
    Declaration,
    Job,
    JobChange,
    JobSource,
    JobState,
)
from .schedules import first_fire_time
from .store import get_store
from .validation import (
    generated_name,
    job_defaults,
    name_taken,
    source_problem,
    stored_schedule,
    validate_calendar,
    validate_job,
)

log = logging.getLogger("schedapp.api")

JobRef = Job | int

__all__ = [
    "backfill",
    "cancel",
    "cancel_backfill",
    "duplicate",
    "get",
    "import_calendar",
    "pause",
    "preview_calendar",
    "requeue",
    "restore",
    "resume",
    "run_now",
    "save_calendar",
    "schedule",
    "schedule_many",
    "tagged",
    "update",
]


def _spec(task: Any, given: Mapping[str, Any]) -> dict[str, Any]:
    """Defaults, overridden by what the caller gave (None means "default" for options)."""
    values = with_defaults(job_defaults(), {**given, "task": task})
    if values.get("name") is None and isinstance(task, str):
        values["name"] = generated_name(task, f"-{uuid.uuid4().hex[:12]}")
    return values


def _first_run(job: Job, now: datetime, rng: policies.Rng = random.random) -> None:
    """The job's first run: its schedule's first occurrence, under its calendar if it follows
    one (refused, field ``calendar``, when the calendar leaves it none within its bounds).
    What the calendar decided on the way waits on ``job._calendar_ranges`` for the ledger
    (``_record_calendar``), once the job has an id."""
    try:
        schedule = stored_schedule(job.__dict__)
        first = first_fire_time(schedule, now)
        if job.interval is not None and job.interval_anchor is None:
            job.interval_anchor = first  # the phase every later occurrence keeps
            schedule = stored_schedule(job.__dict__)
        first, ranges = policies.first_run(schedule, now, job_calendars.for_job(job))
    except ScheduleError as exc:  # an expiry already passed; a calendar that allows nothing
        raise ValidationError({exc.field: [exc.message]}) from exc
    job.scheduled_for = first
    job.next_run_at = first + policies.compute_jitter(job.jitter, rng)
    job._calendar_ranges = ranges  # type: ignore[attr-defined]


def _record_calendar(job: Job, decided_by: str) -> None:
    """The occurrences the job's calendar excluded or merged before its first run."""
    ranges = getattr(job, "_calendar_ranges", ())
    if ranges:
        ledger.record([(job.pk, r) for r in ranges], decided_by)
        job._calendar_ranges = ()  # type: ignore[attr-defined]


class ScheduleOptions(JobOptions, total=False):
    """What ``schedule`` takes beside the task: a job's options, who creates it, and why (for
    the audit trail)."""

    source: str
    reason: str


def schedule(
    task: str, *, unregistered_ok: bool = False, **options: Unpack[ScheduleOptions]
) -> Job:
    """Schedule a Celery task: once (``run_at``), on a ``cron`` expression, every
    ``interval``, or at a solar event (``solar_event`` with ``latitude`` and ``longitude``,
    Celery's ``solar``). A ``run_at`` in the past runs at the next tick.

    The options are ``JobOptions``'s: the schedule, ``name``, ``priority``, ``queue``,
    ``max_retries``, ``jitter``, ``lease_seconds``, ``retry_backoff``, ``retry_backoff_max``,
    ``when_retries_exhausted`` (``"dead"``, the default, or ``"next_occurrence"``: an
    occurrence whose retries are spent is recorded as failed and the job waits for its next
    one, as under Celery beat), ``misfire_policy``, ``misfire_grace``,
    ``misfire_max_catchup``, ``catchup_window`` (an occurrence missed longer ago than it is
    recorded as missed and not run; not shorter than ``misfire_grace``; None: no window),
    ``overlap`` (``"buffer_one"``, ``"skip"``, ``"buffer_all"`` with ``max_buffer``,
    ``"cancel_other"``, ``"terminate_other"``, or ``"allow_all"`` with ``max_concurrent``: each
    occurrence starts on time beside the runs in flight, at most that many of them, each run
    under a lease of its own: the occurrences that come due while a run is in flight),
    ``fixed_delay`` (an interval counted from the end of each run) and
    ``description`` (free text for people); Celery's semantics:
    ``dst_policy`` (a cron's DST rule: ``"gap_end+first"``, the default, ... or ``"celery"``),
    ``cron_day_or`` (False: both day fields must match, as Celery's crontab), ``not_before``
    and ``expires_at`` (django-celery-beat's start_time and expires), ``message_options``
    (apply_async's queue, routing_key, exchange, priority, expires, headers, time_limit,
    soft_time_limit). Any left out (or None, but for ``catchup_window``) takes its default.
    ``source`` records who created the job (``"api"``, ``"admin"``, ``"declared"``,
    ``"imported"``), ``reason`` why (the audit trail's record of its creation).

    ``unregistered_ok``: accept a task the Celery app of this process does not register (the
    allowlist still applies), for a web process that imports fewer task modules than the
    workers; a worker without the task fails its runs ("not registered on worker").
    """
    given: dict[str, Any] = dict(options)
    source = given.pop("source", JobSource.API)
    reason = given.pop("reason", None)
    args = given.get("args", [])
    given["args"] = list(args) if isinstance(args, list | tuple) else args
    values = validate_job(_spec(task, given), check_task=not unregistered_ok)
    if unregistered_ok:
        _allowed(values["task"])
    job = Job(**values, source=_source(source))
    with transaction.atomic():
        _first_run(job, db_now())
        try:
            with transaction.atomic():
                job.save(force_insert=True)
        except IntegrityError as exc:
            raise _integrity_error(exc, values["name"]) from exc
        audit.record(job, JobChange.Action.CREATED, reason=reason)
        _record_calendar(job, "schedule")
        notify_due(job.next_run_at)
    log.info("scheduled job %s (%s)", job.pk, job.name, extra={"action": "schedule", "job": job.pk})
    return job


def _allowed(task: str) -> None:
    """The allowlist alone (``unregistered_ok``): registration is not asked for."""
    problem = task_not_allowed(task)
    if problem:
        raise ValidationError({"task": [problem]})


def _source(source: str) -> str:
    problem = source_problem(source)
    if problem:
        raise ValidationError({"source": [problem]})
    return source


def _integrity_error(exc: IntegrityError, name: str) -> ValidationError:
    if "name" in str(exc) or "unique" in str(exc).lower():
        return ValidationError({"name": [name_taken(name)]})
    return ValidationError({"__all__": [f"the database refused the job: {exc}"]})


def schedule_many(specs: Iterable[Mapping[str, Any]], *, chunk_size: int = CHUNK_SIZE) -> int:
    """Schedule many jobs at once; returns how many were created.

    ``specs`` holds ``schedule()``'s keyword arguments plus ``task`` (and ``source``), as
    dicts: a list, or any iterable, such as a generator of millions, which is read chunk by
    chunk and never held whole. Every spec is checked by ``schedule()``'s rules, with its
    messages; one bad spec rejects the lot, errors keyed ``"<index>.<field>"`` (duplicate
    names too, within the input or against existing jobs), and nothing is written. Valid
    specs are written in one transaction (PostgreSQL: ``COPY``), beats woken once.

    It returns a count, not the jobs: a million ``Job`` objects would not fit the memory
    that streaming saves. Find jobs by the names you gave (unnamed ones are named
    ``"<task>-<call id>-<index>"``, the task cut short if the whole would pass 200 characters).
    """
    return bulk.schedule_many(specs, chunk_size=chunk_size)


def get(job: JobRef) -> Job:
    return Job.objects.get(pk=job.pk if isinstance(job, Job) else job)


def tagged(tag: str) -> QuerySet[Job]:
    """The jobs carrying ``tag`` (any case: tags are stored lowercased)."""
    return Job.objects.filter(get_store().tagged(str(tag).strip().lower()))


def _locked(job: JobRef) -> Job:
    return Job.objects.select_for_update().get(pk=job.pk if isinstance(job, Job) else job)


def update(
    job: JobRef,
    *,
    unregistered_ok: bool = False,
    reason: str | None = None,
    **changes: Unpack[JobChanges],
) -> Job:
    """Change a job's fields. A new schedule replaces the old one (give only the new kind)
    and recomputes ``next_run_at`` for a scheduled or paused job; a running job picks it up
    from its next occurrence. None gives an option the default ``schedule`` would (clears
    ``expires_at``, resets ``max_retries``), as ``schedule`` reads None; ``catchup_window``'s
    None removes the window. ``unregistered_ok`` as for ``schedule``; ``reason`` goes into
    the audit trail's record of the change."""
    unknown = set(changes) - set(JOB_FIELDS)
    if unknown:
        raise ValidationError({f: [f"unknown option {f!r}."] for f in sorted(unknown)})
    with transaction.atomic():
        current = _locked(job)
        return _update(current, dict(changes), unregistered_ok, JobChange.Action.UPDATED, reason)


def _update(
    current: Job, changes: dict[str, Any], unregistered_ok: bool, action: str, reason: str | None
) -> Job:
    """``update`` on a job locked by the caller's transaction, recorded as ``action``."""
    before = audit.snapshot(current)
    values = {f: getattr(current, f) for f in JOB_FIELDS}
    if any(f in changes for f in SCHEDULE_FIELDS):
        # a new schedule replaces the old, phase included (unless one is given)
        values.update(run_at=None, cron=None, interval=None, interval_anchor=None)
        values["solar_event"] = None
        if "solar_event" not in changes:
            values.update(latitude=None, longitude=None)
    given = with_defaults(job_defaults(), changes)
    values.update({f: given[f] for f in changes})
    cleaned = validate_job(values, check_task="task" in changes and not unregistered_ok)
    if unregistered_ok and "task" in changes:
        _allowed(cleaned["task"])
    for field, value in cleaned.items():
        setattr(current, field, value)
    rescheduled = any(
        f in changes
        for f in (
            *SCHEDULE_FIELDS,
            *SCHEDULE_DETAIL_FIELDS,
            *CALENDAR_FIELDS,
            "timezone",
            "interval_anchor",
        )
    )
    if rescheduled and current.state in (JobState.SCHEDULED, JobState.PAUSED, JobState.RUNNING):
        # A run in flight finishes under the old schedule; its completion sees that the
        # job's occurrence is no longer the one it ran, and keeps this one.
        _first_run(current, db_now())
        _record_calendar(current, "update")
    # The job's own fields only: its lease, token and dispatch counter are the lease's.
    written = [*cleaned, "interval_anchor", "scheduled_for", "next_run_at", "updated_at"]
    if "finish_by" in changes or "timezone" in changes:
        current.finish_by_at = None  # the deadline pass arms it again from the new time
        written.append("finish_by_at")
    try:
        with transaction.atomic():
            current.save(update_fields=list(dict.fromkeys(written)))
    except IntegrityError as exc:
        raise _integrity_error(exc, current.name) from exc
    change = audit.diff(before, audit.snapshot(current))
    if change or action != JobChange.Action.UPDATED:
        audit.record(current, action, change, reason=reason)
    if current.state == JobState.SCHEDULED:
        notify_due(current.next_run_at)
    return current


def restore(job: JobRef, change: JobChange | int, *, reason: str | None = None) -> Job:
    """Put the job's own fields back as they were just after ``change`` (one of its audit
    records, ``schedapp.audit.history``), through ``update``'s validation; recorded as a
    restore, whose own record can be restored in turn."""
    with transaction.atomic():
        current = _locked(job)
        record = change if isinstance(change, JobChange) else JobChange.objects.get(pk=change)
        if record.job_id != current.pk:
            raise ValidationError(
                {"change": [f"record {record.pk} is of job {record.job_id}, not {current.pk}."]}
            )
        values = audit.version_values(record, current)
        at = f"{record.at:%Y-%m-%d %H:%M:%S} UTC"
        why = reason if reason is not None else f"restored the version of {at}"
        return _update(
            current, changed_fields(current, values), False, JobChange.Action.RESTORED, why
        )


def _recorded(job: Job, action: str, before: str, reason: str | None) -> None:
    audit.record(job, action, {"state": [before, job.state]}, reason=reason)


def pause(job: JobRef, *, reason: str | None = None) -> Job:
    """Stop claiming the job. A run in flight finishes and its outcome is recorded; a
    recurring job stays paused (a one-off that succeeds is done; a job out of retries is dead,
    since resuming it would only repeat the failure)."""
    with transaction.atomic():
        current = _locked(job)
        if current.state not in (JobState.SCHEDULED, JobState.RUNNING):
            raise JobStateError(
                f"job {current.pk} is {current.state}; only scheduled or "
                "running jobs can be paused."
            )
        before = current.state
        current.state = JobState.PAUSED
        current.save(update_fields=["state", "updated_at"])
        _a_persons_pause(current)
        _recorded(current, JobChange.Action.PAUSED, before, reason)
    return current


def _a_persons_pause(job: Job) -> None:
    """A pause or resume of a declared job is a person's from now on: a release declaring it
    again no longer resumes it as one it paused itself (``declared``'s withdrawal)."""
    if job.source == JobSource.DECLARED:
        Declaration.objects.filter(name=job.name, withdrawn=True).update(withdrawn=False)


def _still_allowed(job: Job) -> None:
    """The allowlist may have changed since the job was written: refuse to set it going."""
    problem = task_not_allowed(job.task)
    if problem:
        raise ValidationError({"task": [problem]})


def resume(job: JobRef, *, reason: str | None = None) -> Job:
    """Claim the job again. Occurrences missed while paused follow its misfire policy."""
    with transaction.atomic():
        current = _locked(job)
        if current.state != JobState.PAUSED:
            raise JobStateError(f"job {current.pk} is {current.state}, not paused.")
        _still_allowed(current)
        _a_persons_pause(current)
        lease.resume_locked(current, db_now(), _first_run)
        _record_calendar(current, "resume")
        _recorded(current, JobChange.Action.RESUMED, JobState.PAUSED, reason)
    return current


def run_now(job: JobRef, *, reason: str | None = None) -> Job:
    """Run the job at the next tick, as an extra occurrence "now". A recurring job's schedule
    is left alone: a cron's next occurrence after now, an interval's next on its phase."""
    with transaction.atomic():
        current = _locked(job)
        if current.state not in (JobState.SCHEDULED, JobState.SUCCEEDED, JobState.DEAD):
            raise JobStateError(
                f"job {current.pk} is {current.state}; run now applies to "
                "scheduled, succeeded or dead jobs."
            )
        _still_allowed(current)
        before = current.state
        lease.run_now_locked(current, db_now())
        _recorded(current, JobChange.Action.RUN_NOW, before, reason)
    return current


def requeue(job: JobRef, *, reason: str | None = None) -> Job:
    """Bring a dead job back: its retry count resets and the failed occurrence runs again
    at the next tick."""
    with transaction.atomic():
        current = _locked(job)
        if current.state != JobState.DEAD:
            raise JobStateError(
                f"job {current.pk} is {current.state}; only dead jobs can be requeued."
            )
        _still_allowed(current)
        lease.requeue_locked(current, db_now())
        _recorded(current, JobChange.Action.REQUEUED, JobState.DEAD, reason)
    return current


def cancel(job: JobRef, *, terminate: bool = False, reason: str | None = None) -> Job:
    """Cancel the job: no further run happens.

    The fencing token moves on, so a run in flight can no longer change the job, and its
    Celery task is revoked: a message not yet started is discarded; one already executing
    runs to its end unless ``terminate=True``, which kills it with SIGTERM (for prefork
    workers; Celery cannot terminate thread or solo pool tasks). Its run is closed
    ``cancelled`` here and now, not when (or if) its worker reports: a worker that dies
    meanwhile must not leave it ``running``, and what the task reports changes nothing.
    """
    with transaction.atomic():
        current = _locked(job)
        if current.state == JobState.CANCELLED:
            return current
        if current.state == JobState.SUCCEEDED:
            raise JobStateError(f"job {current.pk} already ran to completion.")
        before = current.state
        task_ids = lease.cancel_locked(current, terminate=terminate)
        _recorded(current, JobChange.Action.CANCELLED, before, reason)
    if task_ids:
        celery_app().control.revoke(task_ids, terminate=terminate, signal="SIGTERM")
        log.info(
            "cancelled job %s: revoked %s",
            current.pk,
            task_ids,
            extra={"action": "cancel", "job": current.pk},
        )
    return current


def backfill(
    job: JobRef,
    start: datetime,
    end: datetime,
    *,
    overlap: str = backfills.DEFAULT_OVERLAP,
    max_per_second: float = 10.0,
    rerun: bool = False,
    reason: str | None = None,
) -> Backfill:
    """Run each occurrence of the job's schedule in [start, end] as if its time had just
    passed, shared by all beats and throttled to ``max_per_second`` runs (docs/semantics.md,
    "Backfill"). An occurrence that already has a succeeded run is not run again unless
    ``rerun``; one with a run in flight never is. Returns the backfill's row, which the beats
    advance and ``cancel_backfill`` stops. Recorded in the job's audit trail."""
    errors: dict[str, list[str]] = {}
    for name, value in (("start", start), ("end", end)):
        if not isinstance(value, datetime) or value.tzinfo is None:
            errors[name] = ["an aware datetime (with its time zone)."]
    if overlap not in backfills.BACKFILL_OVERLAP:
        errors["overlap"] = [f"one of {', '.join(backfills.BACKFILL_OVERLAP)}, not {overlap!r}."]
    if isinstance(max_per_second, bool) or not isinstance(max_per_second, int | float):
        errors["max_per_second"] = ["a number of runs per second."]
    elif not 0 < max_per_second <= 10_000:
        errors["max_per_second"] = ["more than 0 and at most 10,000 runs per second."]
    if errors:
        raise ValidationError(errors)
    if end <= start:
        raise ValidationError({"end": ["the end must be after the start."]})
    # Counted before the row is locked (a long range takes seconds, and a beat must be able
    # to claim the job meanwhile); counted again under the lock only if what the count
    # depends on changed in between.
    counted = _count_backfill(get(job), start, end)
    with transaction.atomic():
        current = _locked(job)
        if not current.is_recurring:
            raise ValidationError(
                {"job": ["a one-off job has no occurrences to backfill (it has no schedule)."]}
            )
        if current.state == JobState.CANCELLED:
            raise JobStateError(f"job {current.pk} is cancelled; it cannot be backfilled.")
        _still_allowed(current)
        now = db_now()
        if end > now:
            raise ValidationError(
                {"end": [f"in the future ({now.isoformat()} now): a backfill runs past times."]}
            )
        if counted is None or counted[0] != backfills.occurrence_basis(current):
            counted = _count_backfill(current, start, end)
        assert counted is not None
        if isinstance(counted[1], ValueError):
            raise ValidationError({"end": [str(counted[1])]}) from counted[1]
        total = counted[1]
        if total == 0:
            raise ValidationError({"start": ["the range holds no occurrence of the job."]})
        actor = audit.current()
        record = Backfill.objects.create(
            job=current,
            start=start,
            end=end,
            overlap=overlap,
            max_per_second=float(max_per_second),
            rerun=bool(rerun),
            total=total,
            refilled_at=now,
            created_by=actor.who[:200],
            reason=(actor.reason if reason is None else reason) or "",
        )
        audit.record(
            current,
            JobChange.Action.BACKFILL,
            {"backfill": [None, _backfill_summary(record)]},
            reason=reason,
        )
        backfills.wake()
    return record


def _count_backfill(
    job: Job, start: datetime, end: datetime
) -> tuple[object, int | ValueError] | None:
    """What the count of a backfill's range depends on, and the count (or why it cannot be
    backfilled); None for a job without occurrences (the caller refuses it, locked)."""
    if not job.is_recurring:
        return None
    basis = backfills.occurrence_basis(job)
    try:
        return basis, backfills.count_occurrences(job, start, end)[0]
    except ValueError as exc:
        return basis, exc


def _backfill_summary(record: Backfill) -> str:
    return (
        f"#{record.pk}: {record.total} occurrence(s) {record.start.isoformat()} to "
        f"{record.end.isoformat()}, overlap {record.overlap}, {record.max_per_second:g}/s"
        + (", rerun" if record.rerun else "")
    )


def cancel_backfill(record: Backfill | int, *, reason: str | None = None) -> Backfill:
    """Stop a backfill: nothing new is dispatched, the runs already dispatched go on to their
    end, and the occurrences not decided yet are recorded cancelled. Cancelling one that has
    ended changes nothing."""
    pk = record.pk if isinstance(record, Backfill) else record
    with transaction.atomic():
        current = Backfill.objects.select_for_update().get(pk=pk)
        if current.state != BackfillState.RUNNING:
            return current
        backfills.cancel_locked(current)
        job = Job.objects.filter(pk=current.job_id).first()
        if job is not None:
            audit.record(
                job,
                JobChange.Action.BACKFILL_CANCEL,
                {"backfill": [_backfill_summary(current), "cancelled"]},
                reason=reason,
            )
    return current


def duplicate(job: JobRef, *, name: str | None = None, reason: str | None = None) -> Job:
    """A new job with the same task, arguments, schedule and policy, created *paused*: a copy
    is usually made to be edited, and an active one would fire beside the original."""
    source = get(job)
    fields = {f: getattr(source, f) for f in JOB_FIELDS if f not in ("task", "name")}
    fields = {k: v for k, v in fields.items() if v not in (None, "") or k in NONE_IS_A_VALUE}
    if source.run_at is not None:
        fields["run_at"] = max(source.run_at, db_now())  # a one-off in the past runs now
    with transaction.atomic():
        copy_name = name or generated_name(source.name, f" (copy {uuid.uuid4().hex[:6]})")
        why = reason if reason is not None else f"a copy of job {source.pk} ({source.name})"
        copy = schedule(source.task, name=copy_name, reason=why, **fields)
        copy.state = JobState.PAUSED
        copy.save(update_fields=["state", "updated_at"])
    return copy


# --- calendars ------------------------------------------------------------------------------


def save_calendar(name: str, definition: Any, *, description: str = "") -> Calendar:
    """Create the calendar ``name``, or replace the definition of the one of that name.

    ``definition`` is one rule (``schedapp.calendars``): ``{"holidays": {"country": "DE",
    "subdivision": "BY"}}``, ``{"dates": [...]}``, ``{"weekdays": ["sat", "sun"]}``,
    ``{"time_range": {"start": "22:00", "end": "06:00"}}``, ``{"cron": "..."}``,
    ``{"union": [...]}``, ``{"difference": [base, ...]}`` or ``{"calendar": "other"}``.
    Bad input raises ValidationError keyed by field (the definition's by its path, such as
    ``definition.union[1].holidays.country``); a cycle of references, or a calendar that
    excludes every day of the next two years, is refused; nothing is written then.
    """
    with transaction.atomic():
        serialise_calendar_saves()
        existing = Calendar.objects.select_for_update().filter(name=name).first()
        calendar = write_calendar(existing, name, definition, description)
    log.info("saved calendar %s", name, extra={"action": "save_calendar"})
    return calendar


def write_calendar(
    existing: Calendar | None, name: str, definition: Any, description: str
) -> Calendar:
    """``save_calendar``'s checks and writes for ``existing`` (None: a new calendar), in the
    caller's transaction after ``serialise_calendar_saves``: the admin's edit goes through
    them too, and may rename the calendar it edits."""
    today = db_now().date()
    checked = validate_calendar(name, definition, description, instance=existing, today=today)
    before = None if existing is None else existing.definition
    calendar = existing or Calendar()
    for field, value in checked.values.items():
        setattr(calendar, field, value)
    try:
        with transaction.atomic():
            if existing is None:
                calendar.save(force_insert=True)
            else:
                calendar.save(update_fields=[*checked.values, "updated_at"])
    except IntegrityError as exc:
        raise ValidationError({"name": [f"a calendar named {name!r} already exists."]}) from exc
    store_references(calendar, checked.references)
    if existing is not None and calendar.definition != before:
        calendar_edits.after_edit(calendar.pk, calendar.name)
    return calendar


def import_calendar(
    name: str, path: str | os.PathLike[str], *, timezone: str | None = None, description: str = ""
) -> Calendar:
    """Save the iCalendar file at ``path`` (RFC 5545, read from disk: nothing is fetched) as
    the calendar ``name``, whose one rule excludes its events: ``{"ical": {"text": ...,
    "timezone": ...}}`` (``timezone``: the wall clock its timed events are placed on; default
    the file's X-WR-TIMEZONE, else UTC). A file that cannot be read, larger than
    ``calendars.MAX_ICAL_CHARS``, or not UTF-8 is refused on field ``file``; a document the
    calendar rules refuse, on its definition path; nothing is written then."""
    try:
        size = os.path.getsize(path)
        if size > calendars.MAX_ICAL_CHARS * 4:  # UTF-8: at most four bytes a character
            raise ValidationError({"file": [f"{size} bytes; too large for a calendar."]})
        with open(path, encoding="utf-8-sig", newline="") as handle:
            text = handle.read(calendars.MAX_ICAL_CHARS + 1)
    except UnicodeDecodeError as exc:
        raise ValidationError({"file": [f"{path} is not UTF-8 text: {exc}."]}) from exc
    except OSError as exc:
        raise ValidationError({"file": [f"cannot read {path}: {exc.strerror or exc}."]}) from exc
    body: dict[str, Any] = {"text": text}
    if timezone:
        body["timezone"] = timezone
    return save_calendar(name, {"ical": body}, description=description)


def store_references(calendar: Calendar, names: Iterable[str]) -> None:
    """The calendars ``calendar``'s definition names, as rows that keep them (PROTECT)."""
    targets = list(Calendar.objects.filter(name__in=list(names)))
    CalendarReference.objects.filter(calendar=calendar).exclude(target__in=targets).delete()
    for target in targets:
        CalendarReference.objects.get_or_create(calendar=calendar, target=target)


def serialise_calendar_saves() -> None:
    """One calendar save at a time (the store's transaction lock: an advisory lock on
    PostgreSQL): two saves that each name the other would otherwise both pass the cycle
    check. Saves are rare."""
    get_store().lock(CALENDAR_LOCK)


CALENDAR_LOCK = 0x5C4E_CA1E  # schedapp's calendar saves


PREVIEW_MAX = 100


def preview_calendar(
    calendar: str | Calendar,
    *,
    cron: str | None = None,
    interval: float | timedelta | None = None,
    timezone: str = "UTC",
    mode: str = calendars.DEFAULT_MODE,
    roll: str = calendars.DEFAULT_ROLL,
    count: int = 10,
    after: datetime | None = None,
) -> list[dict[str, Any]]:
    """The next ``count`` runs of a ``cron`` or ``interval`` schedule under a stored calendar
    (``mode`` exclude / only, ``roll`` skip / next_business_day / previous_business_day /
    defer), after ``after`` (default: the database's now). Each run: ``at`` (in ``timezone``,
    with its UTC offset), ``occurrence`` (the schedule's own time it stands for), ``roll``
    (what moved it, or None), ``dst`` (what a cron's DST rule did to it: run at a gap's end,
    one offset of a repeated hour; None otherwise) and ``skipped`` (the occurrences passed
    before it: ``first``, ``last``, ``count``, ``reason`` excluded / merged). Bad input raises
    ValidationError keyed by field; a calendar that leaves the schedule no run gives an empty
    list. A job's own preview under its calendar is the admin's (``preview_for``)."""
    errors: dict[str, list[str]] = {}
    found = calendar if isinstance(calendar, Calendar) else None
    if found is None:
        found = (
            Calendar.objects.filter(name=calendar).first() if isinstance(calendar, str) else None
        )
        if found is None:
            errors["calendar"] = [f"no calendar is named {calendar!r}."]
    parsed: dict[str, Any] = {}
    for field, read in (
        ("timezone", lambda: schedules.parse_timezone(timezone)),
        ("mode", lambda: calendars.parse_mode(mode, "mode")),
        ("roll", lambda: calendars.parse_roll(roll, "roll")),
    ):
        try:
            parsed[field] = read()
        except ScheduleError as exc:
            errors.setdefault(exc.field, []).append(exc.message)
    schedule: schedules.Schedule | None = None
    try:
        if (cron is None) == (interval is None):
            raise ScheduleError("cron", "give a cron expression or an interval, one of them.")
        if cron is not None:
            schedule = schedules.parse_cron(cron, parsed.get("timezone", "UTC"))
        else:
            schedule = schedules.parse_interval(interval)
    except ScheduleError as exc:
        errors.setdefault(exc.field, []).append(exc.message)
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= PREVIEW_MAX:
        errors["count"] = [f"must be a whole number from 1 to {PREVIEW_MAX}."]
    if errors or found is None or schedule is None:
        raise ValidationError(errors)
    try:
        parsed_calendar = calendars.parse_calendar(
            found.name, found.definition, stored_calendar_definition
        )
    except ScheduleError as exc:
        raise ValidationError({"calendar": [f"{found.name!r} cannot be read: {exc}"]}) from exc
    zone = schedules.get_zone(parsed["timezone"])
    attached = calendars.Attached(parsed_calendar, parsed["mode"], parsed["roll"])
    start = after if after is not None else db_now()
    return [
        {
            "at": fire.at.astimezone(zone),
            "utc_offset": fire.at.astimezone(zone).strftime("%z"),
            "occurrence": fire.occurrence.astimezone(zone),
            "roll": fire.roll,
            "dst": display.dst_note(schedule, fire.at) or None,
            "skipped": [
                {"first": s.first, "last": s.last, "count": s.count, "reason": s.reason}
                for s in fire.skipped
            ],
        }
        for fire in calendars.fires(schedule, attached, start, zone, count)
    ]


def stored_calendar_definition(name: str) -> object | None:
    """A stored calendar's definition by name (how references resolve), or None."""
    return Calendar.objects.filter(name=name).values_list("definition", flat=True).first()
