"""An operator's whole path through the admin, in headless Chromium, against real processes.

Log in, create a cron job in the form, see the preview of its next fire times, save it, press
"Run now", and watch the run succeed on the runs page: executed by a real ``celery worker``,
dispatched by a real ``celery beat``, both on the test database and Redis.

Needs Debian's ``chromium`` (``apt-get install -y chromium``) and Python's ``playwright``
(never ``playwright install``: the system browser is used). Skipped only when
/usr/bin/chromium is missing.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from project.models import Execution
from schedapp.models import Job, JobRun, JobSource

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

    # Then the preview shows the next five fire times, at 03:00 Paris time
    page.click("#schedapp-preview-button")
    items = page.locator("#schedapp-preview-list li")
    expect(items).to_have_count(5)
    expect(items.last).to_contain_text(re.compile(r"03:00:00 CES?T"))  # the zone as typed
    for text in items.all_inner_texts():
        assert re.search(r"03:00:00 CES?T \(UTC\+0[12]:00\)", text), text

    # ... and a bad cron shows the API's message instead
    page.fill("#id_cron", "0 25 * * *")
    page.click("#schedapp-preview-button")
    expect(page.locator("#schedapp-preview-error")).to_contain_text("cron:")
    expect(items).to_have_count(0)
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
