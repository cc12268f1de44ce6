"""The admin against real processes.

* A fresh server lists the registered tasks in the job form from its first page load (Celery
  discovers the project's ``tasks.py`` modules lazily: read before discovery, the list was
  empty until something else imported them).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.fleet import ROOT

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
