"""The test databases copied from a template instead of migrated, when nothing migrations read
has changed.

Django makes each test database by running every migration: some 98 on each of the two
databases (PostgreSQL's and the portable SQLite one), about 9 s on 2 cores before the first
database test, almost all of it Python rendering model states. The database they leave depends
only on the migration files (the frozen SQL is inside them), on ``schedapp/models.py`` (which
they import) and on Django's version: their fingerprint names a template, kept beside the test
database after a run migrated it (PostgreSQL: a database ``<test name>_t<fingerprint>``;
SQLite: a file beside the test file). The next run copies the template (PostgreSQL's
``CREATE DATABASE ... TEMPLATE``, SQLite's backup), in a fraction of a second. A changed
fingerprint migrates again, and replaces the older template.

``TEST_DB_MIGRATE=1`` migrates whatever the templates hold (and keeps the template it makes).
"""

from __future__ import annotations

import hashlib
import importlib
import os
import re
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import django
from django.apps import apps
from django.conf import settings
from django.core.management import call_command
from django.db import DatabaseError
from django.db.backends.base.creation import BaseDatabaseCreation
from django.db.migrations.loader import MigrationLoader

ROOT = Path(__file__).resolve().parent.parent


def fingerprint() -> str:
    """What the migrated database depends on: every app's migration files, the models module
    schedapp's migrations import, Django's version."""
    digest = hashlib.sha256(django.get_version().encode())
    files = [ROOT / "schedapp" / "models.py"]
    for app in apps.get_app_configs():
        module_name, _explicit = MigrationLoader.migrations_module(app.label)
        if module_name is None:
            continue
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        if getattr(module, "__file__", None) is None:
            continue
        directory = Path(module.__file__).parent
        files.extend(
            p
            for p in directory.rglob("*")
            if p.is_file() and p.suffix in (".py", ".sql") and "__pycache__" not in p.parts
        )
    for path in sorted(set(files)):
        digest.update(str(path).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


class _Postgres:
    def __init__(self, creation: BaseDatabaseCreation, name: str, key: str) -> None:
        self.creation = creation
        self.name = name
        self.prefix = f"{name}_t"
        self.template = f"{self.prefix}{key}"

    def _run(self, sql: str, params: Any = None) -> list[tuple]:
        with self.creation._nodb_cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchall() if cursor.description else []

    def _quote(self, name: str) -> str:
        return self.creation.connection.ops.quote_name(name)

    def exists(self) -> bool:
        return bool(self._run("SELECT 1 FROM pg_database WHERE datname = %s", [self.template]))

    def restore(self) -> None:
        self._run(f"DROP DATABASE IF EXISTS {self._quote(self.name)}")
        self._run(f"CREATE DATABASE {self._quote(self.name)} TEMPLATE {self._quote(self.template)}")

    def save(self) -> None:
        for (old,) in self._run("SELECT datname FROM pg_database"):
            if re.fullmatch(re.escape(self.prefix) + "[0-9a-f]{12}", old):
                self._run(f"DROP DATABASE IF EXISTS {self._quote(old)}")
        self._run(f"CREATE DATABASE {self._quote(self.template)} TEMPLATE {self._quote(self.name)}")


class _SQLite:
    def __init__(self, name: str, key: str) -> None:
        self.path = Path(name)
        self.prefix = f"{self.path.name}.template-"
        self.template = self.path.with_name(f"{self.prefix}{key}")

    def exists(self) -> bool:
        return self.template.is_file()

    @staticmethod
    def _copy(source: Path, target: Path) -> None:
        for leftover in (target, Path(f"{target}-wal"), Path(f"{target}-shm")):
            leftover.unlink(missing_ok=True)
        with sqlite3.connect(source) as src, sqlite3.connect(target) as dst:
            src.backup(dst)
        src.close()
        dst.close()

    def restore(self) -> None:
        self._copy(self.template, self.path)

    def save(self) -> None:
        for old in self.path.parent.glob(f"{self.prefix}*"):
            if re.fullmatch(re.escape(self.prefix) + "[0-9a-f]{12}", old.name):
                old.unlink(missing_ok=True)
        partial = self.path.with_name(f"{self.path.name}.partial")
        self._copy(self.path, partial)
        partial.replace(self.template)


def _store(creation: BaseDatabaseCreation, name: str, key: str) -> _Postgres | _SQLite | None:
    vendor = creation.connection.vendor
    if vendor == "postgresql":
        return _Postgres(creation, name, key)
    if vendor == "sqlite" and not creation.is_in_memory_db(name):
        return _SQLite(name, key)
    return None


@contextmanager
def installed() -> Iterator[None]:
    """``create_test_db`` copies a template while the context is open."""
    original = BaseDatabaseCreation.create_test_db
    key = fingerprint()

    def create_test_db(
        self: BaseDatabaseCreation,
        verbosity: int = 1,
        autoclobber: bool = False,
        serialize: bool = True,
        keepdb: bool = False,
    ) -> str:
        name = self._get_test_db_name()
        store = None
        if not keepdb and self.connection.settings_dict["TEST"].get("MIGRATE") is not False:
            store = _store(self, name, key)
        if store is None:
            return original(self, verbosity, autoclobber, serialize, keepdb)
        if os.environ.get("TEST_DB_MIGRATE") != "1" and store.exists():
            try:
                store.restore()
            except (DatabaseError, sqlite3.Error, OSError):
                pass  # (a test database still in use, say): migrate as Django does
            else:
                return _finish(self, name, serialize)
        name = original(self, verbosity, autoclobber, serialize, keepdb)
        self.connection.close()  # PostgreSQL copies a database nobody is connected to
        try:
            store.save()
        except (DatabaseError, sqlite3.Error, OSError):
            pass  # the next run migrates again
        self.connection.ensure_connection()
        return name

    BaseDatabaseCreation.create_test_db = create_test_db  # type: ignore[method-assign]
    try:
        yield
    finally:
        BaseDatabaseCreation.create_test_db = original  # type: ignore[method-assign]


def _finish(creation: BaseDatabaseCreation, name: str, serialize: bool) -> str:
    """The rest of Django's ``create_test_db`` after its migrate."""
    connection = creation.connection
    connection.close()
    settings.DATABASES[connection.alias]["NAME"] = name
    connection.settings_dict["NAME"] = name
    if serialize:
        connection._test_serialized_contents = creation.serialize_db_to_string()
    call_command("createcachetable", database=connection.alias)
    connection.ensure_connection()
    return name
