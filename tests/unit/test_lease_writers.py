"""Only ``schedapp/lease/`` writes lease state: a job's lease (``claimed_by``,
``lease_expires_at``), its fencing token and its dispatch counter (``unstarted_dispatches``).

Read from the code itself, as ``test_layers.py`` reads the floors: every ORM ``update()``,
attribute assignment and ``save(update_fields=...)`` outside the package, every statement of
``schedapp/sql/`` that sets those columns, and every call of the store's lease writes. The
store (``schedapp/store/``) is the lease's storage seam: it writes them, and only the lease
package calls those writes. A new row starts with no lease (the bulk COPY and ``schedule``
insert defaults): inserts are not writes of lease state.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "schedapp"
LEASE_COLUMNS = frozenset(
    {
        "token",
        "claimed_by",
        "lease_expires_at",
        "unstarted_dispatches",
        "supersede_at",  # cancel_other / terminate_other: the run in flight is cancelled
        "superseded",
    }
)
# The store's methods that write lease state (schedapp.store.base.Store).
STORE_WRITES = frozenset(
    {
        "claim",
        "restamp_leases",
        "admit",
        "renew",
        "succeed_run",
        "succeed_runs",
        "succeed_and_admit",
    }
)
OWNERS = ("lease", "store")  # the package and its storage seam
SQL_WRITE = re.compile(
    r"\bUPDATE\s+schedapp_job\b.*?\bSET\b(?P<set>.*?)(?:\bWHERE\b|\bFROM\b|\bRETURNING\b|;|$)",
    re.IGNORECASE | re.DOTALL,
)


def writes_of_lease_state(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, what) for every write of a lease column ``tree`` makes through the ORM."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            method = node.func.attr
            if method in ("update", "bulk_update", "update_or_create"):
                for keyword in node.keywords:
                    if keyword.arg in LEASE_COLUMNS:
                        yield node.lineno, f".{method}({keyword.arg}=...)"
            if method == "save":
                kwargs = {k.arg: k.value for k in node.keywords}
                fields = kwargs.get("update_fields")
                if fields is None and "force_insert" not in kwargs:
                    yield node.lineno, ".save() of every column, lease columns included"
                for name in _strings(fields):
                    if name in LEASE_COLUMNS:
                        yield node.lineno, f".save(update_fields=[{name!r}, ...])"
            if method in STORE_WRITES and _looks_like_store(node.func.value):
                yield node.lineno, f"the store's lease write .{method}()"
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            for element in _flatten(target):
                if isinstance(element, ast.Attribute) and element.attr in LEASE_COLUMNS:
                    yield node.lineno, f"assigns .{element.attr}"


def _strings(node: ast.AST | None) -> list[str]:
    if node is None:
        return []
    return [
        n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    ]


def _flatten(target: ast.expr) -> Iterator[ast.expr]:
    if isinstance(target, ast.Tuple | ast.List):
        for element in target.elts:
            yield from _flatten(element)
    else:
        yield target


def _looks_like_store(value: ast.expr) -> bool:
    """``get_store().claim(...)``, ``store.claim(...)``, ``self.store.admit(...)``."""
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
        return value.func.id == "get_store"
    if isinstance(value, ast.Name):
        return "store" in value.id
    if isinstance(value, ast.Attribute):
        return "store" in value.attr
    return False


def sql_writes_of_lease_state(text: str) -> list[str]:
    """The lease columns each ``UPDATE schedapp_job ... SET`` in ``text`` sets."""
    found = []
    for match in SQL_WRITE.finditer(text):
        assignments = re.findall(r"(\w+)\s*=", match.group("set"))
        found += [column for column in assignments if column in LEASE_COLUMNS]
    return found


def outside_the_owners() -> Iterator[tuple[str, Path]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).parts
        if parts[0] in (*OWNERS, "migrations"):
            continue
        yield "/".join(parts), path


def test_no_module_outside_the_lease_package_writes_lease_state():
    bad = [
        f"schedapp/{name}:{line}: {what}"
        for name, path in outside_the_owners()
        for line, what in writes_of_lease_state(ast.parse(path.read_text(), str(path)))
    ]
    assert not bad, "lease state written outside schedapp/lease/:\n" + "\n".join(bad)


def test_the_statements_that_write_lease_state_are_called_only_by_the_store():
    # Given the named statements of schedapp/sql that set a lease column
    from schedapp.sql import queries

    writers = {name for name, sql in queries().items() if sql_writes_of_lease_state(sql)}
    assert {"claim_due_jobs", "restamp_leases"} <= writers  # the reading itself works
    # Then no module outside the lease package and its store asks for one of them
    asked = re.compile(r"""query\(\s*["'](\w+)["']""")
    bad = [
        f"schedapp/{name} asks for {statement}"
        for name, path in outside_the_owners()
        for statement in asked.findall(path.read_text())
        if statement in writers
    ]
    assert not bad, "\n".join(bad)


# --- the checker itself ---------------------------------------------------------------------


def test_the_checker_sees_each_kind_of_write():
    # Given code that writes lease state in each way the ORM allows
    code = """
Job.objects.filter(id=1).update(state="x", token=F("token") + 1)
job.claimed_by, job.lease_expires_at = "", None
job.unstarted_dispatches += 1
job.save(update_fields=["state", "lease_expires_at"])
job.save()
get_store().admit(1, 2, "w", "a")
self.store.renew([(1, 2)])
"""
    # Then every one is found, and by its line
    found = sorted(writes_of_lease_state(ast.parse(code)))
    assert [line for line, _ in found] == [2, 3, 3, 4, 5, 6, 7, 8]


def test_the_checker_leaves_other_writes_alone():
    code = """
Job.objects.filter(id=1).update(state="x", next_run_at=None)
job.save(update_fields=["state", "updated_at"])
job.save(force_insert=True)
headers.update(route.headers)
run.token_seen = 3
claims.admit(1)
"""
    assert list(writes_of_lease_state(ast.parse(code))) == []


def test_the_sql_checker_reads_set_lists():
    sql = (
        "UPDATE schedapp_job j SET state = 'running', lease_expires_at = now() + x, "
        "token = j.token + 1 FROM due WHERE j.id = due.id; "
        "UPDATE schedapp_job SET next_run_at = now() WHERE id = 1"
    )
    assert sql_writes_of_lease_state(sql) == ["lease_expires_at", "token"]
