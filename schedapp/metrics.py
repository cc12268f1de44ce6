"""Prometheus metrics for beats and workers, and two ways to expose them.

Beats and worker hooks call the small functions below (``claimed``, ``dispatched``,
``run_finished`` ...); each is a few counter increments, safe to call on every tick.

Exposition:

* ``SCHEDAPP_METRICS_PORT`` + ``start_metrics_server()``: an HTTP endpoint in the beat or in
  the worker's main process (``prometheus_client.start_http_server``).
* ``schedapp.views.metrics``: a Django view. Besides this process's metrics it reports gauges
  read from the database at scrape time (jobs by state, due backlog, age of the oldest due
  job, live beats and workers), i.e. the whole fleet's view, whatever process serves it.

Prefork workers: completions are recorded in the pool's child processes, whose counters the
main process cannot see. Set ``PROMETHEUS_MULTIPROC_DIR`` to an empty directory (per host,
wiped before the worker starts): prometheus_client then writes every process's values there
and the endpoint aggregates them (``MultiProcessCollector``). Beats are single processes and
need nothing.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from collections.abc import Iterable, Iterator
from typing import Any

try:  # schedapp[metrics]; without it every metric below is a no-op
    import prometheus_client
except ImportError:
    prometheus_client = None  # type: ignore[assignment]

from . import overview, signals
from .conf import get_settings

log = logging.getLogger("schedapp.metrics")

AVAILABLE = prometheus_client is not None


class MetricsUnavailable(RuntimeError):
    """prometheus-client is not installed: there is nothing to expose."""


class _NoMetric:
    """Stands in for every metric when prometheus-client is missing: beats and workers call
    the same functions whether or not anyone can scrape them."""

    def labels(self, *args: Any, **kwargs: Any) -> _NoMetric:
        return self

    def inc(self, amount: float = 1) -> None:
        pass

    def observe(self, amount: float) -> None:
        pass

    def set(self, value: float) -> None:
        pass


def _metric(kind: str, name: str, doc: str, labels: tuple[str, ...] = (), **options: Any) -> Any:
    if prometheus_client is None:
        return _NoMetric()
    return getattr(prometheus_client, kind)(name, doc, labels, **options)


# Open breaches are counted per tag for the most common tags only: a label value per tag, not
# per job, and at most this many (the rest summed as "_other"), so a fleet with thousands of
# tags does not make thousands of series.
MAX_TAG_LABELS = 30

LAG_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)

CLAIMS = _metric("Counter", "schedapp_claims", "Jobs claimed by beats (leases taken).")
DISPATCHES = _metric("Counter", "schedapp_dispatches", "Runs published to the broker.")
PUBLISH_FAILURES = _metric(
    "Counter", "schedapp_publish_failures", "Runs whose publish failed; their claims were released."
)
DISPATCH_LAG = _metric(
    "Histogram",
    "schedapp_dispatch_lag_seconds",
    "Seconds from a run being due to its publication.",
    buckets=LAG_BUCKETS,
)
LEASE_EXPIRIES = _metric(
    "Counter",
    "schedapp_lease_expiries",
    "Expired leases reaped by beats (a worker or beat stopped renewing).",
)
MISFIRES_SKIPPED = _metric(
    "Counter", "schedapp_misfires_skipped", "Missed occurrences skipped by the misfire policy."
)
DOOR_SKIPS = _metric(
    "Counter",
    "schedapp_door_skips",
    "Deliveries refused at the worker's door (stale token, job state).",
    ("reason",),
)
RUNS_FINISHED = _metric(
    "Counter", "schedapp_runs_finished", "Runs that finished, by status.", ("status",)
)
STALE_COMPLETIONS = _metric(
    "Counter",
    "schedapp_stale_completions",
    "Completions that arrived after their lease was lost (not applied).",
)
BREACHES = _metric(
    "Counter",
    "schedapp_breaches",
    "Deadline breaches recorded (one per incident), by kind.",
    ("kind",),
)
RECOVERIES = _metric(
    "Counter", "schedapp_breach_recoveries", "Breaches that ended, by kind.", ("kind",)
)
BREACHES_BY_TAG = _metric(
    "Counter",
    "schedapp_breaches_by_tag",
    f"Deadline breaches recorded, by kind and tag (the first {MAX_TAG_LABELS} tags this "
    'process met, the rest as _other; a job counts under each of its tags, untagged under "").',
    ("kind", "tag"),
)
NOTIFICATION_OUTCOMES = ("sent", "failed")  # the values of its outcome label
NOTIFICATIONS = _metric(
    "Counter",
    "schedapp_notifications",
    "Notification events by channel, kind and outcome: sent (carried by a message the channel "
    "took) or failed (given up after the channel's max_attempts).",
    ("channel", "kind", "outcome"),
)
NOTIFICATION_SEND_FAILURES = _metric(
    "Counter",
    "schedapp_notification_send_failures",
    "Messages a channel did not take (an HTTP status, a timeout, an SMTP error), each attempt.",
    ("channel",),
)
DEAD_LETTERS = _metric("Counter", "schedapp_dead_letters", "Jobs that exhausted their retries.")
FAILED_OCCURRENCES = _metric(
    "Counter",
    "schedapp_failed_occurrences",
    "Occurrences given up with their retries spent, the job going on with its next one "
    "(when_retries_exhausted=next_occurrence).",
)
HEARTBEATS = _metric(
    "Counter", "schedapp_heartbeats", "Heartbeats recorded, by node kind.", ("kind",)
)
LEASES_RENEWED = _metric(
    "Counter", "schedapp_leases_renewed", "Leases renewed by worker heartbeats."
)
LEASES_LOST = _metric(
    "Counter",
    "schedapp_leases_lost",
    "Leases found lost at renewal (the job was reclaimed or cancelled).",
)
BEAT_TICKS = _metric("Counter", "schedapp_beat_ticks", "Beat ticks (claim, publish, sleep).")
BEAT_TICK_SECONDS = _metric(
    "Histogram",
    "schedapp_beat_tick_seconds",
    "Duration of one beat tick's work.",
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30),
)
QUARANTINED = _metric(
    "Counter",
    "schedapp_quarantined",
    "Jobs set aside as dead because a beat or worker could not understand them.",
    ("where",),
)
BEAT_ERRORS = _metric(
    "Counter",
    "schedapp_beat_errors",
    "Beat ticks that failed (database or broker unreachable, or an unexpected error); the "
    "beat backs off and goes on.",
    ("kind",),
)
BEAT_LAST_TICK = _metric(
    "Gauge",
    "schedapp_beat_last_tick_timestamp_seconds",
    "Unix time of the last beat tick in this process.",
    multiprocess_mode="max",
)


# --- what beats and workers call ---------------------------------------------------------


def claimed(count: int, *, misfires_skipped: int = 0) -> None:
    """After ``lease.claim_due_jobs``: claims taken, misfires skipped."""
    if count:
        CLAIMS.inc(count)
    if misfires_skipped:
        MISFIRES_SKIPPED.inc(misfires_skipped)


def reaped(expired: int, *, started: int = 0, dead: int = 0, carried_on: int = 0) -> None:
    """Leases reaped: ``started`` of them had a run executing (a failed attempt), ``dead``
    exhausted their job's retries, ``carried_on`` exhausted them and went on with their job's
    next occurrence."""
    if expired:
        LEASE_EXPIRIES.inc(expired)
    if started:
        RUNS_FINISHED.labels(status="lost").inc(started)
    if dead:
        DEAD_LETTERS.inc(dead)
    if carried_on:
        FAILED_OCCURRENCES.inc(carried_on)


def quarantined(count: int, where: str) -> None:
    """Jobs set aside as dead (``where``: beat or worker)."""
    if count:
        QUARANTINED.labels(where=where).inc(count)


def beat_error(kind: str) -> None:
    """A failed tick: ``database``, ``broker`` or ``unexpected``."""
    BEAT_ERRORS.labels(kind=kind).inc()


def dispatched(count: int, lags_seconds: Iterable[float] = ()) -> None:
    """After publishing: how many, and each run's lag (publish time minus due time)."""
    if count:
        DISPATCHES.inc(count)
    for lag in lags_seconds:
        DISPATCH_LAG.observe(max(0.0, float(lag)))


def publish_failed(count: int) -> None:
    if count:
        PUBLISH_FAILURES.inc(count)


def door_skipped(reason: str) -> None:
    """A delivery refused by the worker's door; ``reason`` is a short fixed word
    (``stale_token``, ``job_state``, ``error``) so the label set stays small."""
    DOOR_SKIPS.labels(reason=reason).inc()


def run_finished(
    status: str, *, stale: bool = False, dead: bool = False, carried_on: bool = False
) -> None:
    """A completion: ``status`` is the run's (succeeded, failed, lost, cancelled); ``dead``:
    its job went dead, ``carried_on``: its occurrence was given up and the job went on."""
    RUNS_FINISHED.labels(status=status).inc()
    if stale:
        STALE_COMPLETIONS.inc()
    if dead:
        DEAD_LETTERS.inc()
    if carried_on:
        FAILED_OCCURRENCES.inc()


def heartbeat(kind: str, *, renewed: int = 0, lost: int = 0) -> None:
    """A beat's or worker's heartbeat; for workers, the leases it renewed and found lost."""
    HEARTBEATS.labels(kind=kind).inc()
    if renewed:
        LEASES_RENEWED.inc(renewed)
    if lost:
        LEASES_LOST.inc(lost)


def beat_tick(seconds: float, at: float) -> None:
    """One beat tick's work took ``seconds``; ``at`` is its Unix time."""
    BEAT_TICKS.inc()
    BEAT_TICK_SECONDS.observe(max(0.0, seconds))
    BEAT_LAST_TICK.set(at)


# --- exposition --------------------------------------------------------------------------


def multiprocess_dir() -> str | None:
    return (
        os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        or os.environ.get("prometheus_multiproc_dir")
        or None
    )


def process_registry() -> Any:
    """The registry to expose: all processes of this host in multiprocess mode, else ours."""
    if prometheus_client is None:
        raise MetricsUnavailable(
            "prometheus-client is not installed: pip install 'schedapp[metrics]'"
        )
    if multiprocess_dir():
        from prometheus_client import multiprocess

        registry = prometheus_client.CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return registry
    return prometheus_client.REGISTRY


def process_exited(pid: int) -> None:
    """Call from ``worker_process_shutdown`` in multiprocess mode (drops live gauges)."""
    if prometheus_client is not None and multiprocess_dir():
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid)


def own_files_in_children() -> None:
    """In multiprocess mode, have each child this process forks (a prefork pool process, the
    beat of ``celery worker -B``) take metric files of its own at once, while the
    descriptors it inherited are still open.

    prometheus_client does it at the child's first metric, closing the parent's files; in
    the beat of ``celery worker -B``, Celery has closed every inherited descriptor by then,
    so closing them raised, left prometheus_client's files half closed, and the beat died at
    its first metric. Call it in the process that forks (the worker's main process)."""
    if prometheus_client is None or not multiprocess_dir():
        return
    parent = os.getpid()

    def own_files() -> None:
        if os.getppid() == parent:  # not the children's own children
            try:
                BEAT_TICKS.inc(0)  # any metric: prometheus_client sees the new pid
            except Exception as exc:  # metrics never stop a process
                log.warning("metrics files not reopened after fork: %s", exc)

    os.register_at_fork(after_in_child=own_files)


# What to do when the port is taken, said where it happens (operations.md says it too).
PORT_TAKEN = (
    ". Another process on this host serves that port: each beat and each worker serves its "
    "own metrics, so two of them on one host (a beat and a worker, or two workers) need two "
    "ports. Give each process its own SCHEDAPP_METRICS_PORT (read it from an environment "
    "variable set per process), or leave it unset and scrape schedapp.views.metrics. This "
    "process runs on without a metrics server"
)


def warn_if_pool_unaggregated(pool: Any) -> bool:
    """Say so (once, at worker start) when a prefork worker serves metrics without
    ``PROMETHEUS_MULTIPROC_DIR``: its pool processes count the runs they finish, and without
    the directory the worker's endpoint cannot see their counts, so the runs finished, dead
    letters and stale completions it shows stay at 0. True if it warned."""
    port = metrics_port()
    if not port or prometheus_client is None or multiprocess_dir() or not _is_prefork(pool):
        return False
    log.warning(
        "this worker's prefork pool processes count the runs they finish, and "
        "PROMETHEUS_MULTIPROC_DIR is not set: the metrics it serves on port %s will not show "
        "them (schedapp_runs_finished_total, schedapp_dead_letters_total, "
        "schedapp_stale_completions_total stay at 0). Set PROMETHEUS_MULTIPROC_DIR to an empty "
        "directory of this host, wiped before the worker starts.",
        port,
        extra={"action": "metrics_unaggregated"},
    )
    return True


def _is_prefork(pool: Any) -> bool:
    """Whether ``pool`` (a worker's pool: an alias, a class or its path) is Celery's prefork."""
    if isinstance(pool, str):
        name = pool.partition(":")[0]
        return name in ("prefork", "processes") or name.startswith("celery.concurrency.prefork")
    from celery.concurrency.prefork import TaskPool

    return isinstance(pool, type) and issubclass(pool, TaskPool)


def metrics_port() -> int | None:
    port = get_settings().METRICS_PORT
    return int(port) if port else None


_server_started: list[int] = []


def start_metrics_server(port: int | None = None, addr: str = "0.0.0.0") -> bool:
    """Serve this process's metrics on ``port`` (default ``SCHEDAPP_METRICS_PORT``).

    Returns False (and logs) if no port is configured, the server already runs, the port
    is taken or prometheus-client is missing (the ``schedapp`` system checks report that):
    metrics never stop a beat or a worker from starting.
    """
    port = port if port is not None else metrics_port()
    if not port or _server_started:
        return False
    if prometheus_client is None:
        log.warning(
            "metrics server not started on port %s: prometheus-client is not installed "
            "(pip install 'schedapp[metrics]')",
            port,
            extra={"action": "metrics_failed"},
        )
        return False
    try:
        prometheus_client.start_http_server(port, addr=addr, registry=process_registry())
    except OSError as exc:
        log.warning(
            "metrics server not started on %s:%s: %s%s",
            addr,
            port,
            exc,
            PORT_TAKEN if exc.errno == errno.EADDRINUSE else "",
            extra={"action": "metrics_failed"},
        )
        return False
    _server_started.append(port)
    log.info("metrics on http://%s:%s/metrics", addr, port, extra={"action": "metrics_started"})
    return True


class FleetCollector:
    """Gauges read from the database at scrape time: the same for every process."""

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        data = overview.collect()
        jobs = GaugeMetricFamily("schedapp_jobs", "Jobs by state.", labels=["state"])
        for state, count in data.counts.items():
            jobs.add_metric([state], count)
        yield jobs
        yield GaugeMetricFamily(
            "schedapp_due_backlog", "Scheduled jobs already due (capped count).", value=data.backlog
        )
        yield GaugeMetricFamily(
            "schedapp_oldest_due_seconds",
            "How long the oldest due job has waited (0 if none).",
            value=data.oldest_due_seconds or 0.0,
        )
        yield GaugeMetricFamily(
            "schedapp_expired_leases",
            "Running jobs whose lease expired, not yet reaped.",
            value=data.expired_leases,
        )
        nodes = GaugeMetricFamily(
            "schedapp_nodes_alive", "Beats and workers seen in the last minute.", labels=["kind"]
        )
        nodes.add_metric(["beat"], len(data.beats))
        nodes.add_metric(["worker"], len(data.workers))
        yield nodes
        yield from _open_breach_gauges()


def _open_breach_gauges() -> Iterator[Any]:
    """Open breaches by kind, and by kind and tag (the MAX_TAG_LABELS most common tags; a job
    counts under each of its tags, untagged jobs under "")."""
    from prometheus_client.core import GaugeMetricFamily

    from .deadlines import open_breaches

    by_kind, by_tag = open_breaches(MAX_TAG_LABELS)
    kinds = GaugeMetricFamily(
        "schedapp_open_breaches", "Deadline breaches not yet recovered, by kind.", labels=["kind"]
    )
    for kind, count in sorted(by_kind.items()):
        kinds.add_metric([kind], count)
    yield kinds
    tagged = GaugeMetricFamily(
        "schedapp_open_breaches_by_tag",
        f"Open breaches by kind and tag (the {MAX_TAG_LABELS} most common tags, the rest as "
        "_other; a job counts under each of its tags).",
        labels=["kind", "tag"],
    )
    for (kind, tag), count in sorted(by_tag.items()):
        tagged.add_metric([kind, tag], count)
    yield tagged


# The tags this process counts under their own label (per-tag counters): the first
# MAX_TAG_LABELS it meets, the rest under "_other", so a process makes at most that many
# series per kind whatever the fleet's tags. (The fleet gauges pick the most common tags at
# scrape time instead; a counter cannot change its labels once counted.)
_TAG_LABELS: set[str] = set()
_TAG_LOCK = threading.Lock()
OTHER_TAG = "_other"


def tag_label(tag: str) -> str:
    """The label a per-tag counter counts ``tag`` under: itself, or ``_other`` once this
    process has MAX_TAG_LABELS tags of its own."""
    if tag in _TAG_LABELS:
        return tag
    with _TAG_LOCK:
        if tag in _TAG_LABELS or len(_TAG_LABELS) < MAX_TAG_LABELS:
            _TAG_LABELS.add(tag)
            return tag
    return OTHER_TAG


def _count_breach(sender: Any = None, breach: Any = None, **_: Any) -> None:
    BREACHES.labels(kind=breach.kind).inc()
    for tag in breach.tags or ("",):
        BREACHES_BY_TAG.labels(kind=breach.kind, tag=tag_label(tag)).inc()


def notifications(channel: str, outcome: str, kinds: Iterable[str]) -> None:
    """Events of ``kinds`` that reached their ``outcome`` (sent, failed) on ``channel``."""
    for kind in kinds:
        NOTIFICATIONS.labels(channel=channel, kind=kind, outcome=outcome).inc()


def notification_send_failed(channel: str) -> None:
    NOTIFICATION_SEND_FAILURES.labels(channel=channel).inc()


def _count_recovery(sender: Any = None, breach: Any = None, **_: Any) -> None:
    RECOVERIES.labels(kind=breach.kind).inc()


for _signal in signals.BREACH_SIGNALS.values():
    _signal.connect(_count_breach, weak=False, dispatch_uid="schedapp.metrics.breach")
signals.job_recovered.connect(_count_recovery, weak=False, dispatch_uid="schedapp.metrics.recovery")


def exposition(include_fleet: bool = True) -> tuple[bytes, str]:
    """(body, content type) of a scrape: this host's processes, plus the fleet gauges.

    Raises MetricsUnavailable without prometheus-client."""
    registry = process_registry()
    body = prometheus_client.generate_latest(registry)
    if include_fleet:
        fleet = prometheus_client.CollectorRegistry(auto_describe=False)
        fleet.register(FleetCollector())  # type: ignore[arg-type]
        body += prometheus_client.generate_latest(fleet)
    return body, prometheus_client.CONTENT_TYPE_LATEST
