"""The only place that writes lease state: claim, start, renew, complete, release, reap.

Vocabulary: a beat *claims* due jobs (lease + new fencing token + a run row, in one
transaction), a worker *starts* a run at its door, *renews* leases while it works and
*completes* the run; a beat *releases* claims it could not publish and *reaps* leases that
expired. Every write after a claim is fenced by ``(job_id, token)`` and its row count checked:
no row means the lease was lost, and nothing newer is ever overwritten.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import reduce
from operator import or_

from django.db import connection, transaction
from django.db.models import F, Q
from django.db.models.functions import Now

from . import metrics, policies
from .db import db_now, is_postgresql, notify_due
from .models import (
    ACTIVE_RUN_STATUSES,
    Job,
    JobRun,
    JobState,
    RunStatus,
    idempotency_key,
    task_id_for,
)
from .schedules import Interval, Once, Schedule, parse_cron

log = logging.getLogger("schedapp.claims")


@dataclass
class ClaimedRun:
    """One claimed job, ready to publish. ``args_json``/``kwargs_json`` are JSON text."""

    run_id: int
    job_id: int
    token: int
    task: str
    args_json: str
    kwargs_json: str
    queue: str
    scheduled_for: datetime
    due_at: datetime
    attempt: int
    lease_seconds: int
    lateness: float = 0.0  # seconds between due_at and the claim, in the database clock

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
    reaped: int = 0


def schedule_of(
    run_at: datetime | None, cron: str, timezone: str, interval: timedelta | None
) -> Schedule:
    """A stored job's schedule (already validated when it was written)."""
    if run_at is not None:
        return Once(run_at.astimezone(UTC))
    if cron:
        return parse_cron(cron, timezone)  # cached
    assert interval is not None
    return Interval(interval)


def job_schedule(job: Job) -> Schedule:
    return schedule_of(job.run_at, job.cron, job.timezone, job.interval)


# --- claim -----------------------------------------------------------------------------------

# The due slice, highest priority first, earliest first within a priority. A btree cannot
# deliver "priority DESC, next_run_at" restricted to next_run_at <= now() as one range, so we
# walk the distinct priority levels of the partial index (a loose index scan: one probe per
# level) and take a range scan of each level's due jobs, in order, until the batch is full.
# Rows are locked as they are read (SKIP LOCKED: other beats take the next ones); the
# MATERIALIZED CTE pins the chosen ids so the UPDATE cannot re-run the sub-select
# (PostgreSQL bug #15715). Claim, lease, fencing token and run rows: one statement.
# A CTE ``levels(priority)``: the distinct priority levels of scheduled jobs (overview.py uses
# it too).
DUE_LEVELS_SQL = """
    levels(priority) AS (
        (SELECT priority FROM schedapp_job WHERE state = 'scheduled'
         ORDER BY priority DESC LIMIT 1)
        UNION ALL
        SELECT (SELECT j.priority FROM schedapp_job j
                WHERE j.state = 'scheduled' AND j.priority < levels.priority
                ORDER BY j.priority DESC LIMIT 1)
        FROM levels WHERE levels.priority IS NOT NULL
    )"""

_CLAIM_SQL = f"""
WITH RECURSIVE {DUE_LEVELS_SQL},
due AS MATERIALIZED (
    SELECT d.id
    FROM (SELECT priority FROM levels WHERE priority IS NOT NULL
          ORDER BY priority DESC) AS l
    CROSS JOIN LATERAL (
        SELECT j.id FROM schedapp_job j
        WHERE j.state = 'scheduled' AND j.priority = l.priority AND j.next_run_at <= now()
        ORDER BY j.next_run_at
        LIMIT %(limit)s
        FOR UPDATE OF j SKIP LOCKED
    ) AS d
    LIMIT %(limit)s
),
claimed AS (
    UPDATE schedapp_job AS j
    SET state = 'running', token = j.token + 1, claimed_by = %(beat)s,
        lease_expires_at = now() + make_interval(secs => j.lease_seconds), updated_at = now()
    FROM due WHERE j.id = due.id
    RETURNING j.id, j.token, j.task, j.args::text AS args, j.kwargs::text AS kwargs, j.queue,
              j.scheduled_for, j.next_run_at, j.retry_count, j.lease_seconds, j.jitter,
              j.cron, j.timezone, j.interval, j.misfire_policy,
              j.misfire_max_catchup, j.priority,
              extract(epoch FROM now() - j.next_run_at)::float8 AS lateness,
              (j.run_at IS NULL AND j.retry_count = 0
               AND now() - j.next_run_at > j.misfire_grace) AS late
),
runs AS (
    INSERT INTO schedapp_jobrun (job_id, token, attempt, scheduled_for, due_at, claimed_by,
                                 dispatched_at, task_id, status, heartbeats, stale, worker,
                                 error, traceback)
    SELECT c.id, c.token, c.retry_count + 1, c.scheduled_for, c.next_run_at, %(beat)s, now(),
           'schedapp:' || c.id || ':' || c.token, 'dispatched', 0, false, '', '', ''
    FROM claimed c WHERE NOT c.late
    RETURNING id, job_id
)
SELECT r.id AS run_id, c.* FROM claimed c LEFT JOIN runs r ON r.job_id = c.id
ORDER BY c.priority DESC, c.next_run_at
"""

_NEXT_DUE_SQL = f"""
WITH RECURSIVE {DUE_LEVELS_SQL}
SELECT now(),
       (SELECT min(x.next_run_at) FROM levels l CROSS JOIN LATERAL (
            SELECT j.next_run_at FROM schedapp_job j
            WHERE j.state = 'scheduled' AND j.priority = l.priority
            ORDER BY j.next_run_at LIMIT 1) x
        WHERE l.priority IS NOT NULL),
       (SELECT lease_expires_at FROM schedapp_job WHERE state = 'running'
        ORDER BY lease_expires_at LIMIT 1)
"""


def claim_due_jobs(beat: str, limit: int, rng: policies.Rng = random.random) -> ClaimResult:
    """Claim up to ``limit`` due jobs for ``beat`` in ONE transaction; publish after it.

    Also reaps leases that expired, so their jobs are claimable again (in this same claim when
    they fit). Late recurring jobs get their misfire policy applied here: this is the one place
    that decides misfires.
    """
    result = ClaimResult()
    portable = not is_postgresql()
    with transaction.atomic():
        result.reaped = reap_expired_leases(limit, rng=rng)
        # PostgreSQL's claim statement reads now() itself; the portable path needs it here.
        now = db_now() if portable else None
        rows = _claim_portable(beat, limit, now) if now else _claim_postgresql(beat, limit)
        result.claimed = len(rows)
        late = [r for r in rows if r["late"]]
        ready = [r for r in rows if not r["late"]]
        if late and now is None:
            now = db_now()  # the transaction's time, the same as the claim's now()
        if portable:
            _insert_runs(beat, ready, now)  # type: ignore[arg-type]
        if late:
            result.skipped_misfires = _apply_misfires(beat, late, now, rng)  # type: ignore[arg-type]
            ready.extend(r for r in late if r.get("run_id"))
    result.runs = [_claimed_run(r) for r in ready]
    return result


def _claim_postgresql(beat: str, limit: int) -> list[dict]:
    with connection.cursor() as cursor:
        cursor.execute(_CLAIM_SQL, {"limit": limit, "beat": beat})
        names = [c.name for c in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


_CLAIM_FIELDS = (
    "id",
    "token",
    "task",
    "args",
    "kwargs",
    "queue",
    "scheduled_for",
    "next_run_at",
    "retry_count",
    "lease_seconds",
    "jitter",
    "run_at",
    "cron",
    "timezone",
    "interval",
    "misfire_policy",
    "misfire_max_catchup",
    "misfire_grace",
)


def _claim_portable(beat: str, limit: int, now: datetime) -> list[dict]:
    """The same claim through the ORM, for databases without the PostgreSQL path (SQLite,
    whose IMMEDIATE transactions serialise beats instead of SKIP LOCKED)."""
    rows = list(
        Job.objects.select_for_update(skip_locked=True)
        .filter(state=JobState.SCHEDULED, next_run_at__lte=now)
        .order_by("-priority", "next_run_at")
        .values(*_CLAIM_FIELDS)[:limit]
    )
    for row in rows:
        Job.objects.filter(id=row["id"], token=row["token"]).update(
            state=JobState.RUNNING,
            token=F("token") + 1,
            claimed_by=beat,
            lease_expires_at=now + timedelta(seconds=row["lease_seconds"]),
            updated_at=now,
        )
        row["token"] += 1
        row["args"] = json.dumps(row["args"])
        row["kwargs"] = json.dumps(row["kwargs"])
        row["lateness"] = (now - row["next_run_at"]).total_seconds()
        row["late"] = (
            row["run_at"] is None
            and row["retry_count"] == 0
            and now - row["next_run_at"] > row["misfire_grace"]
        )
    return rows


def _insert_runs(beat: str, rows: list[dict], now: datetime) -> None:
    if not rows:
        return
    runs = JobRun.objects.bulk_create(
        [
            JobRun(
                job_id=r["id"],
                token=r["token"],
                attempt=r["retry_count"] + 1,
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


def _apply_misfires(beat: str, rows: list[dict], now: datetime, rng: policies.Rng) -> int:
    """Apply each late job's misfire policy; returns how many were released without a run."""
    skipped = 0
    to_run: list[dict] = []
    for row in rows:
        schedule = schedule_of(None, row["cron"], row["timezone"], row["interval"])
        plan = policies.plan_misfire(
            schedule, row["scheduled_for"], now, row["misfire_policy"], row["misfire_max_catchup"]
        )
        log.info(
            "job %s missed %d occurrence(s) (policy %s)",
            row["id"],
            plan.missed,
            row["misfire_policy"],
            extra={"action": "misfire", "job": row["id"]},
        )
        if plan.run_for is None:
            assert plan.next_due is not None
            Job.objects.filter(id=row["id"], token=row["token"]).update(
                state=JobState.SCHEDULED,
                claimed_by="",
                lease_expires_at=None,
                scheduled_for=plan.next_due,
                next_run_at=plan.next_due + policies.compute_jitter(row["jitter"], rng),
                missed_runs=F("missed_runs") + plan.missed,
            )
            skipped += 1
            continue
        Job.objects.filter(id=row["id"], token=row["token"]).update(
            scheduled_for=plan.run_for, missed_runs=F("missed_runs") + plan.missed
        )
        row["scheduled_for"] = plan.run_for
        to_run.append(row)
    _insert_runs(beat, to_run, now)
    return skipped


def _claimed_run(row: dict) -> ClaimedRun:
    return ClaimedRun(
        run_id=row["run_id"],
        job_id=row["id"],
        token=row["token"],
        task=row["task"],
        args_json=row["args"],
        kwargs_json=row["kwargs"],
        queue=row["queue"],
        scheduled_for=row["scheduled_for"],
        due_at=row["next_run_at"],
        attempt=row["retry_count"] + 1,
        lease_seconds=row["lease_seconds"],
        lateness=row["lateness"],
    )


def seconds_until_due() -> tuple[datetime, float] | None:
    """The database's now, and seconds from it until the next due job or lease expiry."""
    if is_postgresql():
        with connection.cursor() as cursor:
            cursor.execute(_NEXT_DUE_SQL)
            now, next_due, next_expiry = cursor.fetchone()
    else:
        now = db_now()
        next_due = (
            Job.objects.filter(state=JobState.SCHEDULED)
            .order_by("next_run_at")
            .values_list("next_run_at", flat=True)
            .first()
        )
        next_expiry = (
            Job.objects.filter(state=JobState.RUNNING)
            .order_by("lease_expires_at")
            .values_list("lease_expires_at", flat=True)
            .first()
        )
    times = [t for t in (next_due, next_expiry) if t is not None]
    if not times:
        return None
    return now, max(0.0, (min(times) - now).total_seconds())


# --- after publishing ------------------------------------------------------------------------


def _pairs(
    claims: Iterable[tuple[int, int]], job_field: str = "id", token_field: str = "token"
) -> Q:
    return reduce(or_, (Q(**{job_field: j, token_field: t}) for j, t in claims), Q(pk__in=[]))


def release_claims(claims: Sequence[tuple[int, int]], reason: str) -> int:
    """Give back claims whose messages could not be published, so they are claimed again.

    The token is bumped: if a message did reach the broker after all, it is stale at the door.
    """
    if not claims:
        return 0
    with transaction.atomic():
        JobRun.objects.filter(_pairs(claims, "job_id"), status=RunStatus.DISPATCHED).update(
            status=RunStatus.LOST, finished_at=Now(), error=f"not published: {reason}"
        )
        return Job.objects.filter(_pairs(claims), state=JobState.RUNNING).update(
            state=JobState.SCHEDULED, token=F("token") + 1, claimed_by="", lease_expires_at=None
        )


# --- reaping -------------------------------------------------------------------------------


def reap_expired_leases(limit: int, rng: policies.Rng = random.random) -> int:
    """Make jobs whose lease expired claimable again, marking their runs ``lost``.

    A run that had started counts as a failed attempt (so a task that kills its worker every
    time ends dead instead of looping); one that never started (a beat died between claim and
    publish, a broker lost the message) is simply dispatched again.
    """
    with transaction.atomic(savepoint=False):
        return _reap(limit, rng)


def _reap(limit: int, rng: policies.Rng) -> int:
    expired = list(
        Job.objects.select_for_update(skip_locked=True)
        .filter(state=JobState.RUNNING, lease_expires_at__lt=Now())
        .order_by("lease_expires_at")[:limit]
    )
    if not expired:
        return 0
    started = set(
        JobRun.objects.filter(
            _pairs(((j.id, j.token) for j in expired), "job_id"), status=RunStatus.RUNNING
        ).values_list("job_id", flat=True)
    )
    JobRun.objects.filter(
        _pairs(((j.id, j.token) for j in expired), "job_id"), status__in=ACTIVE_RUN_STATUSES
    ).update(
        status=RunStatus.LOST,
        finished_at=Now(),
        error="lease expired: the worker or beat holding it stopped renewing it",
    )
    not_started = [j.id for j in expired if j.id not in started]
    if not_started:
        Job.objects.filter(id__in=not_started).update(
            state=JobState.SCHEDULED, token=F("token") + 1, claimed_by="", lease_expires_at=None
        )
    for job in expired:
        if job.id in started:
            plan = policies.plan_after_failure(_facts(job), rng=rng)
            _write_after_run(
                job.id,
                job.token,
                plan,
                status=RunStatus.LOST,
                error="lease expired while running",
                bump_token=True,
            )
            metrics.run_finished(RunStatus.LOST, dead=plan.dead)
    metrics.lease_expired(len(expired))
    log.warning(
        "reaped %d expired lease(s) (%d had started)",
        len(expired),
        len(started),
        extra={"action": "reap", "count": len(expired)},
    )
    return len(expired)


# --- worker side -----------------------------------------------------------------------------

START_OK = "started"


def start_run(job_id: int, token: int, worker: str) -> str:
    """The door: mark the run started if its claim is still current; else say why not.

    Only a ``dispatched`` run of the job's current token starts, so a broker redelivery of a
    message whose run already started elsewhere, or a message older than the job's latest
    claim, is not executed.
    """
    started = JobRun.objects.filter(
        job_id=job_id,
        token=token,
        status=RunStatus.DISPATCHED,
        job__token=token,
        job__state=JobState.RUNNING,
    ).update(status=RunStatus.RUNNING, started_at=Now(), worker=worker)
    if started:
        return START_OK
    run = JobRun.objects.filter(job_id=job_id, token=token).values("status").first()
    job = Job.objects.filter(id=job_id).values("token", "state").first()
    if run is None or job is None:
        return "unknown run"
    if run["status"] != RunStatus.DISPATCHED:
        return f"run already {run['status']}"
    reason = "stale token" if job["token"] != token else f"job is {job['state']}"
    with transaction.atomic():
        JobRun.objects.filter(job_id=job_id, token=token, status=RunStatus.DISPATCHED).update(
            status=RunStatus.SKIPPED,
            finished_at=Now(),
            worker=worker,
            error=f"delivered but not executed: {reason}",
        )
        # A message refused because the job was paused gives its lease back, so that resume
        # makes the job claimable at once instead of after the lease expires.
        Job.objects.filter(id=job_id, token=token, state=JobState.PAUSED).update(
            claimed_by="", lease_expires_at=None
        )
    return reason


def renew_leases(held: Sequence[tuple[int, int, int]]) -> set[tuple[int, int]]:
    """Extend the leases ``(job_id, token, lease_seconds)`` a worker holds; return those that
    are still its own. One statement per distinct lease length, not one per task."""
    if not held:
        return set()
    by_lease: dict[int, list[tuple[int, int]]] = {}
    for job_id, token, lease in held:
        by_lease.setdefault(lease, []).append((job_id, token))
    pairs = [(j, t) for j, t, _ in held]
    with transaction.atomic():
        for lease, claims in by_lease.items():
            Job.objects.filter(
                _pairs(claims),
                state__in=[JobState.RUNNING, JobState.PAUSED],
                lease_expires_at__isnull=False,
            ).update(lease_expires_at=Now() + timedelta(seconds=lease))
        renewed = set(
            Job.objects.filter(_pairs(pairs), lease_expires_at__isnull=False).values_list(
                "id", "token"
            )
        )
        if renewed:
            JobRun.objects.filter(_pairs(renewed, "job_id"), status=RunStatus.RUNNING).update(
                heartbeats=F("heartbeats") + 1, heartbeat_at=Now()
            )
    return renewed


SUCCEEDED = "succeeded"
FAILED = "failed"


def complete_run(
    job_id: int,
    token: int,
    outcome: str,
    *,
    error: str = "",
    traceback: str = "",
    retry_delay: timedelta | None = None,
    rng: policies.Rng = random.random,
) -> bool:
    """Record a run's outcome and move its job on; returns False if the completion was stale.

    A stale completion (the job was reclaimed since, or cancelled) is recorded on its run,
    flagged ``stale``, and never touches the job.
    """
    with transaction.atomic():
        job = Job.objects.select_for_update().filter(id=job_id, token=token).first()
        stale = job is None
        JobRun.objects.filter(job_id=job_id, token=token).update(
            status=outcome,
            finished_at=Now(),
            error=error[:10000],
            traceback=traceback[:50000],
            stale=stale,
        )
        if job is None:
            metrics.run_finished(outcome, stale=True)
            log.warning(
                "stale completion of job %s token %s: not applied",
                job_id,
                token,
                extra={"action": "stale_completion", "job": job_id, "token": token},
            )
            return False
        if outcome == SUCCEEDED:
            plan = policies.plan_after_success(_facts(job), rng=rng)
        else:
            plan = policies.plan_after_failure(_facts(job), delay=retry_delay, rng=rng)
        _write_after_run(job_id, token, plan, status=outcome, error=error)
    metrics.run_finished(outcome, dead=plan.dead)
    if plan.dead:
        log.error(
            "job %s is dead after %d attempt(s): %s",
            job_id,
            job.retry_count + 1,
            error.splitlines()[0] if error else "",
            extra={"action": "dead", "job": job_id},
        )
    return True


def _facts(job: Job) -> policies.JobFacts:
    return policies.JobFacts(
        schedule=job_schedule(job),
        state=job.state,
        scheduled_for=job.scheduled_for or job.next_run_at,  # type: ignore[arg-type]
        retry_count=job.retry_count,
        max_retries=job.max_retries,
        retry_backoff=job.retry_backoff,
        retry_backoff_max=job.retry_backoff_max,
        jitter=job.jitter,
    )


def _write_after_run(
    job_id: int,
    token: int,
    plan: policies.AfterRun,
    *,
    status: str,
    error: str = "",
    bump_token: bool = False,
) -> None:
    next_run_at = (Now() + plan.delay) if plan.delay is not None else plan.next_run_at
    changes = {
        "state": plan.state,
        "scheduled_for": plan.scheduled_for,
        "next_run_at": next_run_at,
        "retry_count": plan.retry_count,
        "claimed_by": "",
        "lease_expires_at": None,
        "last_run_at": Now(),
        "last_status": status,
        "updated_at": Now(),
    }
    if status != SUCCEEDED:
        changes["last_error"] = error[:10000]
    if bump_token:
        changes["token"] = F("token") + 1
    updated = Job.objects.filter(id=job_id, token=token).update(**changes)
    assert updated == 1, "the row is locked by this transaction"
    if plan.state == JobState.SCHEDULED:
        # Beats sleep until the next due time they know of; this one may be sooner.
        notify_due(plan.next_run_at, plan.delay.total_seconds() if plan.delay else None)


def record_cancelled(job_id: int, token: int, *, terminated: bool) -> None:
    """A schedapp task was revoked. After ``api.cancel`` (which bumped the token) only the run
    is closed; a revoke from elsewhere (``celery control revoke``) counts as a failed attempt,
    so the job is retried or dead-lettered instead of waiting for its lease to expire."""
    how = "revoked and terminated" if terminated else "revoked"
    current = Job.objects.filter(id=job_id, token=token, state=JobState.RUNNING).exists()
    if current:
        complete_run(job_id, token, FAILED, error=f"task {how} outside schedapp")
        JobRun.objects.filter(job_id=job_id, token=token).update(status=RunStatus.CANCELLED)
        return
    metrics.run_finished("cancelled")
    JobRun.objects.filter(job_id=job_id, token=token, status__in=ACTIVE_RUN_STATUSES).update(
        status=RunStatus.CANCELLED, finished_at=Now(), error=f"cancelled ({how})"
    )
