"""The test databases copied from a template (tests/dbtemplate.py) are the migrated ones: no
migration left to apply on either store, and a change to any migration file (or a new one)
names another template, so a stale copy is never used."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connections
from django.db.migrations.executor import MigrationExecutor
from django.db.migrations.loader import MigrationLoader

from tests import dbtemplate

# PostgreSQL's and the portable store's (project.settings_test_sqlite has only the one)
ALIASES = [alias for alias in ("default", "portable") if alias in settings.DATABASES]


@pytest.mark.django_db(databases=ALIASES)
@pytest.mark.parametrize("alias", ALIASES)
def test_the_test_database_has_every_migration_applied(alias: str) -> None:
    executor = MigrationExecutor(connections[alias])
    assert executor.migration_plan(executor.loader.graph.leaf_nodes()) == []
    assert ("schedapp", "0001_initial") in executor.recorder.applied_migrations()


def test_a_changed_or_added_migration_file_names_another_template(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "fake_migrations"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "0001_initial.py").write_text("# one\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    original = MigrationLoader.migrations_module

    def migrations_module(label: str) -> Any:
        return ("fake_migrations", True) if label == "schedapp" else original(label)

    monkeypatch.setattr(MigrationLoader, "migrations_module", staticmethod(migrations_module))
    first = dbtemplate.fingerprint()
    assert dbtemplate.fingerprint() == first
    (package / "0001_initial.py").write_text("# two\n")
    changed = dbtemplate.fingerprint()
    (package / "0002_more.py").write_text("# more\n")
    added = dbtemplate.fingerprint()
    assert len({first, changed, added}) == 3
