"""What an operator reads on the jobs list and the job page says the same thing in both places:
the schedule in words, and every time of the job in the job's own zone; a job that will not
fire (paused, dead) shows no next run."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.urls import reverse

from schedapp import api
from schedapp.db import db_now
from schedapp.models import Job, JobState

pytestmark = [pytest.mark.django_db]


def cell(html: str, job: Job, column: str) -> str:
    """The text of one column of the job's row on the jobs list."""
    row = re.search(rf'<tr>(?:(?!</tr>).)*value="{job.pk}"(?:(?!</tr>).)*</tr>', html, re.S).group(
        0
    )
    found = re.search(rf'<td class="field-{column}">(.*?)</td>', row, re.S).group(1)
    return re.sub(r"<[^>]+>", "", found).strip()


def readonly(html: str, field: str) -> str:
    """The text of a read-only field of the job page."""
    found = re.search(
        rf'<div class="form-row field-{field}">.*?<div class="readonly">(.*?)</div>', html, re.S
    ).group(1)
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", found)).strip()


def page(admin_client, job: Job) -> str:  # type: ignore[no-untyped-def]
    return admin_client.get(reverse("admin:schedapp_job_change", args=[job.pk])).content.decode()


def test_the_job_page_says_the_schedule_in_the_same_words_as_the_list(admin_client):
    # Given a weekday cron job in Paris
    job = api.schedule(
        "project.tasks.record", cron="30 6 * * 1-5", timezone="Europe/Paris", name="weekdays"
    )
    listed = admin_client.get(reverse("admin:schedapp_job_changelist")).content.decode()
    words = cell(listed, job, "schedule")
    assert words == "At 06:30, Monday through Friday (Europe/Paris)"

    # When the operator opens the job, Then its page says the schedule in the same words
    html = page(admin_client, job)
    shown = re.search(r'<p id="schedapp-preview-words">(.*?)</p>', html).group(1)
    assert shown == words

    # ... and while a new schedule is typed, the preview says it in words too
    typed = admin_client.get(
        reverse("admin:schedapp_job_preview"), {"cron": "0 3 * * *", "timezone": "Asia/Tokyo"}
    ).json()
    assert typed["words"] == "At 03:00 (Asia/Tokyo)"
    bad = admin_client.get(
        reverse("admin:schedapp_job_preview"), {"cron": "0 25 * * *", "timezone": "UTC"}
    ).json()
    assert bad["words"] == "" and bad["errors"]


def test_every_time_of_a_job_is_in_its_own_zone_on_the_list_and_the_page(admin_client):
    # Given a Paris job that ran once and holds a lease, on a server whose zone is UTC
    job = api.schedule(
        "project.tasks.record", cron="0 3 * * *", timezone="Europe/Paris", name="paris"
    )
    now = db_now()
    Job.objects.filter(pk=job.pk).update(
        last_run_at=now, last_status="succeeded", claimed_by="beat-a:1", lease_expires_at=now
    )
    listed = admin_client.get(reverse("admin:schedapp_job_changelist")).content.decode()
    html = page(admin_client, job)

    # Then the next run reads the same on the list and on the page
    assert readonly(html, "next_run") == cell(listed, job, "next_run")
    assert re.fullmatch(r"\d{4}-\d\d-\d\d 03:00 CES?T", cell(listed, job, "next_run"))
    # ... and every instant of the page carries the Paris zone, none the server's
    for field in ("next_run", "occurrence", "last_run", "lease_expiry", "created", "updated"):
        assert re.search(r"\d\d:\d\d(:\d\d)? CES?T\b", readonly(html, field)), field
    assert not re.search(r"\b(UTC|GMT)\b|[ap]\.m\.", readonly(html, "created"))


@pytest.mark.parametrize("state", [JobState.PAUSED, JobState.DEAD])
def test_a_job_that_will_not_fire_shows_no_next_run(admin_client, state):
    # Given a job that is paused (or dead): its stored next_run_at is not a coming run
    job = api.schedule("project.tasks.record", interval=60, name=f"not-firing-{state}")
    if state == JobState.PAUSED:
        api.pause(job)
    else:
        Job.objects.filter(pk=job.pk).update(
            state=JobState.DEAD, next_run_at=db_now() + timedelta(minutes=1)
        )
    assert Job.objects.get(pk=job.pk).next_run_at is not None

    # When the operator looks at the list and at the job
    listed = admin_client.get(reverse("admin:schedapp_job_changelist")).content.decode()
    html = page(admin_client, job)

    # Then neither shows a next run, and the page says why nothing fires
    assert cell(listed, job, "next_run") == "-"
    assert readonly(html, "next_run") == "-"
    assert f"the job is {state}: nothing fires until" in html
