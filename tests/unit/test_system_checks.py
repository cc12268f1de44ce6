"""System checks of the configuration: optional dependencies it needs, jobs declared in code,
and ``CELERY_BEAT_SCHEDULE`` entries the LeaseScheduler cannot run.

A missing package is simulated with ``sys.modules[name] = None`` (an import then fails as if
it were not installed); Celery's configuration is patched on the app the checks read.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from celery import schedules
from django.test import override_settings

from schedapp import checks, declared
from schedapp.celeryapp import celery_app

ROOT = Path(__file__).resolve().parents[2]
SQLITE = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}


def ids(messages) -> list[str]:
    return [m.id for m in messages]


@pytest.fixture
def without(monkeypatch):
    def hide(*modules: str) -> None:
        for module in modules:
            monkeypatch.setitem(sys.modules, module, None)

    return hide


@pytest.fixture
def celery_conf(monkeypatch):
    """Set Celery settings for one test; the app's own changes are put back whole after it
    (monkeypatch's item-by-item undo does not survive Celery's aliasing of a setting's old
    and new names: undoing ``CELERY_ACCEPT_CONTENT`` set ``accept_content`` to the test's)."""
    conf = celery_app().conf
    saved = dict(conf.changes)

    def set_(**values) -> None:
        for key, value in values.items():
            # Celery reads CELERY_BROKER_URL / CELERY_RESULT_BACKEND from the environment first.
            monkeypatch.delenv(f"CELERY_{key.upper()}", raising=False)
            conf[key] = value
            # Celery 5.4 finds a namespaced Django setting (CELERY_BROKER_URL) first.
            conf[f"CELERY_{key.upper()}"] = value

    yield set_
    conf.changes.clear()
    conf.changes.update(saved)


# --- Celery settings the guarantee depends on (settings.md, "System checks") ------------


def schedapp_checks(*, deploy: bool = False) -> list[str]:
    """The ids Django's own check run reports for schedapp: the checks are registered."""
    from django.core.checks import run_checks

    found = run_checks(tags=["schedapp"], include_deployment_checks=deploy)
    return [m.id for m in found if m.id.startswith("schedapp.")]


def test_the_projects_settings_raise_none_of_the_celery_setting_checks():
    assert not {"schedapp.E001", "schedapp.E002", "schedapp.W001", "schedapp.W002"} & set(
        schedapp_checks()
    )


def test_content_other_than_json_is_an_error(celery_conf):
    celery_conf(accept_content=["json", "pickle"])
    assert "schedapp.E001" in schedapp_checks()
    celery_conf(accept_content=["application/json"])
    assert "schedapp.E001" not in schedapp_checks()


def test_a_task_serializer_other_than_json_is_an_error(celery_conf):
    celery_conf(task_serializer="pickle")
    assert "schedapp.E002" in schedapp_checks()


def test_acks_late_off_is_a_warning_and_so_is_reject_on_worker_lost_off_with_it(celery_conf):
    celery_conf(task_acks_late=False, task_reject_on_worker_lost=False)
    found = schedapp_checks()
    assert "schedapp.W001" in found and "schedapp.W002" not in found  # W002 only with acks_late
    celery_conf(task_acks_late=True)
    found = schedapp_checks()
    assert "schedapp.W002" in found and "schedapp.W001" not in found


def test_deploy_warns_of_an_allowlist_that_allows_everything():
    assert "schedapp.W004" not in schedapp_checks(deploy=True)
    with override_settings(SCHEDAPP_ALLOWED_TASKS=["project.*", "*"]):
        assert "schedapp.W004" not in schedapp_checks()  # --deploy only
        assert "schedapp.W004" in schedapp_checks(deploy=True)


def test_deploy_warns_of_sqlite():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "SCHEDAPP_"))}
    env["DJANGO_SETTINGS_MODULE"] = "project.settings_test_sqlite"

    def check(*args: str) -> str:
        result = subprocess.run(
            [sys.executable, "manage.py", "check", *args],
            cwd=ROOT,
            text=True,
            capture_output=True,
            env=env,
            timeout=120,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout + result.stderr

    assert "schedapp.W003" not in check()
    assert "schedapp.W003" in check("--deploy")


# --- optional dependencies ---------------------------------------------------------------


def test_postgresql_without_psycopg_is_an_error(without):
    without("psycopg")
    found = checks.check_dependencies()
    assert "schedapp.E010" in ids(found)
    message = next(m for m in found if m.id == "schedapp.E010")
    assert "schedapp[postgres]" in message.hint


def test_postgresql_with_psycopg_is_fine():
    assert "schedapp.E010" not in ids(checks.check_dependencies())


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
def test_sqlite_needs_no_psycopg(without):
    without("psycopg")
    with override_settings(DATABASES=SQLITE):
        assert "schedapp.E010" not in ids(checks.check_dependencies())


@pytest.mark.parametrize(
    "broker, backend",
    [
        ("redis://127.0.0.1:6379/0", None),
        ("rediss://cache:6380/0", "django-db"),
        ("sentinel://a:26379;sentinel://b:26379", None),
        ("amqp://guest@localhost//", "redis://127.0.0.1:6379/1"),
    ],
)
def test_a_redis_broker_or_backend_without_redis_is_an_error(without, celery_conf, broker, backend):
    celery_conf(broker_url=broker, result_backend=backend)
    without("redis")
    assert "schedapp.E011" in ids(checks.check_dependencies())


def test_no_redis_needed_for_other_brokers(without, celery_conf):
    celery_conf(broker_url="amqp://guest@localhost//", result_backend="django-db")
    without("redis")
    assert "schedapp.E011" not in ids(checks.check_dependencies())


def test_redis_installed_is_fine(celery_conf):
    celery_conf(broker_url="redis://127.0.0.1:6379/0")
    assert "schedapp.E011" not in ids(checks.check_dependencies())


@pytest.mark.parametrize("setting", ["SCHEDAPP_METRICS_PORT", "SCHEDAPP_METRICS_TOKEN"])
def test_metrics_enabled_without_prometheus_client_is_reported(without, setting):
    without("prometheus_client")
    with override_settings(**{setting: 9100}):
        found = checks.check_dependencies()
    assert "schedapp.W010" in ids(found)
    assert "schedapp[metrics]" in next(m for m in found if m.id == "schedapp.W010").hint


def test_metrics_not_enabled_need_no_prometheus_client(without):
    without("prometheus_client")
    with override_settings(SCHEDAPP_METRICS_PORT=None, SCHEDAPP_METRICS_TOKEN=None):
        assert "schedapp.W010" not in ids(checks.check_dependencies())


SOLAR_JOB = {
    "sunrise": {"task": "project.tasks.add", "solar": {"event": "sunrise", "latitude": 48.8}}
}


def test_solar_jobs_without_ephem_are_an_error(without):
    without("ephem")
    with override_settings(SCHEDAPP_JOBS=SOLAR_JOB):
        found = checks.check_dependencies()
    assert "schedapp.E012" in ids(found)
    assert "sunrise" in next(m for m in found if m.id == "schedapp.E012").msg


def test_solar_jobs_with_ephem_and_no_solar_without_it_are_fine(without):
    with override_settings(SCHEDAPP_JOBS=SOLAR_JOB):
        assert "schedapp.E012" not in ids(checks.check_dependencies())
    without("ephem")
    with override_settings(SCHEDAPP_JOBS={"x": {"task": "project.tasks.add", "cron": "* * * * *"}}):
        assert "schedapp.E012" not in ids(checks.check_dependencies())


# --- the worker pool ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "pool", ["gevent", "eventlet", "celery.concurrency.gevent:TaskPool"], ids=str
)
def test_a_green_worker_pool_setting_is_reported_with_what_to_use(celery_conf, pool):
    celery_conf(worker_pool=pool)
    (found,) = checks.check_worker_pool()
    name = "eventlet" if "eventlet" in pool else "gevent"
    assert found.id == "schedapp.W005"
    assert f"CELERY_WORKER_POOL is {name!r}" in found.msg
    assert "prefork, threads (-P threads" in found.msg


@pytest.mark.parametrize("pool", ["prefork", "threads", "solo", "processes"])
def test_the_pools_schedapp_runs_on_are_not_reported(celery_conf, pool):
    celery_conf(worker_pool=pool)
    assert checks.check_worker_pool() == []


# --- jobs declared in code ---------------------------------------------------------------


def declared_errors(jobs: dict) -> dict[str, list[str]]:
    with override_settings(SCHEDAPP_JOBS=jobs):
        found = checks.check_declared_jobs()
    by_id: dict[str, list[str]] = {}
    for message in found:
        assert message.level >= 40, message  # errors, not warnings
        by_id.setdefault(message.id, []).append(message.msg)
    return by_id


def test_an_unknown_task_is_an_error():
    found = declared_errors({"x": {"task": "project.tasks.no_such_task", "cron": "@daily"}})
    assert list(found) == ["schedapp.E020"]
    assert "not registered" in found["schedapp.E020"][0]
    assert "'x'" in found["schedapp.E020"][0]


def test_a_disallowed_task_is_an_error():
    # celery.* is denied by default, and backend_cleanup is registered with every app.
    found = declared_errors({"cleanup": {"task": "celery.backend_cleanup", "cron": "@daily"}})
    assert list(found) == ["schedapp.E020"]
    assert "not allowed" in found["schedapp.E020"][0]
    with override_settings(SCHEDAPP_ALLOWED_TASKS=["schedapp.*"]):
        found = declared_errors({"add": {"task": "project.tasks.add", "cron": "@daily"}})
    assert "not allowed" in found["schedapp.E020"][0]


def test_other_invalid_fields_are_errors_too():
    found = declared_errors(
        {
            "bad-cron": {"task": "project.tasks.add", "cron": "61 * * * *"},
            "typo": {"task": "project.tasks.add", "cron": "@daily", "kwarg": {}},
        }
    )
    assert list(found) == ["schedapp.E021"]
    assert len(found["schedapp.E021"]) == 2


def test_a_name_declared_twice_is_an_error_naming_it(celery_conf):
    celery_conf(
        beat_schedule={"nightly": {"task": "project.tasks.add", "schedule": 3600.0}},
        beat_scheduler="schedapp.beat:LeaseScheduler",
    )
    found = declared_errors({"nightly": {"task": "project.tasks.add", "cron": "0 2 * * *"}})
    assert list(found) == ["schedapp.E021"]
    # the message names where a name can be declared, Celery's beat_schedule among them
    (message,) = found["schedapp.E021"]
    assert "'nightly'" in message and "declared more than once" in message
    assert "beat_schedule" in message


def test_valid_declarations_pass():
    assert (
        declared_errors(
            {
                "add": {"task": "project.tasks.add", "cron": "*/5 * * * *", "args": [1, 2]},
                "prune": {"task": "schedapp.prune_runs", "interval": 3600},
            }
        )
        == {}
    )


def test_periodic_declarations_are_checked():
    declared.periodic(cron="@hourly", name="ghost", task="project.tasks.ghost")(lambda: None)
    try:
        found = declared_errors({})
    finally:
        declared.clear_registry()
    assert list(found) == ["schedapp.E020"]
    assert "ghost" in found["schedapp.E020"][0]


def test_manage_py_check_fails_on_a_declared_job_with_an_unknown_task():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "SCHEDAPP_"))}
    jobs = {"nightly": {"task": "project.tasks.nightly_typo", "cron": "0 2 * * *"}}
    result = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        text=True,
        capture_output=True,
        env={
            **env,
            "DJANGO_SETTINGS_MODULE": "project.settings_test",
            "SCHEDAPP_JOBS": json.dumps(jobs),
        },
        timeout=120,
    )
    assert result.returncode != 0, result.stdout + result.stderr
    assert "schedapp.E020" in result.stderr
    assert "project.tasks.nightly_typo" in result.stderr


# --- CELERY_BEAT_SCHEDULE ----------------------------------------------------------------

ENTRY = {"add": {"task": "project.tasks.add", "schedule": 30.0, "args": (1, 2)}}


def test_a_mappable_beat_schedule_entry_is_not_reported(celery_conf):
    """The LeaseScheduler syncs it at beat start: nothing to warn about."""
    celery_conf(beat_schedule=ENTRY, beat_scheduler="schedapp.beat:LeaseScheduler")
    assert checks.check_beat_schedule() == []
    assert declared_errors({}) == {}


class _OddHours(schedules.crontab):
    """A crontab subclass that decides for itself when it is due."""

    def is_due(self, last_run_at):  # pragma: no cover - never called
        return super().is_due(last_run_at)


def test_a_custom_schedule_class_is_reported_once(celery_conf):
    entries = {**ENTRY, "odd": {"task": "project.tasks.add", "schedule": _OddHours(minute="7")}}
    celery_conf(beat_schedule=entries, beat_scheduler="schedapp.beat:LeaseScheduler")
    found = checks.check_beat_schedule()
    assert ids(found) == ["schedapp.W011"]
    assert found[0].obj == "odd"
    assert "'odd'" in found[0].msg and "_OddHours" in found[0].msg
    assert declared_errors({}) == {}  # not also an error of the declared jobs' check


def test_a_beat_schedule_entry_with_an_unknown_task_is_reported(celery_conf):
    entries = {"typo": {"task": "project.tasks.add_typo", "schedule": 30.0}}
    celery_conf(beat_schedule=entries, beat_scheduler="schedapp.beat:LeaseScheduler")
    found = checks.check_beat_schedule()
    assert ids(found) == ["schedapp.W011"]
    assert "'typo'" in found[0].msg and "task" in found[0].msg


def test_a_malformed_beat_schedule_entry_is_reported_not_a_crash(celery_conf):
    """A missing comma in ``args`` (an int) or a NaN schedule once made ``manage.py check``
    raise; each is a warning naming the entry and the field."""
    entries = {
        **ENTRY,
        "comma": {"task": "project.tasks.add", "schedule": 30.0, "args": (16)},
        "nan": {"task": "project.tasks.add", "schedule": float("nan")},
        "opts": {"task": "project.tasks.add", "schedule": 30.0, "options": "q"},
    }
    celery_conf(beat_schedule=entries, beat_scheduler="schedapp.beat:LeaseScheduler")
    found = checks.check_beat_schedule()
    assert ids(found) == ["schedapp.W011"] * 3
    for message, field in zip(found, ("args", "schedule", "options"), strict=True):
        assert f"{message.obj!r} is not run by schedapp's LeaseScheduler: {field}: " in message.msg
    assert declared_errors({}) == {}  # the declared jobs' check reads them too, and survives


def test_beat_schedule_with_another_scheduler_or_empty_is_not(celery_conf):
    celery_conf(beat_schedule=ENTRY, beat_scheduler="celery.beat:PersistentScheduler")
    assert checks.check_beat_schedule() == []
    celery_conf(beat_schedule={}, beat_scheduler="schedapp.beat:LeaseScheduler")
    assert checks.check_beat_schedule() == []


# --- SCHEDAPP_* settings (schedapp.E030) -----------------------------------------------------


def test_the_projects_settings_raise_no_settings_error():
    assert checks.check_settings() == []


@pytest.mark.parametrize(
    ("setting", "value", "says"),
    [
        ("BATCH_SIZE", 0, "SCHEDAPP_BATCH_SIZE must be a whole number of at least 1, not 0"),
        ("MAX_SLEEP", "5", "SCHEDAPP_MAX_SLEEP must be a number of seconds above 0, not '5'"),
        ("LEASE_HEARTBEAT", 0, "SCHEDAPP_LEASE_HEARTBEAT must be a number of seconds above 0"),
        ("NODE_HEARTBEAT", -1, "SCHEDAPP_NODE_HEARTBEAT must be a number of seconds above 0"),
        ("DISPATCH_LOG", "none", "SCHEDAPP_DISPATCH_LOG must be one of ('each', 'batch', 'off')"),
        ("DISPATCH_LOG_BURST", -5, "SCHEDAPP_DISPATCH_LOG_BURST must be a whole number"),
        ("ALLOWED_TASKS", "myapp.*", "(write ['myapp.*'])"),
        ("DENIED_TASKS", [1], "SCHEDAPP_DENIED_TASKS must be a list of task name patterns"),
        ("METRICS_PORT", "9100", "SCHEDAPP_METRICS_PORT must be None or a port number"),
        ("RUN_RETENTION", 0, "SCHEDAPP_RUN_RETENTION must be a duration above 0"),
        ("JOBS", ["a"], "SCHEDAPP_JOBS must be a mapping"),
        ("DEFAULT_MAX_RETRIES", -1, "SCHEDAPP_DEFAULT_MAX_RETRIES: -1 is negative"),
        ("DEFAULT_MISFIRE_POLICY", "bogus", "SCHEDAPP_DEFAULT_MISFIRE_POLICY: 'bogus' is not one"),
        ("DEFAULT_LEASE_SECONDS", 0, "SCHEDAPP_DEFAULT_LEASE_SECONDS"),
        ("IMPORT_DST_POLICY", "celery+first", "SCHEDAPP_IMPORT_DST_POLICY: unknown DST policy"),
        ("DEFAULT_CATCHUP_WINDOW", 0, "SCHEDAPP_DEFAULT_CATCHUP_WINDOW: must be more than 0"),
        ("DEFAULT_CATCHUP_WINDOW", -60.0, "SCHEDAPP_DEFAULT_CATCHUP_WINDOW: must be more than 0"),
        ("DEFAULT_CATCHUP_WINDOW", "1h", "SCHEDAPP_DEFAULT_CATCHUP_WINDOW: must be a duration"),
        ("DEFAULT_CATCHUP_WINDOW", True, "SCHEDAPP_DEFAULT_CATCHUP_WINDOW: must be a duration"),
        (
            "DEFAULT_CATCHUP_WINDOW",
            float("nan"),
            "SCHEDAPP_DEFAULT_CATCHUP_WINDOW: must be a duration",
        ),
        (
            "DEFAULT_CATCHUP_WINDOW",
            timedelta(days=400),
            "SCHEDAPP_DEFAULT_CATCHUP_WINDOW: must be at most a year",
        ),
        # any duration setting: a number that is no duration is named, not raised from
        ("DEFAULT_MISFIRE_GRACE", float("nan"), "SCHEDAPP_DEFAULT_MISFIRE_GRACE: must be a dur"),
        ("DEFAULT_RETRY_BACKOFF", 1e300, "SCHEDAPP_DEFAULT_RETRY_BACKOFF: must be a duration"),
        ("DEFAULT_RETRY_BACKOFF", True, "SCHEDAPP_DEFAULT_RETRY_BACKOFF: must be a duration"),
        (  # shorter than SCHEDAPP_DEFAULT_MISFIRE_GRACE (a minute): it could never act
            "DEFAULT_CATCHUP_WINDOW",
            30,
            "SCHEDAPP_DEFAULT_CATCHUP_WINDOW: must not be shorter than misfire_grace (0:01:00)",
        ),
    ],
)
def test_a_setting_schedapp_cannot_work_with_is_an_error_naming_it(setting, value, says):
    with override_settings(**{f"SCHEDAPP_{setting}": value}):
        (error,) = [m for m in run_checks() if m.id == "schedapp.E030"]
    assert says in error.msg


@pytest.mark.parametrize("window", [None, 60, 3600.5, timedelta(days=365)])
def test_a_default_window_of_none_or_a_duration_not_under_the_grace_is_fine(window):
    with override_settings(SCHEDAPP_DEFAULT_CATCHUP_WINDOW=window):
        assert [m for m in run_checks() if m.id == "schedapp.E030"] == []


def test_a_bad_housekeeping_cron_is_an_error_only_while_housekeeping_is_on():
    with override_settings(SCHEDAPP_HOUSEKEEPING=True, SCHEDAPP_HOUSEKEEPING_CRON="61 * * * *"):
        (error,) = [m for m in run_checks() if m.id == "schedapp.E030"]
    assert "SCHEDAPP_HOUSEKEEPING_CRON '61 * * * *'" in error.msg
    with override_settings(SCHEDAPP_HOUSEKEEPING=False, SCHEDAPP_HOUSEKEEPING_CRON="61 * * * *"):
        assert checks.check_settings() == []


def run_checks():
    from django.core.checks import run_checks as django_run_checks

    return django_run_checks()


# --- a new user's trial (issue 29, item 12) ---------------------------------------------


def check_ids(*, deploy: bool = False) -> list[str]:
    return ids(run_checks_tagged(deploy))


def run_checks_tagged(deploy: bool) -> list:
    from django.core.checks import run_checks as django_run_checks

    # No database, as `manage.py check` without --database: Django 6.1 runs a tag's
    # 'database' checks too when tags are given, with every alias unless told none.
    found = django_run_checks(tags=["schedapp"], include_deployment_checks=deploy, databases=[])
    return [m for m in found if m.id.startswith("schedapp.")]


def message(id: str, *, deploy: bool = False):
    (found,) = [m for m in run_checks_tagged(deploy) if m.id == id]
    return found


def test_a_lease_shorter_than_three_heartbeats_is_a_warning_naming_both():
    assert "schedapp.W006" not in check_ids()
    with override_settings(SCHEDAPP_DEFAULT_LEASE_SECONDS=5, SCHEDAPP_LEASE_HEARTBEAT=2):
        found = message("schedapp.W006")
    assert "SCHEDAPP_DEFAULT_LEASE_SECONDS (5 s)" in found.msg
    assert "3 lease heartbeats (SCHEDAPP_LEASE_HEARTBEAT 2 s: 6 s)" in found.msg
    with override_settings(SCHEDAPP_DEFAULT_LEASE_SECONDS=6, SCHEDAPP_LEASE_HEARTBEAT=2):
        assert "schedapp.W006" not in check_ids()


def test_a_declared_job_whose_lease_is_shorter_than_three_heartbeats_is_named():
    jobs = {"quick": {"task": "project.tasks.add", "cron": "* * * * *", "lease_seconds": 2}}
    with override_settings(SCHEDAPP_JOBS=jobs, SCHEDAPP_LEASE_HEARTBEAT=1):
        found = message("schedapp.W006")
    assert "declared job 'quick': lease_seconds (2 s)" in found.msg


@pytest.mark.parametrize(
    "backend", ["schedapp.results.DatabaseBackend", "schedapp.results:DatabaseBackend", "django-db"]
)
def test_schedapps_result_backend_without_django_celery_results_installed_is_an_error(
    celery_conf, backend
):
    from django.conf import settings

    celery_conf(result_backend=backend)
    assert "schedapp.E013" not in check_ids()
    apps = [a for a in settings.INSTALLED_APPS if a != "django_celery_results"]
    with override_settings(INSTALLED_APPS=apps):
        found = message("schedapp.E013")
    assert "INSTALLED_APPS" in found.msg and "django_celery_results" in found.hint


def test_another_result_backend_needs_no_django_celery_results(celery_conf):
    from django.conf import settings

    celery_conf(result_backend="redis://127.0.0.1:6379/1")
    apps = [a for a in settings.INSTALLED_APPS if a != "django_celery_results"]
    with override_settings(INSTALLED_APPS=apps):
        assert "schedapp.E013" not in check_ids()


@pytest.mark.parametrize(
    "scheduler",
    [
        "django_celery_beat.schedulers:DatabaseScheduler",
        "django_celery_beat.schedulers.DatabaseScheduler",
    ],
)
def test_django_celery_beats_scheduler_still_configured_is_a_warning(celery_conf, scheduler):
    celery_conf(beat_scheduler=scheduler)
    found = message("schedapp.W015")
    assert "django-celery-beat" in found.msg
    assert "CELERY_BEAT_SCHEDULER = 'schedapp.beat:LeaseScheduler'" in found.hint
    celery_conf(beat_scheduler="schedapp.beat:LeaseScheduler")
    assert "schedapp.W015" not in check_ids()


def test_deploy_warns_of_the_metrics_view_served_without_a_token():
    # project/urls.py routes schedapp.views.metrics at /metrics/
    with override_settings(SCHEDAPP_METRICS_TOKEN=None):
        assert "schedapp.W013" not in check_ids()  # --deploy only
        found = message("schedapp.W013", deploy=True)
    assert "/metrics/" in found.msg and "SCHEDAPP_METRICS_TOKEN" in found.hint
    with override_settings(SCHEDAPP_METRICS_TOKEN="s3cret"):
        assert "schedapp.W013" not in check_ids(deploy=True)


def test_deploy_warns_that_the_metrics_port_takes_no_token():
    with override_settings(SCHEDAPP_METRICS_PORT=None):
        assert "schedapp.W014" not in check_ids(deploy=True)
    with override_settings(SCHEDAPP_METRICS_PORT=9100, SCHEDAPP_METRICS_TOKEN="s3cret"):
        assert "schedapp.W014" not in check_ids()
        found = message("schedapp.W014", deploy=True)
    assert "9100" in found.msg and "SCHEDAPP_METRICS_TOKEN does not protect it" in found.msg


def test_the_checks_celerys_django_fixup_runs_ask_nothing_of_the_database():
    """Celery's Django fixup runs every system check (``run_checks()``, no database named) in
    each beat and worker as it loads the tasks modules. Django 6.1 then hands the checks every
    database alias, unless they are tagged 'database', which it leaves out: the check of
    declared names, which reads the job table, queried from every process's start (pytest
    blocks database access here, so a query raises)."""
    from django.core.checks import run_checks

    # Given a job declared in code, whose name the check would look up
    jobs = {"add": {"task": "project.tasks.add", "cron": "*/5 * * * *"}}

    # When every check runs as Celery's fixup runs them, no database named
    with override_settings(SCHEDAPP_JOBS=jobs):
        found = run_checks()

    # Then none read the database (a query raises above), and nothing is reported
    assert [m.id for m in found if m.id.startswith("schedapp.")] == []


def test_celerys_run_of_every_check_from_inside_one_goes_no_deeper(monkeypatch):
    """A check that loads the tasks modules makes Celery's fixup run every check again from
    inside it (messages thrown away). schedapp's checks skip themselves inside another of
    theirs: one level of nesting, not one per check (16 runs of every check for one
    ``manage.py check``, and at each beat and worker's start, when each skipped only itself)."""
    import django.core.checks

    real = django.core.checks.run_checks
    depth, deepest, runs = [0], [0], [0]

    def counting(*args, **kwargs):
        depth[0] += 1
        runs[0] += 1
        deepest[0] = max(deepest[0], depth[0])
        try:
            return real(*args, **kwargs)
        finally:
            depth[0] -= 1

    # Celery's fixup imports run_checks from django.core.checks each time it runs them
    monkeypatch.setattr(django.core.checks, "run_checks", counting)
    django.core.checks.run_checks()
    assert deepest[0] == 2  # the fixup's runs, one level down, and none below them
    assert runs[0] <= 5


@pytest.mark.postgresql
def test_a_retention_of_more_than_100_partitions_is_a_warning_with_the_width_to_set():
    assert "schedapp.W016" not in check_ids()  # 30 days of one day
    with override_settings(SCHEDAPP_RUN_RETENTION=timedelta(days=365)):
        found = message("schedapp.W016")
    assert "about 365 partitions" in found.msg
    assert "SCHEDAPP_HISTORY_PARTITION to 3 days, 15:36:00 or more" in found.hint
    with override_settings(
        SCHEDAPP_RUN_RETENTION=timedelta(days=365), SCHEDAPP_HISTORY_PARTITION=timedelta(days=4)
    ):
        assert "schedapp.W016" not in check_ids()
