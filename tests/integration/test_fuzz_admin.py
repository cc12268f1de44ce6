"""Hostile input to the admin's job form: a form error or a saved job, never a 500 and never a
half-written row."""

from __future__ import annotations

import json
import string

import pytest
from django.urls import reverse
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedapp.models import Job
from tests import examples
from tests.integration.test_admin import ADD, form_data

pytestmark = pytest.mark.django_db

FUZZ = settings(
    max_examples=examples(120),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
text = st.one_of(
    st.text(max_size=80),
    st.text(alphabet=string.printable, max_size=30),
    st.sampled_from(
        [
            "",
            " ",
            "\x00",
            "null",
            "[]",
            "{}",
            "[1,",
            "1e999",
            "-1",
            "99999999999999999999",
            "NaN",
            "../../",
            "<script>",
            "é",
        ]
    ),
)
json_text = st.one_of(
    text,
    st.recursive(
        st.one_of(st.none(), st.integers(), st.text(max_size=10), st.floats()),
        lambda inner: st.one_of(
            st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
        ),
        max_leaves=20,
    ).map(json.dumps),
)
fields = {
    "name": text,
    "task": st.one_of(
        text,
        st.sampled_from(
            ["project.tasks.record", "celery.backend_cleanup", "os.system", "project.tasks.nope"]
        ),
    ),
    "args": json_text,
    "kwargs": json_text,
    "cron": st.one_of(text, st.sampled_from(["*/5 * * * *", "0 0 30 2 *", "* * * * * * *"])),
    "interval": text,
    "run_at_0": text,
    "run_at_1": text,
    "timezone": st.one_of(text, st.sampled_from(["UTC", "Mars/Base", "Europe/Paris"])),
    "priority": text,
    "queue": text,
    "lease_seconds": text,
    "jitter": text,
    "max_retries": text,
    "retry_backoff": text,
    "retry_backoff_max": text,
    "misfire_policy": st.one_of(text, st.sampled_from(["skip", "run_all"])),
    "when_retries_exhausted": st.one_of(text, st.sampled_from(["dead", "next_occurrence"])),
    "misfire_grace": text,
    "misfire_max_catchup": text,
    "catchup_window": st.one_of(text, st.sampled_from(["00:00:30", "01:00:00", "366 00:00:00"])),
    "overlap": st.one_of(text, st.sampled_from(["skip", "buffer_all"])),
    "max_buffer": st.one_of(text, st.sampled_from(["0", "1", "100001"])),
    "max_concurrent": st.one_of(text, st.sampled_from(["0", "1", "1001"])),
    "fixed_delay": st.one_of(text, st.sampled_from(["on", ""])),
}


@pytest.mark.exhaustive  # 5 s; the form's rules are the API's, which the default run tests
@FUZZ
@given(changes=st.fixed_dictionaries({}, optional=fields))
def test_the_add_form_never_crashes_or_half_writes(admin_client, changes):
    before = Job.objects.count()
    data = form_data(**changes)
    data["name"] = data["name"] if "name" in changes else f"fuzz-{before}"
    response = admin_client.post(reverse(ADD), data)
    assert response.status_code in (200, 302), response.status_code
    if response.status_code == 200:  # redisplayed with errors
        assert response.context["adminform"].form.errors
        assert Job.objects.count() == before
    else:
        assert Job.objects.count() == before + 1
