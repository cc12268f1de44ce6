"""Beats and workers expose Prometheus metrics that move with real work."""

from __future__ import annotations

import re
import urllib.request

import pytest

from schedapp import api
from schedapp.db import db_now
from schedapp.models import Job, JobState
from tests.fleet import wait_until
from tests.servers import free_port

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
