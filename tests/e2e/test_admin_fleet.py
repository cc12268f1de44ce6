"""The admin against real processes: a freshly started web process, and a real worker.

* A fresh server lists the registered tasks in the job form from its first page load (Celery
  discovers the project's ``tasks.py`` modules lazily: read before discovery, the list was
  empty until something else imported them).
* The overview flags a queue that jobs target but that no live worker consumes from, as the
  workers record their queues in their node row.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time

import pytest
from django.core.management import call_command
from django.urls import reverse

from schedapp import api
from schedapp.models import Node
from tests import ROOT

pytestmark = [pytest.mark.e2e]

# A fresh web process: Django set up as a WSGI server would be, then one request to the job
# form, as an operator's first page load after a deploy. Nothing imported the tasks before.
FIRST_PAGE_LOAD = """
import json, sys
import django
django.setup()
from django.contrib.auth import get_user_model
from django.test import Client
from django.test.utils import setup_test_environment
setup_test_environment()
already = [m for m in sys.modules if m == "project.tasks"]
client = Client()
client.force_login(get_user_model().objects.get(username="operator"))
page = client.get("/admin/schedapp/job/add/").content.decode()
start = page.find('<datalist id="schedapp-tasks">')
end = page.find("</datalist>", start)
print(json.dumps({"imported_before": already, "datalist": page[start:end] if start >= 0 else ""}))
"""


def test_a_fresh_server_suggests_the_registered_tasks_on_its_first_page_load(
    fleet, django_user_model
):
    # Given an operator, and a web process that has just started
    django_user_model.objects.create_superuser("operator", "op@example.com", "s3cret-pw")
    result = subprocess.run(
        [sys.executable, "-c", FIRST_PAGE_LOAD],
        env=fleet.env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    # (nothing had imported the project's tasks before the page: the case being tested)
    assert seen["imported_before"] == []
    # When the job form is loaded the first time, Then its task suggestions list the tasks
    assert '<option value="project.tasks.record">' in seen["datalist"], seen


def wait_for(predicate, timeout: float = 60.0, what: str = ""):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def test_the_overview_flags_a_queue_no_live_worker_consumes_from(fleet, admin_client):
    # Given a real worker consuming queue "alpha" only
    fleet.worker(concurrency=1, extra_args=["-Q", "alpha"])
    wait_for(
        lambda: Node.objects.filter(kind=Node.Kind.WORKER, stats__queues=["alpha"]).exists(),
        what="the worker to record its queues",
    )
    # ... a job on "alpha" and a job on "bravo"
    api.schedule("project.tasks.record", cron="0 3 * * *", name="on-alpha", queue="alpha")
    api.schedule("project.tasks.record", cron="0 3 * * *", name="on-bravo", queue="bravo")

    # When the operator opens the overview
    page = admin_client.get(reverse("admin:schedapp_job_overview")).content.decode()

    # Then "bravo" is flagged as consumed by no live worker, and "alpha" is not
    start = page.index('id="schedapp-unconsumed"')
    flagged = page[start : page.index("</div>", start)]
    assert "bravo" in flagged and "alpha" not in flagged, flagged
    assert "alpha" in page  # the worker's queues are shown beside it
    # ... and the status command says the same
    out = io.StringIO()
    call_command("schedapp_status", stdout=out)
    unconsumed = out.getvalue().split("Queues no live worker consumes from:")[1]
    assert "bravo  1 jobs (project.tasks.record)" in unconsumed
    assert "alpha" not in unconsumed


def test_a_worker_killed_and_started_again_under_its_name_shows_the_new_process(
    fleet, admin_client
):
    """Issue 29 item 8: the node row of a worker restarted under the same name (``-n
    revived@%h``) kept the dead process's pid and start on the Nodes page, the overview and
    ``schedapp_status``."""
    from schedapp.testing.processes import start_worker

    def worker() -> object:
        proc = start_worker(
            "revived",
            fleet._env(None, "revived"),
            fleet.tmp_path,
            app=fleet.app,
            cwd=fleet.cwd,
            concurrency=1,
            heartbeat=1,
        )
        fleet.procs.append(proc)
        proc.wait_for(" ready.", timeout=90)
        return proc

    # Given a worker named revived@host that recorded itself
    first = worker()
    row = wait_for(
        lambda: Node.objects.filter(name__startswith="revived@", pid=first.pid).first(),
        what="its node row",
    )

    # When it is killed (no warm shutdown: its row stays) and started again under its name
    first.kill()
    second = worker()

    # Then its row is the new process's: its pid, a later start; the nodes page says so
    wait_for(
        lambda: Node.objects.filter(pk=row.pk, pid=second.pid).exists(),
        what="the new process's pid in the row",
    )
    again = Node.objects.get(pk=row.pk)
    assert again.started_at > row.started_at, (row.started_at, again.started_at)
    html = admin_client.get(reverse("admin:schedapp_node_changelist")).content.decode()
    assert f">{second.pid}<" in html and f">{first.pid}<" not in html


def test_a_real_beats_banner_names_the_id_it_works_under_and_its_longest_sleep(fleet):
    """Issue 29 item 8: ``celery beat``'s banner showed another id than the beat's, and a
    maxinterval of 300 s for a beat that sleeps at most 5 s."""
    import re

    # Given a real celery beat, started as an operator starts one
    beat = fleet.beat()

    # Then its banner names the id it starts, records itself and claims under
    log = beat.log()
    banner = re.search(r"schedapp beat (\S+): jobs in the database", log)
    started = re.search(r"beat (\S+) started: schedapp\.beat:LeaseScheduler", log)
    assert banner and started, log[-3000:]
    assert banner.group(1) == started.group(1), (banner.group(0), started.group(0))
    wait_for(lambda: Node.objects.filter(name=banner.group(1)).exists(), what="its node row")
    # ... and the longest it sleeps without looking
    assert re.search(r"maxinterval -> 5\.00 seconds", log), log[:1500]
