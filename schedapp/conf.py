"""One typed settings object: every ``SCHEDAPP_*`` setting, its default, and why."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from datetime import timedelta
from typing import Any

from django.conf import settings as django_settings
from django.core.signals import setting_changed


@dataclass(frozen=True)
class Settings:
    # Jobs claimed per beat transaction. Smaller than a typical burst so that several beats
    # share it; large enough that one commit serves hundreds of dispatches.
    BATCH_SIZE: int = 500
    # Longest a beat sleeps without looking at the table, even if nothing seems due: a safety
    # net for missed notifications and for databases without LISTEN/NOTIFY.
    MAX_SLEEP: float = 5.0
    # A beat transaction left idle this long (the beat was stopped or stalled mid-claim) is
    # ended by PostgreSQL, releasing its row locks to the other beats.
    BEAT_TRANSACTION_TIMEOUT: float = 15.0
    # Shortest time between the starts of one beat's claims, unless the last filled its batch
    # or reaped a lease (more is due at once): at a steady stream each claim takes what came
    # due since the last. Also the pause when due work exists but other beats hold its rows.
    MIN_SLEEP: float = 0.01
    # Defaults for new jobs (each can be overridden per job).
    DEFAULT_LEASE_SECONDS: int = 60
    DEFAULT_MAX_RETRIES: int = 3
    DEFAULT_RETRY_BACKOFF: timedelta = timedelta(seconds=10)
    DEFAULT_RETRY_BACKOFF_MAX: timedelta = timedelta(hours=1)
    DEFAULT_MISFIRE_POLICY: str = "run_once"
    DEFAULT_MISFIRE_GRACE: timedelta = timedelta(seconds=60)
    DEFAULT_MISFIRE_MAX_CATCHUP: int = 100
    # A new job's catch-up window (a duration or seconds; None: no window): an occurrence
    # missed longer ago than it is recorded as missed and not run. At least the misfire grace.
    DEFAULT_CATCHUP_WINDOW: timedelta | None = None
    # The DST policy of a crontab synced from beat_schedule or imported (schedapp_import,
    # django-celery-beat): schedapp's rule by default, so an upgrade changes no synced job;
    # "celery" for Celery beat's own reading of the spring gap and the autumn hour.
    IMPORT_DST_POLICY: str = "gap_end+first"
    # Celery task names a job may run (glob patterns). The default allows every registered
    # task except Celery's own internals; the task must also be registered with the app.
    ALLOWED_TASKS: tuple[str, ...] = ("*",)
    DENIED_TASKS: tuple[str, ...] = ("celery.*",)
    # Largest JSON encoding of args + kwargs, and deepest nesting, a job may carry.
    MAX_PAYLOAD_BYTES: int = 64 * 1024
    MAX_PAYLOAD_DEPTH: int = 32
    # Dotted path to the Celery app ("project.celery:app"); None means celery.current_app.
    CELERY_APP: str | None = None
    # Serve Prometheus metrics on this port from beats and workers (None: don't), and the
    # bearer token the metrics view demands (None: none).
    METRICS_PORT: int | None = None
    METRICS_TOKEN: str | None = None
    # Jobs declared in code: {"name": {"task": ..., "cron": ..., ...}}, synced at beat start.
    JOBS: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # Calendars declared in code: {"name": definition}, created or replaced at beat start.
    CALENDARS: Mapping[str, Any] = field(default_factory=dict)
    # This deploy's release, ordered: a larger one is newer (compared part by part, runs of
    # digits as numbers: "41" < "100", "2026.12.2" < "2026.12.10"). In a rolling deploy the
    # declared jobs of the newest release win; unset, a set of declarations the database saw
    # later is newer. A git hash alone is not ordered: prefix it with a build number or time.
    RELEASE: str = ""
    # Seconds between a worker's or beat's row updates in the nodes table.
    NODE_HEARTBEAT: float = 10.0
    # Seconds between a worker's lease heartbeats (a thread of its main process, independent
    # of the broker and of the pool). Each heartbeat renews, in one statement, every lease the
    # worker holds whose last renewal is a third of the lease old: keep leases at least three
    # heartbeats long.
    LEASE_HEARTBEAT: float = 1.0
    # The longest a beat or worker waits on the database for one connection (libpq's
    # connect_timeout, unless DATABASES sets one) or for one statement's reply (a watchdog
    # gives the connection up, and the caller's retries take a new one): a network that
    # drops packets without a reset would otherwise hold it for hours. A worker's door and
    # lease renewals wait at most a third of the run's lease, if that is shorter.
    DB_TIMEOUT: float = 30.0
    # Beats log "Scheduler: Sending due task <job> (<task>)" at INFO for each dispatch, as
    # Celery beat does ("each", at most DISPATCH_LOG_BURST lines a batch, then a summary
    # line), one summary line per batch ("batch"), or nothing ("off").
    DISPATCH_LOG: str = "each"
    DISPATCH_LOG_BURST: int = 100
    # Housekeeping schedapp declares for itself (synced at beat start like JOBS, allowed
    # whatever ALLOWED_TASKS says, unless DENIED_TASKS names them): run history older than
    # RUN_RETENTION is pruned, and task results older than RESULT_RETENTION (None: Celery's
    # result_expires, one day by default) deleted, on HOUSEKEEPING_CRON. False: neither.
    HOUSEKEEPING: bool = True
    HOUSEKEEPING_CRON: str = "17 3 * * *"
    RUN_RETENTION: timedelta = timedelta(days=30)
    RESULT_RETENTION: timedelta | None = None
    # PostgreSQL: run history and the occurrence ledger are partitioned by id (migrations 0046,
    # 0048); the beats make each new partition to hold about this long of rows at the rate
    # observed (schedapp.partitions), and retention drops whole partitions.
    HISTORY_PARTITION: timedelta = timedelta(days=1)
    # Record every change to a job in the audit trail (schedapp.audit, the JobChange table).
    AUDIT: bool = True
    # Deadline defaults for new jobs (each job may override or clear them): start_deadline and
    # max_runtime (seconds or a duration), skip_late and revoke_overrun (bool), finish_by
    # ("09:00" or a time), alert_after_failures (a whole number). Unset: no deadline.
    DEADLINES: Mapping[str, Any] = field(default_factory=dict)
    # Seconds between a beat's deadline passes (schedapp.deadlines): detection and recovery.
    DEADLINE_CHECK: float = 5.0
    # Notification channels (schedapp.notify): {"name": {"type": "email" | "webhook", ...}}.
    # Events (late, overrunning, missed_finish_by, failing, dead, recovered) go, grouped, to
    # every channel whose kinds and tags they match (docs/operations.md, "Notifications").
    NOTIFICATIONS: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # Run the delivery loop on a thread of each beat (False: run `manage.py schedapp_notify`).
    NOTIFY_IN_BEAT: bool = True


# Durations whose default is None: seconds given as a number are read as a duration too.
_OPTIONAL_DURATIONS = frozenset({"DEFAULT_CATCHUP_WINDOW"})


def _coerce(value: Any, default: Any, name: str = "") -> Any:
    duration = isinstance(default, timedelta) or name in _OPTIONAL_DURATIONS
    if duration and isinstance(value, int | float) and not isinstance(value, bool):
        try:
            return timedelta(seconds=value)
        except (OverflowError, ValueError):  # NaN, or too large: the settings check says so
            return value
    if isinstance(default, tuple) and isinstance(value, list | tuple):
        return tuple(value)
    return value


# The settings read, and the Django settings object they were read from.
_cached: tuple[Any, Settings] | None = None


def get_settings() -> Settings:
    """``SCHEDAPP_*`` read from Django settings once, then kept: it is called on every claim,
    door and completion (about 2% of the integration tests' time went to reading them
    afresh). A change is seen: Django announces one (``override_settings``, pytest-django's
    ``settings``) with ``setting_changed``, which forgets the copy (``_forget``), and an
    override swaps the object the settings live in, which is checked too (pytest-django's
    ``del settings.X`` sends no signal)."""
    global _cached
    holder = django_settings._wrapped
    found = _cached
    if found is None or found[0] is not holder:
        found = _cached = (holder, _read())
    return found[1]


def _read() -> Settings:
    values: dict[str, Any] = {}
    for f in fields(Settings):
        if hasattr(django_settings, f"SCHEDAPP_{f.name}"):
            default = f.default if f.default is not MISSING else None
            given = getattr(django_settings, f"SCHEDAPP_{f.name}")
            values[f.name] = _coerce(given, default, f.name)
    return Settings(**values)


def _forget(*, setting: str, **_: Any) -> None:
    """A ``SCHEDAPP_*`` setting changed: the next ``get_settings()`` reads them again."""
    global _cached
    if setting.startswith("SCHEDAPP_"):
        _cached = None


setting_changed.connect(_forget, dispatch_uid="schedapp.conf._forget")
