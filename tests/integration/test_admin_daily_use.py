"""The admin and fleet views a person lives in (issue 29, items 7 to 10), through Django's test
client on the real database: time zones said truly on a server that is not on UTC, nodes as
they are now (a restarted worker is its new process; alive or missing at a glance), the job
page that shows its state first and the chosen schedule kind's fields, and the runs list that
finds a job by name.

Given/When/Then in comments; every assertion reads what a person sees (HTML) or what the
database holds.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import django
import pytest
from django.urls import reverse

from schedapp import api, nodes
from schedapp.db import db_now
from schedapp.models import Job, JobState, Node

pytestmark = [pytest.mark.django_db]


def text(html: str) -> str:
    """The page as words: tags dropped, whitespace folded."""
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html)).strip()


def row_of(html: str, needle: str) -> str:
    """The <tr> of a changelist that contains ``needle``."""
    for row in re.findall(r"<tr[ >].*?</tr>", html, re.S):
        if needle in row:
            return row
    raise AssertionError(f"no row with {needle!r}")


# --- item 7: time zones on a server that is not on UTC --------------------------------------

BERLIN = "Europe/Berlin"


@pytest.fixture
def berlin(settings):  # type: ignore[no-untyped-def]
    settings.TIME_ZONE = BERLIN
    return settings


def test_the_overview_labels_the_database_time_with_the_zone_it_is_shown_in(admin_client, berlin):
    # Given a server whose TIME_ZONE is Europe/Berlin
    # When the operator opens the overview
    html = admin_client.get(reverse("admin:schedapp_job_overview")).content.decode()
    now = db_now()

    # Then the database time shown is labelled with the zone it is shown in, never "UTC"
    shown = re.search(r"Database time (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) (\S+)", html)
    assert shown is not None, text(html)[:500]
    berlin_now = now.astimezone(ZoneInfo(BERLIN))
    assert shown.group(2) == berlin_now.tzname(), shown.group(0)  # CET or CEST
    at = datetime.strptime(shown.group(1), "%Y-%m-%d %H:%M:%S").replace(tzinfo=ZoneInfo(BERLIN))
    assert abs((at - now).total_seconds()) < 60, (shown.group(0), now)


def test_the_job_form_says_its_times_are_the_jobs_zone_and_nothing_contradicts_it(
    admin_client, berlin
):
    # Given a server in Berlin
    # When the operator opens the add form
    html = admin_client.get(reverse("admin:schedapp_job_add")).content.decode()

    # Then each date-time of the job carries schedapp's note, in the paragraph of its inputs
    # (Django's admin script adds its "hours ahead of server time" note only where none is)
    for name in ("run_at", "interval_anchor", "not_before", "expires_at"):
        inputs = re.search(
            rf'<p class="datetime">(?:(?!</p>).)*id="id_{name}_0"(?:(?!</p>).)*</p>', html, re.S
        )
        assert inputs is not None, name
        assert "timezonewarning" in inputs.group(0), name
        assert "job&#x27;s time zone" in inputs.group(0) or "job's time zone" in inputs.group(0)
    # ... and nothing tells them to enter times in the server's zone
    assert not re.search(r"Enter times in the \S+ time ?zone", text(html))


def test_the_overviews_breadcrumbs_are_the_installed_admins_markup(admin_client):
    """Django 6.1's admin writes its breadcrumbs as <ol class="breadcrumbs"><li> and styles
    only ol.breadcrumbs; 5.2 and 6.0 write (and style) a div. The overview's breadcrumbs must
    be what the installed admin writes, the same element as on the admin's own Jobs page: the
    main suite runs this on 5.2, `nox -s ci` on 6.1."""
    # Given the installed Django's admin, and its own Jobs page
    jobs = admin_client.get(reverse("admin:schedapp_job_changelist")).content.decode()

    # When the operator opens the overview
    html = admin_client.get(reverse("admin:schedapp_job_overview")).content.decode()

    # Then its breadcrumbs, the only ones on the page, are the element that admin writes
    nav = re.search(r'<nav aria-label="Breadcrumbs">\s*(.*?)\s*</nav>', html, re.S)
    assert nav is not None, html[:2000]
    crumbs = nav.group(1)
    assert html.count('class="breadcrumbs"') == 1
    if django.VERSION >= (6, 1):
        assert crumbs.startswith('<ol class="breadcrumbs">'), crumbs
        items = re.findall(r"<li([^>]*)>(.*?)</li>", crumbs, re.S)
        assert [text(item) for _, item in items] == [
            "Home",
            "Scheduler",
            "Jobs",
            "Scheduler overview",
        ]
        assert items[-1][0] == ' aria-current="page"', items
    else:
        assert crumbs.startswith('<div class="breadcrumbs">'), crumbs
        parts = [part.strip() for part in text(crumbs).split("&rsaquo;")]
        assert parts == ["Home", "Scheduler", "Jobs", "Scheduler overview"], crumbs
    # ... the same element as on the admin's own pages
    tag = re.search(r'<(\w+) class="breadcrumbs">', jobs)
    assert tag is not None and crumbs.startswith(f'<{tag.group(1)} class="breadcrumbs">')


def test_the_overviews_breadcrumbs_lead_back_to_the_jobs(admin_client):
    html = admin_client.get(reverse("admin:schedapp_job_overview")).content.decode()
    crumbs = re.search(r'class="breadcrumbs">(.*?)</(div|ol)>', html, re.S).group(1)
    assert reverse("admin:schedapp_job_changelist") in crumbs
    assert text(crumbs).endswith("Scheduler overview")


# --- item 8: nodes ------------------------------------------------------------------------


def test_a_worker_restarted_under_its_name_shows_its_new_pid_and_start(monkeypatch):
    # Given a worker that recorded itself, then was killed
    first_start = datetime(2026, 1, 1, 8, 0, tzinfo=UTC)
    monkeypatch.setattr(nodes.os, "getpid", lambda: 1111)
    nodes.record_node("worker1@host-a", "worker", first_start, {"active": 0})

    # When it is started again under the same name (a new process, a new start)
    second_start = datetime(2026, 1, 1, 9, 30, tzinfo=UTC)
    monkeypatch.setattr(nodes.os, "getpid", lambda: 2222)
    nodes.record_node("worker1@host-a", "worker", second_start, {"active": 1})

    # Then its row, the overview and the status command's data are the new process's
    row = Node.objects.get(name="worker1@host-a")
    assert (row.pid, row.started_at) == (2222, second_start)
    from schedapp import overview

    [worker] = overview.collect().workers
    assert (worker.pid, worker.started_at) == (2222, second_start)


def test_the_nodes_page_marks_alive_and_missing_nodes_and_reads_stats_as_words(admin_client):
    # Given a live worker and a beat not seen for ten minutes
    now = db_now()
    Node.objects.create(
        name="worker1@ip-10-0-0-1",
        kind="worker",
        hostname="ip-10-0-0-1",
        pid=4242,
        started_at=now - timedelta(hours=1),
        last_seen_at=now,
        stats={"active": 2, "held": 3, "processed": 1234, "queues": ["celery", "reports"]},
    )
    Node.objects.create(
        name="ip-10-0-0-2:77:abc123",
        kind="beat",
        hostname="ip-10-0-0-2",
        pid=77,
        started_at=now - timedelta(hours=2),
        last_seen_at=now - timedelta(minutes=10),
        stats={"claimed": 5, "dispatched": 5},
    )

    # When the operator opens the nodes page
    html = admin_client.get(reverse("admin:schedapp_node_changelist")).content.decode()

    # Then each row says whether the process is alive, and the stats read as words, not JSON
    alive = text(row_of(html, "worker1@ip-10-0-0-1"))
    missing = text(row_of(html, "ip-10-0-0-2:77:abc123"))
    assert "alive" in alive and "missing" not in alive
    assert "missing" in missing and "alive" not in missing
    assert "active 2" in alive and "processed 1,234" in alive and "queues celery, reports" in alive
    assert "{" not in alive and '"active"' not in html


@pytest.mark.exhaustive  # 5 s: a beat started to read its banner
def test_the_beat_banner_names_the_beat_id_it_works_under_and_its_real_longest_sleep():
    """``celery beat`` prints its banner from a scheduler it builds for the banner alone
    (``service.get_scheduler(lazy=True)``), then builds the one that runs."""
    from celery.apps.beat import Beat
    from celery.beat import Service

    from schedapp.celeryapp import celery_app

    # Given celery beat's own service and banner for schedapp's scheduler
    app = celery_app()
    service = Service(app=app, scheduler_cls="schedapp.beat:LeaseScheduler")
    banner = Beat(app=app, quiet=True).startup_info(service)

    # When the scheduler that runs does its first tick
    scheduler = service.scheduler
    try:
        scheduler.tick()
        # Then the banner named the id it claims and records itself under
        assert scheduler.beat_id in banner, (scheduler.beat_id, banner)
    finally:
        scheduler.close()
    # ... and says how long it sleeps at most (SCHEDAPP_MAX_SLEEP, 5 s), not Celery's 300 s
    assert re.search(r"maxinterval -> 5\.00 seconds \(5(\.0)?s\)", banner), banner


# --- item 10: the runs list and the job list's count --------------------------------------


def test_the_runs_search_finds_a_job_by_name_and_a_run_by_its_exact_task_id(admin_client):
    from tests.integration.test_admin_runs import add_run

    # Given runs of two jobs
    billing = api.schedule("project.tasks.record", cron="0 3 * * *", name="nightly-billing-eu")
    other = api.schedule("project.tasks.record", cron="0 4 * * *", name="cache-warmer")
    mine = [add_run(billing, token, "succeeded") for token in (1, 2)]
    theirs = add_run(other, 1, "failed", error="boom")
    url = reverse("admin:schedapp_jobrun_changelist")

    # When the operator searches the runs for part of a job's name
    html = admin_client.get(url, {"q": "billing"}).content.decode()

    # Then that job's runs are listed, and no other job's
    listed = set(map(int, re.findall(r"/admin/schedapp/jobrun/(\d+)/change/", html)))
    assert listed == {r.pk for r in mine}
    # ... and an exact task id still finds its run
    html = admin_client.get(url, {"q": theirs.task_id}).content.decode()
    assert set(map(int, re.findall(r"/admin/schedapp/jobrun/(\d+)/change/", html))) == {theirs.pk}


def test_the_job_list_says_one_count_at_the_top_and_the_bottom(admin_client, monkeypatch):
    from schedapp.admin import filters

    # Given more matching jobs than the list counts (the cap, made small here)
    monkeypatch.setattr(filters, "COUNT_CAP", 3)
    for i in range(5):
        api.schedule("project.tasks.record", cron="0 3 * * *", name=f"capped-{i}")

    # When the operator filters the list
    html = admin_client.get(
        reverse("admin:schedapp_job_changelist"), {"state__exact": "scheduled"}
    ).content.decode()

    # Then the count reads the same wherever it is said: "3+", never the probe's 4
    words = text(html)
    assert "3+ jobs" in words
    assert not re.search(r"\b4 results?\b", words), re.findall(r".{40}\b4 results?.{20}", words)


# --- item 9: the job page -----------------------------------------------------------------


def job_page(admin_client, job: Job) -> str:  # type: ignore[no-untyped-def]
    return admin_client.get(reverse("admin:schedapp_job_change", args=[job.pk])).content.decode()


def test_a_dead_job_says_so_at_the_top_with_its_last_error_and_the_actions_that_apply(admin_client):
    # Given a job that died after its retries, with a long form below
    job = api.schedule("project.tasks.record", cron="0 3 * * *", name="died")
    Job.objects.filter(pk=job.pk).update(
        state=JobState.DEAD,
        retry_count=3,
        last_status="failed",
        last_run_at=db_now(),
        last_error="RuntimeError: the ledger is locked\nTraceback ...",
    )

    # When the operator opens it
    html = job_page(admin_client, job)

    # Then, above the form, a status header says it is dead, why, and offers what applies
    form_at = html.index('id="job_form"')
    header = re.search(r'<div[^>]*id="schedapp-status".*?</div>\s*<!-- /status -->', html, re.S)
    assert header is not None and header.start() < form_at
    words = text(header.group(0))
    assert "dead" in words.lower() and "RuntimeError: the ledger is locked" in words
    assert "Traceback" not in words  # the first line; the whole error stays below
    assert 'id="schedapp-op-requeue"' in header.group(0)
    assert 'id="schedapp-op-run_now"' in header.group(0)
    assert 'id="schedapp-op-pause"' not in header.group(0)  # a dead job cannot be paused


def test_a_scheduled_job_shows_its_state_and_next_run_at_the_top(admin_client):
    job = api.schedule(
        "project.tasks.record", cron="0 3 * * *", timezone="Europe/Paris", name="nightly-top"
    )
    html = job_page(admin_client, job)
    header = re.search(r'<div[^>]*id="schedapp-status".*?<!-- /status -->', html, re.S)
    assert header is not None and header.start() < html.index('id="job_form"')
    words = text(header.group(0))
    assert "scheduled" in words.lower()
    assert re.search(r"Next run \d{4}-\d\d-\d\d 03:00 CES?T", words), words
    assert 'id="schedapp-op-pause"' in header.group(0)


def test_the_schedule_fields_come_with_a_kind_chooser_naming_each_kinds_fields(admin_client):
    from schedapp.fields import SCHEDULE_FIELDS

    # Given an interval job
    job = api.schedule("project.tasks.record", interval=300, name="every-five")

    # When its page is opened
    html = job_page(admin_client, job)

    # Then the Schedule section has a kind chooser, set to the job's kind, whose options
    # name the fields each kind uses (the page script shows the chosen kind's only)
    chooser = re.search(r'<select[^>]*id="schedapp-schedule-kind".*?</select>', html, re.S)
    assert chooser is not None
    options = dict(re.findall(r'<option value="(\w+)"[^>]*data-fields="([^"]*)"', chooser.group(0)))
    assert set(options) == {"cron", "interval", "once", "solar"}
    assert re.search(r'<option value="interval"[^>]*selected', chooser.group(0))
    named = {f for fields in options.values() for f in fields.split()}
    assert set(SCHEDULE_FIELDS) <= named
    assert "schedapp/job_form.js" in html


def test_the_task_is_picked_from_the_registered_tasks_and_labels_are_plain(admin_client):
    # When the operator opens the add form
    html = admin_client.get(reverse("admin:schedapp_job_add")).content.decode()

    # Then the task input comes with a list of the Celery app's registered tasks to pick from
    picker = re.search(r'<select[^>]*id="schedapp-task-picker".*?</select>', html, re.S)
    assert picker is not None
    offered = re.findall(r'<option value="([^"]+)"', picker.group(0))
    assert "project.tasks.record" in offered and not any(o.startswith("celery.") for o in offered)
    assert 'name="task"' in html  # still a text input: a name may be typed
    # ... and the day rule of cron reads in plain words
    label = re.search(r'<label[^>]*for="id_cron_day_or"[^>]*>(.*?)</label>', html, re.S)
    assert label is not None and "Cron day or" not in label.group(1)
    assert "day of month" in label.group(1).lower() and "day of week" in label.group(1).lower()


def test_a_task_not_registered_in_the_web_process_is_saved_with_a_warning(admin_client):
    """Web processes often import fewer task modules than workers: like django-celery-beat's
    admin, a typed name is kept, with a warning; the allowlist still refuses what it denies."""
    from tests.integration.test_admin import form_data

    # When the operator saves a job whose task only the workers know
    response = admin_client.post(
        reverse("admin:schedapp_job_add"),
        form_data(name="worker-only", task="project.worker_only.tasks.crunch"),
        follow=True,
    )

    # Then the job is saved, and the page warns that this web process does not know the task
    job = Job.objects.get(name="worker-only")
    assert job.task == "project.worker_only.tasks.crunch"
    warnings = [str(m) for m in response.context["messages"] if m.level_tag == "warning"]
    assert any("not registered" in w and "worker_only" in w for w in warnings), warnings

    # ... while a task the allowlist denies is still refused on its field
    denied = admin_client.post(
        reverse("admin:schedapp_job_add"), form_data(name="denied", task="celery.backend_cleanup")
    )
    assert denied.status_code == 200 and not Job.objects.filter(name="denied").exists()
    assert "not allowed" in text(denied.content.decode())


def fieldset_of(html: str, css_class: str) -> tuple[str, str]:
    """The classes and the HTML of the admin's section (its module fieldset; 6.1 nests a
    fieldset in it per date-time) that holds the field row ``css_class``."""
    at = html.find(f"form-row {css_class}")
    assert at >= 0, css_class
    modules = list(re.finditer(r'<fieldset class="module aligned ?([^"]*)"', html))
    mine = [m for m in modules if m.start() < at][-1]
    later = [m.start() for m in modules if m.start() > at]
    end = later[0] if later else html.index("</form>", at)
    return mine.group(1), html[mine.start() : end]


def test_what_the_status_header_says_is_folded_below_and_the_runs_stay_in_sight(admin_client):
    """The State section at the bottom repeated the header (state, next and last run, retries,
    the last error) and made a dead job's page ~3,900 px tall at 1,400 px."""
    # Given a dead job with runs
    job = api.schedule("project.tasks.record", cron="0 3 * * *", name="folded")
    Job.objects.filter(pk=job.pk).update(
        state=JobState.DEAD,
        retry_count=3,
        last_status="failed",
        last_run_at=db_now(),
        last_error="RuntimeError: the ledger is locked\nTraceback ...",
    )

    # When the operator opens it
    html = job_page(admin_client, job)

    # Then the state in full (and the whole error) is in a folded section
    classes, state = fieldset_of(html, "field-last_error_text")
    assert "collapse" in classes.split(), classes
    assert "Traceback" in state
    for row in ("field-state_badge", "field-next_run", "field-last_run", "field-retry_count"):
        assert fieldset_of(html, row) == (classes, state), row
    # ... while the runs table is open, in a section of its own
    classes, runs = fieldset_of(html, "field-runs")
    assert "collapse" not in classes.split(), classes
    assert "field-last_error_text" not in runs
    # ... and the descriptions and message options take two lines, as args and kwargs do
    for name in ("description", "message_options"):
        area = re.search(rf'<textarea[^>]*id="id_{name}"[^>]*>', html)
        assert area is not None and 'rows="2"' in area.group(0), (name, area)


def test_the_optional_window_is_folded_until_a_job_has_one(admin_client):
    """Not before and ends at are optional and rarely set; on Django 6.1, whose admin puts
    labels above the fields, their date and time inputs took ~430 px of every job page."""
    # Given a job without a window, and one with an end
    plain = api.schedule("project.tasks.record", cron="0 3 * * *", name="no-window")
    ending = api.schedule(
        "project.tasks.record",
        cron="0 3 * * *",
        name="with-end",
        expires_at=db_now() + timedelta(days=30),
    )

    # When the operator opens each, and the add form
    # Then the window's inputs are in a folded section of their own where nothing is set
    for html in (
        job_page(admin_client, plain),
        admin_client.get(reverse("admin:schedapp_job_add")).content.decode(),
    ):
        classes, window = fieldset_of(html, "field-not_before")
        assert "collapse" in classes.split(), classes
        assert fieldset_of(html, "field-expires_at")[1] == window
        assert "field-cron" not in window and "field-timezone" not in window
    # ... and open where the job has one
    classes, window = fieldset_of(job_page(admin_client, ending), "field-expires_at")
    assert "collapse" not in classes.split(), classes
    assert "field-cron" not in window

    # ... and open when a refused form comes back with a window typed in (its error elsewhere)
    from tests.integration.test_admin import form_data

    refused = admin_client.post(
        reverse("admin:schedapp_job_add"),
        form_data(task="", not_before_0="2030-01-01", not_before_1="08:00:00"),
    )
    assert refused.status_code == 200
    classes, window = fieldset_of(refused.content.decode(), "field-not_before")
    assert "collapse" not in classes.split(), classes
    assert 'value="2030-01-01"' in window
