"""What an operator asks first: how many jobs in each state, how far behind are we, who is alive.

Shared by the admin's overview page and ``manage.py schedapp_status``. Every query here is
bounded, so the page stays fast with millions of jobs and runs:

* counts by state: one ``GROUP BY state`` over the ``(state, task)`` index;
* the due backlog: one range of the due partial index per priority level (ten at most),
  counted up to ``BACKLOG_CAP`` (shown as "100,000+" beyond);
* dispatch lag: computed from the newest ``LAG_SAMPLE`` runs (read backwards on the primary
  key), restricted to the last ``window`` minutes, so a busy history costs the same as an idle
  one;
* beats and workers: the ``Node`` rows refreshed in the last ``NODE_FRESH_SECONDS``;
* queues no live worker consumes from: the queues of the newest ``QUEUE_SAMPLE`` jobs (their
  own queue, else their task's routing, as the beat would publish them) that are scheduled or
  running, minus the queues the live workers record in their node row.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count
from django.db.models.functions import Now

from .celeryapp import celery_app
from .db import db_now
from .dispatch import Dispatcher
from .models import Job, JobState, Node
from .store import get_store

BACKLOG_CAP = 100_000
LAG_SAMPLE = 20_000
NODE_FRESH_SECONDS = 60
LAG_WINDOW_MINUTES = 5
QUEUE_SAMPLE = 20_000


@dataclass(frozen=True)
class Lag:
    """Dispatch lag in seconds over a window: how late beats publish what is due."""

    label: str
    runs: int
    p50: float | None
    p95: float | None
    max: float | None


@dataclass(frozen=True)
class NodeInfo:
    name: str
    kind: str
    hostname: str
    pid: int | None
    started_at: datetime
    last_seen_at: datetime
    age_seconds: float
    stats: dict[str, Any]


@dataclass(frozen=True)
class UnconsumedQueue:
    """A queue jobs are published to that no live worker takes messages from."""

    name: str
    jobs: int  # scheduled or running jobs targeting it, among the newest QUEUE_SAMPLE
    tasks: list[str]


@dataclass
class Overview:
    now: datetime
    counts: dict[str, int]
    total: int
    backlog: int
    backlog_capped: bool
    oldest_due: datetime | None
    expired_leases: int
    lag: Lag | None
    lag_by_minute: list[Lag] = field(default_factory=list)
    beats: list[NodeInfo] = field(default_factory=list)
    workers: list[NodeInfo] = field(default_factory=list)
    recent_statuses: dict[str, int] = field(default_factory=dict)
    unconsumed_queues: list[UnconsumedQueue] = field(default_factory=list)

    @property
    def dead(self) -> int:
        return self.counts.get(JobState.DEAD, 0)

    @property
    def oldest_due_seconds(self) -> float | None:
        """How long the oldest due job has waited (None when nothing is due)."""
        if self.oldest_due is None or self.oldest_due > self.now:
            return None
        return (self.now - self.oldest_due).total_seconds()

    def as_dict(self) -> dict[str, Any]:
        """A JSON-friendly form, for ``schedapp_status --json`` and monitoring scripts."""

        def lag(value: Lag | None) -> dict[str, Any] | None:
            return None if value is None else value.__dict__

        def node(n: NodeInfo) -> dict[str, Any]:
            return {
                **n.__dict__,
                "started_at": n.started_at.isoformat(),
                "last_seen_at": n.last_seen_at.isoformat(),
            }

        return {
            "now": self.now.isoformat(),
            "counts": self.counts,
            "total": self.total,
            "backlog": self.backlog,
            "backlog_capped": self.backlog_capped,
            "oldest_due": self.oldest_due.isoformat() if self.oldest_due else None,
            "oldest_due_seconds": self.oldest_due_seconds,
            "expired_leases": self.expired_leases,
            "dead": self.dead,
            "lag": lag(self.lag),
            "lag_by_minute": [lag(m) for m in self.lag_by_minute],
            "beats": [node(n) for n in self.beats],
            "workers": [node(n) for n in self.workers],
            "recent_statuses": self.recent_statuses,
            "unconsumed_queues": [q.__dict__ for q in self.unconsumed_queues],
        }


def state_counts() -> dict[str, int]:
    """Jobs per state, every state present (zero when none)."""
    counts = {state: 0 for state in JobState.values}
    # COUNT(*), not COUNT(id): an index-only scan of the (state, task) index suffices.
    for row in Job.objects.order_by().values("state").annotate(n=Count("*")):
        counts[row["state"]] = row["n"]
    return counts


def backlog(cap: int = BACKLOG_CAP) -> tuple[int, datetime | None]:
    """(scheduled jobs already due, counted up to ``cap``; the oldest next_run_at)."""
    return get_store().backlog(cap)


def dispatch_lag(
    minutes: int = LAG_WINDOW_MINUTES, sample: int = LAG_SAMPLE
) -> tuple[Lag | None, list[Lag]]:
    """(lag over the whole window, lag per minute), from the newest ``sample`` runs."""
    rows = get_store().dispatch_lag(minutes, sample)
    total: Lag | None = None
    per_minute: list[Lag] = []
    for minute, runs, p50, p95, worst in rows:
        value = Lag(
            label=f"{minute:%H:%M}" if minute else f"last {minutes} min",
            runs=int(runs),
            p50=_float(p50),
            p95=_float(p95),
            max=_float(worst),
        )
        if minute is None:
            total = value
        else:
            per_minute.append(value)
    return total, per_minute


def recent_statuses(minutes: int = LAG_WINDOW_MINUTES, sample: int = LAG_SAMPLE) -> dict[str, int]:
    """Runs claimed in the last ``minutes`` by status (from the newest ``sample`` runs)."""
    return get_store().recent_statuses(minutes, sample)


def live_nodes(now: datetime, fresh_seconds: int = NODE_FRESH_SECONDS) -> list[NodeInfo]:
    """Beats and workers that refreshed their row recently (in the database's clock)."""
    rows = Node.objects.filter(last_seen_at__gte=now - timedelta(seconds=fresh_seconds))
    return [
        NodeInfo(
            name=n.name,
            kind=n.kind,
            hostname=n.hostname,
            pid=n.pid,
            started_at=n.started_at,
            last_seen_at=n.last_seen_at,
            age_seconds=max(0.0, (now - n.last_seen_at).total_seconds()),
            stats=n.stats or {},
        )
        for n in rows.order_by("kind", "name")[:500]
    ]


def targeted_queues(sample: int = QUEUE_SAMPLE) -> dict[str, dict[str, int]]:
    """{queue: {task: jobs}} for the scheduled or running jobs among the newest ``sample``
    (one bounded read backwards on the primary key). A job's queue is its own, else where
    its task routes, resolved as the beat's publisher resolves it."""
    oldest = Job.objects.order_by("-id").values_list("id", flat=True)[sample - 1 : sample]
    recent = Job.objects.filter(state__in=(JobState.SCHEDULED, JobState.RUNNING))
    if oldest:
        recent = recent.filter(id__gte=oldest[0])
    rows = recent.values_list("task", "queue").annotate(n=Count("id")).order_by()
    router = Dispatcher(celery_app())
    targeted: dict[str, dict[str, int]] = {}
    for task, queue, count in rows:
        try:
            route = router.route(task, queue)
        except Exception:  # a router that raises: the beat quarantines such jobs itself
            continue
        name = route.queue.name if route.queue is not None else route.routing_key
        per_task = targeted.setdefault(name, {})
        per_task[task] = per_task.get(task, 0) + int(count)
    return targeted


def unconsumed_queues(
    workers: list[NodeInfo], targeted: dict[str, dict[str, int]]
) -> list[UnconsumedQueue]:
    """The targeted queues that none of ``workers`` consumes from (by the queues each
    recorded; a worker that records none, from an older version, consumes nothing here)."""
    consumed = {q for w in workers for q in w.stats.get("queues") or ()}
    return [
        UnconsumedQueue(name=name, jobs=sum(tasks.values()), tasks=sorted(tasks))
        for name, tasks in sorted(targeted.items())
        if name not in consumed
    ]


def expired_leases() -> int:
    """Running jobs whose lease has expired and that no beat has reaped yet (a partial index)."""
    return (
        Job.objects.filter(state=JobState.RUNNING, lease_expires_at__lt=Now())
        .order_by()
        .values("id")[:BACKLOG_CAP]
        .count()
    )


def collect(minutes: int = LAG_WINDOW_MINUTES) -> Overview:
    """Everything the overview page and the status command show, in a handful of queries."""
    now = db_now()
    counts = state_counts()
    due, oldest = backlog()
    total_lag, per_minute = dispatch_lag(minutes)
    nodes = live_nodes(now)
    workers = [n for n in nodes if n.kind == Node.Kind.WORKER]
    return Overview(
        now=now,
        counts=counts,
        total=sum(counts.values()),
        backlog=due,
        backlog_capped=due >= BACKLOG_CAP,
        oldest_due=oldest,
        expired_leases=expired_leases(),
        lag=total_lag,
        lag_by_minute=per_minute,
        beats=[n for n in nodes if n.kind == Node.Kind.BEAT],
        workers=workers,
        recent_statuses=recent_statuses(minutes),
        unconsumed_queues=unconsumed_queues(workers, targeted_queues()),
    )


def _float(value: Any) -> float | None:
    return None if value is None else round(float(value), 3)
