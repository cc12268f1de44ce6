"""The storage seam: what schedapp asks of its database beyond plain ORM reads and writes.

Two implementations: ``postgresql`` (one statement per claim, PL/pgSQL functions on the
worker's hot path, LISTEN/NOTIFY, COPY) and ``portable`` (the ORM, for SQLite, whose IMMEDIATE
transactions serialise beats where PostgreSQL uses SKIP LOCKED). ``schedapp.store.get_store``
picks one, in one place; the rest of schedapp never asks which database it is on.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from functools import reduce
from operator import or_
from typing import TYPE_CHECKING, Any, Protocol

from django.db import DEFAULT_DB_ALIAS
from django.db.models import Q

from ..message import task_id_for
from ..models import JobRun, RunKind

if TYPE_CHECKING:
    from ..validation import Checked


@dataclass(frozen=True)
class ClaimProbe:
    """What a claim's transaction will find to do besides claiming: False only where the
    store has looked and found nothing (so the statement that would look is skipped)."""

    job_leases_expired: bool = True
    run_leases_expired: bool = True
    retries_due: bool = True


class DoorVerdict(StrEnum):
    """The door's answer for one delivered message; the values are the metric labels."""

    ADMITTED = "admitted"
    STALE_TOKEN = "stale_token"  # claimed again, cancelled or reaped since this message
    LEASE_EXPIRED = "lease_expired"  # the lease ran out before the message arrived
    JOB_PAUSED = "job_paused"
    JOB_STATE = "job_state"  # the job is no longer running (e.g. dead, succeeded)
    DUPLICATE = "duplicate"  # the run already started under another admission, or finished
    UNKNOWN = "unknown"  # no such run
    LATE = "late"  # past its start deadline under skip_late: recorded late, not executed
    ERROR = "error"  # the claim could not be checked (database unreachable): not executed

    @property
    def explanation(self) -> str:
        return _DOOR_EXPLANATIONS[self]

    @property
    def what_next(self) -> str:
        """The explanation and whether (and when) the run is dispatched again: what the
        worker's log says of a refused delivery. A run that never started costs no attempt."""
        return _DOOR_WHAT_NEXT[self]


_DOOR_EXPLANATIONS = {
    DoorVerdict.ADMITTED: "admitted",
    DoorVerdict.STALE_TOKEN: "its claim is no longer the job's current one",
    DoorVerdict.LEASE_EXPIRED: "its lease expired before it arrived; it will be dispatched again",
    DoorVerdict.JOB_PAUSED: "the job is paused",
    DoorVerdict.JOB_STATE: "the job is no longer running",
    DoorVerdict.DUPLICATE: "this run already started or finished (a duplicate delivery)",
    DoorVerdict.UNKNOWN: "no such run",
    DoorVerdict.LATE: "it arrived past its job's start deadline (skip_late)",
    DoorVerdict.ERROR: "the claim could not be checked; its lease will expire and it will be "
    "dispatched again",
}

_NOT_COUNTED = "not counted as an attempt"
_DOOR_WHAT_NEXT = {
    DoorVerdict.ADMITTED: "admitted",
    DoorVerdict.STALE_TOKEN: "its claim is no longer the job's current one: not run again from "
    "this message (the job's newer claim, or its cancellation, stands)",
    DoorVerdict.LEASE_EXPIRED: "its lease expired before it arrived: a beat reaps it and "
    f"dispatches it again at its next tick, {_NOT_COUNTED}",
    DoorVerdict.JOB_PAUSED: "the job is paused: not run again from this message; the job's "
    "schedule goes on when it is resumed",
    DoorVerdict.JOB_STATE: "the job is no longer running: not run again",
    DoorVerdict.DUPLICATE: "this run already started or finished (a duplicate delivery): "
    "nothing to run again",
    DoorVerdict.UNKNOWN: "no such run: nothing to run again",
    DoorVerdict.LATE: "it arrived past its job's start deadline (skip_late): recorded late in "
    f"the ledger, not run again; the job goes on to its next occurrence, {_NOT_COUNTED}",
    DoorVerdict.ERROR: "the claim could not be checked: the run is dispatched again once its "
    f"lease expires (lease_seconds after its dispatch or last renewal), {_NOT_COUNTED}",
}


class Listener(Protocol):
    """A connection that wakes a sleeping beat when a job becomes due sooner."""

    def wait(self, timeout: float, wake_at_db: float | None) -> bool | None:
        """Sleep up to ``timeout``; True if woken by a job due before ``wake_at_db`` (epoch
        seconds, database clock), None if the connection broke."""

    def close(self) -> None: ...


class NameTaken(Exception):
    """The unique index on job names refused a batch of new jobs: none of it was written."""


@dataclass(frozen=True)
class InsertedJobs:
    """Where a batch of new jobs went: enough to map a job back to its place in the batch
    without holding the batch's ids or names."""

    last_id: int
    xid: str = ""  # PostgreSQL: the transaction id of the batch's savepoint (its rows' xmin)
    first_id: int = 0  # the portable store: the first id
    ids: tuple[int, ...] = ()  # the portable store, only if the ids are not contiguous


class JobRows(Protocol):
    """How a validated new job is encoded for ``Store.insert_jobs``: a COPY line on
    PostgreSQL, an unsaved ``Job`` elsewhere."""

    def encode(self, checked: Checked, source: str, first: datetime, due: datetime) -> Any:
        """The row of a valid job, first due at ``due`` for its occurrence ``first``."""


class Store(Protocol):
    """The lease and clock operations whose SQL differs between databases. Every write here
    is fenced and idempotent exactly as ``schedapp.lease`` documents."""

    name: str
    using: str  # the database alias every statement and transaction goes through
    # insert_jobs streams rows (COPY) and tells a name clash only at the end: a bulk write
    # sends first and looks at names only when refused (elsewhere names are looked up first)
    copies_rows: bool

    def now(self) -> datetime:
        """The database's clock (the transaction's time where it has one)."""

    def claim(
        self, beat: str, limit: int, ids: list[int] | None = None
    ) -> tuple[list[dict], datetime | None]:
        """Lock, lease and token up to ``limit`` due jobs (only those of ``ids``, if given),
        with a run row for each that is not late (``row["run_id"]``); returns the rows and the
        claim's now (None: read it with ``now()`` in the same transaction)."""

    def due_ids(self, limit: int) -> list[int]:
        """The ids ``claim`` would take, in its order, locked for this transaction."""

    def restamp_leases(self, job_ids: list[int]) -> None:
        """Leases of these claimed jobs from the clock now, just before the claim commits."""

    def next_due(self) -> tuple[datetime, datetime | None, datetime | None]:
        """(now, earliest next_run_at of a scheduled job, earliest lease expiry)."""

    def admit(
        self, job_id: int, token: int, worker: str, admission: str, run_id: int | None = None
    ) -> DoorVerdict:
        """The door (``lease.admit_run``); ``run_id`` (the message's) finds the run by its
        key, in one partition of the history; None: by its job and token."""

    def renew(
        self, held: Sequence[tuple[int, int]], run_ids: Mapping[tuple[int, int], int] | None = None
    ) -> list[tuple[int, int, str]]:
        """One heartbeat for every held lease (with its run's id where ``run_ids`` knows it):
        ``(job, token, outcome)``, the outcome one of
        renewed, finished, cancelled, unstarted, lost, or busy (its job row held by another
        transaction: not waited for)."""

    def succeed_run(self, args: list[Any]) -> bool:
        """The common success in one call; False: take the general path."""

    def succeed_runs(self, columns: list[list[Any]]) -> list[tuple[int, bool]]:
        """Several successes in one call: ``(1-based index, applied)``; [] where unsupported."""

    def succeed_and_admit(
        self,
        columns: list[list[Any]],
        job_id: int,
        token: int,
        worker: str,
        admission: str,
        run_id: int | None = None,
    ) -> tuple[list[tuple[int, bool]], DoorVerdict]:
        """``succeed_runs(columns)`` (none when ``columns`` is empty), then ``admit``: in one
        statement where the database allows."""

    def notify(self, when: datetime | None, delay_seconds: float | None) -> None:
        """Wake sleeping beats when the transaction commits (a no-op without notifications)."""

    def listen(self) -> Listener | None:
        """A listener for those notifications (None: the beat polls)."""

    def limit_idle_transaction(self, seconds: float) -> None:
        """Have the server end the current transaction if it stalls idle longer than this
        (for this transaction only: nothing stays on the session)."""

    def begin_claim(self, seconds: float) -> ClaimProbe:
        """``limit_idle_transaction(seconds)``, and what the claim's reaper and retries will
        find (one statement where the database allows; all True where it cannot say)."""

    def lock(self, key: int) -> None:
        """A lock on ``key`` for the rest of the transaction."""

    def backlog(self, cap: int) -> tuple[int, datetime | None]:
        """(due scheduled jobs, counted up to ``cap``; the oldest next_run_at)."""

    def dispatch_lag(self, minutes: int, sample: int) -> list[tuple[Any, ...]]:
        """(minute or None for the whole window, runs, p50, p95, max) over the newest ``sample``
        runs dispatched in the last ``minutes``: the whole window first, always."""

    def recent_statuses(self, minutes: int, sample: int) -> dict[str, int]:
        """Runs claimed in the last ``minutes`` by status (among the newest ``sample``)."""

    def label(self) -> str:
        """Where the beats meet, for log lines."""

    def job_rows(self, now: datetime, copy_format: str) -> JobRows:
        """The encoder of new jobs for ``insert_jobs`` (``copy_format``: COPY's "binary" or
        "text", where the store copies rows), created at ``now``."""

    def insert_jobs(self, encoder: Any, rows: Iterable[Any]) -> InsertedJobs:
        """Write at least one new job (rows from ``encoder``, what ``job_rows`` returned: each
        store takes its own kind), all or none, in a savepoint of
        the current transaction. NameTaken if the unique index on names refused one;
        ``ValidationError`` if the database refused them for another reason."""

    def jobs_named(self, names: list[str]) -> dict[str, tuple[int, str]]:
        """The jobs holding any of ``names``: name -> (id, the xid of the batch that wrote it,
        or "" where the store has none)."""

    def record_created(self, names: list[str], *, source: str, actor: str, reason: str) -> None:
        """One ``created`` audit record (``JobChange``) for each job of ``names``."""

    def tagged(self, tag: str) -> Q:
        """The condition "the job carries ``tag``" (a lowercased label)."""


class CopyingStore(Store, Protocol):
    """A store whose ``insert_jobs`` copies rows (``copies_rows``): a batch is found again by
    the transaction id of its savepoint."""

    def inserted_from(self, job_id: int, inserted: InsertedJobs) -> int:
        """How many jobs of the batch ``inserted`` have an id of ``job_id`` or more."""


def pairs(
    claims: Iterable[tuple[int, int]], job_field: str = "id", token_field: str = "token"
) -> Q:
    """``(job, token)`` pairs as one filter."""
    return reduce(or_, (Q(**{job_field: j, token_field: t}) for j, t in claims), Q(pk__in=[]))


def run_kind(row: Mapping[str, Any]) -> str:
    """The kind of the run a claimed row gets: the claim's ``manual`` says whether its
    occurrence is the one a person added (the same rule as the claim statement's)."""
    if row["retry_count"] > 0:
        return RunKind.RETRY
    return RunKind.MANUAL if row.get("manual") else RunKind.SCHEDULED


def insert_runs(beat: str, rows: list[dict], now: datetime, using: str = DEFAULT_DB_ALIAS) -> None:
    """A run row for each claimed row (its id into ``row["run_id"]``), through the ORM."""
    if not rows:
        return
    runs = JobRun.objects.using(using).bulk_create(
        [
            JobRun(
                job_id=r["id"],
                token=r["token"],
                attempt=r["retry_count"] + 1,
                kind=run_kind(r),
                scheduled_for=r["scheduled_for"],
                due_at=r["next_run_at"],
                claimed_by=beat,
                dispatched_at=now,
                task_id=task_id_for(r["id"], r["token"]),
            )
            for r in rows
        ]
    )
    for row, run in zip(rows, runs, strict=True):
        row["run_id"] = run.pk
