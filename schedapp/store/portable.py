"""The portable store: the ORM, for SQLite (the demo) and any database without the PostgreSQL
path. SQLite's IMMEDIATE transactions take the database lock when they begin, so beats'
claims are serialised where PostgreSQL lets them pass each other with SKIP LOCKED. Bound to
one database alias: every query and transaction goes through it."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import DEFAULT_DB_ALIAS, IntegrityError, connections, transaction
from django.db.models import (
    BooleanField,
    Count,
    ExpressionWrapper,
    F,
    Min,
    OuterRef,
    Q,
    Subquery,
    Value,
)
from django.db.models.functions import Coalesce, Greatest, Now
from django.db.models.lookups import LessThan

from ..fields import CELERY_FIELDS
from ..models import Fate, Job, JobChange, JobRun, JobState, RunStatus
from ..policies import dispatch_wait, misfire_after, past_start_deadline
from ..validation import Checked
from .base import ClaimProbe, DoorVerdict, InsertedJobs, Listener, NameTaken, insert_runs, pairs

_NAMES_PER_QUERY = 900  # under SQLite's oldest limit of 999 parameters

if TYPE_CHECKING:  # at run time imported where used: the lease package imports this store
    from ..lease.rules import LeaseJob

_CLAIM_FIELDS = (
    "id",
    "token",
    "name",
    "task",
    "args",
    "kwargs",
    "queue",
    "scheduled_for",
    "next_run_at",
    "retry_count",
    "max_retries",
    "lease_seconds",
    "unstarted_dispatches",
    "jitter",
    "run_at",
    "cron",
    "timezone",
    "interval",
    "interval_anchor",
    "misfire_policy",
    "misfire_max_catchup",
    "misfire_grace",
    "catchup_window",
    "overlap",
    "fixed_delay",
    "calendar_id",
    "calendar_mode",
    "calendar_roll",
    "max_concurrent",
    "skip_late",
    "start_deadline",
    *CELERY_FIELDS,
)


def _slot_free(using: str, job: str = "id") -> Q:
    """The job (``job``: the path to its id) has a slot free under max_concurrent: its runs
    holding a lease of their own are fewer."""
    in_flight = (
        JobRun.objects.using(using)
        .filter(job_id=OuterRef(job), lease_expires_at__isnull=False)
        .order_by()
        .values("job_id")
        .annotate(n=Count("id"))
        .values("n")
    )
    bound = "max_concurrent" if job == "id" else "job__max_concurrent"
    # a bound below 1 (written behind the API's back) counts as 1: the job never stalls
    return Q(LessThan(Coalesce(Subquery(in_flight), Value(0)), Greatest(F(bound), Value(1))))


def _due(now: datetime, using: str) -> Any:
    # An allow_all job with max_concurrent runs in flight waits for a slot.
    return (
        Job.objects.using(using)
        .select_for_update(skip_locked=True)
        .filter(state=JobState.SCHEDULED, next_run_at__lte=now)
        .filter(~Q(overlap="allow_all") | _slot_free(using))
        .order_by("-priority", "next_run_at")
    )


def _claim(
    using: str, beat: str, limit: int, now: datetime, ids: list[int] | None = None
) -> list[dict]:
    """The claim statement of the PostgreSQL store, through the ORM."""
    due = _due(now, using) if ids is None else _due(now, using).filter(id__in=ids)
    # Whether the occurrence is the one a person added, compared in the database (manual_at
    # is never read into Python here: a value written behind the API's back cannot stop it).
    manual = ExpressionWrapper(Q(manual_at=F("scheduled_for")), output_field=BooleanField())
    rows = list(due.annotate(manual=manual).values(*_CLAIM_FIELDS, "manual")[:limit])
    for row in rows:
        Job.objects.using(using).filter(id=row["id"], token=row["token"]).update(
            state=JobState.RUNNING,
            token=F("token") + 1,
            claimed_by=beat,
            lease_expires_at=now + dispatch_wait(row["lease_seconds"], row["unstarted_dispatches"]),
            claimed_at=now,
            updated_at=now,
        )
        row["token"] += 1
        row["args"] = json.dumps(row["args"])
        row["kwargs"] = json.dumps(row["kwargs"])
        row["message_options"] = json.dumps(row["message_options"])
        row["lateness"] = (now - row["next_run_at"]).total_seconds()
        row["late"] = (
            row["run_at"] is None
            and row["retry_count"] == 0
            and not row["fixed_delay"]  # its one pending occurrence runs when found
            and (
                now - row["next_run_at"]
                > misfire_after(row["misfire_policy"], row["misfire_grace"])
                or past_start_deadline(
                    row["skip_late"], row["start_deadline"], row["scheduled_for"], now
                )
            )
        )
    return rows


class PortableStore:
    name = "portable"
    copies_rows = False

    def __init__(self, using: str = DEFAULT_DB_ALIAS) -> None:
        self.using = using  # the database alias every query and transaction goes through

    def now(self) -> datetime:
        return datetime.now(UTC)  # one machine, so its clock is the only clock there is

    def claim(
        self, beat: str, limit: int, ids: list[int] | None = None
    ) -> tuple[list[dict], datetime | None]:
        now = self.now()
        rows = _claim(self.using, beat, limit, now, ids)
        insert_runs(beat, [r for r in rows if not r["late"]], now, self.using)
        return rows, now

    def due_ids(self, limit: int) -> list[int]:
        return list(_due(self.now(), self.using).values_list("id", flat=True)[:limit])

    def restamp_leases(self, job_ids: list[int]) -> None:
        now = datetime.now(UTC)
        jobs = Job.objects.using(self.using)
        leases = jobs.filter(id__in=job_ids).values_list(
            "id", "lease_seconds", "unstarted_dispatches"
        )
        for job_id, lease, unstarted in leases:
            jobs.filter(id=job_id, state=JobState.RUNNING).update(
                lease_expires_at=now + dispatch_wait(lease, unstarted)
            )

    def next_due(self) -> tuple[datetime, datetime | None, datetime | None]:
        now = self.now()
        jobs = Job.objects.using(self.using)
        next_due = (
            jobs.filter(state=JobState.SCHEDULED)
            .filter(~Q(overlap="allow_all") | _slot_free(self.using))
            .order_by("next_run_at")
            .values_list("next_run_at", flat=True)
            .first()
        )
        next_expiry = (
            jobs.filter(state=JobState.RUNNING)
            .order_by("lease_expires_at")
            .values_list("lease_expires_at", flat=True)
            .first()
        )
        next_supersede = (
            jobs.filter(state=JobState.RUNNING, supersede_at__isnull=False)
            .order_by("supersede_at")
            .values_list("supersede_at", flat=True)
            .first()
        )
        next_run_expiry = (
            JobRun.objects.using(self.using)
            .filter(lease_expires_at__isnull=False)
            .order_by("lease_expires_at")
            .values_list("lease_expires_at", flat=True)
            .first()
        )
        next_retry = (
            JobRun.objects.using(self.using)
            .filter(retry_at__isnull=False, job__state__in=[JobState.SCHEDULED, JobState.SUCCEEDED])
            .filter(_slot_free(self.using, "job_id"))
            .order_by("retry_at")
            .values_list("retry_at", flat=True)
            .first()
        )
        times = [
            t for t in (next_expiry, next_supersede, next_run_expiry, next_retry) if t is not None
        ]
        return now, next_due, min(times) if times else None

    def admit(
        self, job_id: int, token: int, worker: str, admission: str, run_id: int | None = None
    ) -> DoorVerdict:
        return _admit(self.using, self.now(), job_id, token, worker, admission, run_id)

    def renew(
        self, held: Sequence[tuple[int, int]], run_ids: Mapping[tuple[int, int], int] | None = None
    ) -> list[tuple[int, int, str]]:
        # One table, no partitions: a held claim (job, token) names its run, whose id adds
        # nothing here.
        return _renew(self.using, self.now(), held)

    def succeed_run(self, args: list[Any]) -> bool:
        return False

    def succeed_runs(self, columns: list[list[Any]]) -> list[tuple[int, bool]]:
        return []

    def succeed_and_admit(
        self,
        columns: list[list[Any]],
        job_id: int,
        token: int,
        worker: str,
        admission: str,
        run_id: int | None = None,
    ) -> tuple[list[tuple[int, bool]], DoorVerdict]:
        return [], self.admit(job_id, token, worker, admission, run_id)

    def notify(self, when: datetime | None, delay_seconds: float | None) -> None:
        pass  # no notifications: beats poll (at most a second apart)

    def listen(self) -> Listener | None:
        return None

    def limit_idle_transaction(self, seconds: float) -> None:
        pass  # SQLite: one process's file lock, no server to end a transaction

    def begin_claim(self, seconds: float) -> ClaimProbe:
        return ClaimProbe()  # no idle limit to set; the claim's own queries look (SQLite)

    def lock(self, key: int) -> None:
        pass  # IMMEDIATE transactions already hold the database's one write lock

    def backlog(self, cap: int) -> tuple[int, datetime | None]:
        scheduled = Job.objects.using(self.using).filter(state=JobState.SCHEDULED)
        due = scheduled.filter(next_run_at__lte=Now()).order_by().values("id")[:cap].count()
        oldest = scheduled.aggregate(m=Min("next_run_at"))["m"]
        return due, oldest

    def dispatch_lag(self, minutes: int, sample: int) -> list[tuple[Any, ...]]:
        """What the PostgreSQL query says (its ``ROLLUP``: the whole window first, always, then
        each minute), computed here over the same bounded read of the newest runs."""
        since = self.now() - timedelta(minutes=minutes)
        runs = JobRun.objects.using(self.using).order_by("-id")
        by_minute: dict[datetime, list[float]] = {}
        for dispatched, due in runs.values_list("dispatched_at", "due_at")[:sample]:
            if dispatched is None or due is None or dispatched < since:
                continue
            minute = dispatched.astimezone(UTC).replace(second=0, microsecond=0)
            by_minute.setdefault(minute, []).append((dispatched - due).total_seconds())
        every = [lag for lags in by_minute.values() for lag in lags]
        return [_lag_row(None, every)] + [
            _lag_row(minute, by_minute[minute]) for minute in sorted(by_minute)
        ]

    def recent_statuses(self, minutes: int, sample: int) -> dict[str, int]:
        since = self.now() - timedelta(minutes=minutes)
        runs = JobRun.objects.using(self.using).order_by("-id")
        counts: dict[str, int] = {}
        for status, dispatched in runs.values_list("status", "dispatched_at")[:sample]:
            if dispatched is not None and dispatched >= since:
                counts[status] = counts.get(status, 0) + 1
        return dict(sorted(counts.items()))

    def label(self) -> str:
        db = connections[self.using]
        return f"{db.vendor} {db.settings_dict.get('NAME')}"

    def job_rows(self, now: datetime, copy_format: str) -> JobInstances:
        return JobInstances()

    def insert_jobs(self, encoder: JobInstances, rows: Iterable[Job]) -> InsertedJobs:
        """``bulk_create`` in a savepoint. Any refusal counts as a name taken: the database
        does not say which constraint refused, and names are the one a caller can clash on
        (it looked them up first)."""
        try:
            with transaction.atomic(using=self.using):
                created = Job.objects.using(self.using).bulk_create(list(rows))
        except IntegrityError as exc:
            raise NameTaken from exc
        ids = sorted(job.pk for job in created)
        contiguous = ids[-1] - ids[0] + 1 == len(ids)  # always on SQLite: one writer
        return InsertedJobs(last_id=ids[-1], first_id=ids[0], ids=() if contiguous else tuple(ids))

    def jobs_named(self, names: list[str]) -> dict[str, tuple[int, str]]:
        found: dict[str, tuple[int, str]] = {}
        jobs = Job.objects.using(self.using)
        for start in range(0, len(names), _NAMES_PER_QUERY):
            clashes = jobs.filter(name__in=names[start : start + _NAMES_PER_QUERY])
            found.update((name, (job_id, "")) for name, job_id in clashes.values_list("name", "id"))
        return found

    def tagged(self, tag: str) -> Q:
        # SQLite has no JSON containment: the JSON text holds the label in its quotes, which
        # no other label's text does (labels are lowercased and hold no quote).
        return Q(tags__icontains=json.dumps(tag))

    def record_created(self, names: list[str], *, source: str, actor: str, reason: str) -> None:
        records = [
            JobChange(
                job_id=job_id,
                job_name=name,
                action=JobChange.Action.CREATED,
                source=source,
                actor=actor,
                reason=reason,
            )
            for name, (job_id, _xid) in self.jobs_named(names).items()
        ]
        JobChange.objects.using(self.using).bulk_create(records, batch_size=_NAMES_PER_QUERY)


class JobInstances:
    """New jobs as unsaved ``Job`` instances, for ``bulk_create``."""

    def encode(self, checked: Checked, source: str, first: datetime, due: datetime) -> Job:
        job = Job(**checked.to_store(), source=source, scheduled_for=first, next_run_at=due)
        if job.interval is not None and job.interval_anchor is None:
            job.interval_anchor = first  # as schedule() does: the phase is the first occurrence
        return job


def _admit(
    using: str,
    now: datetime,
    job_id: int,
    token: int,
    worker: str,
    admission: str,
    run_id: int | None = None,
) -> DoorVerdict:
    """``schedapp_admit_run_v6`` through the ORM (SQLite's IMMEDIATE transactions serialise
    it): the decision is ``lease.rules.door``'s; only the reads and writes are here."""
    from ..lease.rules import (  # not at import: lease imports this
        LeaseJob,
        LeaseRun,
        door,
        skipped_error,
    )

    with transaction.atomic(using=using):
        runs = JobRun.objects.using(using).filter(job_id=job_id, token=token)
        if run_id is not None:  # the claim's run, or none: 'unknown', as the function says
            runs = runs.filter(id=run_id)
        if runs.filter(own_lease=True).exists():
            return _admit_own_lease(using, now, runs, job_id, worker, admission)
        job = (
            Job.objects.using(using)
            .select_for_update()
            .filter(id=job_id)
            .values(
                "token",
                "state",
                "lease_expires_at",
                "lease_seconds",
                "unstarted_dispatches",
                "skip_late",
                "start_deadline",
            )
            .first()
        )
        run = runs.values("status", "admission", "scheduled_for", "attempt", "kind").first()
        decision = door(
            LeaseJob(**job) if job is not None else None,
            LeaseRun(**run) if run is not None else None,
            token,
            admission,
            now,
        )
        verdict = DoorVerdict(decision.verdict)
        if decision.start_run:
            runs.update(
                status=RunStatus.RUNNING,
                started_at=Coalesce("started_at", Value(now)),  # a retried door keeps the first
                worker=worker,
                admission=admission,
            )
        if decision.fresh_lease:
            Job.objects.using(using).filter(id=job_id).update(
                lease_expires_at=now + timedelta(seconds=job["lease_seconds"]),
                unstarted_dispatches=0,
            )
        if decision.skip_run:
            runs.update(
                status=RunStatus.SKIPPED,
                finished_at=now,
                worker=worker,
                error=skipped_error(decision.verdict),
            )
        if decision.release_lease:
            Job.objects.using(using).filter(id=job_id).update(claimed_by="", lease_expires_at=None)
        if decision.hand_back:
            Job.objects.using(using).filter(id=job_id).update(
                state=JobState.SCHEDULED,
                claimed_by="",
                lease_expires_at=None,
                unstarted_dispatches=0,
            )
        if decision.record_late:
            _record_late(using, job_id, run["scheduled_for"], worker)  # type: ignore[index]
        return verdict


def _record_late(using: str, job_id: int, scheduled_for: datetime, worker: str) -> None:
    """The ledger's record of an occurrence the door refused as late (the first decision on
    an occurrence stands, as ``ledger.record`` keeps it)."""
    from ..lease.rules import LATE_DETAIL
    from ..ledger import record_one

    record_one(job_id, scheduled_for, Fate.LATE, LATE_DETAIL, worker, using)


def _admit_own_lease(
    using: str, now: datetime, runs: Any, job_id: int, worker: str, admission: str
) -> DoorVerdict:
    """The door of a run with its own lease (allow_all): ``lease.rules.run_door`` decides on
    the run row; the job row is only read."""
    from ..lease.rules import RunLease, StartDeadline, run_door, skipped_error

    job = (
        Job.objects.using(using)
        .filter(id=job_id)
        .values("state", "lease_seconds", "skip_late", "start_deadline")
        .first()
    )
    run = (
        runs.select_for_update()
        .values("status", "admission", "lease_expires_at", "scheduled_for", "attempt", "kind")
        .first()
    )
    decision = run_door(
        job and job["state"],
        RunLease(**run),
        admission,
        job["lease_seconds"] if job else 0,
        now,
        StartDeadline(job["skip_late"], job["start_deadline"]) if job else StartDeadline(),
    )
    if decision.start_run:
        changes: dict[str, Any] = {}
        if decision.fresh_lease:
            changes["lease_expires_at"] = now + timedelta(seconds=job["lease_seconds"])  # type: ignore[index]
        runs.update(
            status=RunStatus.RUNNING,
            started_at=Coalesce("started_at", Value(now)),
            worker=worker,
            admission=admission,
            **changes,
        )
    if decision.skip_run:
        runs.update(
            status=RunStatus.SKIPPED,
            finished_at=now,
            worker=worker,
            lease_expires_at=None,
            error=skipped_error(decision.verdict),
        )
    if decision.record_late:
        _record_late(using, job_id, run["scheduled_for"], worker)
    return DoorVerdict(decision.verdict)


def _renew(
    using: str, now: datetime, held: Sequence[tuple[int, int]]
) -> list[tuple[int, int, str]]:
    """Job leases as ``_renew_jobs``, runs with their own lease (allow_all) on their rows."""
    from ..lease.rules import RunLease, run_renewal

    with transaction.atomic(using=using):
        own = (
            {
                (row["job_id"], row["token"]): row
                for row in JobRun.objects.using(using)
                .select_for_update()
                .filter(pairs(held, "job_id"), own_lease=True)
                .values("job_id", "token", "status", "lease_expires_at", "stale", "started_at")
            }
            if held
            else {}
        )
        outcomes: dict[tuple[int, int], str] = {}
        for key, row in own.items():
            run = RunLease(
                row["status"],
                row["lease_expires_at"],
                stale=row["stale"],
                started=row["started_at"] is not None,
            )
            decision = run_renewal(run)
            if decision.extend_lease:
                lease = (
                    Job.objects.using(using)
                    .filter(id=key[0])
                    .values_list("lease_seconds", flat=True)
                    .first()
                    or 0
                )
                changes: dict[str, Any] = {"lease_expires_at": now + timedelta(seconds=lease)}
                if decision.heartbeat:
                    changes.update(heartbeats=F("heartbeats") + 1, heartbeat_at=now)
                JobRun.objects.using(using).filter(job_id=key[0], token=key[1]).update(**changes)
            outcomes[key] = decision.outcome
        rest = [key for key in held if key not in own]
        outcomes.update(((j, t), o) for j, t, o in _renew_jobs(using, now, rest))
    return [(*key, outcomes[key]) for key in held]


def _renew_jobs(
    using: str, now: datetime, held: Sequence[tuple[int, int]]
) -> list[tuple[int, int, str]]:
    """``schedapp_renew_leases_v6`` through the ORM: each outcome is ``lease.rules.renewal``'s.
    The rows are locked and waited for (never ``busy``: SQLite's one write lock is held)."""
    from ..lease.rules import LeaseRun, renewal, renews  # not at import: lease imports this

    if not held:
        return []
    with transaction.atomic(using=using):
        jobs = {
            (row["id"], row["token"]): row
            for row in Job.objects.using(using)
            .select_for_update()
            .filter(pairs(held))
            .values("id", "token", "state", "lease_expires_at", "lease_seconds")
        }
        renewed = {key for key in held if renews(_lease_job(jobs.get(key)), key[1])}
        for job_id, token in renewed:
            lease = timedelta(seconds=jobs[job_id, token]["lease_seconds"])
            Job.objects.using(using).filter(id=job_id).update(lease_expires_at=now + lease)
        if renewed:
            JobRun.objects.using(using).filter(
                pairs(renewed, "job_id"), status=RunStatus.RUNNING
            ).update(heartbeats=F("heartbeats") + 1, heartbeat_at=now)
        # read after the writes, as the function reads them: a run that just finished is
        # reported finished, not as a lost lease
        runs = {
            (j, t): LeaseRun(status, stale=stale, started=started is not None)
            for j, t, status, stale, started in JobRun.objects.using(using)
            .filter(pairs(held, "job_id"))
            .values_list("job_id", "token", "status", "stale", "started_at")
        }
    return [
        (*key, renewal(_lease_job(jobs.get(key)), runs.get(key), key[1]).outcome) for key in held
    ]


def _lease_job(row: dict[str, Any] | None) -> LeaseJob | None:
    """A job row as ``lease.rules`` reads it (None: not among the held (job, token) pairs)."""
    from ..lease.rules import LeaseJob

    if row is None:
        return None
    return LeaseJob(row["state"], row["token"], row["lease_expires_at"], row["lease_seconds"])


def _lag_row(minute: datetime | None, lags: list[float]) -> tuple[Any, ...]:
    """(minute, runs, p50, p95, max) as the PostgreSQL query's row: None for an empty group."""
    if not lags:
        return (minute, 0, None, None, None)
    ordered = sorted(lags)
    p50, p95 = _percentile(ordered, 0.5), _percentile(ordered, 0.95)
    return (minute, len(ordered), p50, p95, ordered[-1])


def _percentile(ordered: list[float], fraction: float) -> float:
    """PostgreSQL's ``percentile_cont``: linear between the two nearest ranks."""
    position = fraction * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
