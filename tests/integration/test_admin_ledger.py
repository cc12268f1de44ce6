"""The occurrence ledger in the admin: a job's timeline ("what happened at 08:00?") and the
fleet's "what did not run", both read through ``schedapp.explain``."""

from __future__ import annotations

import html as htmllib
import io
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from schedapp import api, lease, ledger
from schedapp.admin import ledger as admin_ledger
from schedapp.db import db_now
from schedapp.lease import admit_run, claim_due_jobs, complete_run
from schedapp.models import Job, JobRun, Occurrence
from schedapp.policies import MissedRange

pytestmark = [pytest.mark.django_db]

EVERY = timedelta(minutes=5)
ZONE = "Europe/Paris"


@dataclass(frozen=True)
class Story:
    """A job's last hours: 29 occurrences misfired, the next one failed and was retried to
    success, the 9 after it passed while the job was paused, the latest succeeded."""

    job: Job
    misfired_first: datetime
    retried: datetime
    paused_first: datetime
    latest: datetime


def _claim_one(job: Job) -> lease.ClaimedRun:
    runs = [r for r in claim_due_jobs("beat-1", 10).runs if r.job_id == job.pk]
    assert len(runs) == 1, runs
    return runs[0]


def _finish(run: lease.ClaimedRun, outcome: str, error: str = "") -> None:
    assert admit_run(run.job_id, run.token, "worker1@host", f"a{run.token}") == "admitted"
    assert complete_run(run.job_id, run.token, outcome, error=error).applied


def _shift_back(job: Job, by: timedelta) -> None:
    """Moves what the job recorded so far ``by`` earlier (a multiple of its interval, so the
    times stay occurrences): the ledger as if it had been written then."""
    from django.db.models import F

    JobRun.objects.filter(job=job).update(
        scheduled_for=F("scheduled_for") - by,
        due_at=F("due_at") - by,
        dispatched_at=F("dispatched_at") - by,
        started_at=F("started_at") - by,
        finished_at=F("finished_at") - by,
    )
    Occurrence.objects.filter(job=job).update(
        scheduled_for=F("scheduled_for") - by,
        last=F("last") - by,
        recorded_at=F("recorded_at") - by,
    )
    for record in Occurrence.objects.filter(job=job):  # the times its detail names too
        record.detail = re.sub(
            r"\d{4}-\d\d-\d\dT[\d:.]+\+00:00",
            lambda m: (datetime.fromisoformat(m.group(0)) - by).isoformat(),
            record.detail,
        )
        record.save(update_fields=["detail"])


def ledger_story(name: str = "billing-report") -> Story:
    """Made by the ledger's own writers (the claim's misfires, a resume), then placed in time."""
    # on the minute, as people name times; the next occurrence 1.5 to 2.5 minutes ahead
    latest = (db_now() - EVERY / 2).replace(second=0, microsecond=0)
    job = api.schedule(
        "project.tasks.record",
        interval=EVERY,
        interval_anchor=latest,
        timezone=ZONE,
        name=name,
        misfire_policy="run_once",
        max_retries=1,
    )
    # The first hours: found 30 occurrences late, the latest runs, fails and is retried
    first = latest - 29 * EVERY
    Job.objects.filter(pk=job.pk).update(scheduled_for=first, next_run_at=first)
    run = _claim_one(job)
    assert run.scheduled_for == latest
    _finish(run, lease.FAILED, "RuntimeError: the ledger is locked\nTraceback (most recent)")
    Job.objects.filter(pk=job.pk).update(next_run_at=db_now() - timedelta(seconds=1))
    retry = _claim_one(job)
    assert retry.scheduled_for == latest and retry.token > run.token
    _finish(retry, lease.SUCCEEDED)
    _shift_back(job, 10 * EVERY)
    # Then paused for the 9 occurrences after it; resumed for the latest, which succeeds
    Job.objects.filter(pk=job.pk).update(
        scheduled_for=latest - 9 * EVERY, next_run_at=latest - 9 * EVERY
    )
    api.pause(job)
    api.resume(job)
    _finish(_claim_one(job), lease.SUCCEEDED)
    return Story(
        Job.objects.get(pk=job.pk),
        first - 10 * EVERY,
        latest - 10 * EVERY,
        latest - 9 * EVERY,
        latest,
    )


def with_a_skipped_overlap(story: Story) -> Story:
    """The story four occurrences earlier; then, under overlap policy ``skip``, the occurrence
    after its latest ran so long that the three after it came due meanwhile: skipped, one
    record. Its run is the new latest."""
    job, shift = story.job, 4 * EVERY
    _shift_back(job, shift)
    long_run_for = story.latest - 3 * EVERY
    Job.objects.filter(pk=job.pk).update(
        overlap="skip",
        misfire_grace=timedelta(hours=1),  # found late by a quarter of an hour: no misfire
        scheduled_for=long_run_for,
        next_run_at=long_run_for,
    )
    _finish(_claim_one(job), lease.SUCCEEDED)
    return Story(
        Job.objects.get(pk=job.pk),
        story.misfired_first - shift,
        story.retried - shift,
        story.paused_first - shift,
        long_run_for,
    )


@pytest.fixture
def story() -> Story:
    return ledger_story()


def staff(*codenames: str, username: str = "viewer") -> Client:
    user = User.objects.create_user(username, password="pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="schedapp", codename__in=codenames)
    )
    client = Client()
    client.force_login(user)
    return client


def timeline(client: Client, job: Job, **query: str) -> str:
    response = client.get(reverse("admin:schedapp_job_timeline", args=[job.pk]), query)
    assert response.status_code == 200
    return response.content.decode()


def rows(html: str) -> list[str]:
    return re.findall(r'<tr class="schedapp-entry.*?</tr>', html, re.S)


def local(t: datetime) -> str:
    """An occurrence as a person types it: wall time in the job's zone, no offset."""
    return t.astimezone(ZoneInfo(ZONE)).strftime("%Y-%m-%d %H:%M:%S")


def test_the_timeline_shows_each_occurrence_its_attempts_and_what_did_not_run(admin_client, story):
    html = timeline(admin_client, story.job)
    found = rows(html)
    # Newest first: the latest ran, 9 passed while paused, the retried one, 29 misfired
    fates = [re.search(r"schedapp-fate-(\w+)", r).group(1) for r in found]  # type: ignore[union-attr]
    assert fates == ["ran", "paused", "ran", "misfired"]
    latest, paused, retried, misfired = found
    # ... in the job's zone, with its UTC offset
    paris = story.latest.astimezone(ZoneInfo(ZONE))
    offset = paris.strftime("%z")
    assert local(story.latest) in latest
    assert f"{paris.tzname()}, UTC{offset[:3]}:{offset[3:]}" in latest
    # The retried occurrence: both attempts, each linked to its run, the failure's first line
    attempts = list(JobRun.objects.filter(job=story.job, scheduled_for=story.retried))
    assert sorted(r.status for r in attempts) == ["failed", "succeeded"]
    for run in attempts:
        assert reverse("admin:schedapp_jobrun_change", args=[run.pk]) in retried
        assert f"token {run.token}" in retried
    assert "attempt 1" in retried and "attempt 2" in retried
    assert "RuntimeError: the ledger is locked" in retried and "Traceback" not in retried
    assert "worker1@host" in retried and 'schedapp-badge schedapp-succeeded"' in retried
    # The ranges: how many, from when to when, why, and who decided
    assert "29 occurrences" in misfired and local(story.misfired_first) in misfired
    assert local(story.retried - EVERY) in misfired.split("to</small>")[1]
    assert "decided by beat-1" in misfired
    # ... the occurrence it names in the job's zone, as every time of the timeline (the
    # record itself says it in UTC, whoever wrote it)
    folded_into = story.retried.astimezone(ZoneInfo(ZONE)).isoformat(sep=" ")
    assert f'folded into <span class="nowrap">{folded_into}</span>' in misfired
    assert story.retried.isoformat() in Occurrence.objects.get(fate="misfired").detail
    assert "9 occurrences" in paused and "decided by resume" in paused
    assert "passed while the job was paused" in paused


def test_the_fate_filter_keeps_one_fate_and_looks_like_the_admins_filters(admin_client, story):
    html = timeline(admin_client, story.job, fate="paused")
    assert [r for r in rows(html) if "schedapp-fate-paused" not in r] == []
    assert len(rows(html)) == 1
    assert re.search(r'<li class="selected"><a href="\?fate=paused">paused</a></li>', html)
    assert '<nav id="changelist-filter"' in html and '<a href="?fate=misfired">' in html
    ran = timeline(admin_client, story.job, fate="ran")
    assert len(rows(ran)) == 2 and "schedapp-fate-misfired" not in ran
    # An unknown fate says so and shows everything
    unknown = timeline(admin_client, story.job, fate="bogus")
    assert "Unknown fate" in unknown and len(rows(unknown)) == 4


def test_what_happened_at_answers_and_marks_the_row(admin_client, story):
    # A time inside the misfired range, typed in the job's zone
    asked = local(story.misfired_first + 3 * EVERY)
    html = timeline(admin_client, story.job, at=asked)
    answer = re.search(r'id="schedapp-answer">(.*?)</p>', html, re.S).group(1)  # type: ignore[union-attr]
    assert "did not run: Misfired" in answer and "one of 29 occurrences" in answer
    assert "decided by beat-1" in answer
    [marked] = re.findall(r'<tr class="[^"]*schedapp-asked[^"]*".*?</tr>', html, re.S)
    assert "schedapp-fate-misfired" in marked and 'id="schedapp-asked"' in marked
    assert f'value="{asked}"' in html  # the question stays in the form
    # The retried occurrence: both attempts, the failure first
    ran = timeline(admin_client, story.job, at=local(story.retried))
    answer = re.search(r'id="schedapp-answer">(.*?)</p>', ran, re.S).group(1)  # type: ignore[union-attr]
    assert (
        " ran: attempt 1 " in answer and ": failed (RuntimeError: the ledger is locked)" in answer
    )
    assert answer.index("attempt 1") < answer.index("attempt 2") and "succeeded." in answer
    # A time that is no occurrence, and one that is no time at all
    off = timeline(admin_client, story.job, at=local(story.latest + timedelta(minutes=1)))
    assert "is not an occurrence" in off and 'id="schedapp-asked"' not in off
    bad = timeline(admin_client, story.job, at="yesterday-ish")
    assert "is not a time" in bad and 'class="errornote"' in bad and len(rows(bad)) == 4
    for edge in ("0001-01-01 00:00", "9999-12-31 23:59-14:00", "24:00"):
        assert "is not a time" in timeline(admin_client, story.job, at=edge), edge
    assert "is not a time" in timeline(admin_client, story.job, until="0001-01-01T00:30+01:00")


def test_a_clock_time_alone_asks_about_the_latest_one():
    now = datetime(2026, 12, 3, 9, 30, tzinfo=ZoneInfo("UTC"))  # 10:30 in Paris
    at = admin_ledger.parse_time("08:00", ZONE, now)
    assert at == datetime(2026, 12, 3, 7, 0, tzinfo=ZoneInfo("UTC"))
    later = admin_ledger.parse_time("11:15", ZONE, now)  # not yet today: yesterday's
    assert later == datetime(2026, 12, 2, 10, 15, tzinfo=ZoneInfo("UTC"))
    offset = admin_ledger.parse_time("2026-12-03T08:00+00:00", ZONE, now)
    assert offset == datetime(2026, 12, 3, 8, 0, tzinfo=ZoneInfo("UTC"))
    with pytest.raises(ValueError):
        admin_ledger.parse_time("25:00", ZONE, now)


def test_an_answer_off_the_page_links_to_it_and_older_pages_follow(
    admin_client, story, monkeypatch
):
    monkeypatch.setattr(admin_ledger, "TIMELINE_LIMIT", 2)
    html = timeline(admin_client, story.job, at=local(story.misfired_first))
    assert len(rows(html)) == 2 and 'id="schedapp-asked"' not in html
    link = htmllib.unescape(re.search(r'href="([^"]*)" id="schedapp-show-answer"', html).group(1))  # type: ignore[union-attr]
    shown = admin_client.get(reverse("admin:schedapp_job_timeline", args=[story.job.pk]) + link)
    assert 'id="schedapp-asked"' in shown.content.decode()
    # The older link continues where the page stopped, without repeating a row
    older = htmllib.unescape(re.search(r'href="([^"]*)" id="schedapp-older"', html).group(1))  # type: ignore[union-attr]
    page2 = admin_client.get(
        reverse("admin:schedapp_job_timeline", args=[story.job.pk]) + older
    ).content.decode()
    fates = [re.search(r"schedapp-fate-(\w+)", r).group(1) for r in rows(page2)]  # type: ignore[union-attr]
    assert fates == ["ran", "misfired"] and 'id="schedapp-newest"' in page2


def test_the_pages_cost_the_same_queries_however_long_the_history(admin_client, story):
    url = reverse("admin:schedapp_job_timeline", args=[story.job.pk])
    fleet = reverse("admin:schedapp_job_not_run")

    def count(target: str) -> int:
        with CaptureQueriesContext(connection) as queries:
            assert admin_client.get(target, {"at": local(story.retried)}).status_code == 200
        return len(queries)

    before = count(url), count(fleet)
    for i in range(1, 40):  # forty more occurrences ran, each with its run
        at = story.misfired_first - i * EVERY
        JobRun.objects.create(
            job=story.job,
            token=1000 + i,
            attempt=1,
            scheduled_for=at,
            due_at=at,
            dispatched_at=at,
            task_id=f"schedapp:{story.job.pk}:{1000 + i}",
            status="failed",
        )
        ledger.record([(story.job.pk, MissedRange(at, at, 1, "misfired", "x"))], "beat-2")
    assert (count(url), count(fleet)) == before


def test_both_pages_need_the_permission_to_view_jobs(story):
    nobody = staff("view_jobrun", username="nobody")
    assert (
        nobody.get(reverse("admin:schedapp_job_timeline", args=[story.job.pk])).status_code == 403
    )
    assert nobody.get(reverse("admin:schedapp_job_not_run")).status_code == 403
    viewer = staff("view_job", "view_jobrun")
    assert "schedapp-fate-misfired" in timeline(viewer, story.job)
    assert viewer.get(reverse("admin:schedapp_job_not_run")).status_code == 200
    missing = reverse("admin:schedapp_job_timeline", args=[story.job.pk + 1000])
    assert viewer.get(missing).status_code == 404


def test_names_details_and_questions_are_text_never_markup(admin_client):
    evil = "<script>alert('name')</script>"
    job = api.schedule("project.tasks.record", cron="0 8 * * *", timezone=ZONE, name=evil)
    at = job.scheduled_for
    ledger.record(
        [(job.pk, MissedRange(at, at, 1, "misfired", "<script>alert('detail')</script>"))],
        "<b>beat</b>",
    )
    html = timeline(admin_client, job, at="<script>alert('q')</script>")
    html += timeline(admin_client, job, at=local(at))
    html += admin_client.get(reverse("admin:schedapp_job_not_run")).content.decode()
    assert "<script>alert" not in html and "<b>beat" not in html
    assert "&lt;script&gt;alert(&#x27;detail&#x27;)&lt;/script&gt;" in html
    assert "&lt;script&gt;alert(&#x27;name&#x27;)&lt;/script&gt;" in html
    assert "&lt;b&gt;beat&lt;/b&gt;" in html


def test_the_fleet_page_counts_what_did_not_run_and_links_to_each_timeline(admin_client, story):
    other = api.schedule("project.tasks.record", cron="0 8 * * *", timezone=ZONE, name="daily")
    api.cancel(other)
    response = admin_client.get(reverse("admin:schedapp_job_not_run"))
    assert response.status_code == 200
    html = response.content.decode()
    by_fate = re.search(r'id="schedapp-by-fate">(.*?)</table>', html, re.S).group(1)  # type: ignore[union-attr]
    counts = dict(
        re.findall(r'schedapp-(\w+)".*?</span></span></td><td class="num">([\d,]+)<', by_fate)
    )
    assert counts == {
        "misfired": "29",
        "outside_window": "0",
        "paused": "9",
        "cancelled": "1",
        "quarantined": "0",
        "overlapped": "0",
        "buffer_full": "0",
        "excluded": "0",
        "merged": "0",
        "late": "0",
    }
    assert re.search(r"<th>Total</th><th class=\"num\">39</th>", by_fate)
    # Runs that did not succeed, each status linking to its runs
    runs = reverse("admin:schedapp_jobrun_changelist")
    by_status = re.search(r'id="schedapp-by-status">(.*?)</table>', html, re.S).group(1)  # type: ignore[union-attr]
    assert re.search(
        rf'<a href="{runs}\?status__exact=failed"><span[^>]*schedapp-failed.*?</a></td>'
        r'<td class="num">1</td>',
        by_status,
    )
    assert f'href="{runs}?status__exact=lost"' in by_status
    # The latest records, newest first, each linking to its job's timeline at that time
    records = re.findall(r'<tr class="schedapp-record">.*?</tr>', html, re.S)
    assert len(records) == 3 and "daily" in records[0]
    # ... its occurrences in the job's zone, as on its timeline, the detail's times too
    assert local(story.paused_first) in records[1] and "UTC+01:00" in records[1]
    folded_into = story.latest.astimezone(ZoneInfo(ZONE)).isoformat(sep=" ")
    assert f"folded into {folded_into}" in htmllib.unescape(re.sub(r"<[^>]+>", "", records[1]))
    link = htmllib.unescape(
        re.search(r'<a href="([^"]*)">billing-report</a>', records[1]).group(1)  # type: ignore[union-attr]
    )
    assert link.startswith(reverse("admin:schedapp_job_timeline", args=[story.job.pk]) + "?")
    page = admin_client.get(link).content.decode()
    [marked] = re.findall(r'<tr class="[^"]*schedapp-asked[^"]*".*?</tr>', page, re.S)
    assert "schedapp-fate-paused" in marked
    # A shorter window leaves out what was recorded before it
    recent = admin_client.get(reverse("admin:schedapp_job_not_run"), {"hours": "0.5"})
    assert len(re.findall(r'<tr class="schedapp-record">', recent.content.decode())) == 2
    bad = admin_client.get(reverse("admin:schedapp_job_not_run"), {"hours": "-3"})
    assert "give a number" in bad.content.decode()


def test_the_job_page_the_overview_and_the_jobs_list_link_to_the_pages(admin_client, story):
    timeline_url = reverse("admin:schedapp_job_timeline", args=[story.job.pk])
    page = admin_client.get(reverse("admin:schedapp_job_change", args=[story.job.pk]))
    html = page.content.decode()
    assert f'<a href="{timeline_url}" id="schedapp-timeline-tool">' in html  # object tools
    assert f'<a href="{timeline_url}" id="schedapp-timeline-link">' in html  # by its runs
    not_run = reverse("admin:schedapp_job_not_run")
    overview = admin_client.get(reverse("admin:schedapp_job_overview")).content.decode()
    assert f'<a href="{not_run}" id="schedapp-overview-not-run">' in overview
    jobs = admin_client.get(reverse("admin:schedapp_job_changelist")).content.decode()
    assert f'href="{not_run}"' in jobs


def test_a_skipped_overlap_is_a_range_of_its_own_in_the_timeline_and_the_command(admin_client):
    story = with_a_skipped_overlap(ledger_story())
    found = rows(timeline(admin_client, story.job))
    fates = [re.search(r"schedapp-fate-(\w+)", r).group(1) for r in found]  # type: ignore[union-attr]
    assert fates == ["overlapped", "ran", "ran", "paused", "ran", "misfired"]
    skipped = found[0]
    assert "3 occurrences" in skipped and local(story.latest + EVERY) in skipped
    assert "overlap policy skip" in skipped and "decided by run end" in skipped
    # The command says the same of one of them
    out = io.StringIO()
    call_command(
        "schedapp_explain", str(story.job.pk), "--at", local(story.latest + 2 * EVERY), stdout=out
    )
    said = out.getvalue()
    assert "did not run: Overlapped a run in flight" in said, said
    assert "one of 3 occurrences" in said and "decided by run end" in said
