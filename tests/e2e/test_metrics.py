"""Beats and workers expose Prometheus metrics that move with real work."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path

import pytest

from schedapp import api
from schedapp.db import db_now
from schedapp.models import Job, JobState
from schedapp.testing.processes import wait_until
from schedapp.testing.servers import free_port

pytestmark = [pytest.mark.e2e]


def scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    values: dict[str, float] = {}
    for line in text.splitlines():
        match = re.match(r"^(schedapp_[a-z_]+(?:\{[^}]*\})?) ([0-9.e+-]+)$", line)
        if match:
            values[match[1]] = float(match[2])
    return values


def test_beat_and_worker_metrics_count_claims_dispatches_and_completions(fleet, tmp_path):
    beat_port, worker_port = free_port(), free_port()
    fleet.beat(settings={"SCHEDAPP_METRICS_PORT": beat_port})
    multiproc = tmp_path / "prom"
    multiproc.mkdir()
    fleet.worker(
        settings={"SCHEDAPP_METRICS_PORT": worker_port, "PROMETHEUS_MULTIPROC_DIR": str(multiproc)}
    )
    api.schedule_many(
        {"task": "project.tasks.record", "run_at": db_now(), "name": f"m-{i}"} for i in range(5)
    )
    api.schedule("project.tasks.fail", run_at=db_now(), max_retries=0, name="m-fails")
    wait_until(
        lambda: Job.objects.filter(state__in=[JobState.SUCCEEDED, JobState.DEAD]).count() == 6,
        timeout=30,
    )
    beat = wait_until(
        lambda: (m := scrape(beat_port)).get("schedapp_dispatches_total", 0) >= 6 and m, timeout=10
    )
    assert beat["schedapp_claims_total"] >= 6
    assert beat["schedapp_dispatch_lag_seconds_count"] >= 6
    assert beat["schedapp_beat_ticks_total"] >= 1
    worker = wait_until(
        lambda: (
            (m := scrape(worker_port)).get('schedapp_runs_finished_total{status="succeeded"}', 0)
            >= 5
            and m
        ),
        timeout=10,
    )
    assert worker['schedapp_runs_finished_total{status="failed"}'] >= 1
    assert worker["schedapp_dead_letters_total"] >= 1


def documented_liveness_probe(port: int) -> str:
    """The beat's liveness probe of docs/operations.md, as a user copies it."""
    from tests import ROOT

    doc = (ROOT / "docs" / "operations.md").read_text()
    probe = doc.split("livenessProbe:", 1)[1].split("initialDelaySeconds", 1)[0]
    block = probe.split("- |\n", 1)[1]
    script = textwrap.dedent(block)
    assert "schedapp_beat_last_tick_timestamp_seconds" in script and ":9100/" in script
    return script.replace(":9100/", f":{port}/")


def test_the_documented_liveness_probe_passes_on_a_ticking_beat_whose_failed_ticks_stop_its_clock(
    fleet, pg_proxy
):
    # Given a beat serving metrics, its database connections through a proxy
    port = free_port()
    fleet.beat(
        settings={
            "SCHEDAPP_METRICS_PORT": port,
            "DATABASE_URL": pg_proxy.database_url(fleet.env["DATABASE_URL"]),
            "SCHEDAPP_MAX_SLEEP": 0.5,
        }
    )
    tick = "schedapp_beat_last_tick_timestamp_seconds"
    # Then the probe docs/operations.md gives passes, and the last tick advances
    probe = subprocess.run([sys.executable, "-c", documented_liveness_probe(port)], timeout=30)
    assert probe.returncode == 0
    first = wait_until(lambda: scrape(port).get(tick), timeout=10)
    wait_until(lambda: scrape(port)[tick] > first, timeout=10)
    # When the database becomes unreachable (connections refused)
    pg_proxy.stop()
    errors = 'schedapp_beat_errors_total{kind="database"}'
    wait_until(lambda: scrape(port).get(errors, 0) >= 1, timeout=30)
    # Then the failing ticks leave the last tick where it was
    stopped = scrape(port)[tick]
    before = scrape(port)[errors]
    wait_until(lambda: scrape(port)[errors] >= before + 2, timeout=30)
    assert scrape(port)[tick] == stopped


def test_a_prefork_worker_without_a_multiprocess_dir_and_a_beat_on_its_port_say_what_to_do(fleet):
    # Given a prefork worker serving metrics without PROMETHEUS_MULTIPROC_DIR
    port = free_port()
    metric_files = set(Path(fleet.cwd).glob("*.db"))
    unset = {"PROMETHEUS_MULTIPROC_DIR": None}
    worker = fleet.worker(settings={"SCHEDAPP_METRICS_PORT": port, **unset})
    # Then it says its pool processes' counts will be missing, and how to fix it
    worker.wait_for("PROMETHEUS_MULTIPROC_DIR is not set", timeout=30)
    assert f"on port {port} will not show them" in worker.log()
    # and writes no metric files into its working directory (an empty variable would)
    assert set(Path(fleet.cwd).glob("*.db")) == metric_files
    # When a beat on the same host takes the same port
    beat = fleet.beat(settings={"SCHEDAPP_METRICS_PORT": port})
    # Then it runs on, and says the port is taken and what to change
    beat.wait_for(f"metrics server not started on 0.0.0.0:{port}", timeout=30)
    beat.wait_for("Give each process its own SCHEDAPP_METRICS_PORT", timeout=10)
    assert beat.alive()
