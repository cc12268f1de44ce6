"""The test settings with SQLite (the portable store) as the default database: the whole
suite can be run on it by hand (``pytest --ds=project.settings_test_sqlite``), and a test of
the system checks starts a process with it. The default run tests the portable store next to
PostgreSQL in one process instead (tests/integration/test_store_contract.py, through the
``portable`` alias of project.settings_test). Tests that only make sense on PostgreSQL are
marked ``postgresql``."""

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
