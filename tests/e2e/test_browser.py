"""An operator's whole path through the admin, in headless Chromium, against real processes.

Log in, create a cron job in the form, see the preview of its next fire times, save it, press
"Run now", and watch the run succeed on the runs page: executed by a real ``celery worker``,
dispatched by a real ``celery beat``, both on the test database and Redis.

Needs Debian's ``chromium`` (``apt-get install -y chromium``) and Python's ``playwright``
(never ``playwright install``: the system browser is used). Skipped only when
/usr/bin/chromium is missing.

Screenshots of the jobs list and a job page at 1,400 px are written to ``var/screenshots/``
(or ``$SCHEDAPP_SCREENSHOTS``), kept as CI artefacts.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

from project.models import Execution
from schedapp.models import Job, JobRun, JobSource
from tests import ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]


@pytest.fixture
def browser(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is missing: apt-get install -y chromium")
    sync_api = pytest.importorskip("playwright.sync_api")
    # Playwright's sync API runs an event loop in this thread; the ORM calls the test makes
    # between page actions are still synchronous.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()
            # ORM calls made while Playwright's loop runs get connections of their own
            # context: close them here, or the test database cannot be dropped afterwards.
            from django.db import connections

            connections.close_all()


def test_operator_creates_a_cron_job_previews_it_runs_it_and_sees_it_succeed(
    live_server, fleet, browser, django_user_model
):
    from playwright.sync_api import expect

    # Given an operator account, a beat and a worker
    django_user_model.objects.create_superuser("operator", "op@example.com", "s3cret-pw")
    fleet.beat()
    fleet.worker(concurrency=1)
    page = browser.new_page()
    page.set_default_timeout(15_000)

    # When the operator logs in
    page.goto(f"{live_server.url}/admin/login/?next=/admin/schedapp/job/add/")
    page.fill("#id_username", "operator")
    page.fill("#id_password", "s3cret-pw")
    page.click("input[type=submit]")
    page.wait_for_url(re.compile(r"/admin/schedapp/job/add/$"))

    # ... fills in a cron job (03:00 in Paris every day: it will not fire by itself soon)
    page.fill("#id_name", "browser-job")
    page.fill("#id_task", "project.tasks.record")
    page.fill("#id_kwargs", '{"label": "from-the-browser"}')
    page.fill("#id_cron", "0 3 * * *")
    page.fill("#id_timezone", "Europe/Paris")

    # Then the preview shows the schedule in words and the next five fire times, at 03:00
    # Paris time
    page.click("#schedapp-preview-button")
    items = page.locator("#schedapp-preview-list li")
    expect(items).to_have_count(5)
    expect(page.locator("#schedapp-preview-words")).to_have_text("At 03:00 (Europe/Paris)")
    expect(items.last).to_contain_text(re.compile(r"03:00:00 CES?T"))  # the zone as typed
    for text in items.all_inner_texts():
        assert re.search(r"03:00:00 CES?T \(UTC\+0[12]:00\)", text), text

    # ... and a bad cron shows the API's message instead
    page.fill("#id_cron", "0 25 * * *")
    page.click("#schedapp-preview-button")
    expect(page.locator("#schedapp-preview-error")).to_contain_text("cron:")
    expect(items).to_have_count(0)
    expect(page.locator("#schedapp-preview-words")).to_have_text("")
    page.fill("#id_cron", "0 3 * * *")

    # When the operator saves and stays on the job
    page.click("input[name=_continue]")
    page.wait_for_url(re.compile(r"/admin/schedapp/job/\d+/change/$"))
    job = Job.objects.get(name="browser-job")
    assert job.source == JobSource.ADMIN and job.cron == "0 3 * * *"
    expect(page.locator("#schedapp-preview-list li")).to_have_count(5)

    # ... and presses "Run now"
    page.click("#schedapp-op-run_now")
    expect(page.locator("ul.messagelist")).to_contain_text(
        "Run now: 1 job will run at the next tick: browser-job."
    )

    # Then the runs page of the job shows the run, succeeded
    page.click("#schedapp-runs-link")
    page.wait_for_url(re.compile(rf"/admin/schedapp/jobrun/\?job={job.pk}$"))
    deadline = time.monotonic() + 60
    while not page.locator(".schedapp-badge.schedapp-succeeded").count():
        assert time.monotonic() < deadline, f"no succeeded run:\n{fleet.logs()}"
        time.sleep(0.5)
        page.reload()
    expect(page.locator("#result_list tbody tr")).to_have_count(1)
    assert "browser-job" in page.locator("#result_list").inner_text()
    # ... really executed once by the worker, for this job
    run = JobRun.objects.get(job=job)
    assert run.status == "succeeded" and run.worker.startswith("worker")
    assert list(
        Execution.objects.filter(label="from-the-browser").values_list("job_id", flat=True)
    ) == [job.pk]


# Screenshots of the admin are kept as test artefacts (var/ is not committed).
SCREENSHOTS = Path(os.environ.get("SCHEDAPP_SCREENSHOTS", ROOT / "var" / "screenshots"))
WIDE_COLUMNS = ("Next run", "Last run", "Lease", re.compile(r"Retr(y|ies)", re.I))


def realistic_jobs() -> None:
    """Jobs as a fleet shows them: long names and tasks, schedules in words, a lease held by a
    worker with a long host name, outcomes and retries."""
    from datetime import timedelta

    from schedapp import api
    from schedapp.db import db_now

    now = db_now()
    specs = [
        dict(cron="0 0 * * 1-5", timezone="Europe/Paris"),
        dict(cron="*/15 9-17 * * 1-5", timezone="America/New_York"),
        dict(interval=90),
        dict(run_at=now + timedelta(hours=5), timezone="Asia/Kolkata"),
        dict(cron="30 2 1,15 * *", timezone="Australia/Lord_Howe"),
    ]
    for i, spec in enumerate(specs * 4):
        job = api.schedule(
            "project.tasks.record_once",
            name=f"nightly-billing-reconciliation-for-region-{i:02d}-eu-west",
            queue="reports-high-priority",
            **spec,  # type: ignore[arg-type]
        )
        if i % 3 == 0:
            Job.objects.filter(pk=job.pk).update(
                state="running",
                claimed_by=f"worker{i}@ip-10-120-33-{i}.eu-west-1.compute.internal",
                lease_expires_at=now + timedelta(seconds=60),
                last_run_at=now - timedelta(minutes=5),
                last_status="failed",
                retry_count=2,
            )
        elif i % 3 == 1:
            Job.objects.filter(pk=job.pk).update(
                last_run_at=now - timedelta(hours=1), last_status="succeeded"
            )


def test_the_jobs_list_fits_1400_pixels_with_every_column_visible(
    live_server, browser, django_user_model
):
    # Given an operator and a page of realistic jobs
    django_user_model.objects.create_superuser("operator", "op@example.com", "s3cret-pw")
    realistic_jobs()
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.set_default_timeout(30_000)

    # When the operator opens the jobs list on a 1,400 px wide screen
    page.goto(f"{live_server.url}/admin/login/?next=/admin/schedapp/job/")
    page.fill("#id_username", "operator")
    page.fill("#id_password", "s3cret-pw")
    page.click("input[type=submit]")
    page.wait_for_url(re.compile(r"/admin/schedapp/job/$"))
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "jobs-list-1400.png"), full_page=True)

    # Then nothing scrolls sideways: neither the page nor the results table
    widths = page.evaluate(
        """() => {
            const results = document.querySelector('#changelist .results');
            return {page: [document.documentElement.scrollWidth,
                           document.documentElement.clientWidth],
                    results: [results.scrollWidth, results.clientWidth]};
        }"""
    )
    assert widths["page"][0] <= widths["page"][1], widths
    assert widths["results"][0] <= widths["results"][1], widths
    # ... and the headers of Next run, Last run, Lease and Retry are on screen
    for title in WIDE_COLUMNS:
        header = page.locator("#result_list thead th", has_text=title).first
        box = header.bounding_box()
        assert header.is_visible() and box is not None, title
        assert box["x"] >= 0 and box["x"] + box["width"] <= 1400, (title, box)

    # ... and the job page, at the same width, is kept as an artefact too
    page.click("#result_list tbody tr th a")
    page.wait_for_url(re.compile(r"/admin/schedapp/job/\d+/change/$"))
    page.screenshot(path=str(SCREENSHOTS / "job-page-1400.png"), full_page=True)
    widths = page.evaluate(
        "() => [document.documentElement.scrollWidth, document.documentElement.clientWidth]"
    )
    assert widths[0] <= widths[1], widths


# --- issue 29 items 7 to 10: the views a person lives in, at 1,400 px, on a Berlin server ---

SHOTS_DAILY = Path(os.environ.get("SCHEDAPP_DAILY_SCREENSHOTS", SCREENSHOTS))


def _login(page, live_server, target: str) -> None:  # type: ignore[no-untyped-def]
    page.goto(f"{live_server.url}/admin/login/?next={target}")
    page.fill("#id_username", "operator")
    page.fill("#id_password", "s3cret-pw")
    page.click("input[type=submit]")
    page.wait_for_url(re.compile(re.escape(target.split("?")[0]) + r"(\?.*)?$"))


def _no_sideways_scroll(page) -> None:  # type: ignore[no-untyped-def]
    widths = page.evaluate(
        "() => [document.documentElement.scrollWidth, document.documentElement.clientWidth]"
    )
    assert widths[0] <= widths[1], widths


def _fleet_rows() -> tuple[Job, Job]:
    """A dead job with runs on long-named workers, a live worker and a beat gone missing."""
    from datetime import timedelta

    from schedapp import api
    from schedapp.db import db_now
    from schedapp.models import JobState, Node, task_id_for

    now = db_now()
    dead = api.schedule(
        "project.tasks.record_once",
        cron="0 3 * * *",
        timezone="Europe/Berlin",
        name="nightly-billing-reconciliation-eu-west",
    )
    Job.objects.filter(pk=dead.pk).update(
        state=JobState.DEAD,
        retry_count=3,
        last_status="failed",
        last_run_at=now - timedelta(minutes=3),
        last_error="RuntimeError: the ledger is locked by another reconciliation\nTraceback ...",
    )
    for token in range(1, 4):
        JobRun.objects.create(
            job=dead,
            token=token,
            attempt=token,
            scheduled_for=now - timedelta(minutes=10),
            due_at=now - timedelta(minutes=10),
            claimed_by=f"ip-10-120-33-{token}.eu-west-1.compute.internal:4242:a1b2c3",
            dispatched_at=now - timedelta(minutes=10),
            started_at=now - timedelta(minutes=10),
            finished_at=now - timedelta(minutes=9),
            worker=f"celery-worker-{token}@ip-10-120-33-{token}.eu-west-1.compute.internal",
            task_id=task_id_for(dead.pk, token),
            status="failed",
            error="RuntimeError: the ledger is locked by another reconciliation "
            "(ledger_id=eu-west-2026-12, holder=reconcile-7f3a9c2e4b1d)",
        )
    cron = api.schedule(
        "project.tasks.record", cron="*/15 9-17 * * 1-5", timezone="Europe/Berlin", name="office"
    )
    Node.objects.create(
        name="celery-worker-1@ip-10-120-33-1.eu-west-1.compute.internal",
        kind="worker",
        hostname="ip-10-120-33-1.eu-west-1.compute.internal",
        pid=4242,
        started_at=now - timedelta(hours=3),
        last_seen_at=now,
        stats={"active": 2, "held": 3, "processed": 12345, "queues": ["celery", "reports"]},
    )
    Node.objects.create(
        name="ip-10-120-33-9.eu-west-1.compute.internal:77:9f8e7d",
        kind="beat",
        hostname="ip-10-120-33-9.eu-west-1.compute.internal",
        pid=77,
        started_at=now - timedelta(hours=5),
        last_seen_at=now - timedelta(minutes=12),
        stats={"claimed": 1200, "dispatched": 1200, "reaped": 3, "ticks": 40000},
    )
    return dead, cron


def test_the_admin_a_person_lives_in_at_1400_pixels_on_a_berlin_server(
    live_server, browser, django_user_model, settings
):
    """Issue 29, items 7 to 10, in a real browser: the overview's zone and breadcrumbs, the
    job form's notes, the status header and kind chooser, the runs and nodes lists' width."""
    from playwright.sync_api import expect

    # Given a Berlin server, an operator in Berlin, and a fleet's worth of rows
    settings.TIME_ZONE = "Europe/Berlin"
    django_user_model.objects.create_superuser("operator", "op@example.com", "s3cret-pw")
    dead, cron = _fleet_rows()
    context = browser.new_context(
        viewport={"width": 1400, "height": 900}, timezone_id="Europe/Berlin"
    )
    page = context.new_page()
    page.set_default_timeout(30_000)
    SHOTS_DAILY.mkdir(parents=True, exist_ok=True)

    # item 7: the overview says its time in Berlin's zone, under styled breadcrumbs
    _login(page, live_server, "/admin/schedapp/job/overview/")
    expect(page.locator("#schedapp-db-time")).to_contain_text(re.compile(r"CES?T \(Europe/Berlin"))
    crumbs = page.locator(".breadcrumbs")
    expect(crumbs).to_contain_text("Scheduler overview")
    assert crumbs.evaluate("e => getComputedStyle(e).backgroundColor") != "rgba(0, 0, 0, 0)"
    page.screenshot(path=str(SHOTS_DAILY / "overview-berlin-1400.png"), full_page=True)

    # item 9: a dead job says so at the top, with the actions that apply
    page.goto(f"{live_server.url}/admin/schedapp/job/{dead.pk}/change/")
    header = page.locator("#schedapp-status")
    expect(header).to_contain_text("This job is dead")
    expect(header).to_contain_text("RuntimeError: the ledger is locked")
    box = header.bounding_box()
    assert box is not None and box["y"] < 400, box  # on the first screen
    expect(page.locator("#schedapp-op-requeue")).to_be_visible()
    # ... and only the cron kind's fields are shown
    expect(page.locator("#schedapp-schedule-kind")).to_have_value("cron")
    expect(page.locator("#id_cron")).to_be_visible()
    expect(page.locator("#id_interval")).to_be_hidden()
    expect(page.locator("#id_run_at_0")).to_be_hidden()
    # ... the State section, which the header says, folded; the latest runs open
    expect(page.locator(".field-last_error_text")).to_be_hidden()
    expect(page.locator(".field-runs")).to_be_visible()
    page.screenshot(path=str(SHOTS_DAILY / "job-dead-1400.png"), full_page=True)
    height = page.evaluate("() => document.documentElement.scrollHeight")
    assert height < 2800, height  # 3,867 on Django 6.1 with the State and Window sections open
    _no_sideways_scroll(page)

    # item 9 and 7: a new job: pick the task, choose the kind, no note of the server's zone
    page.goto(f"{live_server.url}/admin/schedapp/job/add/")
    page.select_option("#schedapp-task-picker", "project.tasks.record")
    expect(page.locator("#id_task")).to_have_value("project.tasks.record")
    expect(page.locator("#schedapp-task-warning")).to_be_hidden()
    page.fill("#id_task", "project.tasks.not_here")
    expect(page.locator("#schedapp-task-warning")).to_be_visible()
    page.fill("#id_task", "project.tasks.record")
    page.select_option("#schedapp-schedule-kind", "once")
    expect(page.locator("#id_run_at_0")).to_be_visible()
    expect(page.locator("#id_cron")).to_be_hidden()
    expect(page.locator(".field-run_at .schedapp-wall-time")).to_be_visible()
    assert "server time" not in page.locator("#job_form").inner_text()
    page.screenshot(path=str(SHOTS_DAILY / "job-add-once-1400.png"), full_page=True)
    # ... an interval job saved from the chooser keeps only the interval
    page.fill("#id_name", "every-five-minutes")
    page.select_option("#schedapp-schedule-kind", "cron")
    page.fill("#id_cron", "0 3 * * *")  # typed, then another kind chosen
    page.select_option("#schedapp-schedule-kind", "interval")
    page.fill("#id_interval", "00:05:00")
    page.fill("#id_timezone", "Europe/Berlin")
    page.click("input[name=_continue]")
    page.wait_for_url(re.compile(r"/admin/schedapp/job/\d+/change/$"))
    saved = Job.objects.get(name="every-five-minutes")
    assert saved.cron == "" and saved.interval is not None and saved.interval.total_seconds() == 300
    expect(page.locator("#schedapp-schedule-kind")).to_have_value("interval")

    # item 10: the runs list, sidebar open, shows attempt and error on screen
    page.goto(f"{live_server.url}/admin/schedapp/jobrun/?q=billing")
    expect(page.locator("#result_list tbody tr")).to_have_count(3)
    page.screenshot(path=str(SHOTS_DAILY / "runs-search-1400.png"), full_page=True)
    results = page.locator("#changelist .results")
    for title in ("Attempt", "Error"):
        cell = page.locator("#result_list thead th", has_text=title).first
        box, frame = cell.bounding_box(), results.bounding_box()
        assert box is not None and frame is not None, title
        assert box["x"] + box["width"] <= frame["x"] + frame["width"], (title, box, frame)
    _no_sideways_scroll(page)
    scroll = results.evaluate("e => [e.scrollWidth, e.clientWidth]")
    assert scroll[0] <= scroll[1], scroll

    # item 10: a filtered jobs list past the count's cap (made 1 here) says one count
    from schedapp.admin import filters

    cap, filters.COUNT_CAP = filters.COUNT_CAP, 1
    page.goto(f"{live_server.url}/admin/schedapp/job/?state__exact=scheduled")
    expect(page.locator("#schedapp-result-count")).to_contain_text("1+ jobs match")
    expect(page.locator("p.paginator")).to_contain_text("1+ jobs")
    assert not re.search(r"\b2 results?\b", page.locator("#changelist").inner_text())
    page.screenshot(path=str(SHOTS_DAILY / "jobs-filtered-1400.png"), full_page=True)
    filters.COUNT_CAP = cap

    # item 8: the nodes page marks alive and missing, stats as words, compact rows
    page.goto(f"{live_server.url}/admin/schedapp/node/")
    rows = page.locator("#result_list tbody tr")
    expect(rows).to_have_count(2)
    expect(page.locator("#result_list")).to_contain_text("alive")
    expect(page.locator("#result_list")).to_contain_text("missing")
    page.screenshot(path=str(SHOTS_DAILY / "nodes-1400.png"), full_page=True)
    for i in range(2):
        box = rows.nth(i).bounding_box()
        assert box is not None and box["height"] < 100, box
    _no_sideways_scroll(page)
    scroll = page.locator("#changelist .results").evaluate("e => [e.scrollWidth, e.clientWidth]")
    assert scroll[0] <= scroll[1], scroll

    # item 7: a browser in another zone than the server's gets no "server time" note either
    other = browser.new_context(
        viewport={"width": 1400, "height": 900}, timezone_id="America/New_York"
    )
    away = other.new_page()
    away.set_default_timeout(30_000)
    _login(away, live_server, f"/admin/schedapp/job/{cron.pk}/change/")
    away.select_option("#schedapp-schedule-kind", "once")
    expect(away.locator(".field-run_at .schedapp-wall-time")).to_be_visible()
    assert "server time" not in away.locator("#job_form").inner_text()
    away.screenshot(path=str(SHOTS_DAILY / "job-form-new-york-browser-1400.png"), full_page=True)
    other.close()
    context.close()


def test_the_occurrence_ledger_pages_at_1400_pixels(live_server, browser, django_user_model):
    """A job's timeline, with "what happened at ...?" answered, and the fleet's "what did not
    run", at 1,400 px: a job with a misfired range, an occurrence failed then retried, a
    paused range, a run so long that the next three were skipped (overlap policy skip), and
    another job cancelled."""
    from playwright.sync_api import expect

    from schedapp import api
    from tests.integration.test_admin_ledger import ledger_story, local, with_a_skipped_overlap

    # Given an operator, a job's last hours in its ledger, and a job cancelled
    django_user_model.objects.create_superuser("operator", "op@example.com", "s3cret-pw")
    story = with_a_skipped_overlap(ledger_story("nightly-billing-reconciliation-eu-west"))
    daily = api.schedule(
        "project.tasks.record", cron="0 8 * * *", timezone="Europe/Paris", name="daily-export"
    )
    api.cancel(daily)
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.set_default_timeout(30_000)
    SHOTS_DAILY.mkdir(parents=True, exist_ok=True)

    # When the operator opens the job's timeline from its page
    _login(page, live_server, f"/admin/schedapp/job/{story.job.pk}/change/")
    page.click("#schedapp-timeline-tool")
    page.wait_for_url(re.compile(rf"/admin/schedapp/job/{story.job.pk}/timeline/$"))
    rows = page.locator("#schedapp-timeline-table tbody tr.schedapp-entry")
    expect(rows).to_have_count(6)

    # ... and asks what happened at the occurrence that failed and was retried
    page.fill("#schedapp-at", local(story.retried)[:16])
    page.click("#schedapp-ask-form input[type=submit]")
    answer = page.locator("#schedapp-answer")
    expect(answer).to_contain_text("ran: attempt 1")
    expect(answer).to_contain_text("failed (RuntimeError: the ledger is locked)")
    # Then its row is marked, with both attempts, and nothing scrolls sideways
    asked = page.locator("#schedapp-asked")
    expect(asked).to_be_visible()
    expect(asked.locator("li.schedapp-attempt")).to_have_count(2)
    expect(rows.nth(5)).to_contain_text("29 occurrences")
    expect(rows.nth(3)).to_contain_text("9 occurrences")
    expect(rows.nth(0)).to_contain_text("overlap policy skip")
    _no_sideways_scroll(page)
    scroll = page.locator("#changelist .results").evaluate("e => [e.scrollWidth, e.clientWidth]")
    assert scroll[0] <= scroll[1], scroll
    page.screenshot(path=str(SHOTS_DAILY / "ledger-timeline-1400.png"), full_page=True)

    # When the operator opens "What did not run" from the overview
    page.goto(f"{live_server.url}/admin/schedapp/job/overview/")
    page.click("#schedapp-overview-not-run")
    page.wait_for_url(re.compile(r"/admin/schedapp/job/not-run/$"))
    # Then the counts by why, the failed run, and the latest records are there
    expect(page.locator("#schedapp-by-fate")).to_contain_text("42")
    expect(page.locator("#schedapp-by-status")).to_contain_text("failed")
    records = page.locator("tr.schedapp-record")
    expect(records).to_have_count(4)
    _no_sideways_scroll(page)
    page.screenshot(path=str(SHOTS_DAILY / "ledger-not-run-1400.png"), full_page=True)
    # ... and a record's job leads to its timeline at that time, the record marked
    records.nth(2).locator("a").click()
    page.wait_for_url(re.compile(rf"/admin/schedapp/job/{story.job.pk}/timeline/\?"))
    expect(page.locator("#schedapp-asked")).to_contain_text("9 occurrences")


def test_a_jobs_history_at_1400_pixels_and_a_version_restored(
    live_server, browser, django_user_model
):
    """A job's audit trail: created by a deploy's declared sync, its schedule changed by one
    person with a reason, paused by another, then a version restored from the page."""
    from playwright.sync_api import expect

    from schedapp import api, audit

    # Given a job with four recorded changes by three actors
    django_user_model.objects.create_superuser("operator", "op@example.com", "s3cret-pw")
    with audit.acting("celery beat pid 4242 on beat-1", source="declared"):
        job = api.schedule(
            "project.tasks.record",
            name="invoices-eu",
            cron="0 6 * * 1-5",
            timezone="Europe/Paris",
            kwargs={"region": "eu"},
            reason="declared in code (SCHEDAPP_JOBS)",
        )
    with audit.acting("alice", source="admin"):
        api.update(
            job,
            cron="30 7 * * 1-5",
            max_retries=5,
            kwargs={"region": "eu", "batch": 500},
            reason="the bank's file now arrives at 07:00 (INC-2231)",
        )
    with audit.acting("bob", source="admin"):
        api.pause(job, reason="bank holiday freeze")
        api.resume(job)
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.set_default_timeout(30_000)
    SHOTS_DAILY.mkdir(parents=True, exist_ok=True)

    # When the operator opens its history from the job's page
    _login(page, live_server, f"/admin/schedapp/job/{job.pk}/change/")
    page.click("a.historylink")
    page.wait_for_url(re.compile(rf"/admin/schedapp/job/{job.pk}/history/$"))
    rows = page.locator("#schedapp-history-table tbody tr.schedapp-change")
    expect(rows).to_have_count(4)
    # Then the schedule change shows who, why, the diff and the fire times before and after
    change = rows.nth(2)
    expect(change).to_contain_text("alice")
    expect(change).to_contain_text("INC-2231")
    expect(change.locator(".schedapp-before").first).to_contain_text("0 6 * * 1-5")
    expect(change.locator(".schedapp-fires")).to_contain_text("07:30")
    expect(change.locator(".schedapp-fires")).to_contain_text("06:00")

    # When they restore the version it was created with, giving a reason
    created = rows.nth(3)
    created.locator("input[name=reason]").fill("back to 06:00 until the bank confirms")
    created.locator("input[type=submit]").click()
    page.wait_for_url(re.compile(rf"/admin/schedapp/job/{job.pk}/history/$"))
    # Then the job is back, and the restore is the newest record, by the operator
    expect(rows).to_have_count(5)
    expect(rows.nth(0)).to_contain_text("Restored to an earlier version")
    expect(rows.nth(0)).to_contain_text("operator")
    job.refresh_from_db()
    assert (job.cron, job.max_retries, job.kwargs) == ("0 6 * * 1-5", 3, {"region": "eu"})
    _no_sideways_scroll(page)
    page.screenshot(path=str(SHOTS_DAILY / "audit-history-1400.png"), full_page=True)


def test_needs_attention_at_1400_pixels_from_the_admin_index(
    live_server, browser, django_user_model
):
    """The "needs attention" page, reached from the admin index: open breaches of every kind
    (the late and dead ones recorded by the deadline pass itself), counted at the top, a tag
    filter, and a channel whose deliveries fail."""
    from datetime import timedelta

    from django.db.models.functions import Now
    from playwright.sync_api import expect

    from schedapp import api, deadlines
    from schedapp.models import Breach, JobState, Notification, NotificationChannel

    # Given jobs in trouble: late and dead (by the deadline pass), and the other kinds
    django_user_model.objects.create_superuser("operator", "op@example.com", "s3cret-pw")
    late = api.schedule(
        "project.tasks.record",
        name="invoices-eu-nightly",
        interval=timedelta(hours=1),
        start_deadline=timedelta(minutes=5),
        tags=["billing", "eu"],
    )
    Job.objects.filter(pk=late.pk).update(
        scheduled_for=Now() - timedelta(minutes=12), next_run_at=Now() - timedelta(minutes=12)
    )
    dead = api.schedule(
        "project.tasks.record", name="ledger-export", cron="0 3 * * *", tags=["billing"]
    )
    Job.objects.filter(pk=dead.pk).update(
        state=JobState.DEAD, last_error="ConnectionError: sftp.bank.example refused\ntraceback"
    )
    deadlines.check_deadlines()
    others = [
        (
            "overrunning",
            "search-reindex",
            ["search"],
            "running longer than its max runtime (1:00:00)",
        ),
        (
            "failing",
            "crm-sync",
            ["crm", "eu"],
            "3 failed attempt(s) in a row (alert_after_failures)",
        ),
        (
            "missed_finish_by",
            "daily-report",
            ["reports"],
            "the occurrence due by 09:00 (Europe/Paris) had not succeeded",
        ),
        (
            "failing",
            "payroll-export",
            ["billing"],
            "5 failed attempt(s) in a row (alert_after_failures)",
        ),
    ]
    for i, (kind, name, tags, detail) in enumerate(others):
        job = api.schedule(
            "project.tasks.record", name=name, cron="0 9 * * *", timezone="Europe/Paris", tags=tags
        )
        made = Breach.objects.create(
            job=job, kind=kind, scheduled_for=job.scheduled_for - timedelta(days=1), detail=detail
        )
        Breach.objects.filter(pk=made.pk).update(opened_at=Now() - timedelta(minutes=7 * i + 3))
    Notification.objects.create(
        channel="pager-webhook",
        kind="dead",
        job_id=dead.pk,
        job_name=dead.name,
        failed_at=Now(),
        attempts=5,
        last_error="HTTPError 502 from https://hooks.example/alerts after 10.0 s",
    )
    NotificationChannel.objects.create(name="pager-webhook", failures=5, retry_at=Now())
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.set_default_timeout(30_000)
    SHOTS_DAILY.mkdir(parents=True, exist_ok=True)

    # When the operator opens "Needs attention" from the admin index
    _login(page, live_server, "/admin/")
    page.click("a[href='/admin/schedapp/attention/']")
    page.wait_for_url(re.compile(r"/admin/schedapp/attention/$"))
    # Then every kind is counted at the top, and each row is its job with a timeline link
    expect(page.locator("#schedapp-count-all .count")).to_have_text("6")
    expect(page.locator("#schedapp-count-failing .count")).to_have_text("2")
    expect(page.locator("#schedapp-breaches-late")).to_contain_text("invoices-eu-nightly")
    expect(page.locator("#schedapp-breaches-late")).to_contain_text("not started within")
    expect(page.locator("#schedapp-breaches-dead")).to_contain_text("dead: ConnectionError")
    expect(page.locator("#schedapp-channels")).to_contain_text("pager-webhook")
    expect(page.locator("tr.schedapp-failed-notification")).to_have_count(1)
    _no_sideways_scroll(page)
    page.screenshot(path=str(SHOTS_DAILY / "attention-1400.png"), full_page=True)

    # When they filter by a tag
    page.fill("#schedapp-tag", "billing")
    page.click("#schedapp-tag-filter input[type=submit]")
    page.wait_for_url(re.compile(r"/admin/schedapp/attention/\?tag=billing$"))
    # Then only the billing team's jobs are left, counted
    expect(page.locator("#schedapp-count-all .count")).to_have_text("3")
    expect(page.locator("tr.schedapp-breach")).to_have_count(3)
    expect(page.locator("#schedapp-breaches-failing")).not_to_contain_text("crm-sync")
    # ... and a row's timeline link leads to the job's occurrence
    page.locator("#schedapp-breaches-late a", has_text="timeline").click()
    page.wait_for_url(re.compile(rf"/admin/schedapp/job/{late.pk}/timeline/\?"))

    # When they requeue the dead job from the page
    page.goto(f"{live_server.url}/admin/schedapp/attention/?kind=dead")
    page.locator("form.schedapp-requeue input[type=submit]").click()
    page.wait_for_url(re.compile(r"/admin/schedapp/attention/\?kind=dead$"))
    # Then it is back on schedule (through the API, in the audit trail), no button left
    expect(page.locator("ul.messagelist")).to_contain_text("requeued from the dead letters")
    expect(page.locator("form.schedapp-requeue")).to_have_count(0)
    dead.refresh_from_db()
    assert dead.state == JobState.SCHEDULED


def test_a_backfill_from_the_job_page_and_its_progress_at_1400_pixels(
    live_server, browser, django_user_model
):
    """A job's "Backfill..." form, filled and sent, then the backfills page showing the
    backfill part-way (a step taken as a beat takes it), refreshing itself, and cancelled."""
    import shutil
    from datetime import timedelta

    from django.utils import timezone
    from playwright.sync_api import expect

    from schedapp import api
    from schedapp.db import db_now
    from schedapp.lease import backfill as engine
    from schedapp.models import Backfill, BackfillState

    django_user_model.objects.create_superuser("operator", "op@example.com", "s3cret-pw")
    job = api.schedule(
        "project.tasks.record",
        name="warehouse-hourly-load",
        cron="0 * * * *",
        tags=["warehouse"],
        max_concurrent=50,
    )
    end = db_now().replace(minute=0, second=0, microsecond=0) - timedelta(hours=1)
    start = end - timedelta(hours=47)
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.set_default_timeout(30_000)
    SHOTS_DAILY.mkdir(parents=True, exist_ok=True)
    _login(page, live_server, f"/admin/schedapp/job/{job.pk}/change/")
    page.click("#schedapp-backfill-tool")
    page.fill("#id_start", timezone.localtime(start).strftime("%Y-%m-%d %H:%M:%S"))
    page.fill("#id_end", timezone.localtime(end).strftime("%Y-%m-%d %H:%M:%S"))
    page.fill("#id_max_per_second", "20")
    page.fill("#id_reason", "warehouse outage 2 days")
    page.click("#schedapp-backfill-form input[type=submit]")
    page.wait_for_url(re.compile(r"/admin/schedapp/backfill/\?job="))
    record = Backfill.objects.get()
    assert record.total == 48
    # a beat's step: 20 of the 48 occurrences dispatched
    Backfill.objects.filter(pk=record.pk).update(
        allowance=20, refilled_at=db_now() - timedelta(hours=1)
    )
    engine.advance("beat-1", 100)
    page.reload()
    expect(page.locator("#result_list")).to_contain_text("20 / 48 (42%)")
    assert page.locator("meta[http-equiv=refresh]").count() == 1
    _no_sideways_scroll(page)
    for shown in ("button.schedapp-cancel-backfill", "#result_list progress"):
        box = page.locator(shown).bounding_box()
        assert box is not None and box["x"] + box["width"] <= 1400, (shown, box)
    cell = page.locator("#result_list td.field-progress_col").bounding_box()
    table = page.locator("#changelist .results").bounding_box()
    assert cell["x"] + cell["width"] <= table["x"] + table["width"] + 1, (cell, table)
    page.screenshot(path=str(SHOTS_DAILY / "backfill-1400.png"), full_page=True)
    shutil.copy(SHOTS_DAILY / "backfill-1400.png", ROOT / "docs" / "images" / "admin-backfill.png")
    # (submitted at once: the page reloads itself every few seconds while it runs)
    page.evaluate("document.querySelector('button.schedapp-cancel-backfill').click()")
    expect(page.locator("ul.messagelist")).to_contain_text("cancelled")
    assert Backfill.objects.get().state == BackfillState.CANCELLED
    assert page.locator("meta[http-equiv=refresh]").count() == 0
