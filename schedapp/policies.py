"""Policy decisions, pure: backoff, retry-or-dead, misfires, and a job's state after a run.

Time is always passed in (the database's ``now()`` as read by the caller) and randomness comes
from an injectable ``rng``, so these rules are tested exhaustively without a clock.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, time, timedelta
from zoneinfo import ZoneInfo

from . import calendars
from .exceptions import ScheduleError
from .schedules import (
    Interval,
    Once,
    Schedule,
    count_fire_times,
    first_fire_time,
    next_fire_time,
    no_occurrence_error,
    recent_fire_times,
)

# Claim priority: higher is claimed first. A bounded range (Celery and Oban use 0-9) keeps a
# claim's cost independent of how many distinct priorities exist: the claim probes each level.
MIN_PRIORITY = 0
MAX_PRIORITY = 9

# A message a worker has not started by the end of its lease (it waits in the queue behind
# busy workers, or the broker lost it) is sent again, and the new copy waits twice as long,
# up to 2**MAX_WAIT_DOUBLINGS leases: a backlog longer than a lease adds a copy per doubling,
# not per lease, and the newest copy does not expire behind the older ones.
MAX_WAIT_DOUBLINGS = 4


def dispatch_wait(lease_seconds: int, unstarted_dispatches: int) -> timedelta:
    """How long a dispatched run may wait for a worker's door before it is sent again (its
    lease at claim). Once admitted, a run holds an ordinary lease."""
    return timedelta(seconds=lease_seconds * 2 ** min(unstarted_dispatches, MAX_WAIT_DOUBLINGS))


RUN_ONCE = "run_once"
SKIP = "skip"
RUN_ALL = "run_all"
RUN_RECENT = "run_recent"
MISFIRE_POLICIES = (RUN_ONCE, SKIP, RUN_ALL, RUN_RECENT)

# A run_recent job's grace is how old its latest missed occurrence may be and still run (Celery's
# beat_cron_starting_deadline), not how late a claim must be to count as a misfire: found later
# than this (or its grace, if shorter), its missed occurrences are folded into the latest, as
# Celery sends a crontab once however many runs it missed. Under a second late, a claim is the
# ordinary one (a cron's occurrences are a second apart at the least).
RUN_RECENT_LATE_AFTER = timedelta(seconds=1)

Rng = Callable[[], float]

# What a job does when an occurrence's retries are spent (its ``when_retries_exhausted``):
# go ``dead`` (a dead letter for a person, ``api.requeue``), or record the failure and go on
# with the next occurrence, as Celery beat does (it sends the next one whatever the last did).
DEAD = "dead"
NEXT_OCCURRENCE = "next_occurrence"
WHEN_RETRIES_EXHAUSTED = (DEAD, NEXT_OCCURRENCE)

# What becomes of the occurrences that come due while a run of the job is in flight (its
# ``overlap``), decided when the run ends, with Temporal's meanings: ``buffer_one`` (the
# default, and schedapp's behaviour before overlap policies existed): the next occurrence
# waits for the run, and if it is late beyond its grace by then, the misfire policy decides;
# ``skip``: every occurrence that came due meanwhile is skipped, the job waits for the first
# one after the run; ``buffer_all``: each of them runs, one after another, the oldest first,
# at most ``max_buffer`` of them (the most recent; older ones are dropped);
# ``cancel_other``: the next occurrence coming due cancels the run in flight (its Celery task
# is revoked: a message not yet started is discarded, one executing runs on, Celery cannot
# interrupt it), and the latest occurrence due runs when that run has ended or its lease
# lapsed; ``terminate_other``: the same, the task revoked with terminate (SIGTERM, prefork);
# ``allow_all``: every occurrence starts when it comes due, whether or not earlier runs have
# ended, each run under a lease of its own (``JobRun.lease_expires_at``), at most
# ``max_concurrent`` of them in flight (an occurrence waits for a slot, then the misfire policy
# applies as to any late one). The job moves on to its next occurrence at the claim.
OVERLAP_SKIP = "skip"
BUFFER_ONE = "buffer_one"
BUFFER_ALL = "buffer_all"
CANCEL_OTHER = "cancel_other"
TERMINATE_OTHER = "terminate_other"
ALLOW_ALL = "allow_all"
OVERLAP_POLICIES = (OVERLAP_SKIP, BUFFER_ONE, BUFFER_ALL, CANCEL_OTHER, TERMINATE_OTHER, ALLOW_ALL)
SUPERSEDING = (CANCEL_OTHER, TERMINATE_OTHER)  # the policies that act while a run is in flight


def misfire_after(policy: str, grace: timedelta) -> timedelta:
    """How late a claimed occurrence may be before its job's misfire policy decides it: the
    grace, but at most ``RUN_RECENT_LATE_AFTER`` for ``run_recent``, whose grace is a deadline.
    The claim statement (sql/queries.sql, claim_due_jobs) says the same in SQL."""
    return min(grace, RUN_RECENT_LATE_AFTER) if policy == RUN_RECENT else grace


def past_start_deadline(
    skip_late: bool, start_deadline: timedelta | None, occurrence: datetime, now: datetime
) -> bool:
    """Whether the claim finds an occurrence of a job that skips late ones past its start
    deadline (counted from its nominal time, jitter included in the wait): its misfire plan
    then records it as ``late`` instead of running it. The claim statement (sql/queries.sql,
    claim_rows) says the same in SQL."""
    return bool(skip_late) and start_deadline is not None and now - occurrence > start_deadline


def next_finish_by(finish_by: time, zone: str, after: datetime) -> tuple[datetime, datetime]:
    """(the first ``finish_by`` wall-clock instant in ``zone`` strictly after ``after``, the
    start of its local day): the deadline a job's ``finish_by`` sets for that day's
    occurrences. A wall time the clocks skip is read at the old offset (02:30 in a spring gap
    is 03:30), one they repeat at its first instant."""
    tz = ZoneInfo(zone)
    day = after.astimezone(tz).date()
    for _ in range(3):
        wall = datetime.combine(day, finish_by.replace(tzinfo=None)).replace(tzinfo=tz)
        at = wall.astimezone(UTC)
        if at > after:
            start = datetime.combine(day, time(0)).replace(tzinfo=tz).astimezone(UTC)
            return at, start
        day += timedelta(days=1)
    raise AssertionError("a wall-clock time comes once a day")  # pragma: no cover


# The longest schedapp waits before a retry: the API's bound of a backoff (validation), and
# the bound of any delay it adds to the database's now(), so a value written behind the API's
# back (a backoff of a million years) cannot push a retry past what a timestamp holds: the
# completion's write ("timestamp out of range") would fail for ever, and the reaper's with it.
MAX_DELAY = timedelta(days=365)


def bounded_delay(delay: timedelta) -> timedelta:
    """``delay`` within ``[0, MAX_DELAY]``: a wait is never negative nor longer than that."""
    return min(max(delay, timedelta(0)), MAX_DELAY)


def compute_backoff(retry_count: int, base: timedelta, cap: timedelta) -> timedelta:
    """``min(base * 2**retry_count, cap)``: the wait before retry number ``retry_count + 1``,
    within ``[0, MAX_DELAY]`` whatever the stored base and cap say."""
    base, cap = bounded_delay(base), bounded_delay(cap)
    if retry_count >= 64:  # 2**64 seconds overflows timedelta long before the cap matters
        return cap if base else min(base, cap)  # a zero base stays zero
    try:
        return min(base * (2**retry_count), cap)
    except OverflowError:
        return cap


def compute_jitter(jitter_seconds: int, rng: Rng = random.random) -> timedelta:
    """A uniform offset in ``[0, jitter_seconds]``, so same-instant jobs spread out."""
    if jitter_seconds <= 0:
        return timedelta(0)
    return timedelta(seconds=rng() * jitter_seconds)


# Why an occurrence did not run: the fates the ledger records (``schedapp.models.Occurrence``).
# An occurrence that ran is its runs (``JobRun`` rows with its ``scheduled_for``), not one of
# these.
MISFIRED = "misfired"  # found late beyond its grace: the misfire policy ran another, or none
OUTSIDE_WINDOW = "outside_window"  # older than the job's catch-up window when found
PAUSED = "paused"  # passed while the job was paused (then the misfire policy decided)
CANCELLED = "cancelled"  # the job was cancelled with this occurrence pending
QUARANTINED = "quarantined"  # the job's row could not be followed; set aside for a person
OVERLAPPED = "overlapped"  # came due while a run was in flight (skip; a later one ran instead)
BUFFER_FULL = "buffer_full"  # came due while a run was in flight, beyond max_buffer
EXCLUDED = "excluded"  # the job's calendar excludes it (roll skip, or no business day fits)
MERGED = "merged"  # a calendar roll moved a run onto or over it: that run covers it
LATE = "late"  # past its start deadline when the claim found it, and the job skips late ones
FATES = (
    MISFIRED,
    OUTSIDE_WINDOW,
    PAUSED,
    CANCELLED,
    QUARANTINED,
    OVERLAPPED,
    BUFFER_FULL,
    EXCLUDED,
    MERGED,
    LATE,
)

_TICK = timedelta(microseconds=1)  # the finest step between two times a schedule can tell


@dataclass(frozen=True)
class MissedRange:
    """Consecutive occurrences that will never run and why: ``first`` to ``last`` (both
    occurrences, both included), ``count`` of them exactly. A range, not a row per
    occurrence, so a job back after a year of minutes costs one record."""

    first: datetime
    last: datetime
    count: int
    fate: str
    detail: str


@dataclass(frozen=True)
class Catchup:
    """What to do with a recurring job found late beyond its grace time."""

    run_for: datetime | None  # the occurrence to run now, or None to run nothing now
    next_due: datetime | None  # with run_for None: the occurrence to wait for instead
    missed: int  # occurrences that will never run (an exact count)
    # The same occurrences as the ledger records them: oldest first, counts adding to missed.
    ranges: tuple[MissedRange, ...] = field(default=(), compare=False)


def _missed(
    schedule: Schedule, due: datetime, before: datetime, count: int, fate: str, detail: str
) -> tuple[MissedRange, ...]:
    """The ``count`` occurrences from ``due`` to just before ``before``, as one range. Costs
    two bounded lookups (the first and the last), never a walk over the range."""
    if count <= 0:
        return ()
    first = recent_fire_times(schedule, due, due, 1)  # ``due`` itself, when an occurrence
    start = first[0] if first else next_fire_time(schedule, due)
    last = recent_fire_times(schedule, before - _TICK, due, 1)
    assert start is not None and last, "a counted range has a first and a last occurrence"
    return (MissedRange(start, last[-1], count, fate, detail),)


# --- a job's calendar ------------------------------------------------------------------------

# The most runs under a calendar that one decision walks (a misfire plan in the claim, a
# resume): each costs at most calendars.MAX_WINDOWS exclusion windows and SEARCH_DAYS day
# steps. Past it, the rest of the missed occurrences are counted without the calendar (one
# arithmetic range), so nothing in the claim grows with how long a job was away.
CALENDAR_WALK = 64


@dataclass(frozen=True)
class OnCalendar:
    """A job's calendar as the rules use it: the calendar with its mode and roll, and the zone
    its wall times are read in (the job's)."""

    attached: calendars.Attached
    tz: ZoneInfo

    @property
    def detail(self) -> str:
        a = self.attached
        return f"calendar {a.calendar.name!r} ({a.mode}, roll {a.roll})"


def calendar_ranges(fire: calendars.Fire, cal: OnCalendar) -> tuple[MissedRange, ...]:
    """What the calendar did on the way to ``fire``, as the ledger records it: the occurrences
    it excluded or merged, and the occurrence it moved (merged into the moved run)."""
    out = [
        MissedRange(
            s.first, s.last, s.count, EXCLUDED if s.reason == "excluded" else MERGED, cal.detail
        )
        for s in fire.skipped
    ]
    if fire.moved:
        out.append(
            MissedRange(
                fire.occurrence,
                fire.occurrence,
                1,
                MERGED,
                f"moved to {fire.at.isoformat()} by {cal.detail}; the run there stands for it",
            )
        )
    return tuple(out)


def next_run(
    schedule: Schedule, after: datetime, cal: OnCalendar | None
) -> tuple[datetime | None, tuple[MissedRange, ...]]:
    """The job's next run strictly after ``after`` and what its calendar decided on the way
    (ledger ranges, ``excluded`` / ``merged``). Every path that sets a job's next run asks
    this, never ``next_fire_time`` alone. None: the schedule has ended (its expires); a
    calendar that leaves no run within its bounds raises ScheduleError (field ``calendar``),
    which the beat turns into a quarantine."""
    if cal is None or isinstance(schedule, Once):
        return next_fire_time(schedule, after), ()
    fire = calendars.next_fire(schedule, cal.attached, after, cal.tz)
    if fire is None:
        if next_fire_time(schedule, after) is None:
            return None, ()
        raise ScheduleError(
            "calendar",
            f"{cal.detail} leaves {schedule!r} no run after {after.isoformat()} within its "
            f"bounds ({calendars.MAX_WINDOWS} exclusions, {calendars.SEARCH_DAYS} days).",
        )
    return fire.at, calendar_ranges(fire, cal)


def first_run(
    schedule: Schedule, now: datetime, cal: OnCalendar | None
) -> tuple[datetime, tuple[MissedRange, ...]]:
    """A new (or rescheduled, or resumed) job's first run under its calendar: the calendar's
    first allowed run at or after the schedule's first occurrence."""
    first = first_fire_time(schedule, now)
    if cal is None or isinstance(schedule, Once):
        return first, ()
    calendars.check_allows_something(
        cal.attached.excluded, now.astimezone(cal.tz).date(), "calendar"
    )
    at, ranges = next_run(schedule, first - _TICK, cal)
    if at is None:
        raise ScheduleError("expires_at", "leaves no run the calendar allows.")
    return at, ranges


def _walk_calendar(
    schedule: Schedule, first: datetime, now: datetime, cal: OnCalendar
) -> tuple[list[datetime], list[MissedRange], datetime, datetime | None, tuple[MissedRange, ...]]:
    """The calendar's runs from ``first`` (one) up to ``now``, at most ``CALENDAR_WALK`` of
    them, with what it excluded or merged between them: (runs, those ranges, the last run, the
    run the walk stopped at and what the calendar did on the way to it). A stop at or before
    ``now`` means the bound was reached; one after it, the next run after now."""
    runs, ranges, cursor = [first], [], first
    while True:
        at, found = next_run(schedule, cursor, cal)
        if at is None or at > now or len(runs) >= CALENDAR_WALK:
            return runs, ranges, cursor, at, found
        ranges.extend(found)
        runs.append(at)
        cursor = at


def _calendar_misfire(
    schedule: Schedule,
    due: datetime,
    now: datetime,
    policy: str,
    max_catchup: int,
    grace: timedelta,
    window: tuple[timedelta | None, str, str],
    fate: str,
    cal: OnCalendar,
) -> Catchup:
    """``plan_misfire`` under a calendar: the missed runs are the calendar's (``due`` is one),
    walked at most ``CALENDAR_WALK`` of them; the occurrences the calendar excluded or merged
    on the way are recorded as such, and only the runs it allowed count as missed. ``window``
    is (the limit, the fate and the words of what is older): the catch-up window, or the start
    deadline of a job that skips late occurrences, whichever is shorter.

    Past the bound, the occurrences up to the latest before ``now`` are counted without the
    calendar (one range, arithmetic); that latest one runs if the calendar allows it at its own
    time and the policy runs one (``run_all`` then runs just it), else the job waits."""
    runs, ranges, cursor, at, found = _walk_calendar(schedule, due, now, cal)
    why = "passed while the job was paused; " if fate == PAUSED else ""
    detail = f"{why}missed under {cal.detail} (misfire policy {policy})"
    out = list(ranges)
    limit, limit_fate, limit_text = window  # a catch-up window, or a start deadline (late)
    if limit is not None:
        outside = [r for r in runs if now - r > limit]
        runs = runs[len(outside) :]
        out.extend(MissedRange(r, r, 1, limit_fate, limit_text) for r in outside)
    else:
        outside = []
    run_for: datetime | None = None
    if at is not None and at <= now:  # past the bound: count the rest without the calendar
        out.extend(MissedRange(r, r, 1, fate, detail) for r in runs)
        missed = len(outside) + len(runs)
        recent = recent_fire_times(schedule, now, cursor + _TICK, 1)
        latest = recent[-1] if recent else cursor  # none: a run rolled back before now
        wall = latest.astimezone(cal.tz)
        runs_one = policy in (RUN_ONCE, RUN_ALL) or (policy == RUN_RECENT and now - latest <= grace)
        if recent and runs_one and not calendars.excludes(cal.attached.excluded, wall):
            run_for = latest
        end = latest - _TICK if run_for is not None else latest
        count = count_fire_times(schedule, cursor + _TICK, end) if recent else 0
        if count > 0:
            first = next_fire_time(schedule, cursor)
            last = recent_fire_times(schedule, end, cursor + _TICK, 1)[-1]
            assert first is not None
            text = f"missed; past {CALENDAR_WALK} runs of {cal.detail}, counted without it"
            out.append(MissedRange(first, last, count, fate, text))
        missed += count
        if run_for is None:
            at, found = next_run(schedule, latest, cal)
            while at is not None and at <= now:  # a previous-business-day run: pass it
                at, found = next_run(schedule, at, cal)
            out.extend(found)
        out.sort(key=lambda r: r.first)
        return Catchup(run_for, None if run_for else at, missed, tuple(out))
    out.extend(found)  # what the calendar did on the way to the next run after now
    if runs:
        if policy == RUN_RECENT:
            run_for = runs[-1] if now - runs[-1] <= grace else None
        elif policy == RUN_ONCE:
            run_for = runs[-1]
        elif policy == RUN_ALL:
            run_for = runs[max(0, len(runs) - max(1, max_catchup))]
    missed_runs = runs if run_for is None else runs[: runs.index(run_for)]
    out.extend(MissedRange(r, r, 1, fate, detail) for r in missed_runs)
    out.sort(key=lambda r: r.first)
    missed = len(outside) + len(missed_runs)
    if run_for is not None:
        # The calendar's ranges past run_for are decided again when it ends: keep them out.
        out = [r for r in out if r.first <= run_for]
        return Catchup(run_for, None, missed, tuple(out))
    return Catchup(None, at, missed, tuple(out))


def plan_misfire(
    schedule: Schedule,
    due: datetime,
    now: datetime,
    policy: str,
    max_catchup: int,
    grace: timedelta = timedelta(0),
    window: timedelta | None = None,
    fate: str = MISFIRED,
    calendar: OnCalendar | None = None,
    start_deadline: timedelta | None = None,
) -> Catchup:
    """Decide a misfire: ``due`` is an occurrence that should have run a while before ``now``.

    * ``skip``: run nothing; wait for the first occurrence after now. All missed ones count.
    * ``run_once``: run once, for the latest missed occurrence, then continue from the next
      occurrence after it (in the future). The older missed ones count as missed.
    * ``run_all``: run every missed occurrence, oldest first, but at most ``max_catchup`` of
      them: the most recent ones. Older ones beyond that bound count as missed.
    * ``run_recent``: as ``run_once`` if the latest missed occurrence is at most ``grace``
      before now, else as ``skip``: Celery's crontab under ``beat_cron_starting_deadline``.

    A catch-up ``window`` comes first: occurrences older than ``now - window`` are missed
    (``outside_window``) whatever the policy, which then decides among the rest. A
    ``start_deadline`` (a job that skips late occurrences) acts as a window whose misses are
    ``late``; the shorter of the two applies. ``fate`` is
    what the rest are recorded as (``paused`` when a resume decides them).

    It runs inside the beat's claim transaction, so its cost must not grow with the outage:
    the missed count is arithmetic (``count_fire_times``) and only the occurrences it keeps are
    listed (``recent_fire_times``, at most ``max_catchup`` of them).
    """
    if isinstance(schedule, Once):
        return Catchup(run_for=due, next_due=None, missed=0)  # one-off jobs always run
    limit, why, said = window, OUTSIDE_WINDOW, f"older than its catch-up window ({window})"
    if start_deadline is not None and (window is None or start_deadline < window):
        limit, why = start_deadline, LATE
        said = f"not started within its start deadline ({start_deadline}); skip_late"
    if calendar is not None:
        return _calendar_misfire(
            schedule, due, now, policy, max_catchup, grace, (limit, why, said), fate, calendar
        )
    outside: tuple[MissedRange, ...] = ()
    if limit is not None and now - due > limit:  # (never now - limit: it may overflow)
        cutoff = now - limit
        old = count_fire_times(schedule, due, cutoff - _TICK)
        outside = _missed(schedule, due, cutoff, old, why, said)
        if outside:
            due_next = next_fire_time(schedule, outside[0].last)
            if due_next is None or due_next > now:  # nothing left inside the window
                return Catchup(None, due_next, old, outside)
            due = due_next
    plan = _plan_policy(schedule, due, now, policy, max_catchup, grace, fate)
    if not outside:
        return plan
    missed = plan.missed + outside[0].count
    return Catchup(plan.run_for, plan.next_due, missed, outside + plan.ranges)


def _plan_policy(
    schedule: Schedule,
    due: datetime,
    now: datetime,
    policy: str,
    max_catchup: int,
    grace: timedelta,
    fate: str,
) -> Catchup:
    total = count_fire_times(schedule, due, now)
    why = "passed while the job was paused; " if fate == PAUSED else ""
    skipped = f"{why}misfire policy skip runs none"
    if policy == RUN_RECENT:
        recent = recent_fire_times(schedule, now, due, 1)
        latest = recent[-1] if recent else due  # ``due`` itself: an extra one (run now)
        if now - latest <= grace:
            missed = max(0, total - 1) if recent else 0
            detail = f"{why}folded into {latest.isoformat()} (misfire policy run_recent)"
            ranges = _missed(schedule, due, latest, missed, fate, detail)
            return Catchup(latest, None, missed, ranges)
        policy = SKIP  # too old to run
        skipped = f"{why}older than its misfire grace ({grace}) when found (misfire policy "
        skipped += "run_recent)"
    if policy == SKIP:
        # Continue from the latest missed occurrence, not from now, so an interval keeps its
        # phase: next_fire_time(interval, now) would be now + every, which is no occurrence.
        latest = recent_fire_times(schedule, now, due, 1)
        nxt = next_fire_time(schedule, latest[-1] if latest else now)
        detail = skipped
        end = latest[-1] + _TICK if latest else now
        return Catchup(None, nxt, total, _missed(schedule, due, end, total, fate, detail))
    keep = 1 if policy == RUN_ONCE else max(1, max_catchup)
    recent = recent_fire_times(schedule, now, due, keep)
    if not recent:  # ``due`` itself is after now: nothing was missed
        return Catchup(run_for=due, next_due=None, missed=0)
    missed = max(0, total - len(recent))
    detail = (
        f"{why}folded into {recent[0].isoformat()} (misfire policy run_once)"
        if policy == RUN_ONCE
        else f"{why}beyond misfire_max_catchup ({max_catchup}) (misfire policy run_all)"
    )
    return Catchup(recent[0], None, missed, _missed(schedule, due, recent[0], missed, fate, detail))


def waiting_after(
    plan: Catchup, occurrence: datetime, jitter: int, rng: Rng = random.random
) -> tuple[str, datetime, datetime | None]:
    """A job whose misfire plan runs nothing now: its state, occurrence and due time. It waits
    for the plan's next occurrence (plus jitter) or, with none left (its expires_at passed
    while it was away), it is done, as after a last run (``plan_after_success``)."""
    if plan.next_due is None:
        return "succeeded", occurrence, None
    return "scheduled", plan.next_due, plan.next_due + compute_jitter(jitter, rng)


@dataclass(frozen=True)
class JobFacts:
    """The part of a job the after-run rules read."""

    schedule: Schedule
    state: str
    scheduled_for: datetime
    retry_count: int
    max_retries: int
    retry_backoff: timedelta
    retry_backoff_max: timedelta
    jitter: int
    # When the job's due time, and the occurrence the finished run was for. If that differs
    # from ``scheduled_for``, the job was given a new schedule while the run was in flight:
    # ``scheduled_for``/``next_run_at`` already hold the new schedule's first occurrence.
    next_run_at: datetime | None = None
    ran_for: datetime | None = None
    when_retries_exhausted: str = DEAD
    # The database's now() as the run ends (None: the overlap policy and fixed delay are not
    # applied, as before they existed), and what the job says of overlaps and intervals.
    now: datetime | None = None
    overlap: str = BUFFER_ONE
    max_buffer: int = 1
    fixed_delay: bool = False
    # The run ending was cancelled by a later occurrence (cancel_other, terminate_other): its
    # outcome, whatever it is, moves the job on to the latest occurrence due, never a retry.
    superseded: bool = False
    # The job's calendar (None: none): its next run is the calendar's (``next_run``).
    calendar: OnCalendar | None = None

    @property
    def rescheduled(self) -> bool:
        return self.ran_for is not None and self.ran_for != self.scheduled_for


@dataclass(frozen=True)
class AfterRun:
    """The job's new values. ``next_run_at`` is either absolute or a delay from DB ``now()``."""

    state: str
    scheduled_for: datetime | None
    next_run_at: datetime | None
    delay: timedelta | None  # when set, next_run_at = now() + delay, computed by the database
    retry_count: int
    dead: bool = False
    # An occurrence whose retries were all spent and failed (the job's failed_occurrences
    # counts them), whether the job then went dead or on to its next occurrence.
    failed_occurrence: bool = False
    # Occurrences the overlap policy decided not to run, for the ledger.
    ranges: tuple[MissedRange, ...] = ()
    # A fixed-delay interval's new phase: the end of the run (None: unchanged).
    interval_anchor: datetime | None = None


# A run's outcome moves a job only from "running"; an operator's pause or cancel made while the
# run was in flight stands, and the run's outcome is still recorded.
def _keep_operator_state(current: str, new: str) -> str:
    return current if current in ("paused", "cancelled") else new


def _done(current: str) -> str:
    """A job with no occurrence left after its run: done, unless a person cancelled it."""
    return "cancelled" if current == "cancelled" else "succeeded"


def plan_after_success(job: JobFacts, rng: Rng = random.random) -> AfterRun:
    """One-off jobs are done; recurring ones wait for the occurrence after the one that ran.
    A job rescheduled while the run was in flight waits for its new schedule's first one."""
    if job.rescheduled:
        return AfterRun(
            _keep_operator_state(job.state, "scheduled"),
            job.scheduled_for,
            job.next_run_at,
            None,
            0,
        )
    if job.fixed_delay and job.now is not None and job.calendar is not None:
        if isinstance(job.schedule, Interval):  # counted from now: the old phase is not asked
            return _after_fixed_delay_on_calendar(job, job.calendar, job.now, rng)
    nxt, ranges = next_run(job.schedule, job.scheduled_for, job.calendar)
    if nxt is None and not isinstance(job.schedule, Once):
        # Only its ``expires`` ends a recurring job; a schedule with no occurrence left
        # otherwise is one the beat cannot follow (the caller quarantines the job), not done.
        error = no_occurrence_error(job.schedule, job.scheduled_for)
        if error is not None:
            raise error
    if isinstance(job.schedule, Once) or nxt is None:
        return AfterRun(_done(job.state), job.scheduled_for, None, None, 0)
    fixed_delay = job.fixed_delay and isinstance(job.schedule, Interval)
    if job.now is not None and job.calendar is not None:
        if job.overlap in (OVERLAP_SKIP, BUFFER_ALL, *SUPERSEDING) and nxt <= job.now:
            return _after_overlap_on_calendar(job, job.calendar, nxt, ranges, job.now, rng)
    elif job.now is not None and end_decides(job.overlap, fixed_delay, nxt <= job.now):
        return _after_overlap(job, nxt, job.now, rng)
    return AfterRun(
        _keep_operator_state(job.state, "scheduled"),
        nxt,
        nxt + compute_jitter(job.jitter, rng),
        None,
        0,
        ranges=ranges,
    )


def plan_at_start(job: JobFacts, rng: Rng = random.random) -> AfterRun:
    """An ``allow_all`` job as its run is claimed: it moves on at once to the occurrence after
    the one that starts, as after a success under ``buffer_one`` (the same schedule math), so
    the next occurrence starts on time whether or not this run has ended."""
    return plan_after_success(replace(job, overlap=BUFFER_ONE, now=None, ran_for=None), rng=rng)


def end_decides(
    overlap: str, fixed_delay: bool, next_passed: bool, has_calendar: bool = False
) -> bool:
    """Whether the time a run ends decides what its job does next: a fixed-delay interval
    counts from it, and an overlap policy other than ``buffer_one`` decides the occurrences
    that came due before it (``next_passed``: the next occurrence is not after the database's
    now()); a job following a calendar, or whose overlap is ``allow_all``, is never the
    common case. ``plan_after_success`` computes those; the worker's one-call success
    (``schedapp_succeed_run_v5``, held to this by a differential test) leaves them."""
    return (
        has_calendar
        or overlap == ALLOW_ALL
        or fixed_delay
        or (overlap != BUFFER_ONE and next_passed)
    )


def _after_overlap(job: JobFacts, nxt: datetime, now: datetime, rng: Rng) -> AfterRun:
    """A recurring job's next occurrence ``nxt`` came due while its run was in flight (before
    ``now``, as the run ends) and its ``overlap`` is not ``buffer_one``, or its interval counts
    from the end of each run (``fixed_delay``): those decide. Costs bounded lookups
    (``count_fire_times``, at most ``max_buffer`` listed), never a walk over the overlap."""
    state = _keep_operator_state(job.state, "scheduled")
    schedule = job.schedule
    if job.fixed_delay and isinstance(schedule, Interval):
        # The interval's phase moves to the end of this run: the next one is a whole
        # interval after it, and no occurrence came due meanwhile.
        after = next_fire_time(replace(schedule, anchor=now), now)
        if after is None:  # its expires_at comes first: done, as after a last run
            return AfterRun(_done(job.state), job.scheduled_for, None, None, 0)
        jittered = after + compute_jitter(job.jitter, rng)
        return AfterRun(state, after, jittered, None, 0, interval_anchor=now)
    total = count_fire_times(schedule, nxt, now)
    ran = job.ran_for or job.scheduled_for
    why = f"came due while the run for {ran.isoformat()} was in flight"
    if job.overlap == OVERLAP_SKIP:
        latest = recent_fire_times(schedule, now, nxt, 1)
        end = latest[-1] if latest else nxt
        after = next_fire_time(schedule, end)
        ranges = _missed(
            schedule, nxt, end + _TICK, total, OVERLAPPED, f"{why} (overlap policy skip)"
        )
        if after is None:  # its expires_at passed meanwhile: done, as after a last run
            return AfterRun(_done(job.state), job.scheduled_for, None, None, 0, ranges=ranges)
        jittered = after + compute_jitter(job.jitter, rng)
        return AfterRun(state, after, jittered, None, 0, ranges=ranges)
    if job.overlap in SUPERSEDING:
        # The latest occurrence due runs now; those before it were cancelled with the run.
        latest = recent_fire_times(schedule, now, nxt, 1)
        run_for = latest[-1] if latest else nxt
        detail = f"{why}, a later one ran instead (overlap policy {job.overlap})"
        ranges = _missed(schedule, nxt, run_for, total - 1, OVERLAPPED, detail)
        return AfterRun(state, run_for, None, timedelta(0), 0, ranges=ranges)
    # buffer_all: the buffered occurrences run one after another from now, oldest first.
    keep = recent_fire_times(schedule, now, nxt, max(1, job.max_buffer))
    first = keep[0] if keep else nxt
    dropped = max(0, total - len(keep))
    detail = f"{why}, beyond max_buffer ({job.max_buffer}) (overlap policy buffer_all)"
    ranges = _missed(schedule, nxt, first, dropped, BUFFER_FULL, detail)
    return AfterRun(state, first, None, timedelta(0), 0, ranges=ranges)


def _after_overlap_on_calendar(
    job: JobFacts,
    cal: OnCalendar,
    nxt: datetime,
    ranges: tuple[MissedRange, ...],
    now: datetime,
    rng: Rng,
) -> AfterRun:
    """``_after_overlap`` for a job under a calendar: the runs that came due during the run
    are the calendar's, walked from ``nxt`` (at most ``CALENDAR_WALK``); the overlap policy
    decides among them as it does among the schedule's own occurrences. Past the bound, the
    occurrences up to now are counted without the calendar and the job waits for its next
    run after now, whatever the policy."""
    state = _keep_operator_state(job.state, "scheduled")
    schedule = job.schedule
    ran = job.ran_for or job.scheduled_for
    why = f"came due while the run for {ran.isoformat()} was in flight, under {cal.detail}"
    runs, walked, cursor, at, found = _walk_calendar(schedule, nxt, now, cal)
    out = [*ranges, *walked]
    fate = BUFFER_FULL if job.overlap == BUFFER_ALL else OVERLAPPED
    if at is not None and at <= now:  # past the bound: count the rest, wait for the next
        out.extend(
            MissedRange(r, r, 1, fate, f"{why} (overlap policy {job.overlap})") for r in runs
        )
        recent = recent_fire_times(schedule, now, cursor + _TICK, 1)
        latest = recent[-1] if recent else cursor  # none: a run rolled back before now
        count = count_fire_times(schedule, cursor + _TICK, latest) if recent else 0
        first = next_fire_time(schedule, cursor)
        if count > 0 and first is not None:
            detail = f"{why}; past {CALENDAR_WALK} runs, counted without the calendar"
            out.append(MissedRange(first, latest, count, fate, detail))
        at, found = next_run(schedule, latest, cal)
        while at is not None and at <= now:  # a previous-business-day run: pass it
            at, found = next_run(schedule, at, cal)
        runs = []
    if job.overlap == OVERLAP_SKIP or not runs:
        detail = f"{why} (overlap policy {job.overlap})"
        out.extend(MissedRange(r, r, 1, fate, detail) for r in runs)
        out.extend(found)
        if at is None:  # its expires_at passed meanwhile: done, as after a last run
            return AfterRun(_done(job.state), job.scheduled_for, None, None, 0, ranges=tuple(out))
        jittered = at + compute_jitter(job.jitter, rng)
        return AfterRun(state, at, jittered, None, 0, ranges=tuple(out))
    if job.overlap in SUPERSEDING:
        run_for = runs[-1]  # the latest due runs now; those before it were cancelled with it
        detail = f"{why}, a later one ran instead (overlap policy {job.overlap})"
        out.extend(MissedRange(r, r, 1, OVERLAPPED, detail) for r in runs[:-1])
    else:  # buffer_all: the most recent max_buffer of them run one after another from now
        keep = runs[-max(1, job.max_buffer) :]
        run_for = keep[0]
        detail = f"{why}, beyond max_buffer ({job.max_buffer}) (overlap policy buffer_all)"
        out.extend(MissedRange(r, r, 1, BUFFER_FULL, detail) for r in runs[: -len(keep)])
    out = [r for r in out if r.first <= run_for]  # what comes after is decided again later
    return AfterRun(state, run_for, None, timedelta(0), 0, ranges=tuple(out))


def _after_fixed_delay_on_calendar(
    job: JobFacts, cal: OnCalendar, now: datetime, rng: Rng
) -> AfterRun:
    """A fixed-delay interval under a calendar, as its run ends at ``now``: the interval's
    phase moves to the end of the run (as without a calendar), and the calendar places the
    run a whole delay later as it places any interval's occurrence (``next_run``): there when
    allowed, else moved by the roll or skipped to the next multiple of the delay it allows,
    each decision in the ledger. The phase is the run's end, which validation cannot know, so
    a delay in step with an exclusion could skip for months: past ``CALENDAR_WALK`` multiples
    the job runs at the first instant the calendar allows after the first (as ``defer``),
    recorded, instead."""
    state = _keep_operator_state(job.state, "scheduled")
    schedule = job.schedule
    assert isinstance(schedule, Interval)
    anchored = replace(schedule, anchor=now)
    if next_fire_time(anchored, now) is None:  # its expires_at comes first: done
        return AfterRun(_done(job.state), job.scheduled_for, None, None, 0)
    bound = now + schedule.every * CALENDAR_WALK + _TICK
    if anchored.expires is not None and anchored.expires < bound:
        bound = anchored.expires
    try:
        at, ranges = next_run(replace(anchored, expires=bound), now, cal)
    except ScheduleError:
        at = None
    if at is None:
        at, ranges = _fixed_delay_deferred(anchored, now, cal)
        if anchored.expires is not None and at > anchored.expires:
            return AfterRun(_done(job.state), job.scheduled_for, None, None, 0, ranges=ranges)
    jittered = at + compute_jitter(job.jitter, rng)
    return AfterRun(state, at, jittered, None, 0, ranges=ranges, interval_anchor=now)


def _fixed_delay_deferred(
    anchored: Interval, now: datetime, cal: OnCalendar
) -> tuple[datetime, tuple[MissedRange, ...]]:
    """The first allowed instant at or after the delay's first multiple after ``now``, and the
    multiples passed on the way (``excluded``). ScheduleError (the beat quarantines the job)
    only when the calendar allows nothing within its bounds."""
    first = next_fire_time(anchored, now)
    assert first is not None, "a schedule whose expires ended it has no run to defer"
    wall = first.astimezone(cal.tz).replace(tzinfo=None)
    end = calendars.allowed_at_or_after(cal.attached.excluded, wall)
    if end is None:
        raise ScheduleError(
            "calendar", f"{cal.detail} allows nothing after {first.isoformat()} within its bounds."
        )
    at = calendars.to_instant(end, cal.tz, floor=first)
    count = count_fire_times(replace(anchored, expires=None), first, at - _TICK)
    detail = (
        f"{cal.detail}: none of the next {CALENDAR_WALK} multiples of the fixed delay allowed, "
        f"run at the first allowed instant, {at.isoformat()}"
    )
    return at, _missed(replace(anchored, expires=None), first, at, count, EXCLUDED, detail)


def plan_after_expiry(job: JobFacts, rng: Rng = random.random) -> AfterRun:
    """A message Celery discarded past its ``expires``, or a run whose task raised Celery's
    ``Ignore``: the occurrence is dropped, as under Celery beat, and the job goes on with the
    next one, no attempt counted. A one-off job has no next one and ends ``cancelled``."""
    plan = plan_after_success(job, rng=rng)
    if isinstance(job.schedule, Once) and plan.state == "succeeded":
        return AfterRun("cancelled", plan.scheduled_for, None, None, 0)
    return plan


def plan_after_failure(
    job: JobFacts, delay: timedelta | None = None, rng: Rng = random.random
) -> AfterRun:
    """Retry the same occurrence after a capped exponential backoff, or, its retries spent,
    follow the job's ``when_retries_exhausted``.

    ``delay`` overrides the backoff (a task's own ``self.retry(countdown=...)``). A recurring
    job's retry budget is per occurrence. When it is spent, under ``dead`` (the default) the
    whole job goes ``dead`` so that a person looks at it (``api.requeue`` brings it back),
    rather than failing quietly forever; under ``next_occurrence`` the failure is recorded and
    the job waits for its next occurrence, as under Celery beat. A job with no next occurrence
    (a one-off, or past its ``expires_at``) has nothing to go on with: it goes ``dead``.

    Under ``next_occurrence`` a retry the task asked for itself (``delay`` given:
    ``self.retry``, ``autoretry_for``) is granted whatever the job's ``max_retries``, as
    Celery's worker runs its retry message: Celery's ``Task.retry`` has already checked the
    task's own ``max_retries`` (the message carries the occurrence's retries so far) and
    raises the failure itself past them. The job's budget bounds the retries schedapp adds.
    """
    if job.superseded and job.overlap in SUPERSEDING and not job.rescheduled:
        plan = plan_after_success(job, rng=rng)  # a later occurrence cancelled this one
        if plan.next_run_at is not None or plan.delay is not None:
            return plan
    task_retry = delay is not None and job.when_retries_exhausted == NEXT_OCCURRENCE
    if job.retry_count >= job.max_retries and not task_retry:
        if job.when_retries_exhausted == NEXT_OCCURRENCE and not isinstance(job.schedule, Once):
            plan = plan_after_success(job, rng=rng)
            if plan.next_run_at is not None:
                return replace(plan, failed_occurrence=True)
        state = "cancelled" if job.state == "cancelled" else "dead"
        return AfterRun(
            state, job.scheduled_for, None, None, job.retry_count, dead=True, failed_occurrence=True
        )
    if job.rescheduled:
        # The failed occurrence belongs to the old schedule: the attempt counts, and the job
        # goes on with its new schedule rather than retrying what no longer exists.
        return AfterRun(
            _keep_operator_state(job.state, "scheduled"),
            job.scheduled_for,
            job.next_run_at,
            None,
            job.retry_count + 1,
        )
    wait = (
        bounded_delay(delay)
        if delay is not None
        else compute_backoff(job.retry_count, job.retry_backoff, job.retry_backoff_max)
    )
    return AfterRun(
        _keep_operator_state(job.state, "scheduled"),
        job.scheduled_for,
        None,
        wait + compute_jitter(job.jitter, rng),
        job.retry_count + 1,
    )
