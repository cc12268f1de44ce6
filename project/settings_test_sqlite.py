"""The test settings on SQLite (the portable store): the claim tests run here too, so the
path the demo takes is tested as PostgreSQL's is (tests/integration/test_portable_store.py
runs them). Tests that only make sense on PostgreSQL are marked ``postgresql``."""

import os

from .settings_test import *  # noqa: F403
from .settings_test import VAR_DIR

VAR_DIR.mkdir(parents=True, exist_ok=True)
_name = os.environ.get("DATABASE_TEST_NAME") or "test"
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": VAR_DIR / f"{_name}.sqlite3",
        # As the demo's: writers take the lock when their transaction begins.
        "OPTIONS": {
            "transaction_mode": "IMMEDIATE",
            "timeout": 30,
            "init_command": "PRAGMA journal_mode=WAL;",
        },
        "TEST": {"NAME": VAR_DIR / f"{_name}.sqlite3"},
    }
}
