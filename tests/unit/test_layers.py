"""The package's layers, read from its own imports (imports inside functions included).

A module may import modules of its own floor or of floors below it, never above, and the
imports have no cycle. Every module has a floor: a new one must be given its place here (and a
line in the README's Architecture section).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "schedapp"

# Bottom floor first. Names are module paths below ``schedapp``; a trailing ``.*`` takes a
# whole subpackage.
FLOORS: list[tuple[str, tuple[str, ...]]] = [
    # Schedule and policy math, the message format, settings and signals: no database.
    (
        "pure",
        (
            "exceptions",
            "message",
            "cronsyntax",
            "cronmath",
            "solar",
            "schedules",
            "calendars",
            "policies",
            "display",
            "fields",
            "payload",
            "schedule_checks",
            "conf",
            "signals",
            "lease.rules",
            "notify.channels",
            "notify.messages",
        ),
    ),
    # What a job is and the statements that read and write it.
    (
        "storage",
        (
            "db",
            "sql",
            "store",
            "store.*",
            "models",
            "ledger",
            "audit",
            "celeryapp",
            "option_rules",
            "validation",
            "job_calendars",
            "calendar_edits",
            "lease",
            "lease.*",
            "settings_checks",
            "bulk",
            "copyrows",
            "partitions",
            "prune",
            "nodes",
            "explain",
            "deadlines",
            "attention",
            "notify",
            "notify.outbox",
        ),
    ),
    # The Python API and the jobs that reach it from code and from other schedulers.
    ("api", ("api", "declared", "importer")),
    # Beats and workers, and what runs inside them.
    # (overview reads the fleet's state and resolves queues as the publisher does)
    (
        "processes",
        (
            "dispatch",
            "overview",
            "context",
            "metrics",
            "beat",
            "worker",
            "worker.*",
            "tasks",
            "results",
            "notify.delivery",
        ),
    ),
    # What people and Django see: the admin, views, checks, commands, the app and package.
    (
        "operations",
        (
            "",  # the package itself (its lazy re-exports of context)
            "apps",
            "checks",
            "extras",
            "views",
            "admin",
            "admin.*",
            "admin_*",
            "forms",
            "management",
            "management.*",
            "templatetags",
            "templatetags.*",
        ),
    ),
    # The test kit (servers, the PostgreSQL proxy, real processes): on top, so that nothing
    # else in schedapp imports it; tests/unit/test_kit.py holds it to knowing no project.
    ("kit", ("testing", "testing.*")),
]

# Pure modules are tested without a database or a broker: they import neither.
PURE = (
    "exceptions",
    "message",
    "cronmath",
    "solar",
    "schedules",
    "calendars",
    "policies",
    "display",
    "lease.rules",
    "fields",
    "payload",
    "schedule_checks",
    "notify.channels",
    "notify.messages",
)
IMPURE_PREFIXES = ("django.db", "celery", "kombu", "psycopg", "redis")


def modules() -> dict[str, Path]:
    """``schedapp`` modules by name below the package ("" is the package itself)."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if "migrations" in parts:
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def imports(name: str, path: Path, known: set[str]) -> Iterator[str]:
    """Every module ``name`` imports (absolute names), wherever the import statement is."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ["schedapp", *filter(None, package.split("."))]
                base = base[: len(base) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            yield target
            for alias in node.names:  # ``from . import lease`` imports a module
                if _local(f"{target}.{alias.name}") in known:
                    yield f"{target}.{alias.name}"


def _local(absolute: str) -> str | None:
    if absolute == "schedapp":
        return ""
    if absolute.startswith("schedapp."):
        return absolute.removeprefix("schedapp.")
    return None


def floor_of(name: str) -> int:
    for index, (_floor, names) in enumerate(FLOORS):
        for pattern in names:
            if pattern.endswith("*"):
                if name.startswith(pattern[:-1]):
                    return index
            elif name == pattern:
                return index
    raise LookupError(name)


def graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    edges: dict[str, set[str]] = {}
    for name, path in found.items():
        targets = {_local(t) for t in imports(name, path, known)}
        # Importing a submodule imports its package: that edge is Python's, not a design one.
        edges[name] = {t for t in targets if t is not None and t in known and t not in ("", name)}
    return edges


def test_every_module_has_a_floor():
    unplaced = []
    for name in modules():
        try:
            floor_of(name)
        except LookupError:
            unplaced.append(name)
    assert not unplaced, f"give these modules a floor in FLOORS: {unplaced}"


def test_no_module_imports_from_a_floor_above_its_own():
    upward = [
        f"{name} ({FLOORS[floor_of(name)][0]}) imports {target} ({FLOORS[floor_of(target)][0]})"
        for name, targets in graph().items()
        for target in sorted(targets)
        if floor_of(target) > floor_of(name)
    ]
    assert not upward, "\n".join(upward)


def test_the_imports_have_no_cycle():
    edges = graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(name: str) -> list[str] | None:
        state[name] = 1
        path.append(name)
        for target in sorted(edges.get(name, ())):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state and (cycle := visit(target)):
                return cycle
        path.pop()
        state[name] = 2
        return None

    for name in sorted(edges):
        if name not in state and (cycle := visit(name)):
            pytest.fail("import cycle: " + " -> ".join(cycle))


def test_pure_modules_import_no_database_and_no_broker():
    found = modules()
    known = set(found)
    for name in PURE:
        bad = sorted(
            t
            for t in imports(name, found[name], known)
            if any(t == p or t.startswith(f"{p}.") for p in IMPURE_PREFIXES)
        )
        assert not bad, f"{name} imports {bad}"


def test_the_checker_sees_imports_inside_functions_and_relative_ones(tmp_path: Path):
    # Given a module whose only imports are a relative one and one inside a function
    module = tmp_path / "probe.py"
    module.write_text("from .lease import x\n\ndef f():\n    from . import beat\n")
    # Then both are seen
    found = set(imports("probe", module, {"lease", "beat"}))
    assert {"schedapp.lease", "schedapp.beat"} <= found
