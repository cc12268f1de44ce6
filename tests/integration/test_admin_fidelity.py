"""The admin shows Celery's day rule: in its plain words and in its preview."""

from __future__ import annotations

from datetime import datetime

import pytest
from django.urls import reverse

from schedapp import api

pytestmark = [pytest.mark.django_db]


def test_the_preview_honours_celerys_and_of_the_day_fields(admin_client):
    url = reverse("admin:schedapp_job_preview")
    query = {"cron": "0 9 1-7 * sun", "timezone": "UTC"}
    both = admin_client.get(url, {**query, "cron_day_or": "off"}).json()["times"]
    either = admin_client.get(url, query).json()["times"]  # no checkbox sent: cron's OR
    assert len(both) == len(either) == 5
    days = [datetime.strptime(t.split(" UTC")[0][-19:], "%Y-%m-%d %H:%M:%S") for t in both]
    assert all(d.weekday() == 6 and d.day <= 7 for d in days), both
    assert both != either


def test_the_changelist_says_an_and_cron_in_plain_words(admin_client):
    api.schedule(
        "project.tasks.record",
        cron="0 9 1-7 * sun",
        timezone="UTC",
        cron_day_or=False,
        name="first-sunday",
    )
    page = admin_client.get(reverse("admin:schedapp_job_changelist")).content.decode()
    assert "only on days matching both the day of month and the day of week" in page


def test_the_change_form_edits_celerys_fields_and_message_options(admin_client):
    job = api.schedule(
        "project.tasks.record", cron="0 9 * * *", timezone="UTC", name="with-options"
    )
    url = reverse("admin:schedapp_job_change", args=[job.pk])
    page = admin_client.get(url).content.decode()
    for field in (
        "cron_day_or",
        "solar_event",
        "latitude",
        "longitude",
        "not_before",
        "expires_at",
        "message_options",
    ):
        assert f'name="{field}' in page, field  # date-times come as _0 and _1
    form = {
        "name": "with-options",
        "task": "project.tasks.record",
        "args": "[]",
        "kwargs": "{}",
        "cron": "0 9 1-7 * sun",
        "interval": "",
        "timezone": "UTC",
        "priority": "0",
        "queue": "",
        "message_options": '{"queue": "slow", "priority": 5, "headers": {"team": "a"}}',
        "lease_seconds": "30",
        "jitter": "0",
        "max_retries": "3",
        "retry_backoff": "10",
        "retry_backoff_max": "3600",
        "misfire_policy": "run_once",
        "when_retries_exhausted": "dead",
        "misfire_grace": "60",
        "misfire_max_catchup": "100",
        "overlap": "skip",
        "max_buffer": "100",
        "max_concurrent": "10",
    }  # cron_day_or unticked: Celery's AND of the day fields
    response = admin_client.post(url, form)
    assert response.status_code == 302, response.content.decode()[:3000]
    job.refresh_from_db()
    assert job.cron_day_or is False
    assert job.message_options == {"queue": "slow", "priority": 5, "headers": {"team": "a"}}
    bad = admin_client.post(url, {**form, "message_options": '{"priority": "high"}'})
    assert bad.status_code == 200 and "message_options" in bad.content.decode()
    job.refresh_from_db()
    assert job.message_options["priority"] == 5  # nothing half-written
