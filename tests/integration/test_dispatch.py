"""The Redis fast path stores exactly what kombu would, so stock workers consume it."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime

import pytest
import redis
from django.conf import settings

from project.celery import app
from schedapp.claims import ClaimedRun
from schedapp.dispatch import Dispatcher, _redis_channel

pytestmark = pytest.mark.usefixtures("broker_url")


def claimed(job_id: int = 7, token: int = 3, queue: str = "") -> ClaimedRun:
    return ClaimedRun(
        run_id=11,
        job_id=job_id,
        token=token,
        name="a job",
        task="project.tasks.record",
        args_json='[1, "two"]',
        kwargs_json='{"label": "x\\u00e9"}',
        queue=queue,
        scheduled_for=datetime(2030, 1, 1, 12, tzinfo=UTC),
        due_at=datetime(2030, 1, 1, 12, tzinfo=UTC),
        attempt=1,
        lease_seconds=30,
    )


def stored(queue: str = "celery") -> list[dict]:
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    return [json.loads(raw) for raw in client.lrange(queue, 0, -1)]


def test_fast_path_message_matches_kombus_own_publish():
    dispatcher = Dispatcher(app, origin="test")
    run = claimed()
    # Given the same run published by kombu's producer and by the fast path
    with app.producer_or_acquire() as producer:
        assert _redis_channel(producer) is not None
        # the fast path first: it restores the queue binding the flushed test broker lost,
        # which kombu, remembering it declared it, would not (and would drop the message)
        dispatcher._publish_redis(producer, producer.channel, [run])
        dispatcher._publish_one(producer, run)
    slow, fast = stored()  # LPUSH: the newest first
    # Then they are the same message but for kombu's random delivery tag
    for message in (fast, slow):
        message["properties"].pop("delivery_tag")
    assert fast == slow
    body = json.loads(base64.b64decode(fast["body"]))
    assert body[0] == [1, "two"] and body[1] == {"label": "xé"}
    assert fast["headers"]["id"] == "schedapp:7:3"
    assert fast["headers"]["schedapp_token"] == 3


def test_fast_path_message_carries_every_header_celery_sends():
    dispatcher = Dispatcher(app, origin="test")
    result = dispatcher.publish([claimed()])  # declares the queue binding if it is missing
    app.send_task("project.tasks.record", kwargs={"label": "plain"})
    assert result.error is None and len(result.published) == 1
    celerys, ours = stored()
    assert set(celerys["headers"]) <= set(ours["headers"])
    assert set(celerys["properties"]) == set(ours["properties"])
    assert ours["content-type"] == celerys["content-type"] == "application/json"


def test_a_job_queue_routes_the_message_to_that_queue():
    Dispatcher(app).publish([claimed(queue="reports")])
    (message,) = stored("reports")
    assert message["properties"]["delivery_info"]["routing_key"] == "reports"
    assert stored("celery") == []


def test_a_flushed_broker_gets_its_queue_binding_back_instead_of_losing_messages():
    dispatcher = Dispatcher(app)
    dispatcher.publish([claimed(1, 1)])
    redis.Redis.from_url(settings.CELERY_BROKER_URL).flushdb()  # bindings gone
    fresh = Dispatcher(app)
    assert fresh.publish([claimed(2, 1)]).error is None
    (message,) = stored()
    assert message["headers"]["id"] == "schedapp:2:1"


def test_publishing_to_an_unreachable_broker_reports_every_run_failed(monkeypatch):
    monkeypatch.delenv("CELERY_BROKER_URL", raising=False)  # Celery prefers it to any config
    broken = app.__class__("broken", broker="redis://127.0.0.1:1/0", set_as_current=False)
    assert broken.conf.broker_url == "redis://127.0.0.1:1/0"
    result = Dispatcher(broken).publish([claimed(1, 1), claimed(2, 1)])
    assert result.published == []
    assert [r.job_id for r in result.failed] == [1, 2]
    assert result.error is not None
