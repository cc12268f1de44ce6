"""schedapp imports and works without any of its extras (psycopg, redis, prometheus-client,
ephem): a fresh interpreter where those imports fail, on SQLite and kombu's filesystem broker,
imports every module, records metrics as no-ops, and passes ``check``; what the configuration
would need is then reported by the system checks, not raised as an ImportError."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import importlib, io, json, pkgutil, sys
    for name in ("psycopg", "psycopg2", "redis", "prometheus_client", "ephem", "dj_database_url"):
        sys.modules[name] = None  # an import of it now fails as if it were not installed

    from django.conf import settings
    settings.configure(
        INSTALLED_APPS=["django.contrib.admin", "django.contrib.auth",
                        "django.contrib.contenttypes", "django.contrib.sessions",
                        "django.contrib.messages", "django_celery_results", "schedapp"],
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
        SCHEDAPP_METRICS_PORT=int(sys.argv[1]) or None,
        SCHEDAPP_ALLOWED_TASKS=["schedapp.*"],
        SECRET_KEY="x", USE_TZ=True,
        TEMPLATES=[{"BACKEND": "django.template.backends.django.DjangoTemplates",
                    "APP_DIRS": True, "OPTIONS": {"context_processors": [
                        "django.template.context_processors.request",
                        "django.contrib.auth.context_processors.auth",
                        "django.contrib.messages.context_processors.messages"]}}],
        MIDDLEWARE=["django.contrib.sessions.middleware.SessionMiddleware",
                    "django.contrib.auth.middleware.AuthenticationMiddleware",
                    "django.contrib.messages.middleware.MessageMiddleware"],
    )
    import django
    django.setup()
    from celery import Celery
    app = Celery("t", broker="filesystem://", set_as_current=True)
    app.conf.update(task_acks_late=True, task_reject_on_worker_lost=True)

    import schedapp
    modules = [m.name for m in pkgutil.walk_packages(schedapp.__path__, "schedapp.")]
    for name in modules:
        importlib.import_module(name)

    from schedapp import metrics, schedules
    from schedapp.views import metrics as view
    metrics.claimed(3, misfires_skipped=1)
    metrics.door_skipped("stale_token")
    metrics.beat_tick(0.01, 1.0)
    from django.test import RequestFactory
    scrape = view(RequestFactory().get("/metrics"))
    try:
        schedules.parse_solar("sunrise", 48.8, 2.3)
        solar = "parsed"
    except Exception as exc:
        solar = str(exc)

    from django.core.management import call_command
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command("check", stdout=out, stderr=err)
        failed = False
    except Exception as exc:
        failed, err = True, io.StringIO(str(exc))
    print(json.dumps({
        "modules": len(modules),
        "metrics_available": metrics.AVAILABLE,
        "server": metrics.start_metrics_server(),
        "scrape": [scrape.status_code, scrape.content.decode()],
        "solar": solar,
        "check": [failed, out.getvalue() + err.getvalue()],
    }))
    """
)


def run(metrics_port: int = 0) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(metrics_port)],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_every_module_imports_and_works_without_the_extras():
    found = run()
    assert found["modules"] > 30
    assert found["metrics_available"] is False
    assert found["server"] is False  # no port configured
    status, body = found["scrape"]
    assert status == 503 and "schedapp[metrics]" in body
    assert "schedapp[solar]" in found["solar"]
    failed, output = found["check"]
    assert not failed, output
    assert "no issues" in output


def test_metrics_port_without_prometheus_client_is_a_check_warning_not_a_crash():
    found = run(metrics_port=9464)
    assert found["server"] is False
    failed, output = found["check"]
    assert not failed, output  # a warning: beats and workers still run
    assert "schedapp.W010" in output and "schedapp[metrics]" in output
