"""A pickle message reaches a worker: it is refused, never executed (JSON only)."""

from __future__ import annotations

import time

import pytest

from project.celery import app
from project.models import Execution
from schedapp.testing.processes import wait_until

pytestmark = [pytest.mark.e2e]


def test_a_pickle_message_is_refused_by_the_worker(fleet):
    worker = fleet.worker(concurrency=1)
    app.send_task("project.tasks.record", kwargs={"label": "pickled"}, serializer="pickle")
    app.send_task("project.tasks.record", kwargs={"label": "json"})
    wait_until(
        lambda: Execution.objects.filter(label="json").exists(),
        timeout=20,
        message="the JSON message ran",
    )
    wait_until(lambda: "pickle" in worker.log(), timeout=10, message="the refusal was logged")
    time.sleep(1)
    assert not Execution.objects.filter(label="pickled").exists()
    assert "Refusing to deserialize untrusted content of type pickle" in worker.log()
