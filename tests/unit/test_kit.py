"""The test kit (``schedapp.testing``) is the package's own: the tests and the benchmarks import
it, it imports no project, no test and no bench, and it imports on the package's hard
dependencies alone (what else it uses is imported when used)."""

from __future__ import annotations

import subprocess
import sys

from tests.unit.test_layers import graph, imports, modules

KIT = "testing"
OUTSIDERS = ("project", "tests", "bench")


def kit_modules() -> dict[str, object]:
    return {n: p for n, p in modules().items() if n == KIT or n.startswith(f"{KIT}.")}


def test_the_kit_imports_no_project_no_test_and_no_bench():
    known = set(modules())
    found = sorted(
        f"{name} imports {target}"
        for name, path in kit_modules().items()
        for target in imports(name, path, known)  # type: ignore[arg-type]
        if target.split(".")[0] in OUTSIDERS
    )
    assert not found, found


def test_nothing_else_in_schedapp_imports_the_kit():
    found = sorted(
        f"{name} imports schedapp.{target}"
        for name, targets in graph().items()
        if not (name == KIT or name.startswith(f"{KIT}."))
        for target in targets
        if target == KIT or target.startswith(f"{KIT}.")
    )
    assert not found, found


def test_every_kit_module_imports_without_psutil_a_project_or_the_tests(tmp_path):
    # Given an interpreter where psutil (an extra), the demo project, the tests and the bench
    # cannot be imported, run from outside the repository
    names = sorted(f"schedapp.{n}" for n in kit_modules() if not n.endswith("__main__"))
    script = (
        "import importlib, sys\n"
        "for blocked in ('psutil', 'project', 'tests', 'bench'):\n"
        "    sys.modules[blocked] = None\n"
        f"for name in {names!r}:\n"
        "    importlib.import_module(name)\n"
    )
    # When every kit module is imported, Then none fails
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(names) >= 9, names
