"""The admin's "needs attention" page: open breaches by kind (counted, filtered by kind and
tag, each row linking to its job and timeline), the failed notifications and failing
channels; listed on the admin index; seen only by staff who may view jobs; a flat, bounded
number of queries however many breaches are open or cleared."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.db.models.functions import Now
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from project import admin_data
from schedapp import api, attention, deadlines
from schedapp.models import Breach, Job, JobChange, JobState, Notification, NotificationChannel
from tests.integration.test_admin_scale import check_bounded

pytestmark = [pytest.mark.django_db]

TASK = "project.tasks.record"
URL = "admin:schedapp_attention_changelist"


def page(client: Client, **query: str) -> str:
    response = client.get(reverse(URL), query)
    assert response.status_code == 200
    return response.content.decode()


def breach(job: Job, kind: str, detail: str = "", ago: timedelta = timedelta(0)) -> Breach:
    made = Breach.objects.create(
        job=job, kind=kind, scheduled_for=job.scheduled_for, detail=detail or f"{kind} detail"
    )
    Breach.objects.filter(pk=made.pk).update(opened_at=Now() - ago)
    return made


def rows(html: str, kind: str) -> list[str]:
    section = re.search(rf'id="schedapp-breaches-{kind}".*?</div>', html, re.S)
    return (
        re.findall(r'<tr class="schedapp-breach">.*?</tr>', section.group(0), re.S)
        if section
        else []
    )


def count_of(html: str, kind: str) -> str:
    found = re.search(rf'id="schedapp-count-{kind}"[^>]*><span class="count">([^<]*)</span>', html)
    assert found, kind
    return found.group(1)


@pytest.fixture
def open_breaches() -> dict[str, Job]:
    """A job per kind, each with an open breach; the billing ones tagged; one cleared."""
    jobs = {}
    for kind in attention.KINDS:
        tags = ["billing"] if kind in ("late", "dead") else ["ops"]
        jobs[kind] = api.schedule(TASK, cron="0 8 * * *", name=f"job-{kind}", tags=tags)
        breach(jobs[kind], kind, ago=timedelta(minutes=30))
    cleared = api.schedule(TASK, cron="0 8 * * *", name="job-cleared", tags=["billing"])
    gone = breach(cleared, "failing")
    Breach.objects.filter(pk=gone.pk).update(cleared_at=Now(), cleared_detail="succeeded")
    return jobs


def test_the_page_counts_each_kind_and_lists_its_open_breaches_with_links(
    admin_client, open_breaches
):
    html = page(admin_client)
    assert count_of(html, "all") == "5"
    for kind, job in open_breaches.items():
        assert count_of(html, kind) == "1"
        (row,) = rows(html, kind)
        assert f'href="{reverse("admin:schedapp_job_change", args=[job.pk])}"' in row
        timeline = reverse("admin:schedapp_job_timeline", args=[job.pk])
        assert f'href="{timeline}?' in row  # at its occurrence
        assert f"{kind} detail" in row
        assert re.search(r"for 0:(29:5\d|30:0\d)", row), row  # open for half an hour
    assert "job-cleared" not in html  # a cleared breach is history, not attention


def test_filters_by_kind_and_by_tag(admin_client, open_breaches):
    html = page(admin_client, kind="dead")
    assert rows(html, "dead") and not rows(html, "late")
    assert count_of(html, "late") == "1"  # the counts stay at the top
    html = page(admin_client, tag="BILLING")  # tags are stored lowercased
    assert count_of(html, "all") == "2"
    assert [k for k in attention.KINDS if rows(html, k)] == ["late", "dead"]
    html = page(admin_client, kind="late", tag="ops")
    assert not rows(html, "late") and count_of(html, "overrunning") == "1"
    html = page(admin_client, kind="nonsense")
    assert "kind: &#x27;nonsense&#x27; is not one of" in html
    assert all(rows(html, k) for k in attention.KINDS)


def test_a_dead_job_recorded_by_the_deadline_pass_is_on_the_page(admin_client):
    job = api.schedule(TASK, cron="0 8 * * *", name="nightly-export", tags=["billing"])
    Job.objects.filter(pk=job.pk).update(state=JobState.DEAD, last_error="boom\ntrace")
    deadlines.check_deadlines()
    (row,) = rows(page(admin_client), "dead")
    assert "nightly-export" in row and "dead: boom" in row and ">billing</a>" in row


def test_a_kind_pages_older_breaches_by_keyset(admin_client, monkeypatch):
    monkeypatch.setattr(attention, "PAGE_SIZE", 3)
    jobs = [api.schedule(TASK, cron="0 8 * * *", name=f"late-{i}") for i in range(7)]
    for i, job in enumerate(jobs):
        breach(job, "late", ago=timedelta(minutes=i))
    html = page(admin_client)
    assert len(rows(html, "late")) == 3 and "all of this kind" in html
    seen = []
    query = {"kind": "late"}
    while True:
        html = page(admin_client, **query)
        seen += re.findall(r">(late-\d)</a>", "".join(rows(html, "late")))
        older = re.search(r'href="\?([^"]*)" class="schedapp-older"', html)
        if not older:
            break
        query = dict(p.split("=", 1) for p in older.group(1).replace("&amp;", "&").split("&"))
        query = {k: v.replace("%3A", ":").replace("%2B", "+") for k, v in query.items()}
    assert seen == [f"late-{i}" for i in range(7)]


def test_failed_notifications_and_failing_channels_are_shown(admin_client):
    job = api.schedule(TASK, cron="0 8 * * *", name="payroll")
    Notification.objects.create(
        channel="pager",
        kind="dead",
        job_id=job.pk,
        job_name="payroll",
        failed_at=Now(),
        attempts=5,
        last_error="HTTP 500 from https://hooks.example\nmore",
    )
    Notification.objects.create(channel="ops-mail", kind="late", job_name="old", sent_at=Now())
    NotificationChannel.objects.create(name="pager", failures=5, retry_at=Now())
    NotificationChannel.objects.create(name="ops-mail", failures=0)
    html = page(admin_client)
    failed = re.findall(r'<tr class="schedapp-failed-notification">.*?</tr>', html, re.S)
    assert len(failed) == 1 and "HTTP 500 from https://hooks.example" in failed[0]
    assert "payroll" in failed[0] and "more" not in failed[0]
    channels = re.search(r'id="schedapp-channels".*?</div>', html, re.S).group(0)
    assert "pager" in channels and "ops-mail" not in channels


def test_listed_on_the_admin_index_and_linked_from_the_overview(admin_client):
    url = reverse(URL)
    assert f'href="{url}"' in admin_client.get(reverse("admin:index")).content.decode()
    overview = admin_client.get(reverse("admin:schedapp_job_overview")).content.decode()
    assert f'href="{url}"' in overview
    jobs = admin_client.get(reverse("admin:schedapp_job_changelist")).content.decode()
    assert f'href="{url}"' in jobs


def staff(*codenames: str, username: str) -> Client:
    user = User.objects.create_user(username, password="pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="schedapp", codename__in=codenames)
    )
    client = Client()
    client.force_login(user)
    return client


def test_only_staff_who_may_view_jobs_see_it(client, open_breaches):
    url = reverse(URL)
    nobody = staff("view_jobrun", username="nobody")
    assert nobody.get(url).status_code == 403
    assert url not in nobody.get(reverse("admin:index")).content.decode()
    assert client.get(url).status_code == 302  # to the login page
    viewer = staff("view_job", username="viewer")
    assert "job-dead" in page(viewer)
    assert url in viewer.get(reverse("admin:index")).content.decode()
    # Read-only: no add, change or delete view exists.
    assert viewer.get(url + "add/").status_code == 404
    assert viewer.post(url, {"action": "delete_selected"}).status_code == 200
    assert Breach.objects.filter(cleared_at__isnull=True).count() == 5


def test_the_same_few_bounded_queries_with_10_open_breaches_and_1000(admin_client):
    views = ["", "?kind=dead", "?tag=ops", "?kind=late&tag=ops"]

    def fill(start: int, stop: int) -> None:
        with connection.cursor() as cursor:
            admin_data.fill_jobs(cursor, start, stop)
            cursor.execute("UPDATE schedapp_job SET tags = '[\"ops\"]' WHERE name LIKE 'job-%%'")
            # one open breach per job (kinds in turn), and as many cleared ones of history
            for cleared in ("NULL", "now()"):
                cursor.execute(
                    "INSERT INTO schedapp_breach (job_id, kind, scheduled_for, opened_at,"
                    " cleared_at, detail, cleared_detail) SELECT id,"
                    " (ARRAY['late','overrunning','missed_finish_by','failing','dead'])"
                    f"[1 + id %% 5], now(), now() - make_interval(secs => id), {cleared},"
                    " 'x', '' FROM schedapp_job WHERE name IN"
                    " (SELECT 'job-' || i FROM generate_series(%s, %s) i)",
                    [start, stop],
                )
            cursor.execute(
                "INSERT INTO schedapp_notification (channel, kind, job_name, tags, detail,"
                " incident, attempts, failed_at, last_error) SELECT 'pager', 'dead', 'j',"
                " '[]', '', '', 5, now() - make_interval(secs => i), 'HTTP 500'"
                " FROM generate_series(%s, %s) i",
                [start, stop],
            )

    def queries(url: str) -> list[str]:
        with CaptureQueriesContext(connection) as captured:
            response = admin_client.get(reverse(URL) + url)
        assert response.status_code == 200
        return [q["sql"] for q in captured]

    fill(1, 10)
    small = {url: len(queries(url)) for url in views}
    fill(11, 1_000)
    assert Breach.objects.filter(cleared_at__isnull=True).count() == 1_000
    for url in views:
        sqls = queries(url)
        assert len(sqls) == small[url], (url, sqls)
        check_bounded(sqls, url)
        assert len(sqls) <= 16, sqls
    html = page(admin_client)
    assert count_of(html, "dead") == "200"
    assert len(rows(html, "dead")) == attention.PAGE_SIZE


def test_counts_are_capped(admin_client, open_breaches, monkeypatch):
    monkeypatch.setattr(attention, "COUNT_CAP", 0)
    html = page(admin_client)
    assert count_of(html, "dead") == "0+"


def test_a_dead_job_is_requeued_from_the_page_through_the_api_and_recorded(admin_client):
    job = api.schedule(TASK, cron="0 8 * * *", name="ledger-export")
    Job.objects.filter(pk=job.pk).update(state=JobState.DEAD, last_error="boom")
    deadlines.check_deadlines()
    (row,) = rows(page(admin_client, kind="dead"), "dead")
    action = re.search(r'<form method="post" action="([^"]+)" class="schedapp-requeue">', row)
    assert action and action.group(1).endswith(f"/{job.pk}/do/requeue/")
    back = reverse(URL) + "?kind=dead"
    response = admin_client.post(action.group(1), {"next": back})
    assert response.status_code == 302 and response["Location"] == back
    job.refresh_from_db()
    assert job.state == JobState.SCHEDULED
    change = JobChange.objects.filter(job_id=job.pk).order_by("-id").first()
    assert (change.action, change.source, change.actor) == ("requeued", "admin", "admin")
    deadlines.check_deadlines()
    assert not rows(page(admin_client), "dead")  # the breach recovered
    # A next leading elsewhere is not followed: the job page, as from its own button
    Job.objects.filter(pk=job.pk).update(state=JobState.DEAD)
    response = admin_client.post(action.group(1), {"next": "https://evil.example/"})
    assert response["Location"] == reverse("admin:schedapp_job_change", args=[job.pk])


def test_no_requeue_button_without_the_permission(open_breaches):
    job = open_breaches["dead"]
    Job.objects.filter(pk=job.pk).update(state=JobState.DEAD)
    requeuer = staff("view_job", "requeue_job", username="requeuer")
    assert 'class="schedapp-requeue"' in page(requeuer)
    viewer = staff("view_job", username="viewer")
    html = page(viewer)
    assert "job-dead" in html and 'class="schedapp-requeue"' not in html
    url = reverse("admin:schedapp_job_operation", args=[job.pk, "requeue"])
    assert viewer.post(url).status_code == 403


def test_names_details_and_rows_written_behind_the_apis_back_are_shown_as_text(admin_client):
    evil = "<script>alert('name')</script>"
    job = api.schedule(TASK, cron="0 8 * * *", name=evil)
    breach(job, "failing", detail="<b>detail</b>")
    Job.objects.filter(pk=job.pk).update(tags=7, timezone="Mars/Olympus_Mons")
    other = api.schedule(TASK, cron="0 8 * * *", name="dict-tags")
    breach(other, "late")
    Job.objects.filter(pk=other.pk).update(tags={"pager": 1})
    html = page(admin_client)
    assert "<script>alert" not in html and "<b>detail" not in html
    assert "&lt;script&gt;alert(&#x27;name&#x27;)&lt;/script&gt;" in html
    assert "&lt;b&gt;detail&lt;/b&gt;" in html
    assert len(rows(html, "failing")) == 1 and len(rows(html, "late")) == 1
