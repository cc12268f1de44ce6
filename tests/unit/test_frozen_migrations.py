"""Migrations run frozen copies of their SQL: what a migration runs can never change after it
shipped (a database that applied it keeps what it ran), so none may take its text from
somewhere that changes: another migration's module, schedapp/sql, a file read at migrate time,
a string patched or formatted from other values. (Django's own references to schedapp.models,
field defaults and expressions, are the migration framework's business, not SQL text.)"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

MIGRATIONS = Path(__file__).resolve().parents[2] / "schedapp" / "migrations"

# Imports that can carry a text which changes later.
FORBIDDEN_MODULES = ("importlib", "schedapp.migrations", "schedapp.sql", "pathlib")
# Calls that read or rewrite a text at migrate time.
FORBIDDEN_CALLS = {"import_module", "__import__", "open", "read_text", "replace", "format"}


def unfrozen(tree: ast.AST) -> list[str]:
    """What in a migration's module could make the SQL it runs differ from its own literals."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                names.append("." * node.level + (node.module or ""))
            found += [
                f"line {node.lineno}: import {name}"
                for name in names
                if name.startswith(".") or name.startswith(FORBIDDEN_MODULES)
            ]
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in FORBIDDEN_CALLS:
                found.append(f"line {node.lineno}: {name}()")
    return found


@pytest.mark.parametrize("path", sorted(MIGRATIONS.glob("0*.py")), ids=lambda p: p.stem)
def test_a_migration_runs_only_its_own_literal_text(path: Path):
    assert unfrozen(ast.parse(path.read_text())) == []
