"""The lease rules as tables: the door's verdict, a renewal's outcome and which completions
are accepted, each a pure function over plain values that returns the verdict and the writes
it implies.

Why here, and pure: these rules decide a run's fate, and PostgreSQL must also have them in
PL/pgSQL for speed (``schedapp_admit_run``, ``schedapp_renew_leases``,
``schedapp_succeed_run``). Written once here, the portable store and the ORM paths of
``schedapp.lease`` call them, and ``tests/integration/test_lease_rules_sql.py`` enumerates each
table against the PL/pgSQL, so the two languages cannot drift apart unseen (DESIGN rule 22).
Nothing here reads a clock or a database: the time is an argument, the rows are plain values.
Each table is read top down; the first row whose condition holds decides.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

# Job states and run statuses as the models spell them (``models.JobState``, ``RunStatus``).
RUNNING = "running"
PAUSED = "paused"
DISPATCHED = "dispatched"
SUCCEEDED = "succeeded"
FAILED = "failed"
LOST = "lost"
CANCELLED = "cancelled"
LIVE_JOB_STATES = (RUNNING, PAUSED)  # a run of such a job may still move it on

# The door's verdicts: the values of ``store.DoorVerdict`` and of ``schedapp_admit_run``.
ADMITTED = "admitted"
STALE_TOKEN = "stale_token"
LEASE_EXPIRED = "lease_expired"
JOB_PAUSED = "job_paused"
JOB_STATE = "job_state"
DUPLICATE = "duplicate"
UNKNOWN = "unknown"
LATE = "late"  # past its start deadline at the door, under skip_late (schedapp_admit_run_v6)
# The one kind of run a start deadline applies to (``models.RunKind``; None: a run claimed
# before kinds were recorded, a scheduled one or a run now). Not to a retry, a run now, or a
# backfill (which runs its occurrence as if its time had just passed).
SCHEDULED = "scheduled"


@dataclass(frozen=True)
class LeaseJob:
    """What the rules read of a job row."""

    state: str
    token: int
    lease_expires_at: datetime | None = None
    lease_seconds: int = 0
    unstarted_dispatches: int = 0
    skip_late: bool = False
    start_deadline: timedelta | None = None


@dataclass(frozen=True)
class LeaseRun:
    """What the rules read of the run row of the message's token."""

    status: str
    admission: str = ""
    stale: bool = False
    started: bool = False  # started_at is set
    scheduled_for: datetime | None = None  # its occurrence
    attempt: int = 1
    kind: str | None = None


def late_at_door(
    skip_late: bool,
    start_deadline: timedelta | None,
    scheduled_for: datetime | None,
    attempt: int,
    kind: str | None,
    now: datetime,
) -> bool:
    """A first attempt of an occurrence of the schedule reaching the door more than its
    job's ``start_deadline`` after the occurrence, under ``skip_late``: refused as late, as
    the claim skips such an occurrence (``policies.past_start_deadline``). A retry is not
    subject to it (Kubernetes' startingDeadlineSeconds bounds a job's start, not its
    retries), nor is a run a person added (run now), nor a backfill's run."""
    return (
        skip_late
        and start_deadline is not None
        and scheduled_for is not None
        and attempt == 1
        and (kind or SCHEDULED) == SCHEDULED
        and now - scheduled_for > start_deadline
    )


def lease_alive(job: LeaseJob, now: datetime) -> bool:
    """A lease that has not expired at ``now`` (no lease is not a live one)."""
    return job.lease_expires_at is not None and job.lease_expires_at > now


def lease_needs_rewrite(job: LeaseJob, now: datetime) -> bool:
    """The 5/6 rule of an admitted run: its job gets an ordinary lease from ``now`` (and its
    count of unstarted dispatches goes back to 0) unless it already holds an ordinary lease
    with at least five sixths of it left. Then the run's first renewal (a third of a lease
    after the worker took the message) still has half a lease to spare, and the job row, the
    costliest write of a run, is not written. A long dispatch wait (more than one lease left)
    is cut back to one lease. A job without a lease (it is not running: only a retried door
    gets this far) is given one only if a dispatch went unstarted, as ``schedapp_admit_run``
    decides (its comparisons with a NULL lease are NULL, so false)."""
    if job.unstarted_dispatches:
        return True
    if job.lease_expires_at is None:
        return False
    lease = timedelta(seconds=job.lease_seconds)
    return not lease * 5 / 6 <= job.lease_expires_at - now <= lease


# --- the door ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class DoorCall:
    """One door call: the message's claim (``token``) and this call's ``admission`` (and, at
    a replacement's door, the admission that started the run it takes over)."""

    job: LeaseJob
    run: LeaseRun
    token: int
    admission: str
    now: datetime
    carried: str = ""


@dataclass(frozen=True)
class DoorDecision:
    """The verdict and the writes it implies."""

    verdict: str
    start_run: bool = False  # run -> running (started_at kept if set), worker and admission
    fresh_lease: bool = False  # job lease := now + lease_seconds, unstarted_dispatches := 0
    skip_run: bool = False  # run -> skipped, its error ``skipped_error(verdict)``
    release_lease: bool = False  # a paused job gives its lease back: resume is immediate
    record_late: bool = False  # the ledger records the run's occurrence with fate late
    hand_back: bool = False  # job -> scheduled, no lease: the claim skips the occurrence late
    take_over: bool = False  # a replacement door: the run's admission and worker become its own


# A run the door refused is closed ``skipped`` with this text, word for word as
# schedapp_admit_run_v6 writes it: the admin shows the same on every database. (The worker's
# own log says more: ``DoorVerdict.what_next``.)
SKIPPED_REASONS = {
    STALE_TOKEN: "its claim is no longer the job's current one",
    JOB_PAUSED: "the job is paused",
    JOB_STATE: "the job is no longer running",
    LEASE_EXPIRED: "its lease expired before it arrived",
    LATE: "it arrived past its start deadline (skip_late)",
}

# The ledger's detail of an occurrence the door refused as late.
LATE_DETAIL = "delivered past its start deadline; skip_late: refused at the door"


def skipped_error(verdict: str) -> str:
    """The error a refused, never-started run is closed with."""
    return f"delivered but not executed: {SKIPPED_REASONS.get(verdict, verdict)}"


Row = tuple[str, Callable[[DoorCall], bool], str]

DOOR: tuple[Row, ...] = (
    ("claimed again, cancelled or reaped since", lambda c: c.job.token != c.token, STALE_TOKEN),
    (
        "this same call again: its commit landed, its reply was lost",
        lambda c: c.run.status == RUNNING and c.run.admission == c.admission,
        ADMITTED,
    ),
    ("the job is paused", lambda c: c.job.state == PAUSED, JOB_PAUSED),
    ("the job is no longer running", lambda c: c.job.state != RUNNING, JOB_STATE),
    ("the run already started or finished", lambda c: c.run.status != DISPATCHED, DUPLICATE),
    (
        "past its start deadline, under skip_late",
        lambda c: late_at_door(
            c.job.skip_late,
            c.job.start_deadline,
            c.run.scheduled_for,
            c.run.attempt,
            c.run.kind,
            c.now,
        ),
        LATE,
    ),
    ("the lease ran out first", lambda c: not lease_alive(c.job, c.now), LEASE_EXPIRED),
    ("otherwise", lambda c: True, ADMITTED),
)


def first_row(table: tuple[Row, ...], call: DoorCall) -> str:
    """The outcome of the first row of ``table`` whose condition holds."""
    return next(outcome for _why, holds, outcome in table if holds(call))


def door(
    job: LeaseJob | None, run: LeaseRun | None, token: int, admission: str, now: datetime
) -> DoorDecision:
    """The door (``lease.admit_run``): start the run if its claim is current and its lease
    alive; a retry of this same call is admitted again. A refused run that was still only
    dispatched never starts: it is closed as skipped (a paused job also gives its lease back;
    an expired one is left to the reaper, which dispatches the occurrence again). A late one
    (``late_at_door``) is recorded late in the ledger and its job handed back to the claim,
    which skips the occurrence as late and moves the job on, as it does with any late one."""
    if job is None or run is None:
        return DoorDecision(UNKNOWN)
    verdict = first_row(DOOR, DoorCall(job, run, token, admission, now))
    if verdict == ADMITTED:
        return DoorDecision(ADMITTED, start_run=True, fresh_lease=lease_needs_rewrite(job, now))
    if verdict == LATE:
        return DoorDecision(LATE, skip_run=True, record_late=True, hand_back=True)
    if run.status == DISPATCHED:
        return DoorDecision(verdict, skip_run=True, release_lease=verdict == JOB_PAUSED)
    return DoorDecision(verdict)


REPLACEMENT_DOOR: tuple[Row, ...] = (
    ("claimed again, cancelled or reaped since", lambda c: c.job.token != c.token, STALE_TOKEN),
    # paused: the run in flight goes on
    ("the job is no longer running", lambda c: c.job.state not in LIVE_JOB_STATES, JOB_STATE),
    ("the run is not running", lambda c: c.run.status != RUNNING, DUPLICATE),
    (
        "another admission runs it",
        lambda c: c.run.admission not in (c.carried, c.admission),
        DUPLICATE,
    ),
    ("the lease ran out first", lambda c: not lease_alive(c.job, c.now), LEASE_EXPIRED),
    ("otherwise", lambda c: True, ADMITTED),
)


def replacement_door(
    job: LeaseJob | None,
    run: LeaseRun | None,
    token: int,
    carried: str,
    admission: str,
    now: datetime,
) -> DoorDecision:
    """The door of a task that replaced the run's task (``lease.admit_replacement``): it
    takes over the running run that the ``carried`` admission (or, on a retry, its own
    ``admission``) started; nothing else is written."""
    if job is None or run is None:
        return DoorDecision(UNKNOWN)
    verdict = first_row(REPLACEMENT_DOOR, DoorCall(job, run, token, admission, now, carried))
    return DoorDecision(verdict, take_over=verdict == ADMITTED)


# --- renewal ----------------------------------------------------------------------------------

RENEWED = "renewed"
BUSY = "busy"
FINISHED = "finished"
UNSTARTED = "unstarted"
RENEWAL_LOST = "lost"


@dataclass(frozen=True)
class RenewDecision:
    """A held lease's outcome and the writes it implies."""

    outcome: str
    extend_lease: bool = False  # job lease := now + lease_seconds
    heartbeat: bool = False  # run heartbeats += 1, heartbeat_at := now


def renews(job: LeaseJob | None, token: int, *, locked: bool = True) -> bool:
    """A held lease is extended only under the job's current token, while the job holds a
    lease and is running or paused (a paused job's run in flight goes on)."""
    return (
        job is not None
        and locked
        and job.token == token
        and job.lease_expires_at is not None
        and job.state in LIVE_JOB_STATES
    )


def renewal(
    job: LeaseJob | None, run: LeaseRun | None, token: int, *, locked: bool = True
) -> RenewDecision:
    """One held lease at a heartbeat (``lease.renew_leases``). ``locked``: the job row could
    be locked (PostgreSQL skips a row another transaction holds and says ``busy``; the
    portable store waits for it). The run is read after the writes, so a completion that
    just committed reads as finished, not as a lost lease."""
    if renews(job, token, locked=locked):
        return RenewDecision(
            RENEWED, extend_lease=True, heartbeat=run is not None and run.status == RUNNING
        )
    if job is not None and not locked:
        return RenewDecision(BUSY)
    if run is None:
        return RenewDecision(RENEWAL_LOST)
    if run.status == CANCELLED:
        return RenewDecision(CANCELLED)  # an operator's cancel, not an alarm
    if run.status in (SUCCEEDED, FAILED) and not run.stale:
        return RenewDecision(FINISHED)
    if not run.started:
        return RenewDecision(UNSTARTED)  # the door will refuse this copy: nothing ran
    return RenewDecision(RENEWAL_LOST)


# --- completions ------------------------------------------------------------------------------


class Completion(StrEnum):
    APPLIED = "applied"  # the run's outcome moved its job on
    STALE = "stale"  # recorded on the run only: the job had moved on (lease lost, cancelled)
    ALREADY_RECORDED = "already_recorded"  # a retried completion whose first attempt landed


STARTED = frozenset({RUNNING, LOST})  # an ordinary outcome: the run passed a door
UNSTARTED_ONLY = frozenset({DISPATCHED})  # a copy that never reached a door
ANY = STARTED | UNSTARTED_ONLY  # a task terminated as it started


def completion(
    job: LeaseJob | None, run_status: str | None, token: int, accepted: frozenset[str]
) -> Completion:
    """Whether an outcome for the run of ``token`` is recorded, and whether it moves the job:
    a run in none of the ``accepted`` statuses already has its outcome (a retry: nothing is
    written); a run whose job moved on (another token, no longer running or paused) or that
    was marked lost is recorded on the run only, flagged stale; otherwise it moves the job."""
    if run_status is None or run_status not in accepted:
        return Completion.ALREADY_RECORDED
    if job is None or job.token != token or job.state not in LIVE_JOB_STATES:
        return Completion.STALE
    if run_status == LOST:
        return Completion.STALE
    return Completion.APPLIED


def fast_success(
    job: LeaseJob | None,
    run_status: str | None,
    token: int,
    *,
    same_schedule: bool,
    end_decides: bool = False,
) -> bool:
    """Whether the one-call success (``schedapp_succeed_run``) applies: only the common case,
    an applied success of a running run whose job still has the schedule its claim saw, and
    whose next occurrence does not depend on when it ended (``end_decides``); anything else
    (False) takes the general path, which tells the cases apart."""
    return (
        same_schedule
        and not end_decides
        and run_status == RUNNING
        and completion(job, run_status, token, STARTED) is Completion.APPLIED
    )


# --- a run with a lease of its own (overlap policy allow_all) -------------------------------
#
# Several runs of one job in flight at once: each run row holds its lease (``RunLease``), and
# the door, renewals, completions and the reaper decide on it; the job moved on to its next
# occurrence when the run was claimed, so neither its token nor its lease fences the run.

SKIPPED = "skipped"
CLOSED_UNSTARTED = frozenset({LOST, SKIPPED, CANCELLED})  # reaped, released, refused, cancelled


@dataclass(frozen=True)
class RunLease:
    """What the rules read of a run with its own lease."""

    status: str
    lease_expires_at: datetime | None = None
    admission: str = ""
    stale: bool = False
    started: bool = False
    scheduled_for: datetime | None = None
    attempt: int = 1
    kind: str | None = None


def run_lease_needs_rewrite(run: RunLease, lease_seconds: int, now: datetime) -> bool:
    """The 5/6 rule (``lease_needs_rewrite``) on the run's own lease."""
    if run.lease_expires_at is None:
        return False
    lease = timedelta(seconds=lease_seconds)
    return not lease * 5 / 6 <= run.lease_expires_at - now <= lease


@dataclass(frozen=True)
class StartDeadline:
    """What the door of a run with its own lease reads of its job's start deadline."""

    skip_late: bool = False
    start_deadline: timedelta | None = None


RUN_DOOR: tuple[tuple[str, Callable[[RunLease, str, str, datetime], bool], str], ...] = (
    ("reaped, released or cancelled", lambda r, s, a, n: r.status in CLOSED_UNSTARTED, STALE_TOKEN),
    (
        "this same call again: its commit landed, its reply was lost",
        lambda r, s, a, n: r.status == RUNNING and r.admission == a,
        ADMITTED,
    ),
    ("the job is paused", lambda r, s, a, n: s == PAUSED, JOB_PAUSED),
    ("the job was cancelled", lambda r, s, a, n: s == CANCELLED, JOB_STATE),
    ("the run already started or finished", lambda r, s, a, n: r.status != DISPATCHED, DUPLICATE),
    (
        "the run's lease ran out first",
        lambda r, s, a, n: r.lease_expires_at is None or r.lease_expires_at <= n,
        LEASE_EXPIRED,
    ),
    ("otherwise", lambda r, s, a, n: True, ADMITTED),
)


def run_door(
    job_state: str | None,
    run: RunLease,
    admission: str,
    lease_seconds: int,
    now: datetime,
    deadline: StartDeadline = StartDeadline(),
) -> DoorDecision:
    """The door of a run with its own lease (``schedapp_admit_run_v6``'s first branch): the
    run row decides; the job's state only refuses a paused or cancelled job's run (the job is
    'scheduled', or done, while its runs are in flight). ``fresh_lease`` here renews the
    run's lease; a refused run still dispatched is closed as skipped, but for one whose lease
    ran out: that is the reaper's, which sends its occurrence again (the job moved on at the
    claim: nothing else would). A late run (``late_at_door``, before the lease's row as at
    the job-lease door) is recorded late in the ledger; its job moved on at the claim, so
    nothing is handed back."""
    if job_state is None:
        return DoorDecision(UNKNOWN)
    verdict = next(v for _why, holds, v in RUN_DOOR if holds(run, job_state, admission, now))
    # a row of its own between "already started" and "the lease ran out" (RUN_DOOR's rows
    # read no job deadline): only a run still dispatched that got that far
    if (
        run.status == DISPATCHED
        and verdict in (LEASE_EXPIRED, ADMITTED)
        and late_at_door(
            deadline.skip_late,
            deadline.start_deadline,
            run.scheduled_for,
            run.attempt,
            run.kind,
            now,
        )
    ):
        verdict = LATE
    if verdict == LATE:
        return DoorDecision(LATE, skip_run=True, record_late=True)
    if verdict == ADMITTED:
        return DoorDecision(
            ADMITTED, start_run=True, fresh_lease=run_lease_needs_rewrite(run, lease_seconds, now)
        )
    if run.status == DISPATCHED and verdict != LEASE_EXPIRED:
        return DoorDecision(verdict, skip_run=True)
    return DoorDecision(verdict)


def run_renewal(run: RunLease, *, locked: bool = True) -> RenewDecision:
    """A heartbeat for a run with its own lease: renewed while the run is in flight (its
    lease not yet cleared by its end or the reaper), whatever the job's state."""
    if locked and run.lease_expires_at is not None and run.status in (DISPATCHED, RUNNING):
        return RenewDecision(RENEWED, extend_lease=True, heartbeat=run.status == RUNNING)
    if not locked:
        return RenewDecision(BUSY)
    if run.status == CANCELLED:
        return RenewDecision(CANCELLED)
    if run.status in (SUCCEEDED, FAILED) and not run.stale:
        return RenewDecision(FINISHED)
    if not run.started:
        return RenewDecision(UNSTARTED)
    return RenewDecision(RENEWAL_LOST)


def run_completion(
    job_exists: bool, run_status: str | None, accepted: frozenset[str]
) -> Completion:
    """An outcome for a run with its own lease: a run in none of the ``accepted`` statuses
    already has its outcome (nothing is written); one the reaper marked lost, or whose job is
    gone, is recorded on the run only (stale); otherwise it is applied (the run's outcome,
    the job's last status)."""
    if run_status is None or run_status not in accepted:
        return Completion.ALREADY_RECORDED
    if not job_exists or run_status == LOST:
        return Completion.STALE
    return Completion.APPLIED
