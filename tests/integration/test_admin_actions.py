"""Admin actions, job-page buttons and permissions, through Django's test client.

Each operation must go through ``schedapp.api`` and say what it did; a user without the
operation's permission neither sees it nor can run it.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.contrib.messages import get_messages
from django.test import Client
from django.urls import reverse

from schedapp import api
from schedapp.admin.operations import OPERATIONS
from schedapp.db import db_now
from schedapp.models import Job, JobState

pytestmark = [pytest.mark.django_db]

CHANGELIST = "admin:schedapp_job_changelist"


def op_url(job: Job, slug: str) -> str:
    return reverse("admin:schedapp_job_operation", args=[job.pk, slug])


def staff(*codenames: str, username: str = "viewer") -> Client:
    user = User.objects.create_user(username, password="pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="schedapp", codename__in=codenames)
    )
    client = Client()
    client.force_login(user)
    return client


VIEW_ONLY = ("view_job", "view_jobrun", "view_node")


def texts(response) -> list[str]:  # type: ignore[no-untyped-def]
    return [str(m) for m in get_messages(response.wsgi_request)]


def make_dead(job: Job) -> None:
    Job.objects.filter(pk=job.pk).update(
        state=JobState.DEAD, last_status="failed", last_error="boom", retry_count=3
    )


def bulk(client: Client, action: str, jobs: list[Job]):  # type: ignore[no-untyped-def]
    return client.post(
        reverse(CHANGELIST),
        {"action": action, "_selected_action": [j.pk for j in jobs], "index": 0},
        follow=True,
    )


@pytest.fixture
def jobs() -> dict[str, Job]:
    later = db_now() + timedelta(hours=1)
    result = {
        "a": api.schedule("project.tasks.record", cron="0 3 * * *", name="a"),
        "b": api.schedule("project.tasks.record", interval=600, name="b"),
        "c": api.schedule("project.tasks.record", run_at=later, name="c"),
    }
    return result


def state(job: Job) -> str:
    return Job.objects.values_list("state", flat=True).get(pk=job.pk)


# --- bulk actions ----------------------------------------------------------------------------


def test_pause_resume_and_run_now_act_on_the_selection_and_report_per_job(admin_client, jobs):
    # When the operator pauses a and b
    response = bulk(admin_client, "pause", [jobs["a"], jobs["b"]])
    # Then both are paused, c untouched, and the message names them
    assert [state(jobs[k]) for k in "abc"] == ["paused", "paused", "scheduled"]
    assert "Pause: 2 jobs paused: a, b." in texts(response)

    # When run now is applied to a paused job and a scheduled one
    response = bulk(admin_client, "run_now", [jobs["a"], jobs["c"]])
    # Then the scheduled one is due now and the paused one is refused, with the API's reason
    messages = texts(response)
    assert "Run now: 1 job will run at the next tick: c." in messages
    assert any(m.startswith("Run now failed for a: job") and "paused" in m for m in messages)
    job_c = Job.objects.get(pk=jobs["c"].pk)
    assert job_c.next_run_at <= db_now()

    # When resumed
    response = bulk(admin_client, "resume", [jobs["a"], jobs["b"]])
    assert [state(jobs[k]) for k in "ab"] == ["scheduled", "scheduled"]
    assert "Resume: 2 jobs resumed: a, b." in texts(response)


def test_cancel_requeue_and_duplicate(admin_client, jobs):
    make_dead(jobs["b"])
    response = bulk(admin_client, "requeue", [jobs["a"], jobs["b"]])
    messages = texts(response)
    assert "Requeue: 1 job requeued from the dead letters: b." in messages
    assert any("Requeue failed for a:" in m and "only dead jobs" in m for m in messages)
    assert state(jobs["b"]) == "scheduled"

    response = bulk(admin_client, "cancel", [jobs["a"]])
    assert state(jobs["a"]) == "cancelled"
    assert "Cancel: 1 job cancelled: a." in texts(response)

    response = bulk(admin_client, "duplicate", [jobs["b"]])
    copy = Job.objects.exclude(pk__in=[j.pk for j in jobs.values()]).get()
    assert copy.name.startswith("b (copy ") and copy.interval == timedelta(seconds=600)
    assert copy.state == JobState.PAUSED  # it would fire beside the original otherwise
    assert f"Duplicate: 1 job duplicated (created paused): b as {copy.name}." in texts(response)


def test_bulk_delete_is_not_offered(admin_client, jobs):
    response = admin_client.get(reverse(CHANGELIST))
    assert "delete_selected" not in response.content.decode()


# --- buttons on the job page -----------------------------------------------------------------


def test_job_page_offers_the_buttons_that_fit_the_state(admin_client, jobs):
    page = admin_client.get(reverse("admin:schedapp_job_change", args=[jobs["a"].pk]))
    html = page.content.decode()
    for slug in ("run_now", "pause", "duplicate", "cancel"):
        assert f'id="schedapp-op-{slug}"' in html
    for slug in ("resume", "requeue"):
        assert f'id="schedapp-op-{slug}"' not in html
    make_dead(jobs["b"])
    html = admin_client.get(
        reverse("admin:schedapp_job_change", args=[jobs["b"].pk])
    ).content.decode()
    assert 'id="schedapp-op-requeue"' in html and 'id="schedapp-op-pause"' not in html


def test_buttons_post_through_the_api_and_redirect_back(admin_client, jobs):
    job = jobs["a"]
    response = admin_client.post(op_url(job, "pause"))
    assert response.status_code == 302
    assert response["Location"] == reverse("admin:schedapp_job_change", args=[job.pk])
    assert state(job) == "paused"
    response = admin_client.post(op_url(job, "pause"), follow=True)  # already paused
    assert any("Pause failed for a:" in m for m in texts(response))
    admin_client.post(op_url(job, "resume"))
    admin_client.post(op_url(job, "run_now"))
    assert Job.objects.get(pk=job.pk).next_run_at <= db_now()
    response = admin_client.post(op_url(job, "duplicate"))
    copy = Job.objects.get(name__startswith="a (copy ")
    assert response["Location"] == reverse("admin:schedapp_job_change", args=[copy.pk])
    admin_client.post(op_url(job, "cancel"))
    assert state(job) == "cancelled"


def test_buttons_need_post_and_a_csrf_token(admin_user, jobs):
    client = Client(enforce_csrf_checks=True)
    client.force_login(admin_user)
    assert client.get(op_url(jobs["a"], "pause")).status_code == 405
    assert client.post(op_url(jobs["a"], "pause")).status_code == 403  # no token
    assert state(jobs["a"]) == "scheduled"
    assert client.post(op_url(jobs["a"], "explode")).status_code in (403, 404)


# --- permissions -----------------------------------------------------------------------------


def test_a_view_only_user_sees_everything_and_can_change_nothing(jobs):
    client = staff(*VIEW_ONLY)
    job = jobs["a"]
    make_dead(jobs["b"])
    # Sees: the lists, the job page, the runs, the overview, the dead letters, the preview
    for url in (
        reverse(CHANGELIST),
        reverse(CHANGELIST) + "?state__exact=dead",
        reverse("admin:schedapp_job_change", args=[job.pk]),
        reverse("admin:schedapp_jobrun_changelist"),
        reverse("admin:schedapp_node_changelist"),
        reverse("admin:schedapp_job_overview"),
        reverse("admin:schedapp_job_preview") + "?cron=0+0+*+*+*&timezone=UTC",
    ):
        assert client.get(url).status_code == 200, url
    # ... but no action and no button
    listing = client.get(reverse(CHANGELIST))
    assert listing.context["action_form"] is None
    page = client.get(reverse("admin:schedapp_job_change", args=[job.pk])).content.decode()
    assert "schedapp-op-" not in page
    assert 'name="cron"' not in page  # read-only page
    # Every operation is refused, by button and by action, and nothing changes
    before = list(Job.objects.order_by("pk").values_list("pk", "state", "next_run_at", "token"))
    for op in OPERATIONS:
        for target in (jobs["a"], jobs["b"]):
            assert client.post(op_url(target, op.slug)).status_code == 403, op.slug
        response = bulk(client, op.slug, [jobs["a"], jobs["b"]])
        assert response.status_code == 200
    assert client.post(reverse("admin:schedapp_job_add"), {"name": "x"}).status_code == 403
    assert (
        client.post(
            reverse("admin:schedapp_job_change", args=[job.pk]), {"name": "renamed"}
        ).status_code
        == 403
    )
    assert (
        client.post(
            reverse("admin:schedapp_job_delete", args=[job.pk]), {"post": "yes"}
        ).status_code
        == 403
    )
    after = list(Job.objects.order_by("pk").values_list("pk", "state", "next_run_at", "token"))
    assert after == before


@pytest.mark.parametrize(
    ("codename", "allowed", "refused"),
    [
        ("run_job", {"run_now"}, {"pause", "resume", "cancel", "requeue", "duplicate"}),
        ("pause_job", {"pause", "resume"}, {"run_now", "cancel", "requeue", "duplicate"}),
        ("cancel_job", {"cancel"}, {"run_now", "pause", "resume", "requeue", "duplicate"}),
        ("requeue_job", {"requeue"}, {"run_now", "pause", "resume", "cancel", "duplicate"}),
        ("add_job", {"duplicate"}, {"run_now", "pause", "resume", "cancel", "requeue"}),
    ],
)
def test_each_operation_needs_its_own_permission(jobs, codename, allowed, refused):
    client = staff(*VIEW_ONLY, codename)
    listing = client.get(reverse(CHANGELIST))
    offered = {
        name for name, _label in listing.context["action_form"].fields["action"].choices if name
    }
    assert offered == allowed
    for slug in refused:
        assert client.post(op_url(jobs["a"], slug)).status_code == 403, slug
    for slug in allowed:
        assert client.post(op_url(jobs["a"], slug)).status_code == 302, slug


def test_change_permission_alone_edits_but_does_not_operate(jobs):
    client = staff(*VIEW_ONLY, "change_job")
    page = client.get(reverse("admin:schedapp_job_change", args=[jobs["a"].pk])).content.decode()
    assert 'name="cron"' in page and "schedapp-op-" not in page
    assert client.post(op_url(jobs["a"], "run_now")).status_code == 403


def test_deleting_a_job_summarises_its_history_instead_of_listing_it(admin_client, jobs):
    job = jobs["c"]
    page = admin_client.get(reverse("admin:schedapp_job_delete", args=[job.pk]))
    assert "c and its run history (0 runs)" in page.content.decode()
    admin_client.post(reverse("admin:schedapp_job_delete", args=[job.pk]), {"post": "yes"})
    assert not Job.objects.filter(pk=job.pk).exists()


def test_deleting_a_running_job_or_a_huge_history_is_refused(admin_client, jobs, monkeypatch):
    from schedapp.admin import jobs as schedapp_admin

    Job.objects.filter(pk=jobs["a"].pk).update(state=JobState.RUNNING, lease_expires_at=db_now())
    page = admin_client.get(reverse("admin:schedapp_job_delete", args=[jobs["a"].pk]))
    assert "a is running: cancel it first" in page.content.decode()
    admin_client.post(reverse("admin:schedapp_job_delete", args=[jobs["a"].pk]), {"post": "yes"})
    assert Job.objects.filter(pk=jobs["a"].pk).exists()

    from schedapp.models import JobRun, task_id_for

    now = db_now()
    JobRun.objects.bulk_create(
        JobRun(
            job=jobs["b"],
            token=t,
            scheduled_for=now,
            due_at=now,
            dispatched_at=now,
            task_id=task_id_for(jobs["b"].pk, t),
            status="succeeded",
        )
        for t in range(1, 4)
    )
    monkeypatch.setattr(schedapp_admin, "DELETE_RUNS_MAX", 2)
    page = admin_client.get(reverse("admin:schedapp_job_delete", args=[jobs["b"].pk]))
    assert "prune the history first" in page.content.decode()
    admin_client.post(reverse("admin:schedapp_job_delete", args=[jobs["b"].pk]), {"post": "yes"})
    assert Job.objects.filter(pk=jobs["b"].pk).exists()
