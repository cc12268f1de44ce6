"""The runs changelist and run page, fleet nodes, and the overview page."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse

from schedapp import api
from schedapp.db import db_now
from schedapp.models import Job, JobRun, JobState, Node, task_id_for

pytestmark = [pytest.mark.django_db]


def add_run(
    job: Job,
    token: int,
    status: str,
    *,
    lag: float = 0.5,
    duration: float = 2.0,
    error: str = "",
    traceback: str = "",
    ago: float = 30.0,
) -> JobRun:
    now = db_now()
    due = now - timedelta(seconds=ago)
    return JobRun.objects.create(
        job=job,
        token=token,
        attempt=1,
        scheduled_for=due,
        due_at=due,
        claimed_by="beat-host:1:abc",
        dispatched_at=due + timedelta(seconds=lag),
        started_at=due + timedelta(seconds=lag),
        finished_at=(
            due + timedelta(seconds=lag + duration)
            if status not in ("dispatched", "running")
            else None
        ),
        worker="worker1@host",
        task_id=task_id_for(job.pk, token),
        status=status,
        error=error,
        traceback=traceback,
    )


@pytest.fixture
def job() -> Job:
    return api.schedule(
        "project.tasks.fail", cron="0 3 * * *", timezone="Europe/Paris", name="nightly"
    )


def test_runs_list_shows_status_job_times_duration_worker_beat_attempt_and_error(admin_client, job):
    add_run(job, 1, "succeeded", duration=2.5)
    add_run(
        job,
        2,
        "failed",
        error="RuntimeError: nightly failed on purpose\nmore",
        traceback="Traceback (most recent call last):\n  File x\nRuntimeError: boom",
    )
    response = admin_client.get(reverse("admin:schedapp_jobrun_changelist"))
    html = response.content.decode()
    assert response.status_code == 200
    assert 'class="schedapp-badge schedapp-succeeded"' in html
    assert 'class="schedapp-badge schedapp-failed"' in html
    assert "nightly" in html and "2.5 s" in html
    assert "worker1@host" in html and "beat-host:1:abc" in html
    assert "RuntimeError: nightly failed on purpose" in html
    assert "Traceback (most recent call last)" not in html  # only on the run page
    # Read-only for everybody, superusers included
    assert "Add job run" not in html
    assert response.context["action_form"] is None
    assert admin_client.get(reverse("admin:schedapp_jobrun_add")).status_code == 403


def test_run_page_shows_the_full_error_and_traceback_and_cannot_be_changed(admin_client, job):
    run = add_run(
        job,
        1,
        "failed",
        error="RuntimeError: boom\nsecond line",
        traceback='Traceback (most recent call last):\n  File "x.py"\nRuntimeError',
    )
    url = reverse("admin:schedapp_jobrun_change", args=[run.pk])
    html = admin_client.get(url).content.decode()
    assert "RuntimeError: boom\nsecond line" in html
    assert "Traceback (most recent call last):\n  File &quot;x.py&quot;" in html
    assert task_id_for(job.pk, 1) in html
    assert 'name="status"' not in html
    assert admin_client.post(url, {"status": "succeeded"}).status_code == 403
    assert (
        admin_client.post(
            reverse("admin:schedapp_jobrun_delete", args=[run.pk]), {"post": "yes"}
        ).status_code
        == 403
    )
    assert JobRun.objects.get(pk=run.pk).status == "failed"


def test_job_page_links_to_its_runs_which_are_paginated(admin_client, job):
    other = api.schedule("project.tasks.record", interval=60, name="other")
    for token in range(1, 131):
        add_run(job, token, "succeeded")
    add_run(other, 1, "succeeded")
    page = admin_client.get(reverse("admin:schedapp_job_change", args=[job.pk])).content.decode()
    link = f"{reverse('admin:schedapp_jobrun_changelist')}?job={job.pk}"
    assert f'href="{link}"' in page
    assert page.count("schedapp-badge schedapp-succeeded") == 5  # the latest few, not all

    response = admin_client.get(link)
    cl = response.context["cl"]
    assert {r.job_id for r in cl.result_list} == {job.pk}
    assert len(cl.result_list) == 100 and cl.multi_page
    assert "130 job runs" in response.content.decode()
    second = admin_client.get(link + "&p=2").context["cl"]
    assert len(second.result_list) == 30


@pytest.mark.parametrize("value", ["\u00b2", "\u0661", "99999999999999999999", "-1", "x", " 1"])
def test_a_job_filter_that_is_no_job_id_shows_no_runs(admin_client, job, value):
    add_run(job, 1, "succeeded")
    response = admin_client.get(reverse("admin:schedapp_jobrun_changelist"), {"job": value})
    assert response.status_code == 200
    assert list(response.context["cl"].result_list) == []


def test_runs_can_be_found_by_task_id_and_filtered_by_status(admin_client, job):
    add_run(job, 1, "succeeded")
    add_run(job, 2, "lost")
    url = reverse("admin:schedapp_jobrun_changelist")
    found = admin_client.get(url, {"q": task_id_for(job.pk, 2)}).context["cl"].result_list
    assert [r.token for r in found] == [2]
    lost = admin_client.get(url, {"status__exact": "lost"}).context["cl"].result_list
    assert [r.token for r in lost] == [2]


def test_overview_shows_states_backlog_lag_nodes_and_dead_letters(admin_client, job):
    # Given jobs in several states, two due jobs, recent dispatches and live nodes
    now = db_now()
    due = [
        api.schedule("project.tasks.record", run_at=now - timedelta(minutes=m), name=f"due-{m}")
        for m in (1, 3)
    ]
    dead = api.schedule("project.tasks.fail", interval=60, name="dead-one")
    Job.objects.filter(pk=dead.pk).update(state=JobState.DEAD)
    for token, lag in enumerate((0.2, 0.4, 3.0), start=1):
        add_run(job, token, "succeeded", lag=lag)
    Node.objects.create(
        name="beat-1",
        kind="beat",
        hostname="h1",
        pid=10,
        started_at=now,
        last_seen_at=now,
        stats={"claimed": 7},
    )
    Node.objects.create(
        name="worker-1",
        kind="worker",
        hostname="h2",
        pid=11,
        started_at=now,
        last_seen_at=now,
        stats={"active": 1},
    )
    Node.objects.create(
        name="beat-old",
        kind="beat",
        hostname="h3",
        pid=12,
        started_at=now - timedelta(hours=1),
        last_seen_at=now - timedelta(minutes=10),
    )

    response = admin_client.get(reverse("admin:schedapp_job_overview"))

    assert response.status_code == 200
    data = response.context["overview"]
    assert data.counts["scheduled"] == 3 and data.counts["dead"] == 1
    assert data.backlog == 2
    assert data.oldest_due == min(j.next_run_at for j in due)
    assert data.lag is not None and data.lag.runs == 3 and data.lag.max == 3.0
    assert [n.name for n in data.beats] == ["beat-1"]
    assert [n.name for n in data.workers] == ["worker-1"]
    html = response.content.decode()
    assert "beat-old" not in html and "claimed 7" in html  # stats as words
    assert f'href="{reverse("admin:schedapp_job_changelist")}?state__exact=dead"' in html
    assert "Dispatch lag" in html


def test_overview_needs_view_permission(client, django_user_model):
    user = django_user_model.objects.create_user("nobody", password="pw", is_staff=True)
    client.force_login(user)
    assert client.get(reverse("admin:schedapp_job_overview")).status_code == 403
