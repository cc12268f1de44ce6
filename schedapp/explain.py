"""What happened to a job's occurrences: the ledger read back as answers.

An occurrence that ran is its runs (``JobRun`` rows with its ``scheduled_for``, one per
attempt); one that did not is an ``Occurrence`` record (a range with an exact count) saying
why. ``explain(job, at)`` answers "what happened at 08:00?", ``timeline`` lists a job's
occurrences newest first, ``not_run`` is the fleet's view of what did not run lately. The
admin's timeline and fleet pages and ``manage.py schedapp_explain`` show these, nothing more.
Every read of the records goes through ``ledger.first_records``: of an occurrence recorded
twice (across two partitions of the ledger, PostgreSQL), the first decision is the one told
and counted (``not_run`` looks for the first within its window only).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from django.db.models import Count, Sum

from .conf import get_settings
from .db import db_now
from .display import WAITING, run_status
from .ledger import first_records
from .models import (
    ACTIVE_RUN_STATUSES,
    BackfillFate,
    BackfillRange,
    Breach,
    Fate,
    Job,
    JobRun,
    JobState,
    Occurrence,
    RunStatus,
)
from .schedules import Schedule, fire_times, next_fire_time, recent_fire_times

RAN = "ran"  # an entry's fate when the occurrence was dispatched (its attempts say how it went)
BREACH = "breach"  # an entry holding only deadline breaches (no run or record at its time)
_TICK = timedelta(microseconds=1)


@dataclass(frozen=True)
class Attempt:
    """One run of an occurrence: a dispatch, and what became of it."""

    run_id: int
    attempt: int
    token: int
    status: str
    dispatched_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    claimed_by: str
    worker: str
    error: str
    stale: bool
    kind: str | None = None  # as the claim recorded it (None: claimed before 0027)
    retry_at: datetime | None = None  # a retry of an allow_all occurrence not sent yet

    @property
    def shown_status(self) -> str:
        return run_status(self.status, self.retry_at)


@dataclass(frozen=True)
class BreachNote:
    """A deadline breach recorded with an occurrence (``schedapp.deadlines``)."""

    kind: str
    opened_at: datetime
    cleared_at: datetime | None
    detail: str
    cleared_detail: str

    @property
    def text(self) -> str:
        said = f"{self.kind.replace('_', ' ')}: {self.detail}"
        if self.cleared_at is not None:
            said += f"; recovered ({self.cleared_detail})"
        return said


@dataclass(frozen=True)
class Entry:
    """One line of a job's timeline: an occurrence that ran (``fate`` ``ran``, with its
    attempts), or occurrences that did not (``first`` to ``last``, ``count`` of them)."""

    first: datetime
    last: datetime
    count: int
    fate: str
    detail: str = ""
    decided_by: str = ""
    recorded_at: datetime | None = None
    attempts: tuple[Attempt, ...] = ()
    # "scheduled", or "manual" for a run at a time that is no occurrence of the schedule (a
    # run now): read off the schedule, not recorded, until runs carry their kind.
    kind: str = "scheduled"
    # Deadline breaches recorded with this occurrence (late, overrunning, ...): on an entry
    # of fate BREACH when no run or record of the occurrence is in the ledger (a pending one,
    # a finish_by instant, a dead job's occurrence).
    breaches: tuple[BreachNote, ...] = ()

    @property
    def outcome(self) -> str:
        """The last attempt's status (succeeded, failed, running, ...); '' when none ran."""
        return self.attempts[-1].shown_status if self.attempts else ""

    @property
    def lag(self) -> timedelta | None:
        """From the nominal time to the first dispatch (jitter and backoff included)."""
        return self.attempts[0].dispatched_at - self.first if self.attempts else None

    @property
    def started_lag(self) -> timedelta | None:
        """From the nominal time to the first start on a worker."""
        started = [a.started_at for a in self.attempts if a.started_at is not None]
        return started[0] - self.first if started else None


@dataclass(frozen=True)
class Answer:
    """What happened at ``at``: ``entry`` if the ledger holds it, and ``text`` for people."""

    job_id: int
    at: datetime
    nominal: bool  # whether ``at`` is an occurrence of the job's schedule
    text: str
    entry: Entry | None = None
    before: datetime | None = None  # the occurrences around ``at`` (the nearest ones)
    after: datetime | None = None


def job_named(job: Job | int | str) -> Job:
    """A job by itself, its id, or its name (what a person types: "42" or "nightly-report")."""
    if isinstance(job, Job):
        return job
    if isinstance(job, int) or (isinstance(job, str) and job.isdigit()):
        found = Job.objects.filter(pk=int(job)).first()
        if found is not None:
            return found
    found = Job.objects.filter(name=str(job)).first()
    if found is None:
        raise Job.DoesNotExist(f"no job with id or name {job!r}")
    return found


def aware(at: datetime, zone: str) -> datetime:
    """``at`` as an aware UTC time; a naive one is read in ``zone`` (the job's own)."""
    if at.tzinfo is None:
        at = at.replace(tzinfo=ZoneInfo(zone))
    return at.astimezone(UTC)


def _attempts(runs: Iterable[JobRun]) -> dict[datetime, list[Attempt]]:
    grouped: dict[datetime, list[Attempt]] = {}
    for r in runs:
        grouped.setdefault(r.scheduled_for, []).append(
            Attempt(
                r.pk,
                r.attempt,
                r.token,
                r.status,
                r.dispatched_at,
                r.started_at,
                r.finished_at,
                r.claimed_by,
                r.worker,
                r.error,
                r.stale,
                r.kind,
                r.retry_at,
            )
        )
    for attempts in grouped.values():
        attempts.sort(key=lambda a: a.token)
    return grouped


def _entry(o: Occurrence, zone: str) -> Entry:
    detail = _in_zone(o.detail, zone)
    return Entry(o.scheduled_for, o.last, o.count, o.fate, detail, o.decided_by, o.recorded_at)


# An occurrence a record's detail names, as the deciding process wrote it (UTC, ISO 8601).
_UTC_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?[+-]\d\d:\d\d")


def _in_zone(text: str, zone: str) -> str:
    """A detail's times in the job's zone, as every other time of its timeline: the detail is
    written once, in UTC, by whichever process decided, and read in the zone of its reader."""
    if not text:
        return text
    try:
        tz = ZoneInfo(zone)
    except Exception:  # an unreadable zone: leave the times as written
        return text

    def local(match: re.Match[str]) -> str:
        at = datetime.fromisoformat(match.group(0)).astimezone(tz)
        return at.isoformat(sep=" ", timespec="seconds" if not at.microsecond else "auto")

    return _UTC_TIME.sub(local, text)


_RUN_FIELDS = (
    "id",
    "attempt",
    "token",
    "status",
    "scheduled_for",
    "dispatched_at",
    "started_at",
    "finished_at",
    "claimed_by",
    "worker",
    "error",
    "stale",
    "kind",
    "retry_at",
)


def timeline(
    job: Job | int | str,
    since: datetime | None = None,
    until: datetime | None = None,
    fates: Sequence[str] = (),
    limit: int = 100,
) -> list[Entry]:
    """A job's occurrences, newest first: those that ran, with their attempts, and the
    records of those that did not. ``fates`` keeps only those (``ran`` for the ones that
    ran). Reads at most ``limit`` occurrences of each kind through the job's indexes."""
    job = job_named(job)
    entries: list[Entry] = []
    if not fates or RAN in fates:
        runs = JobRun.objects.filter(job=job).only(*_RUN_FIELDS).order_by("-id")
        if since is not None:
            runs = runs.filter(scheduled_for__gte=since)
        if until is not None:
            runs = runs.filter(scheduled_for__lte=until)
        # the newest runs by id: a few attempts per occurrence at most, so 4x the limit
        grouped = _attempts(runs[: limit * 4])
        entries += [
            Entry(at, at, 1, RAN, attempts=tuple(a), kind=_occurrence_kind(job, at, a))
            for at, a in grouped.items()
        ]
    other = [f for f in fates if f != RAN]
    if not fates or other:
        records = first_records(Occurrence.objects.filter(job=job)).order_by("-scheduled_for")
        if other:
            records = records.filter(fate__in=other)
        if since is not None:
            records = records.filter(last__gte=since)
        if until is not None:
            records = records.filter(scheduled_for__lte=until)
        listed = [_entry(o, job.timezone) for o in records[:limit]]
        # An occurrence whose dispatches never started and that a record holds is that
        # record's (one fate a line): its dispatches were deliveries, not its fate.
        entries = [
            e
            for e in entries
            if not (
                e.attempts
                and never_started(e.attempts)
                and any(r.first <= e.first <= r.last for r in listed)
            )
        ]
        entries += listed
        entries += _backfill_entries(job, other, since, until, limit)
    if not fates or BREACH in fates:
        entries = _with_breaches(job, entries, since, until, limit, only=bool(fates))
    entries.sort(key=lambda e: e.first, reverse=True)
    return entries[:limit]


def _backfill_entries(
    job: Job, fates: Sequence[str], since: datetime | None, until: datetime | None, limit: int
) -> list[Entry]:
    """The occurrences a backfill of the job decided not to run, as ranges with their count
    (those it ran are its runs, kind backfill)."""
    ranges = BackfillRange.objects.filter(backfill__job=job).exclude(fate=BackfillFate.DISPATCHED)
    if fates:
        ranges = ranges.filter(fate__in=fates)
    if since is not None:
        ranges = ranges.filter(last__gte=since)
    if until is not None:
        ranges = ranges.filter(first__lte=until)
    return [
        Entry(
            r.first,
            r.last,
            r.count,
            r.fate,
            f"backfill #{r.backfill_id}: {BackfillFate(r.fate).label}",
            f"backfill #{r.backfill_id}",
            kind="backfill",
        )
        for r in ranges.order_by("-first")[:limit]
    ]


def backfill_note(job: Job, at: datetime) -> str:
    """What the job's backfills decided for ``at`` when they did not run it ('' if none)."""
    found = (
        BackfillRange.objects.filter(backfill__job=job, first__lte=at, last__gte=at)
        .exclude(fate=BackfillFate.DISPATCHED)
        .order_by("backfill_id")
    )
    return " ".join(
        f"Backfill #{r.backfill_id} did not run it: {BackfillFate(r.fate).label.split(': ')[-1]}."
        for r in found[:5]
    )


def _with_breaches(
    job: Job,
    entries: list[Entry],
    since: datetime | None,
    until: datetime | None,
    limit: int,
    only: bool,
) -> list[Entry]:
    """The entries with the job's breaches attached to the occurrence each concerns; those
    with no entry of their own become BREACH entries."""
    found = Breach.objects.filter(job=job).order_by("-scheduled_for", "-id")
    if since is not None:
        found = found.filter(scheduled_for__gte=since)
    if until is not None:
        found = found.filter(scheduled_for__lte=until)
    notes: dict[datetime, list[BreachNote]] = {}
    for b in found[:limit]:
        note = BreachNote(b.kind, b.opened_at, b.cleared_at, b.detail, b.cleared_detail)
        notes.setdefault(b.scheduled_for, []).insert(0, note)
    out: list[Entry] = []
    for entry in entries:
        attached = [n for at, ns in notes.items() if entry.first <= at <= entry.last for n in ns]
        for at in [at for at in notes if entry.first <= at <= entry.last]:
            del notes[at]
        out.append(replace(entry, breaches=tuple(attached)) if attached else entry)
    if only:
        out = []
    for at, ns in notes.items():
        text = "; ".join(n.text for n in ns)
        out.append(
            Entry(at, at, 1, BREACH, text, "deadline pass", ns[0].opened_at, breaches=tuple(ns))
        )
    return out


def explain(job: Job | int | str, at: datetime) -> Answer:
    """What happened at ``at`` (a naive time is in the job's zone): it ran (its attempts),
    it did not and why, it is pending, it is not an occurrence of the schedule (and the
    nearest ones are), or the ledger has no record (before it began, or pruned)."""
    job = job_named(job)
    at = aware(at, job.timezone)
    runs = JobRun.objects.filter(job=job, scheduled_for=at).only(*_RUN_FIELDS)
    attempts = _attempts(runs).get(at)
    record = (
        first_records(Occurrence.objects.filter(job=job, scheduled_for__lte=at, last__gte=at))
        .order_by("-scheduled_for")
        .first()
    )
    if attempts and not (record is not None and never_started(attempts)):
        kind = _occurrence_kind(job, at, attempts)
        entry = Entry(at, at, 1, RAN, attempts=tuple(attempts), kind=kind)
        return Answer(job.pk, at, True, _ran_text(job, entry) + _moved_here(job, at), entry)
    nominal, before, after = _around(job, at)
    note = backfill_note(job, at) if nominal else ""
    if record is not None and (nominal or attempts):
        entry = _entry(record, job.timezone)
        text = _not_run_text(job, at, entry)
        if attempts:
            text += f" It had been dispatched {len(attempts)} time(s) before; none started."
        text += f" {note}" if note else ""
        return Answer(job.pk, at, True, text, entry, before, after)
    if not nominal:
        near = ", ".join(_local(job, t) for t in (before, after) if t is not None)
        text = f"{_local(job, at)} is not an occurrence of job {job.name!r}'s schedule"
        text += f"; the nearest: {near}." if near else "."
        return Answer(job.pk, at, False, text, None, before, after)
    text = _pending_or_unknown(job, at) + (f" {note}" if note else "")
    return Answer(job.pk, at, True, text, None, before, after)


def never_started(attempts: Sequence[Attempt]) -> bool:
    """Whether every dispatch of an occurrence ended without starting (refused at the door,
    its message lost or revoked): deliveries, not its fate, when a record says why it did
    not run (a resume or the misfire policy decided it after them)."""
    return all(a.started_at is None and a.status not in ACTIVE_RUN_STATUSES for a in attempts)


def _is_occurrence(schedule: Schedule, at: datetime) -> bool:
    return recent_fire_times(schedule, at, at, 1) == [at]


def _previous(schedule: Schedule, at: datetime) -> datetime | None:
    """The occurrence before ``at``, looked for over the year before it (a bounded walk)."""
    earlier = recent_fire_times(schedule, at - _TICK, at - timedelta(days=400), 1)
    return earlier[-1] if earlier else None


def _occurrence_kind(job: Job, at: datetime, attempts: Sequence[Attempt]) -> str:
    """Manual, scheduled or backfill (every run of it a backfill's), as recorded on the runs;
    derived from the schedule for runs claimed before runs recorded it."""
    recorded = {a.kind for a in attempts if a.kind and a.kind != "retry"}
    if recorded:
        if "manual" in recorded:
            return "manual"
        return "backfill" if recorded == {"backfill"} else "scheduled"
    return _kind(job, at)


def _kind(job: Job, at: datetime) -> str:
    try:
        nominal = _is_occurrence(job.schedule, at)
    except Exception:  # a row the beat quarantined may hold any schedule
        return "scheduled"
    return "scheduled" if nominal else "manual"


def run_kind(
    job: Job | int | str, scheduled_for: datetime, attempt: int, recorded: str | None = None
) -> str:
    """The kind the claim ``recorded`` on the run; for a run claimed before runs recorded
    it, ``retry`` past the first attempt, ``manual`` for a time that is no occurrence of the
    schedule (a run now), else ``scheduled``."""
    if recorded:
        return recorded
    return "retry" if attempt > 1 else _kind(job_named(job), scheduled_for)


def data_interval(job: Job | int | str, scheduled_for: datetime) -> tuple[datetime, datetime]:
    """The interval an occurrence covers, as Airflow's data interval: from the occurrence
    before it (or itself, for the first or a one-off) to it. A manual run's starts at the
    occurrence before the time it was asked for."""
    job = job_named(job)
    try:
        earlier = _previous(job.schedule, scheduled_for)
    except Exception:  # a row the beat quarantined may hold any schedule
        earlier = None
    return (earlier or scheduled_for), scheduled_for


def _around(job: Job, at: datetime) -> tuple[bool, datetime | None, datetime | None]:
    """Whether ``at`` is an occurrence, and the occurrences just before and after it."""
    try:
        schedule = job.schedule
        return _is_occurrence(schedule, at), _previous(schedule, at), next_fire_time(schedule, at)
    except Exception:  # a row the beat quarantined may hold any schedule
        return False, None, None


def _local(job: Job, t: datetime | None) -> str:
    if t is None:
        return "-"
    try:
        local = t.astimezone(ZoneInfo(job.timezone))
    except Exception:  # an unreadable zone: say it in UTC
        local = t.astimezone(UTC)
    return local.isoformat(sep=" ", timespec="seconds")


def _ms(delta: timedelta | None) -> str:
    if delta is None:
        return "-"
    seconds = delta.total_seconds()
    return f"{seconds * 1000:.0f} ms" if abs(seconds) < 10 else f"{seconds:.1f} s"


def _ran_text(job: Job, entry: Entry) -> str:
    parts = []
    for a in entry.attempts:
        if a.shown_status == WAITING and a.retry_at is not None:
            parts.append(
                f"attempt {a.attempt} (token {a.token}) waiting for its retry, due "
                f"{_local(job, a.retry_at)}"
            )
            continue
        line = f"attempt {a.attempt} (token {a.token}) dispatched by {a.claimed_by or '?'} "
        line += f"{_ms(a.dispatched_at - entry.first)} after its time"
        if a.started_at is not None:
            line += f", started on {a.worker or '?'} {_ms(a.started_at - entry.first)} after"
        line += f": {a.status}"
        if a.stale:
            line += " (stale: its lease had been lost)"
        if a.error:
            line += f" ({a.error.splitlines()[0][:200]})"
        parts.append(line)
    manual = {
        "manual": " (a manual run: no occurrence of the schedule)",
        "backfill": " (in a backfill)",
    }.get(entry.kind, "")
    return f"{_local(job, entry.first)} ran{manual}: " + "; ".join(parts) + "."


def _moved_here(job: Job, at: datetime) -> str:
    """Where a calendar's roll moved the run at ``at`` from: the occurrences recorded merged
    "moved to" it (``policies.calendar_ranges``), so a moved run names what it stands for."""
    moved = first_records(
        Occurrence.objects.filter(
            job=job,
            fate=Fate.MERGED,
            detail__startswith=f"moved to {at.astimezone(UTC).isoformat()} ",
        )
    ).order_by("scheduled_for")
    said = [
        f"{_local(job, o.scheduled_for)} ({o.detail.split(' by ', 1)[-1].split(';')[0]})"
        for o in moved[:10]
    ]
    return f" It was moved here from {', '.join(said)}." if said else ""


def _not_run_text(job: Job, at: datetime, entry: Entry) -> str:
    label = Fate(entry.fate).label if entry.fate in Fate.values else entry.fate
    text = f"{_local(job, at)} did not run: {label}"
    if entry.detail:
        text += f" ({entry.detail})"
    if entry.count > 1:
        text += (
            f"; one of {entry.count} occurrences from {_local(job, entry.first)} to "
            f"{_local(job, entry.last)}"
        )
    when = f" at {_local(job, entry.recorded_at)}" if entry.recorded_at else ""
    return text + f"; decided by {entry.decided_by or '?'}{when}."


def _pending_or_unknown(job: Job, at: datetime) -> str:
    when = _local(job, at)
    current = job.scheduled_for
    if current is not None and at == current:
        if job.state == JobState.SCHEDULED:
            return f"{when} has not run yet: it is due at {_local(job, job.next_run_at)}."
        if job.state == JobState.PAUSED:
            return f"{when} has not run yet: the job is paused."
        if job.state == JobState.RUNNING:
            return f"{when} is being dispatched (claimed by {job.claimed_by or '?'})."
    if (
        current is not None
        and at > current
        and job.state in (JobState.SCHEDULED, JobState.PAUSED, JobState.RUNNING)
    ):
        return f"{when} has not come yet: the job is at {_local(job, current)}."
    if at < job.created_at:
        return f"{when} is before the job existed (created {_local(job, job.created_at)})."
    retention = get_settings().RUN_RETENTION
    return (
        f"no record of {when}: the job was {job.state} then, or it is older than the history "
        f"kept (SCHEDAPP_RUN_RETENTION, {retention}), or from before the ledger began."
    )


@dataclass(frozen=True)
class FleetView:
    """What did not run in the fleet since ``since``: occurrences by fate, runs by outcome."""

    since: datetime
    occurrences_by_fate: dict[str, int] = field(default_factory=dict)
    runs_by_status: dict[str, int] = field(default_factory=dict)
    records: list[tuple[int, str, Entry]] = field(default_factory=list)  # (job id, name, entry)
    zones: dict[int, str] = field(default_factory=dict)  # each listed job's time zone


NOT_SUCCEEDED = (RunStatus.FAILED, RunStatus.LOST, RunStatus.SKIPPED, RunStatus.CANCELLED)


def not_run(since: datetime | None = None, limit: int = 200) -> FleetView:
    """The fleet's occurrences that did not run, recorded since ``since`` (default: the last
    day), counted by fate, and the runs that ended otherwise than succeeded, by status. Reads
    the records' time index and the runs' dispatch index: never the whole history. An
    occurrence recorded twice in the window counts once, as first decided; one whose first
    record is older than the window counts as its second (none is looked for there)."""
    since = since or db_now() - timedelta(days=1)
    # The first of a decision recorded twice among the window's records: looking further
    # back for each would read the whole ledger (ledger.first_records).
    records = first_records(Occurrence.objects.filter(recorded_at__gte=since), since)
    by_fate = {
        row["fate"]: row["n"] or 0
        for row in records.values("fate").annotate(n=Sum("count")).order_by()
    }
    runs = JobRun.objects.filter(dispatched_at__gte=since, status__in=NOT_SUCCEEDED)
    by_status = {
        row["status"]: row["n"] for row in runs.values("status").annotate(n=Count("id")).order_by()
    }
    latest = records.select_related("job").order_by("-recorded_at", "-id")[:limit]
    listed = [(o.job_id, o.job.name, _entry(o, o.job.timezone)) for o in latest]
    zones = {o.job_id: o.job.timezone for o in latest}
    return FleetView(since, by_fate, by_status, listed, zones)


def unaccounted(job: Job | int | str, start: datetime, end: datetime) -> list[datetime]:
    """Occurrences of the job in [start, end] with neither a run nor a record: what the
    ledger promises never exists for a time the job was scheduled. For tests and audits: it
    lists occurrences one by one, so give it a bounded range."""
    job = job_named(job)
    occurrences = list(fire_times(job.schedule, start - _TICK, end, limit=100_000))
    ran = set(
        JobRun.objects.filter(job=job, scheduled_for__gte=start, scheduled_for__lte=end)
        .values_list("scheduled_for", flat=True)
        .distinct()
    )
    ranges = list(
        first_records(
            Occurrence.objects.filter(job=job, last__gte=start, scheduled_for__lte=end)
        ).values_list("scheduled_for", "last")
    )
    return [
        t
        for t in occurrences
        if t not in ran and not any(first <= t <= last for first, last in ranges)
    ]


__all__ = [
    "RAN",
    "Answer",
    "Attempt",
    "Entry",
    "FleetView",
    "aware",
    "data_interval",
    "explain",
    "not_run",
    "run_kind",
    "timeline",
    "unaccounted",
]
