"""The claim tests on the portable store: the same tests as on PostgreSQL, run against SQLite
(project.settings_test_sqlite, as the demo runs), so the ORM claim, door and renewals are
tested, not just smoke-checked by the demo. One settings module per process is Django's rule,
hence a second pytest run; tests about PostgreSQL itself are marked ``postgresql`` and skipped
there."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SQLITE = ["--ds=project.settings_test_sqlite"]
CLAIM_TESTS = [
    "tests/integration/test_claims.py",
    "tests/integration/test_job_lifecycle.py",
    "tests/integration/test_worker_protocol.py",
]


def test_the_claim_tests_pass_on_the_portable_store():
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "project.settings_test_sqlite"}
    env.pop("DATABASE_URL", None)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *SQLITE, *CLAIM_TESTS],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    # It really ran them, on SQLite: most passed, and only PostgreSQL's own were skipped.
    passed = int(re.search(r"(\d+) passed", summary).group(1))  # type: ignore[union-attr]
    assert passed >= 30, summary
    assert "sqlite" in _engine_seen(env), "the run did not use SQLite"


def _engine_seen(env: dict[str, str]) -> str:
    probe = "from django.conf import settings; print(settings.DATABASES['default']['ENGINE'])"
    return subprocess.run(
        [sys.executable, "-c", f"import django; django.setup(); {probe}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
