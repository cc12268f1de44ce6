"""Settings for the test suite: PostgreSQL and Redis on this machine unless the environment
says otherwise (tests of claims, leases, beats and workers need real services)."""

import json
import os
import tempfile
from pathlib import Path

os.environ.setdefault("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/schedapp")
os.environ.setdefault("CELERY_BROKER_URL", "redis://127.0.0.1:6379/7")

from .settings import *  # noqa: F403

# Tests declare their own jobs: the demo's SCHEDAPP_JOBS would appear in every beat they start.
SCHEDAPP_JOBS: dict = {}
SCHEDAPP_HOUSEKEEPING = False  # likewise schedapp's own housekeeping jobs (tested on their own)

# Subprocesses started by the end-to-end tests get schedapp settings through the environment:
# SCHEDAPP_BATCH_SIZE=100 becomes settings.SCHEDAPP_BATCH_SIZE = 100.
for _key, _value in os.environ.items():
    if _key.startswith("SCHEDAPP_") and _key not in ("SCHEDAPP_VAR_DIR", "SCHEDAPP_LOG_LEVEL"):
        try:
            globals()[_key] = json.loads(_value)
        except ValueError:
            globals()[_key] = _value

# A worker started by an end-to-end test may run as Celery does by default, its database
# connection closed around every task: PROJECT_DB_REUSE_MAX=null (CELERY_DB_REUSE_MAX unset).
if os.environ.get("PROJECT_DB_REUSE_MAX"):
    CELERY_DB_REUSE_MAX = json.loads(os.environ["PROJECT_DB_REUSE_MAX"])

# An end-to-end test's SMTP sink (tests/receivers.py): the processes' email goes there.
if os.environ.get("PROJECT_EMAIL_PORT"):
    EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    EMAIL_HOST = "127.0.0.1"
    EMAIL_PORT = int(os.environ["PROJECT_EMAIL_PORT"])

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# The portable store's database, next to PostgreSQL's in the same process: the store contract
# suite (tests/integration/test_store_contract.py) runs each test on both stores, and only
# the tests that ask for this alias (django_db(databases=...)) create it. A file named after
# the default database's test database (DATABASE_TEST_NAME if given, else its name), so that
# runs on different test databases never share it, one DATABASE_URL or not. SQLite as the
# demo runs it: writers take the lock when their transaction begins.
_default = DATABASES["default"]  # noqa: F405
_portable_file = Path(tempfile.gettempdir()) / (
    f"schedapp_{Path(str(_default.get('TEST', {}).get('NAME') or _default['NAME'])).stem}"
    "_portable.sqlite3"
)
DATABASES["portable"] = {  # noqa: F405
    "ENGINE": "django.db.backends.sqlite3",
    "NAME": _portable_file,
    "OPTIONS": {
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
        "init_command": "PRAGMA journal_mode=WAL;",
    },
    "TEST": {"NAME": _portable_file.with_stem(f"test_{_portable_file.stem}")},
}

# django-celery-beat (a test extra, never a runtime dependency): installed here so that its
# tables exist in the test database and `schedapp_import --from-django-celery-beat` can be
# tested against them. Its scheduler is never used.
try:
    import django_celery_beat  # noqa: F401
except ImportError:
    pass
else:
    INSTALLED_APPS = [*INSTALLED_APPS, "django_celery_beat"]  # noqa: F405
