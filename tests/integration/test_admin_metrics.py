"""Prometheus metrics: the functions beats and workers call, and their exposition."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import urllib.request
from datetime import timedelta
from pathlib import Path

import pytest
from django.test import RequestFactory, override_settings
from prometheus_client import REGISTRY

from schedapp import api, metrics, views
from schedapp.db import db_now
from schedapp.models import Job, JobState, Node

ROOT = Path(__file__).resolve().parents[2]


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_functions_count_claims_dispatches_lag_failures_and_heartbeats():
    before = {
        "claims": value("schedapp_claims_total"),
        "dispatches": value("schedapp_dispatches_total"),
        "lag_count": value("schedapp_dispatch_lag_seconds_count"),
        "lag_fast": value("schedapp_dispatch_lag_seconds_bucket", le="0.1"),
        "expiries": value("schedapp_lease_expiries_total"),
        "failed": value("schedapp_runs_finished_total", status="failed"),
        "succeeded": value("schedapp_runs_finished_total", status="succeeded"),
        "dead": value("schedapp_dead_letters_total"),
        "stale": value("schedapp_stale_completions_total"),
        "door": value("schedapp_door_skips_total", reason="stale_token"),
        "publish": value("schedapp_publish_failures_total"),
        "heartbeats": value("schedapp_heartbeats_total", kind="worker"),
        "renewed": value("schedapp_leases_renewed_total"),
    }
    metrics.claimed(10, misfires_skipped=1)
    metrics.reaped(2)
    metrics.dispatched(3, [0.05, 0.02, 4.0])
    metrics.publish_failed(1)
    metrics.run_finished("failed", dead=True)
    metrics.run_finished("succeeded", stale=True)
    metrics.door_skipped("stale_token")
    metrics.heartbeat("worker", renewed=4, lost=0)
    metrics.beat_tick(0.01, at=1_700_000_000.0)

    assert value("schedapp_claims_total") - before["claims"] == 10
    assert value("schedapp_lease_expiries_total") - before["expiries"] == 2
    assert value("schedapp_dispatches_total") - before["dispatches"] == 3
    assert value("schedapp_dispatch_lag_seconds_count") - before["lag_count"] == 3
    assert value("schedapp_dispatch_lag_seconds_bucket", le="0.1") - before["lag_fast"] == 2
    assert value("schedapp_publish_failures_total") - before["publish"] == 1
    assert value("schedapp_runs_finished_total", status="failed") - before["failed"] == 1
    assert value("schedapp_runs_finished_total", status="succeeded") - before["succeeded"] == 1
    assert value("schedapp_dead_letters_total") - before["dead"] == 1
    assert value("schedapp_stale_completions_total") - before["stale"] == 1
    assert value("schedapp_door_skips_total", reason="stale_token") - before["door"] == 1
    assert value("schedapp_heartbeats_total", kind="worker") - before["heartbeats"] == 1
    assert value("schedapp_leases_renewed_total") - before["renewed"] == 4
    assert value("schedapp_beat_last_tick_timestamp_seconds") == 1_700_000_000.0


@pytest.mark.django_db
def test_exposition_has_process_metrics_and_fleet_gauges_from_the_database():
    now = db_now()
    api.schedule("project.tasks.record", run_at=now - timedelta(seconds=30), name="due")
    dead = api.schedule("project.tasks.fail", interval=60, name="dead")
    Job.objects.filter(pk=dead.pk).update(state=JobState.DEAD)
    Node.objects.create(name="b1", kind="beat", started_at=now, last_seen_at=now)
    metrics.claimed(1)

    body, content_type = metrics.exposition()
    text = body.decode()

    assert content_type.startswith("text/plain")
    assert "# TYPE schedapp_claims_total counter" in text
    assert "# TYPE schedapp_dispatch_lag_seconds histogram" in text
    assert 'schedapp_jobs{state="scheduled"} 1.0' in text
    assert 'schedapp_jobs{state="dead"} 1.0' in text
    assert "schedapp_due_backlog 1.0" in text
    assert 'schedapp_nodes_alive{kind="beat"} 1.0' in text
    oldest = next(
        line for line in text.splitlines() if line.startswith("schedapp_oldest_due_seconds ")
    )
    assert float(oldest.split()[1]) >= 30


@pytest.mark.django_db
def test_metrics_view_and_its_optional_token():
    request = RequestFactory().get("/metrics/")
    response = views.metrics(request)
    assert response.status_code == 200 and b"schedapp_jobs" in response.content
    with override_settings(SCHEDAPP_METRICS_TOKEN="s3cret"):
        assert views.metrics(RequestFactory().get("/metrics/")).status_code == 401
        ok = RequestFactory().get("/metrics/", HTTP_AUTHORIZATION="Bearer s3cret")
        assert views.metrics(ok).status_code == 200


def test_metrics_server_serves_this_process():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    assert metrics.start_metrics_server(port, addr="127.0.0.1")
    assert not metrics.start_metrics_server(port, addr="127.0.0.1")  # once per process
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert "schedapp_claims_total" in body
    with override_settings(SCHEDAPP_METRICS_PORT=None):
        assert metrics.metrics_port() is None


def test_prefork_children_are_counted_in_multiprocess_mode(tmp_path):
    # A parent (the worker's main process) and a forked child (a pool process) both count;
    # with PROMETHEUS_MULTIPROC_DIR the parent's exposition includes the child's increments.
    script = textwrap.dedent("""
        import os
        os.environ["DJANGO_SETTINGS_MODULE"] = "project.settings_test"
        import django; django.setup()
        from schedapp import metrics
        metrics.run_finished("succeeded")
        pid = os.fork()
        if pid == 0:
            metrics.run_finished("succeeded"); metrics.run_finished("failed")
            os._exit(0)
        os.waitpid(pid, 0)
        print(metrics.exposition(include_fleet=False)[0].decode())
    """)
    env = {
        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path),
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(ROOT),
    }
    out = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert 'schedapp_runs_finished_total{status="succeeded"} 2.0' in out
    assert 'schedapp_runs_finished_total{status="failed"} 1.0' in out
