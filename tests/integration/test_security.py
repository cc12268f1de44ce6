"""Security defaults: no secrets in defaults, a clean deploy check, JSON only."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from django.conf import settings

from project.celery import app

ROOT = Path(__file__).resolve().parents[2]


def manage(*args: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "SCHEDAPP_"))}
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        text=True,
        capture_output=True,
        env={**clean, **env},
        timeout=120,
    )


def test_celery_accepts_and_sends_json_only():
    assert set(app.conf.accept_content) == {"json"}
    assert app.conf.task_serializer == app.conf.result_serializer == "json"


def test_production_settings_refuse_to_start_without_a_secret_key():
    result = manage(
        "check",
        DJANGO_SETTINGS_MODULE="project.settings_prod",
        DATABASE_URL=settings_url(),
        CELERY_BROKER_URL="redis://127.0.0.1:6379/9",
    )
    assert result.returncode != 0
    assert "DJANGO_SECRET_KEY must be set" in result.stderr


def test_production_settings_pass_the_deploy_check():
    result = manage(
        "check",
        "--deploy",
        "--fail-level",
        "WARNING",
        DJANGO_SETTINGS_MODULE="project.settings_prod",
        DJANGO_SECRET_KEY="k" + os.urandom(32).hex() + "-Zq9!",
        DJANGO_ALLOWED_HOSTS="scheduler.example.com",
        SCHEDAPP_METRICS_TOKEN=os.urandom(16).hex(),
        DATABASE_URL=settings_url(),
        CELERY_BROKER_URL="redis://127.0.0.1:6379/9",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_the_demo_key_is_labelled_insecure_and_never_used_with_debug_off():
    assert "insecure" in settings.SECRET_KEY or os.environ.get("DJANGO_SECRET_KEY")


def settings_url() -> str:
    db = settings.DATABASES["default"]
    return (
        f"postgresql://{db['USER'] or 'postgres'}@{db['HOST'] or '127.0.0.1'}:"
        f"{db['PORT'] or 5432}/{db['NAME']}"
    )
