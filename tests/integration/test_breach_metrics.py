"""Prometheus counters for deadlines and notifications (docs/operations.md): breaches per kind
and tag, their tags bounded per process; notification events sent and given up, per channel
and kind; each message a channel did not take."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import override_settings
from prometheus_client import REGISTRY

from schedapp import metrics, notify
from schedapp.deadlines import check_deadlines
from schedapp.models import JobState
from schedapp.notify.delivery import deliver_once
from tests.integration.test_deadlines import make, now_of, run
from tests.integration.test_notifications import a_job, deliver_until, hook
from tests.receivers import webhook_receiver

pytestmark = pytest.mark.django_db(transaction=True)


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_a_breach_is_counted_under_each_of_its_jobs_tags():
    before = {
        tag: value("schedapp_breaches_by_tag_total", kind="late", tag=tag)
        for tag in ("team-a", "nightly", "")
    }
    now = now_of("default")
    for name, tags in (("tagged", ["team-a", "nightly"]), ("untagged", [])):
        job = make(
            "default",
            name=name,
            tags=tags,
            start_deadline=timedelta(seconds=10),
            state=JobState.RUNNING,
            scheduled_for=now - timedelta(seconds=30),
            lease_expires_at=now + timedelta(minutes=1),
            token=1,
        )
        run("default", job, status="dispatched")
    check_deadlines()
    check_deadlines()  # the same incidents: not counted again
    after = {tag: value("schedapp_breaches_by_tag_total", kind="late", tag=tag) for tag in before}
    assert {tag: after[tag] - before[tag] for tag in before} == {"team-a": 1, "nightly": 1, "": 1}


def test_tags_past_the_bound_are_counted_as_other(monkeypatch):
    monkeypatch.setattr(metrics, "_TAG_LABELS", {f"t{i}" for i in range(metrics.MAX_TAG_LABELS)})
    assert metrics.tag_label("t3") == "t3"
    assert metrics.tag_label("one-too-many") == metrics.OTHER_TAG
    assert "one-too-many" not in metrics._TAG_LABELS


def test_notifications_sent_are_counted_by_channel_and_kind():
    before = value("schedapp_notifications_total", channel="ops", kind="dead", outcome="sent")
    with webhook_receiver() as receiver:
        with override_settings(SCHEDAPP_NOTIFICATIONS={"ops": hook(receiver.url)}):
            notify.enqueue("dead", a_job())
            deliver_until(lambda: receiver.accepted())
    after = value("schedapp_notifications_total", channel="ops", kind="dead", outcome="sent")
    assert after - before == 1


def test_notifications_given_up_and_each_failed_message_are_counted():
    failed = (
        "schedapp_notifications_total",
        {"channel": "ops", "kind": "dead", "outcome": "failed"},
    )
    tries = ("schedapp_notification_send_failures_total", {"channel": "ops"})
    before = [value(name, **labels) for name, labels in (failed, tries)]
    with webhook_receiver(statuses=[500] * 10) as receiver:
        with override_settings(SCHEDAPP_NOTIFICATIONS={"ops": hook(receiver.url, backoff=0.1)}):
            notify.enqueue("dead", a_job())
            deliver_until(lambda: len(receiver.received) == 3)
            for _ in range(3):  # nothing more is tried, nothing more counted
                deliver_once()
    after = [value(name, **labels) for name, labels in (failed, tries)]
    assert [a - b for a, b in zip(after, before, strict=True)] == [1, 3]
