"""The test settings' own promises: two test runs that may share a machine never share a
database, SQLite's included."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests import ROOT


def _portable_test_file(**env: str) -> str:
    code = (
        "import json, project.settings_test as s; "
        "print(json.dumps(str(s.DATABASES['portable']['TEST']['NAME'])))"
    )
    environ = {k: v for k, v in os.environ.items() if k != "DATABASE_TEST_NAME"}
    environ.update(env)
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=environ, capture_output=True, text=True,
        check=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_runs_on_one_database_url_with_their_own_test_names_get_their_own_portable_file() -> None:
    """Two runs given one DATABASE_URL and their own DATABASE_TEST_NAME (as parallel sessions
    on one machine are) must not disturb each other's portable-store tests."""
    url = "postgres://postgres@127.0.0.1:5432/schedapp"
    first = _portable_test_file(DATABASE_URL=url, DATABASE_TEST_NAME="test_schedapp_a")
    second = _portable_test_file(DATABASE_URL=url, DATABASE_TEST_NAME="test_schedapp_b")
    assert first != second
    assert _portable_test_file(DATABASE_URL=url) not in (first, second)
