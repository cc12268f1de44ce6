"""Notifications with a real beat and worker: a job failing past its retries is dead-lettered
by the worker's outcome, and the beat's delivery loop sends exactly one email to a real SMTP
sink and one signed webhook to a real HTTP receiver."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from schedapp import api
from schedapp.db import db_now
from schedapp.models import Job, JobState, Notification
from schedapp.testing.processes import wait_until
from tests.receivers import SECRET, smtp_sink, webhook_receiver

pytestmark = [pytest.mark.e2e]


def test_a_dead_lettered_job_sends_one_email_and_one_signed_webhook(fleet):
    with smtp_sink() as sink, webhook_receiver() as receiver:
        channels = {
            "mail": {"type": "email", "to": ["ops@example.com"], "group_wait": 1},
            "hook": {"type": "webhook", "url": receiver.url, "secret": SECRET, "group_wait": 1},
        }
        env = {"SCHEDAPP_NOTIFICATIONS": json.dumps(channels), "PROJECT_EMAIL_PORT": sink.port}
        job = api.schedule(
            "project.tasks.fail",
            name="charge-cards",
            kwargs={"label": "charge-cards"},
            run_at=db_now(),
            max_retries=1,
            retry_backoff=timedelta(seconds=1),
            tags=["billing"],
        )
        fleet.worker(settings=env)
        fleet.beat(settings=env)
        wait_until(lambda: Job.objects.get(pk=job.pk).state == JobState.DEAD, timeout=60)
        # Both outbox rows sent: nothing is left that could send a second message
        wait_until(
            lambda: Notification.objects.filter(sent_at__isnull=False).count() == 2, timeout=30
        )
        assert not Notification.objects.filter(sent_at=None).exists()
        (mail,) = sink.messages
        assert mail["To"] == "ops@example.com"
        assert mail["Subject"] == "[schedapp] 1 dead: charge-cards"
        assert "charge-cards failed on purpose" in mail.get_payload()
        (hook,) = receiver.received
        assert hook.signed and hook.status == 200
        assert hook.body["counts"] == {"dead": 1}
        (event,) = hook.body["events"]
        assert event["job"] == {"id": job.pk, "name": "charge-cards", "tags": ["billing"]}
        assert event["incident"] == f"dead:{job.pk}"
