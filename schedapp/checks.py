"""System checks: settings that would break schedapp's promises are reported at startup."""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.apps import apps
from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured, ValidationError
from django.db import DatabaseError, connections, transaction

from . import extras
from .celeryapp import celery_app
from .conf import get_settings
from .settings_checks import core_problems, notification_problems
from .worker import green_pool_name, green_pool_problem


def register() -> None:
    checks.register(check_settings, "schedapp")
    checks.register(check_notifications, "schedapp")
    checks.register(check_serialization, "schedapp")
    checks.register(check_crash_safety, "schedapp")
    checks.register(check_worker_pool, "schedapp")
    checks.register(check_leases, "schedapp")
    checks.register(check_history_partitions, "schedapp")
    checks.register(check_result_backend, "schedapp")
    checks.register(check_beat_scheduler, "schedapp")
    checks.register(check_dependencies, "schedapp")
    checks.register(check_declared_jobs, "schedapp")
    checks.register(check_beat_schedule, "schedapp")
    checks.register(check_declared_calendars, "schedapp")
    # Tagged 'database': Django 6.1 hands every other check all the database aliases when
    # none is named (Celery's fixup, in each beat and worker's start), and leaves these out.
    checks.register(check_declared_names, "schedapp", checks.Tags.database)
    checks.register(check_database, "schedapp", deploy=True)
    checks.register(check_allowlist, "schedapp", deploy=True)
    checks.register(check_metrics_exposure, "schedapp", deploy=True)


def _celery_conf() -> Any:
    return celery_app().conf


# --- SCHEDAPP_* settings --------------------------------------------------------------------


def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    return [
        checks.Error(problem, hint="Fix it in your Django settings.", id="schedapp.E030")
        for problem in core_problems()
    ]


def check_notifications(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    return [
        checks.Error(
            problem,
            hint="Fix the channel in SCHEDAPP_NOTIFICATIONS (docs/operations.md, Notifications).",
            id="schedapp.E040",
        )
        for problem in notification_problems()
    ]


def check_serialization(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    conf = _celery_conf()
    errors: list[checks.CheckMessage] = []
    accepted = set(conf.accept_content or [])
    if accepted - {"json", "application/json"}:
        errors.append(
            checks.Error(
                f"Celery accepts {sorted(accepted)}; schedapp needs JSON only (never pickle).",
                hint="Set CELERY_ACCEPT_CONTENT = ['json'].",
                id="schedapp.E001",
            )
        )
    if conf.task_serializer != "json":
        errors.append(
            checks.Error(
                f"CELERY_TASK_SERIALIZER is {conf.task_serializer!r}; schedapp publishes JSON.",
                hint="Set CELERY_TASK_SERIALIZER = 'json'.",
                id="schedapp.E002",
            )
        )
    return errors


def check_crash_safety(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    conf = _celery_conf()
    warnings: list[checks.CheckMessage] = []
    if not conf.task_acks_late:
        warnings.append(
            checks.Warning(
                "CELERY_TASK_ACKS_LATE is off: a worker that dies mid-task loses the message "
                "(schedapp still re-runs the job when its lease expires, but later).",
                hint="Set CELERY_TASK_ACKS_LATE = True.",
                id="schedapp.W001",
            )
        )
    if conf.task_acks_late and not conf.task_reject_on_worker_lost:
        warnings.append(
            checks.Warning(
                "CELERY_TASK_REJECT_ON_WORKER_LOST is off: a killed pool process's message is "
                "acknowledged as failed instead of requeued.",
                hint="Set CELERY_TASK_REJECT_ON_WORKER_LOST = True.",
                id="schedapp.W002",
            )
        )
    return warnings


def check_worker_pool(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """A green ``CELERY_WORKER_POOL`` (gevent, eventlet): every worker started without ``-P``
    runs it, and executes no schedapp run (each fails, with the reason)."""
    pool = green_pool_name(_celery_conf().worker_pool)
    if pool is None:
        return []
    return [
        checks.Warning(
            f"CELERY_WORKER_POOL is {pool!r}: a worker that {green_pool_problem(pool)}",
            hint="Every schedapp run delivered to a worker started without -P then fails "
            "without executing. Set CELERY_WORKER_POOL = 'prefork' (or 'threads'), or start "
            "the workers that run schedapp's jobs with -P prefork, threads or solo.",
            id="schedapp.W005",
        )
    ]


# Result backends that store in django-celery-results' TaskResult table.
_TASK_RESULT_BACKENDS = (
    "django-db",
    "schedapp.results:DatabaseBackend",
    "django_celery_results.backends.database:DatabaseBackend",
    "django_celery_results.backends:DatabaseBackend",
)


def check_result_backend(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """schedapp's result backend (or ``django-db``) without ``django_celery_results`` in
    ``INSTALLED_APPS``: its model cannot load, so no task result is stored, and a run's
    outcome, which schedapp records from the signals Celery sends after storing it, is not
    recorded either."""
    backend = _celery_conf().result_backend
    if _dotted(backend) not in _TASK_RESULT_BACKENDS or apps.is_installed("django_celery_results"):
        return []
    return [
        checks.Error(
            f"CELERY_RESULT_BACKEND is {_dotted(backend)!r}, which stores results in "
            "django-celery-results' TaskResult table, but 'django_celery_results' is not in "
            "INSTALLED_APPS: no task result can be stored, and schedapp records a run's "
            "outcome only after Celery has stored its result.",
            hint="Add 'django_celery_results' to INSTALLED_APPS (schedapp installs the "
            "package) and run manage.py migrate.",
            id="schedapp.E013",
        )
    ]


def _dotted(value: Any) -> str:
    """A Celery class setting as "module:Name" (given as a path with a dot or a colon, an
    alias, or the class itself)."""
    if not isinstance(value, str):
        return f"{getattr(value, '__module__', '')}:{getattr(value, '__name__', value)}"
    if ":" in value or "." not in value:
        return value
    module, _, name = value.rpartition(".")
    return f"{module}:{name}"


def check_beat_scheduler(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``CELERY_BEAT_SCHEDULER`` still django-celery-beat's after installing schedapp: every
    ``celery beat`` then runs django-celery-beat's periodic tasks, and no schedapp job."""
    path = _dotted(_celery_conf().beat_scheduler)
    if not path.startswith("django_celery_beat."):
        return []
    return [
        checks.Warning(
            f"CELERY_BEAT_SCHEDULER is django-celery-beat's ({path}): celery beat runs "
            "django-celery-beat's periodic tasks with it, and no schedapp job is dispatched.",
            hint="Import its periodic tasks once (manage.py schedapp_import "
            "--from-django-celery-beat), then set CELERY_BEAT_SCHEDULER = "
            "'schedapp.beat:LeaseScheduler' (docs/migrating.md).",
            id="schedapp.W015",
        )
    ]


def check_metrics_exposure(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Metrics served to anyone who reaches them (``--deploy``): the view routed without
    ``SCHEDAPP_METRICS_TOKEN``, and ``SCHEDAPP_METRICS_PORT``, whose server takes no token."""
    s = get_settings()
    found: list[checks.CheckMessage] = []
    routes = [] if s.METRICS_TOKEN else _metrics_routes()
    if routes:
        found.append(
            checks.Warning(
                f"schedapp.views.metrics is routed at {', '.join(routes)} without "
                "SCHEDAPP_METRICS_TOKEN: anyone who reaches it reads the fleet's metrics "
                "(jobs by state, backlog, live beats and workers).",
                hint="Set SCHEDAPP_METRICS_TOKEN (Prometheus sends it with authorization: "
                "{credentials: ...}), or protect the path at the proxy.",
                id="schedapp.W013",
            )
        )
    if s.METRICS_PORT:
        found.append(
            checks.Warning(
                f"SCHEDAPP_METRICS_PORT {s.METRICS_PORT}: beats and workers serve their "
                "metrics on it to anyone who reaches the port (prometheus_client's server); "
                "SCHEDAPP_METRICS_TOKEN does not protect it.",
                hint="Keep the port on a private network (a firewall, a pod network policy), "
                "or serve metrics through schedapp.views.metrics with a token instead.",
                id="schedapp.W014",
            )
        )
    return found


def _metrics_routes() -> list[str]:
    """The paths at which the project's URLconf routes ``schedapp.views.metrics``."""
    from django.urls import URLPattern, URLResolver, get_resolver

    try:
        patterns = get_resolver().url_patterns
    except Exception:  # a broken URLconf: Django's own checks report it
        return []
    found: list[str] = []

    def walk(entries: Any, prefix: str) -> None:
        for entry in entries:
            if isinstance(entry, URLResolver):
                walk(entry.url_patterns, prefix + str(entry.pattern))
            elif isinstance(entry, URLPattern) and entry.lookup_str == "schedapp.views.metrics":
                found.append("/" + prefix + str(entry.pattern))

    walk(patterns, "")
    return found


def check_database(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    try:
        vendor = connections["default"].vendor
    except ImproperlyConfigured:  # its driver is missing: check_dependencies says so
        return []
    if vendor != "postgresql":
        return [
            checks.Warning(
                f"The default database is {vendor}: fine for a demo, but several beats on several "
                "hosts need PostgreSQL (row locks with SKIP LOCKED, LISTEN/NOTIFY).",
                id="schedapp.W003",
            )
        ]
    return []


def check_allowlist(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    if "*" in get_settings().ALLOWED_TASKS:
        return [
            checks.Warning(
                "SCHEDAPP_ALLOWED_TASKS allows every registered task: anyone who may add a job "
                "(API, admin, imports) can schedule any task the app defines.",
                hint="List the tasks jobs may run: SCHEDAPP_ALLOWED_TASKS = ['myapp.tasks.*'].",
                id="schedapp.W004",
            )
        ]
    return []


# --- helpers ----------------------------------------------------------------------------


_running: list[str] = []


def _outermost(
    check: Callable[..., list[checks.CheckMessage]],
) -> Callable[..., list[checks.CheckMessage]]:
    """Run ``check`` unless one of these is already running: loading the tasks modules (to
    find ``@periodic`` declarations and registered tasks) makes Celery's Django fixup run every
    system check again, from inside it, and throw their messages away. Guarded by name only,
    each check that loads them ran the others again one level deeper: 16 runs of every check
    for one ``manage.py check``, at each beat and worker's start too; now 4."""

    @functools.wraps(check)
    def wrapper(*args: Any, **kwargs: Any) -> list[checks.CheckMessage]:
        if _running:
            return []
        _running.append(check.__name__)
        try:
            return check(*args, **kwargs)
        finally:
            _running.remove(check.__name__)

    return wrapper


def _declarations() -> dict[str, Any]:
    from .declared import declarations

    return declarations()


# --- leases and heartbeats ----------------------------------------------------------------


# A worker renews a lease once it is a third old: one late heartbeat must not let it lapse.
LEASE_HEARTBEATS = 3


@_outermost
def check_leases(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Leases shorter than three lease heartbeats (the default, and each declared job's): a
    lease is renewed once it is a third old, at the next heartbeat, so a shorter one is left
    with less than a heartbeat of slack, and a run still running may be reaped and run
    again. Jobs in the database are not read here."""
    s = get_settings()
    beat = s.LEASE_HEARTBEAT
    if not _positive(beat):
        return []  # schedapp.E030 says so
    floor = LEASE_HEARTBEATS * beat
    short = []
    if _positive(s.DEFAULT_LEASE_SECONDS) and s.DEFAULT_LEASE_SECONDS < floor:
        short.append(f"SCHEDAPP_DEFAULT_LEASE_SECONDS ({s.DEFAULT_LEASE_SECONDS} s)")
    for name, spec in sorted(_declarations().items()):
        lease = spec.get("lease_seconds") if isinstance(spec, dict) else None
        if _positive(lease) and lease < floor:
            short.append(f"declared job {name!r}: lease_seconds ({lease} s)")
    if not short:
        return []
    return [
        checks.Warning(
            f"{'; '.join(short)}: shorter than {LEASE_HEARTBEATS} lease heartbeats "
            f"(SCHEDAPP_LEASE_HEARTBEAT {beat:g} s: {floor:g} s). A worker renews a lease once "
            "it is a third old, at its next heartbeat, so one late heartbeat lets the lease "
            "expire under a run that still runs, and the run is reaped and run again.",
            hint="Keep every lease at least three heartbeats long: raise lease_seconds "
            "(SCHEDAPP_DEFAULT_LEASE_SECONDS for new jobs) or lower SCHEDAPP_LEASE_HEARTBEAT.",
            id="schedapp.W006",
        )
    ]


# Past this many partitions of run history each door and success costs more with every
# partition (bench/README.md, "Generic plans for the worker's functions").
MAX_HISTORY_PARTITIONS = 100


def check_history_partitions(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """A run retention that keeps more than MAX_HISTORY_PARTITIONS partitions: the door's and
    the success's plans cover every partition (each is locked as the plan starts, then pruned
    to the run's), so their PostgreSQL CPU grows with the count past a few dozen."""
    s = get_settings()
    retention, width = s.RUN_RETENTION, s.HISTORY_PARTITION
    if connections["default"].vendor != "postgresql" or not all(
        isinstance(v, timedelta) and v > timedelta(0) for v in (retention, width)
    ):
        return []  # one table; or schedapp.E030 says what is wrong with them
    kept = retention / width
    if kept <= MAX_HISTORY_PARTITIONS:
        return []
    return [
        checks.Warning(
            f"SCHEDAPP_RUN_RETENTION ({retention}) keeps about {kept:.0f} partitions of run "
            f"history of SCHEDAPP_HISTORY_PARTITION ({width}) each. Every door and success "
            "of a worker plans over all of them, and costs more with each one past a few "
            "dozen (twice the PostgreSQL CPU at 200 as at 30).",
            hint=f"Keep at most {MAX_HISTORY_PARTITIONS} partitions: set "
            f"SCHEDAPP_HISTORY_PARTITION to {retention / MAX_HISTORY_PARTITIONS} or more.",
            id="schedapp.W016",
        )
    ]


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


# --- optional dependencies (schedapp.extras) ----------------------------------------------


def _missing(module: str, why: str, id: str, *, error: bool = True) -> checks.CheckMessage:
    extra, needs = extras.EXTRAS[module]
    kind = checks.Error if error else checks.Warning
    return kind(
        f"{why}, but {module!r} is not installed: schedapp[{extra}] brings it, for {needs}.",
        hint=extras.install_hint(module),
        id=id,
    )


def _urls(value: Any) -> list[str]:
    """Celery accepts a URL, a list of URLs or a ';'-separated string of them."""
    if not value:
        return []
    if isinstance(value, list | tuple):
        return [str(v) for v in value]
    return [u.strip() for u in str(value).split(";")]


@_outermost
def check_dependencies(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Each optional dependency the configuration needs and that is not installed."""
    found: list[checks.CheckMessage] = []
    engine = str(settings.DATABASES.get("default", {}).get("ENGINE", ""))
    if ("postgresql" in engine or "postgis" in engine) and not extras.installed("psycopg"):
        found.append(
            _missing("psycopg", f"The default database is PostgreSQL ({engine})", "schedapp.E010")
        )
    conf = _celery_conf()
    redis_urls = [
        (name, url)
        for name, value in (("broker", conf.broker_url), ("result backend", conf.result_backend))
        for url in _urls(value)
        if url.startswith(("redis", "sentinel"))
    ]
    if redis_urls and not extras.installed("redis"):
        name, url = redis_urls[0]
        found.append(
            _missing("redis", f"Celery's {name} is Redis ({url.split(':')[0]}://)", "schedapp.E011")
        )
    from .conf import get_settings

    schedapp = get_settings()
    if (schedapp.METRICS_PORT or schedapp.METRICS_TOKEN) and not extras.installed(
        "prometheus_client"
    ):
        setting = "SCHEDAPP_METRICS_PORT" if schedapp.METRICS_PORT else "SCHEDAPP_METRICS_TOKEN"
        found.append(
            _missing("prometheus_client", f"{setting} is set", "schedapp.W010", error=False)
        )
    solar = sorted(name for name, spec in _declarations().items() if _is_solar(spec))
    if solar and not extras.installed("ephem"):
        found.append(
            _missing("ephem", f"Declared jobs {solar} have solar schedules", "schedapp.E012")
        )
    return found


def _is_solar(spec: Any) -> bool:
    return isinstance(spec, dict) and any(str(key).startswith("solar") for key in spec)


# --- jobs declared in code -----------------------------------------------------------------


@_outermost
def check_declared_jobs(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``SCHEDAPP_JOBS`` and ``@periodic`` declarations a beat would refuse at its start: a
    task that is unknown to the Celery app or not allowed is an error here, not a log line
    at beat start (and so is any other invalid field). ``beat_schedule`` entries are
    ``check_beat_schedule``'s (W011), except a name declared twice."""
    from .declared import declared_values

    found: list[checks.CheckMessage] = []
    for name, spec in _declarations().items():
        if "_unmapped" in spec or spec.get("_keep_phase"):
            continue  # a beat_schedule entry: check_beat_schedule reports it (W011)
        try:
            declared_values(name, spec)
        except ValidationError as exc:
            for key, messages in exc.message_dict.items():
                field = key.removeprefix(f"{name}.")
                task = field == "task"
                found.append(
                    checks.Error(
                        f"Declared job {name!r}, {field}: {' '.join(messages)}",
                        hint=_TASK_HINT if task else "Fix it in SCHEDAPP_JOBS or @periodic.",
                        obj=name,
                        id="schedapp.E020" if task else "schedapp.E021",
                    )
                )
    return found


# A stored calendar a declared one names: not read here (no database), checked at beat start.
_STORED_STAND_IN = {"dates": ["0001-01-01"]}


def check_declared_calendars(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``SCHEDAPP_CALENDARS`` entries a beat would refuse at its start (E022, each field
    named by its path in the definition), read without the database: a reference to a
    calendar not declared stands for a stored one, whose existence the beat's sync checks."""
    from datetime import UTC, datetime

    from . import calendars
    from .declared import declared_calendars
    from .exceptions import ScheduleError

    decls = declared_calendars()
    found: list[checks.CheckMessage] = []
    today = datetime.now(UTC).date()

    def resolve(other: str) -> object:
        return decls.get(other, _STORED_STAND_IN)

    for name, definition in decls.items():
        if not isinstance(name, str) or not name.strip():
            problem = f"name: {name!r} is not a non-empty string."
        else:
            try:
                parsed = calendars.parse_calendar(name, definition, resolve)
                calendars.check_allows_something(parsed.rule, today)
                continue
            except ScheduleError as exc:
                problem = f"{exc.field}: {exc.message}"
            except (TypeError, ValueError, RecursionError) as exc:
                problem = f"definition: cannot be read as a calendar: {exc}."
        found.append(
            checks.Error(
                f"Declared calendar {name!r}, {problem}",
                hint="Fix it in SCHEDAPP_CALENDARS (docs/semantics.md, Calendars).",
                obj=str(name),
                id="schedapp.E022",
            )
        )
    return found


_TASK_HINT = (
    "A declared task must be registered with the Celery app (SCHEDAPP_CELERY_APP, or the app "
    "your project's __init__.py imports), allowed by SCHEDAPP_ALLOWED_TASKS and not denied by "
    "SCHEDAPP_DENIED_TASKS."
)


def _lease_scheduler_configured(conf: Any) -> bool:
    scheduler = conf.beat_scheduler
    path = (
        scheduler if isinstance(scheduler, str) else f"{scheduler.__module__}:{scheduler.__name__}"
    )
    return path.replace(".LeaseScheduler", ":LeaseScheduler") == "schedapp.beat:LeaseScheduler"


@_outermost
def check_beat_schedule(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``beat_schedule`` entries (``CELERY_BEAT_SCHEDULE``, ``add_periodic_task``) that the
    LeaseScheduler cannot run. It syncs every entry at beat start as a declared job, mapped
    as ``importer.map_beat_entry`` maps it; an entry that cannot be mapped (a custom schedule
    class, no task) or whose job would be invalid (a task not registered or not allowed) is
    reported then and skipped: this check says so before the beat starts."""
    conf = _celery_conf()
    if not conf.beat_schedule or not _lease_scheduler_configured(conf):
        return []
    from .declared import beat_schedule_declarations, declared_values

    found: list[checks.CheckMessage] = []
    for name, spec in beat_schedule_declarations().items():
        try:
            declared_values(name, spec)
        except ValidationError as exc:
            reasons = [
                f"{key.removeprefix(f'{name}.')}: {' '.join(messages)}"
                for key, messages in exc.message_dict.items()
            ]
            found.append(
                checks.Warning(
                    f"beat_schedule entry {name!r} is not run by schedapp's LeaseScheduler: "
                    + "; ".join(reasons),
                    hint="Declare it with a crontab, a solar or an interval schedule and a task "
                    "registered with the Celery app and allowed by SCHEDAPP_ALLOWED_TASKS (or "
                    "move it to SCHEDAPP_JOBS).",
                    obj=name,
                    id="schedapp.W011",
                )
            )
    return found


@_outermost
def check_declared_names(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """Declared names (``SCHEDAPP_JOBS``, ``@periodic``, ``beat_schedule`` entries) that a job
    of another source already holds, typically one imported from django-celery-beat's copy
    of a ``CELERY_BEAT_SCHEDULE`` entry: the beats' sync leaves such a job alone, so every
    later edit of the declaration is ignored.

    It reads the job table, so it runs, as Django's database checks do, only when asked to
    check the default database (``manage.py check --database default``; ``migrate`` asks
    too): Celery's Django fixup runs every check in each beat and worker as it loads the
    tasks modules, which must not wait on the database (Django 6.1 gives that run every
    alias, so the check is also tagged 'database', which it then leaves out). A beat names
    each conflict in a warning at its start."""
    if not databases or "default" not in databases:
        return []
    names = list(_declarations())
    if not names:
        return []
    from .declared import conflict_text
    from .models import Job, JobSource

    try:
        with transaction.atomic():  # a failed query leaves a caller's transaction usable
            taken = sorted(
                Job.objects.filter(name__in=names)
                .exclude(source=JobSource.DECLARED)
                .values_list("name", "source")
            )
    except (DatabaseError, ImproperlyConfigured):  # not migrated, or no database: no jobs
        return []
    return [
        checks.Warning(
            f"Declared job {name!r} is not synced by schedapp's beats: "
            + conflict_text(name, source),
            hint=_CONFLICT_HINT,
            obj=name,
            id="schedapp.W012",
        )
        for name, source in taken
    ]


_CONFLICT_HINT = (
    "Keep one of the two: delete (or rename) the existing job so that the next beat start "
    "creates the declared one, or remove the declaration (the CELERY_BEAT_SCHEDULE entry, "
    "SCHEDAPP_JOBS item or @periodic) to keep the job. schedapp_import "
    "--from-django-celery-beat leaves out django-celery-beat's copies of CELERY_BEAT_SCHEDULE "
    "entries, so that they do not take the entries' names (docs/migrating.md)."
)
