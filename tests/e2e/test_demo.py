"""The demo command, as a newcomer runs it: on SQLite and the filesystem broker, and stopped
the way supervisors stop things (SIGTERM), it leaves nothing running and nothing behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.e2e]


def test_sigterm_stops_the_demo_and_every_process_it_started(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL")}
    env.update(SCHEDAPP_VAR_DIR=str(tmp_path / "var"), DJANGO_SETTINGS_MODULE="project.settings")
    out = tmp_path / "demo.out"
    with open(out, "wb") as sink:
        demo = subprocess.Popen(
            [sys.executable, "manage.py", "demo", "--seconds", "120", "--port", "8799"],
            cwd=ROOT,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 90
        while b"admin: http://" not in out.read_bytes():
            assert demo.poll() is None, out.read_text()
            assert time.monotonic() < deadline, out.read_text()
            time.sleep(0.5)
        # a broadcast (what `api.cancel` sends to revoke) declares the control exchange
        subprocess.run(
            [
                sys.executable,
                "-c",
                "import django; django.setup(); from project.celery import app; "
                "app.control.ping(timeout=1)",
            ],
            cwd=tmp_path,
            env={**env, "PYTHONPATH": str(ROOT)},
            check=True,
            timeout=60,
        )
        children = psutil.Process(demo.pid).children(recursive=True)
        assert len(children) >= 4  # two beats, a worker (and its pool), the web server
        demo.send_signal(signal.SIGTERM)
        demo.wait(timeout=60)
        _gone, alive = psutil.wait_procs(children, timeout=20)
        assert not alive, [p.cmdline() for p in alive]
        assert "stopped." in out.read_text()
    finally:
        if demo.poll() is None:
            demo.kill()
    # the filesystem broker keeps its control files under the var directory, not in the
    # working directory of whoever sent a broadcast
    assert not (tmp_path / "control").exists()
    assert (tmp_path / "var" / "broker" / "control").is_dir()
