"""The admin's backfill: a job's "Backfill..." form (validated with the API's field-named
errors, through ``api.backfill``, recorded as the admin user's) and the backfills page
(progress, refreshing while running, Cancel through ``api.cancel_backfill``)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

from schedapp import api
from schedapp.db import db_now
from schedapp.lease import backfill as engine
from schedapp.models import Backfill, BackfillState, Job, JobChange

pytestmark = [pytest.mark.django_db]

MINUTE = timedelta(minutes=1)
FORMAT = "%Y-%m-%d %H:%M:%S"


def minutely() -> Job:
    return api.schedule(
        "project.tasks.record",
        name="to-backfill",
        interval=MINUTE,
        interval_anchor=db_now().replace(second=0, microsecond=0) - timedelta(days=1),
    )


def the_range(minutes: int = 20) -> tuple[str, str]:
    end = db_now().replace(second=0, microsecond=0) - MINUTE
    return (end - (minutes - 1) * MINUTE).strftime(FORMAT), end.strftime(FORMAT)


def test_the_job_page_links_the_form_which_names_the_field_in_error(admin_client: Client) -> None:
    job = minutely()
    page = admin_client.get(reverse("admin:schedapp_job_change", args=[job.pk])).content.decode()
    url = reverse("admin:schedapp_backfill_start", args=[job.pk])
    assert url in page
    start, end = the_range()
    response = admin_client.post(
        url, {"start": end, "end": start, "overlap": "allow_all", "max_per_second": "5"}
    )
    assert response.status_code == 200
    assert response.context["form"].errors["end"]
    response = admin_client.post(
        url, {"start": start, "end": end, "overlap": "allow_all", "max_per_second": "0"}
    )
    assert response.context["form"].errors["max_per_second"]
    assert not Backfill.objects.exists()


def test_a_backfill_from_the_admin_shows_its_progress_and_cancels(admin_client: Client) -> None:
    job = minutely()
    start, end = the_range(20)
    response = admin_client.post(
        reverse("admin:schedapp_backfill_start", args=[job.pk]),
        {
            "start": start,
            "end": end,
            "overlap": "allow_all",
            "max_per_second": "5",
            "reason": "outage",
        },
    )
    assert response.status_code == 302
    record = Backfill.objects.get()
    assert record.total == 20 and record.created_by == "admin"
    change = JobChange.objects.get(action=JobChange.Action.BACKFILL)
    assert (change.source, change.actor, change.reason) == ("admin", "admin", "outage")
    Backfill.objects.filter(pk=record.pk).update(
        allowance=5, refilled_at=db_now() - timedelta(hours=1)
    )
    engine.advance("beat-1", 100)
    listing = admin_client.get(reverse("admin:schedapp_backfill_changelist") + f"?job={job.pk}")
    text = listing.content.decode()
    assert "5 / 20 (25%)" in text and 'http-equiv="refresh"' in text
    cancel = reverse("admin:schedapp_backfill_cancel", args=[record.pk])
    assert cancel in text
    # the button posts the changelist's form (its CSRF token, its other fields) to it
    assert admin_client.post(cancel, {"action": "", "index": "0"}).status_code == 302
    record.refresh_from_db()
    assert record.state == BackfillState.CANCELLED
    assert (
        JobChange.objects.filter(action=JobChange.Action.BACKFILL_CANCEL, source="admin").count()
        == 1
    )
    text = admin_client.get(reverse("admin:schedapp_backfill_changelist")).content.decode()
    assert 'http-equiv="refresh"' not in text  # nothing running: no refresh


def test_the_changelist_action_opens_the_form_for_one_job(admin_client: Client) -> None:
    job = minutely()
    response = admin_client.post(
        reverse("admin:schedapp_job_changelist"),
        {"action": "backfill_one", "_selected_action": [job.pk]},
    )
    assert response.status_code == 302
    assert response["Location"] == reverse("admin:schedapp_backfill_start", args=[job.pk])


def test_a_user_without_change_permission_cannot_backfill() -> None:
    job = minutely()
    user = User.objects.create_user("viewer", password="pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename="view_job"))
    client = Client()
    client.force_login(user)
    start, end = the_range()
    response = client.post(
        reverse("admin:schedapp_backfill_start", args=[job.pk]),
        {"start": start, "end": end, "overlap": "allow_all", "max_per_second": "5"},
    )
    assert response.status_code == 403
    assert not Backfill.objects.exists()


def test_a_view_only_user_sees_no_backfill_action_or_link() -> None:
    job = minutely()
    user = User.objects.create_user("viewer", password="pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename="view_job"))
    client = Client()
    client.force_login(user)
    page = client.get(reverse("admin:schedapp_job_change", args=[job.pk])).content.decode()
    assert reverse("admin:schedapp_backfill_start", args=[job.pk]) not in page
    assert client.get(reverse("admin:schedapp_job_changelist")).context["action_form"] is None
