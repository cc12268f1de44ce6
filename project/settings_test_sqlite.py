"""The test settings with SQLite (the portable store) as the default database, for a test of
the system checks that starts a process with it. The portable store is tested next to
PostgreSQL in one process instead (tests/integration/test_store_contract.py, through the
``portable`` alias of project.settings_test), in the default run. The whole suite on these
settings (``pytest --ds=project.settings_test_sqlite``) is not kept green: about 40 tests
assume PostgreSQL's SQL or its clock held still for a transaction (schedule_many's raw rows,
lock and LISTEN tests not yet marked ``postgresql``), and the contract suite's ``portable``
alias is not defined here."""

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
