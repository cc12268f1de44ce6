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
