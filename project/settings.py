"""Settings for the demo and the tests. Everything that differs per machine comes from the
environment: DATABASE_URL and CELERY_BROKER_URL. With neither set, the demo runs on SQLite
(IMMEDIATE transactions, so two beats still never claim the same job) and a filesystem broker.
"""

import os
from pathlib import Path

import dj_database_url

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("SCHEDAPP_VAR_DIR", BASE_DIR / "var"))

# The demo's key: DJANGO_SECRET_KEY must be set in production (see project/settings_prod.py).
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "insecure-demo-key-do-not-use-in-production")
DEBUG = os.environ.get("DJANGO_DEBUG", "1") == "1"
ALLOWED_HOSTS = os.environ.get("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1").split(",")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_celery_results",
    "schedapp",
    "project",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "project.urls"
WSGI_APPLICATION = "project.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]


def _database() -> dict:
    url = os.environ.get("DATABASE_URL")
    if not url:
        VAR_DIR.mkdir(parents=True, exist_ok=True)
        return {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": VAR_DIR / "schedapp.sqlite3",
            # Writers take the database lock when their transaction begins, so two beats'
            # claims are serialised; the timeout lets them wait for each other.
            "OPTIONS": {
                "transaction_mode": "IMMEDIATE",
                "timeout": 30,
                "init_command": "PRAGMA journal_mode=WAL;",
            },
            "TEST": {"NAME": VAR_DIR / "test.sqlite3"},
        }
    config = dj_database_url.parse(url, conn_max_age=600, conn_health_checks=True)
    test_name = os.environ.get("DATABASE_TEST_NAME")
    if test_name:
        config["TEST"] = {"NAME": test_name}
    return config


DATABASES = {"default": _database()}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS: list[dict] = []
LANGUAGE_CODE = "en-us"
TIME_ZONE = os.environ.get("TIME_ZONE", "UTC")
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "schedapp": {
            "handlers": ["console"],
            "level": os.environ.get("SCHEDAPP_LOG_LEVEL", "INFO"),
            "propagate": False,
        }
    },
}


def _broker() -> str:
    url = os.environ.get("CELERY_BROKER_URL")
    if url:
        return url
    return "filesystem://"


# --- Celery ---------------------------------------------------------------------------------
CELERY_BROKER_URL = _broker()
if CELERY_BROKER_URL.startswith("filesystem://"):
    _queue_dir = VAR_DIR / "broker"
    (_queue_dir / "processed").mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_queue_dir),
        "data_folder_out": str(_queue_dir),
        "processed_folder": str(_queue_dir / "processed"),
        "store_processed": False,
        # Broadcast (control) messages too, not in a `control/` folder of the working directory.
        "control_folder": str(_queue_dir / "control"),
    }
else:
    # A message not acknowledged within this time is redelivered by Redis; schedapp's fencing
    # token makes such a late redelivery harmless (it is skipped at the worker's door).
    CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 3600}
# django-celery-results' table, through a backend that retries across a database restart
# (see schedapp/results.py): task results are where Django users look, in the admin.
CELERY_RESULT_BACKEND = os.environ.get("CELERY_RESULT_BACKEND", "schedapp.results.DatabaseBackend")
CELERY_RESULT_BACKEND_ALWAYS_RETRY = True
CELERY_RESULT_BACKEND_MAX_RETRIES = 20
CELERY_RESULT_BACKEND_BASE_SLEEP_BETWEEN_RETRIES_MS = 100
CELERY_RESULT_BACKEND_MAX_SLEEP_BETWEEN_RETRIES_MS = 5000
CELERY_RESULT_EXTENDED = True
# JSON only, never pickle.
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TIMEZONE = TIME_ZONE
# Crash safety: a task's message is acknowledged after it ran, and requeued if the worker
# process running it dies; one message at a time per process so a long job does not hold
# others hostage. See the README's "Worker settings".
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BEAT_SCHEDULER = "schedapp.beat:LeaseScheduler"
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
# Celery's Django fixup closes the database connection before and after every task unless this
# is set: a reconnect (and its setup transactions) per execution. With it, schedapp costs a
# worker two commits per execution: the door and the completion.
CELERY_DB_REUSE_MAX = 1000
CELERY_WORKER_REDIRECT_STDOUTS = False  # schedapp's log lines keep their own level and format

SCHEDAPP_ALLOWED_TASKS = ["project.*", "schedapp.*"]

# Jobs declared in code: synced to the database when a beat starts (schedapp.declared); a
# declaration removed later pauses its job rather than deleting it. The demo prunes its own
# run history every night.
SCHEDAPP_JOBS = {
    "schedapp-prune-runs": {
        "task": "schedapp.prune_runs",
        "cron": "0 3 * * *",
        "timezone": TIME_ZONE,
        "kwargs": {"older_than_seconds": 30 * 86400},
    }
}
# Prometheus: beats and workers serve /metrics on this port when it is set (see
# schedapp.metrics; prefork workers also need PROMETHEUS_MULTIPROC_DIR).
SCHEDAPP_METRICS_PORT = int(os.environ.get("SCHEDAPP_METRICS_PORT", "0")) or None
