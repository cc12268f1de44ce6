"""Tags on jobs: labels that group jobs for the admin's filter, metrics and alert routing,
settable wherever a job's fields are (API, schedule_many, declared jobs, the admin form),
stored lowercased, sorted and once each, refused with the field named when they are not
labels.
"""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.test import Client, override_settings
from django.urls import reverse
from hypothesis import given
from hypothesis import strategies as st

from schedapp import api, declared
from schedapp.fields import with_defaults
from schedapp.models import Job, JobChange
from schedapp.validation import TAG_LENGTH_MAX, TAG_PATTERN, TAGS_MAX, JobValidator, job_defaults
from tests.integration.test_admin import form_data

TASK = "project.tasks.noop"

LABEL = st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9_.:/=-]{0,20}\Z")


def check(tags: object):  # type: ignore[no-untyped-def]
    given = {"task": TASK, "name": "tagged", "interval": 60, "tags": tags}
    values = with_defaults(job_defaults(), given)
    return JobValidator().check(values)


@given(st.lists(st.builds(lambda w, pad: pad + w + pad, LABEL, st.sampled_from(["", " "]))))
def test_labels_are_stored_lowercased_sorted_and_once_each(tags):
    checked = check(tags)
    words = {t.strip().lower() for t in tags}
    if len(words) > TAGS_MAX:
        assert "tags" in checked.errors
        return
    assert not checked.errors, checked.errors
    assert checked.values["tags"] == sorted(words)
    assert all(TAG_PATTERN.fullmatch(t) for t in checked.values["tags"])


@pytest.mark.parametrize(
    "tags, message",
    [
        ("billing", "must be a list of labels, got str."),
        ({"a": 1}, "must be a list of labels, got dict."),
        (["ok", 3], "each must be a string, got int."),
        (["two words"], "'two words' is not a label"),
        (["a,b"], "'a,b' is not a label"),
        (["-lead"], "'-lead' is not a label"),
        ([""], "'' is not a label"),
        (["x" * (TAG_LENGTH_MAX + 1)], "is not a label: 1 to 64"),
        ([f"t{i}" for i in range(TAGS_MAX + 1)], f"at most {TAGS_MAX} labels, got 21."),
    ],
)
def test_what_is_not_a_label_is_refused_naming_the_field(tags, message):
    errors = check(tags).errors
    assert list(errors) == ["tags"]
    assert message in errors["tags"][0]


@pytest.mark.django_db
def test_the_api_stores_tags_and_finds_the_jobs_carrying_one():
    billing = api.schedule(TASK, name="billing-eu", interval=60, tags=["Billing", "team-eu"])
    api.schedule(TASK, name="billing-us", interval=60, tags=["billing", "team-us"])
    api.schedule(TASK, name="untagged", interval=60)
    api.schedule(TASK, name="billing-ops", interval=60, tags=["billing-ops"])

    assert billing.tags == ["billing", "team-eu"]
    assert Job.objects.get(name="untagged").tags == []
    assert sorted(api.tagged("billing").values_list("name", flat=True)) == [
        "billing-eu",
        "billing-us",
    ]
    assert list(api.tagged("TEAM-EU").values_list("name", flat=True)) == ["billing-eu"]
    assert not api.tagged("team").exists()
    # a change of tags is a change like any other: validated, and in the audit trail
    api.update(billing, tags=["billing"], reason="moved to the shared team")
    change = JobChange.objects.filter(job_id=billing.pk).latest("id")
    assert change.changes == {"tags": [["billing", "team-eu"], ["billing"]]}
    with pytest.raises(ValidationError) as exc:
        api.update(billing, tags="billing")
    assert list(exc.value.message_dict) == ["tags"]


@pytest.mark.django_db
def test_schedule_many_refuses_bad_tags_naming_spec_and_field():
    specs = [
        {"task": TASK, "interval": 60, "name": "a", "tags": ["ok"]},
        {"task": TASK, "interval": 60, "name": "b", "tags": ["not ok"]},
    ]
    with pytest.raises(ValidationError) as exc:
        api.schedule_many(specs)
    assert list(exc.value.message_dict) == ["1.tags"]
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_declared_jobs_carry_their_tags():
    jobs = {"nightly": {"task": TASK, "cron": "0 2 * * *", "tags": ["reports", "team-eu"]}}
    with override_settings(SCHEDAPP_JOBS=jobs):
        declared.sync_declared_jobs()
    assert Job.objects.get(name="nightly").tags == ["reports", "team-eu"]
    retagged = {"nightly": {**jobs["nightly"], "tags": ["reports"]}}
    with override_settings(SCHEDAPP_JOBS=retagged):
        report = declared.sync_declared_jobs()
    assert report.updated == {"nightly": ["tags"]}
    assert Job.objects.get(name="nightly").tags == ["reports"]


@pytest.mark.django_db
def test_the_admin_form_takes_tags_as_words_and_the_list_filters_by_tag():
    user = User.objects.create_superuser("tagger", "t@example.com", "pw")
    client = Client()
    client.force_login(user)
    job = api.schedule(TASK, name="tag-me", interval=60)
    api.schedule(TASK, name="other", interval=60, tags=["reports"])
    url = reverse("admin:schedapp_job_change", args=[job.pk])
    data = form_data(
        name="tag-me",
        task=TASK,
        kwargs="{}",
        cron="",
        interval="60",
        timezone="UTC",
        tags="Billing, team-eu  billing",
    )
    response = client.post(url, data)
    assert response.status_code == 302, response.context["adminform"].form.errors
    job.refresh_from_db()
    assert job.tags == ["billing", "team-eu"]
    # the form shows them as typed words again
    assert 'value="billing, team-eu"' in client.get(url).content.decode()
    # a bad one is the field's error
    data["tags"] = "ok, not/ok!"
    response = client.post(url, data)
    assert response.status_code == 200
    assert "tags" in response.context["adminform"].form.errors

    changelist = reverse("admin:schedapp_job_changelist")
    page = client.get(changelist, {"tag": "billing"})
    shown = [j.name for j in page.context["cl"].result_list]
    assert shown == ["tag-me"]
    # a tag in the address in another case finds the same jobs, as api.tagged does
    upper = client.get(changelist, {"tag": "BILLING"})
    assert [j.name for j in upper.context["cl"].result_list] == ["tag-me"]
    choices = [c["display"] for c in page.context["cl"].filter_specs[1].choices(page.context["cl"])]
    assert {"billing", "team-eu", "reports"} <= set(choices)
