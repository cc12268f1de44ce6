"""What a beat or a worker says when its metrics would mislead or cannot be served: a prefork
worker without ``PROMETHEUS_MULTIPROC_DIR``, and a metrics port another process on the host
already serves (two processes with one ``SCHEDAPP_METRICS_PORT``)."""

from __future__ import annotations

import logging
import socket

import pytest
from celery.concurrency.prefork import TaskPool as PreforkPool
from celery.concurrency.thread import TaskPool as ThreadPool
from django.test import override_settings

from schedapp import metrics


@pytest.fixture
def no_multiproc_dir(monkeypatch):
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    monkeypatch.delenv("prometheus_multiproc_dir", raising=False)


@pytest.mark.parametrize(
    "pool", ["prefork", "processes", "celery.concurrency.prefork:TaskPool", PreforkPool], ids=str
)
def test_a_prefork_worker_serving_metrics_without_a_multiprocess_dir_is_told(
    no_multiproc_dir, caplog, pool
):
    with override_settings(SCHEDAPP_METRICS_PORT=9100), caplog.at_level(logging.WARNING):
        assert metrics.warn_if_pool_unaggregated(pool)
    (record,) = [r for r in caplog.records if r.name == "schedapp.metrics"]
    assert record.levelno == logging.WARNING
    assert "PROMETHEUS_MULTIPROC_DIR is not set" in record.getMessage()
    assert "on port 9100 will not show them" in record.getMessage()


@pytest.mark.parametrize("pool", ["threads", "solo", ThreadPool], ids=str)
def test_other_pools_are_not(no_multiproc_dir, caplog, pool):
    with override_settings(SCHEDAPP_METRICS_PORT=9100), caplog.at_level(logging.WARNING):
        assert not metrics.warn_if_pool_unaggregated(pool)
    assert not caplog.records


def test_nor_a_prefork_worker_with_the_directory_or_without_a_metrics_port(
    no_multiproc_dir, monkeypatch, tmp_path, caplog
):
    with override_settings(SCHEDAPP_METRICS_PORT=None), caplog.at_level(logging.WARNING):
        assert not metrics.warn_if_pool_unaggregated("prefork")
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    with override_settings(SCHEDAPP_METRICS_PORT=9100), caplog.at_level(logging.WARNING):
        assert not metrics.warn_if_pool_unaggregated("prefork")
    assert not caplog.records


def test_a_metrics_port_another_process_serves_is_logged_with_the_fix(monkeypatch, caplog):
    monkeypatch.setattr(metrics, "_server_started", [])
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with caplog.at_level(logging.WARNING):
            assert metrics.start_metrics_server(port, addr="127.0.0.1") is False
    text = caplog.text
    assert f"metrics server not started on 127.0.0.1:{port}" in text
    assert "Another process on this host serves that port" in text
    assert "Give each process its own SCHEDAPP_METRICS_PORT" in text
