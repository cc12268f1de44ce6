"""The audit trail: every path that changes a job records who, from where, when, why and what,
in the change's own transaction; any recorded version can be restored, and the restore is
recorded too.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.test import Client, override_settings
from django.urls import reverse
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedapp import api, audit, declared
from schedapp.admin.history import history_page
from schedapp.importer import from_beat_schedule, import_candidates
from schedapp.models import Job, JobChange, JobState
from tests import examples
from tests.integration.test_admin import form_data

pytestmark = [pytest.mark.django_db]

TASK = "project.tasks.noop"


def trail(job: Job) -> list[tuple[str, str, str, str]]:
    """(action, source, actor, reason) of each record of ``job``, oldest first."""
    return [
        (c.action, c.source, c.actor, c.reason)
        for c in JobChange.objects.filter(job_id=job.pk).order_by("id")
    ]


def admin_client(username: str = "alice") -> Client:
    user = User.objects.create_superuser(username, f"{username}@example.com", "pw")
    client = Client()
    client.force_login(user)
    return client


# --- each path records ------------------------------------------------------------------------


def test_the_api_records_creation_changes_and_operations_with_this_process_as_actor():
    job = api.schedule(TASK, name="nightly", cron="0 2 * * *", reason="ticket 1")
    api.update(job, cron="0 3 * * *", priority=5, reason="later, and first")
    api.pause(job, reason="maintenance")
    api.resume(job)
    api.run_now(job)
    api.cancel(job, reason="retired")

    me = audit.this_process()
    assert trail(job) == [
        ("created", "api", me, "ticket 1"),
        ("updated", "api", me, "later, and first"),
        ("paused", "api", me, "maintenance"),
        ("resumed", "api", me, ""),
        ("run_now", "api", me, ""),
        ("cancelled", "api", me, "retired"),
    ]
    updated = JobChange.objects.get(job_id=job.pk, action="updated")
    assert updated.changes == {"cron": ["0 2 * * *", "0 3 * * *"], "priority": [0, 5]}
    paused = JobChange.objects.get(job_id=job.pk, action="paused")
    assert paused.changes == {"state": ["scheduled", "paused"]}


def test_an_update_that_changes_nothing_records_nothing_and_a_refused_one_leaves_nothing():
    job = api.schedule(TASK, name="same", interval=60, priority=3)
    api.update(job, priority=3)
    with pytest.raises(ValidationError):
        api.update(job, priority="high")
    assert [a for a, *_ in trail(job)] == ["created"]


def test_the_admin_form_records_its_user_and_the_reason_it_asks_for():
    client = admin_client("alice")
    job = api.schedule(TASK, name="edited", interval=60)
    url = reverse("admin:schedapp_job_change", args=[job.pk])
    data = form_data(
        name="edited",
        task=TASK,
        kwargs="{}",
        cron="",
        interval="120",
        timezone="UTC",
        change_reason="load is lower at 2 minutes",
    )
    response = client.post(url, data)
    assert response.status_code == 302, response.context["adminform"].form.errors
    assert trail(job)[-1] == ("updated", "admin", "alice", "load is lower at 2 minutes")
    change = JobChange.objects.filter(job_id=job.pk).latest("id")
    assert change.changes["interval"] == ["00:01:00", "00:02:00"]


def test_admin_actions_and_buttons_record_their_user():
    client = admin_client("bob")
    job = api.schedule(TASK, name="acted-on", interval=60)
    changelist = reverse("admin:schedapp_job_changelist")
    client.post(changelist, {"action": "pause", "_selected_action": [job.pk], "index": 0})
    client.post(reverse("admin:schedapp_job_operation", args=[job.pk, "resume"]))
    assert trail(job)[1:] == [("paused", "admin", "bob", ""), ("resumed", "admin", "bob", "")]


def test_an_admin_delete_records_what_was_deleted():
    client = admin_client("carol")
    job = api.schedule(TASK, name="doomed", cron="*/5 * * * *")
    url = reverse("admin:schedapp_job_delete", args=[job.pk])
    assert client.post(url, {"post": "yes"}).status_code == 302
    assert not Job.objects.filter(pk=job.pk).exists()
    deleted = JobChange.objects.get(job_id=job.pk, action="deleted")
    assert (deleted.actor, deleted.source, deleted.job_name) == ("carol", "admin", "doomed")
    assert deleted.changes["cron"] == ["*/5 * * * *", None]


def test_declared_sync_records_as_declared():
    jobs = {"declared-nightly": {"task": TASK, "cron": "0 2 * * *"}}
    with override_settings(SCHEDAPP_JOBS=jobs):
        declared.sync_declared_jobs()
    changed = {"declared-nightly": {"task": TASK, "cron": "0 4 * * *"}}
    with override_settings(SCHEDAPP_JOBS=changed):
        declared.sync_declared_jobs()
    job = Job.objects.get(name="declared-nightly")
    assert [(a, s) for a, s, _who, _why in trail(job)] == [
        ("created", "declared"),
        ("updated", "declared"),
    ]
    assert JobChange.objects.filter(job_id=job.pk).latest("id").changes["cron"] == [
        "0 2 * * *",
        "0 4 * * *",
    ]


def test_the_importer_records_as_imported():
    candidates = from_beat_schedule({"imported-every-minute": {"task": TASK, "schedule": 60.0}})
    report = import_candidates(candidates)
    assert report.created == ["imported-every-minute"]
    job = Job.objects.get(name="imported-every-minute")
    assert [(a, s) for a, s, _who, _why in trail(job)] == [("created", "imported")]


def test_schedule_many_records_each_created_job_as_bulk_and_nothing_when_it_refuses():
    specs = [{"task": TASK, "name": f"many-{i}", "interval": 60} for i in range(25)]
    with audit.acting(reason="backfill of tenants"):
        assert api.schedule_many(specs, chunk_size=10) == 25
    records = JobChange.objects.filter(job_name__startswith="many-")
    assert records.count() == 25
    assert set(records.values_list("action", "source", "reason")) == {
        ("created", "bulk", "backfill of tenants")
    }
    assert set(records.values_list("job_id", flat=True)) == set(
        Job.objects.filter(name__startswith="many-").values_list("id", flat=True)
    )
    # A refused lot writes neither jobs nor records
    with pytest.raises(ValidationError):
        api.schedule_many([{"task": TASK, "name": "ok-1", "interval": 60}, {"task": TASK}])
    assert not JobChange.objects.filter(job_name="ok-1").exists()


@override_settings(SCHEDAPP_AUDIT=False)
def test_the_trail_can_be_turned_off():
    job = api.schedule(TASK, name="unaudited", interval=60)
    api.update(job, interval=120)
    api.schedule_many([{"task": TASK, "name": "unaudited-bulk", "interval": 60}])
    assert not JobChange.objects.exists()


# --- restore ----------------------------------------------------------------------------------


def test_restore_puts_a_version_back_through_the_api_and_is_recorded():
    job = api.schedule(TASK, name="restored", cron="0 2 * * *", timezone="Europe/Paris")
    api.update(job, cron="0 3 * * *", max_retries=5)
    api.update(job, interval=300, reason="interval now")
    first = JobChange.objects.get(job_id=job.pk, action="created")

    job = api.restore(job, first, reason="back to 02:00")

    assert (job.cron, job.interval, job.max_retries) == ("0 2 * * *", None, 3)
    assert job.state == JobState.SCHEDULED
    restore = JobChange.objects.filter(job_id=job.pk).latest("id")
    assert (restore.action, restore.reason) == ("restored", "back to 02:00")
    assert restore.changes["cron"] == ["", "0 2 * * *"]
    assert restore.changes["interval"] == ["00:05:00", None]
    # and the version before the restore can be restored in turn
    before = JobChange.objects.get(job_id=job.pk, reason="interval now")
    job = api.restore(job, before)
    assert (job.cron, job.interval) == ("", timedelta(seconds=300))


def test_restore_refuses_a_record_of_another_job():
    one = api.schedule(TASK, name="one", interval=60)
    other = api.schedule(TASK, name="other", interval=60)
    with pytest.raises(ValidationError) as exc:
        api.restore(one, JobChange.objects.get(job_id=other.pk))
    assert "change" in exc.value.message_dict


OPTIONS = st.fixed_dictionaries(
    {},
    optional={
        "priority": st.integers(0, 9),
        "max_retries": st.integers(0, 5),
        "description": st.text(
            st.characters(exclude_characters="\x00", exclude_categories=("Cs",)), max_size=20
        ),
        "kwargs": st.dictionaries(st.sampled_from("abc"), st.integers(-3, 3), max_size=2),
        "cron": st.sampled_from(["0 2 * * *", "*/5 * * * *", "30 8 * * 1-5"]),
        "interval": st.sampled_from([60, 90, 3600]),
        "timezone": st.sampled_from(["UTC", "Europe/Paris", "America/New_York"]),
        "misfire_grace": st.sampled_from([30, 300]),
    },
)


@settings(
    max_examples=examples(60),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(st.lists(OPTIONS, min_size=1, max_size=5))
def test_each_recorded_version_reads_back_as_the_job_was_right_after_it(updates):
    Job.objects.filter(name="versioned").delete()
    job = api.schedule(TASK, name="versioned", interval=60)
    seen = {JobChange.objects.filter(job_id=job.pk).latest("id").pk: audit.snapshot(job)}
    for changes in updates:
        if "cron" in changes and "interval" in changes:
            changes = {k: v for k, v in changes.items() if k != "interval"}
        job = api.update(job, **changes)
        latest = JobChange.objects.filter(job_id=job.pk).latest("id")
        seen[latest.pk] = audit.snapshot(job)
    for record in JobChange.objects.filter(job_id=job.pk):
        assert audit.snapshot(Job(**audit.version_values(record))) == seen[record.pk]


# --- the admin's history page -----------------------------------------------------------------


def test_the_history_page_shows_diffs_fire_times_and_restores():
    client = admin_client("dave")
    job = api.schedule(TASK, name="paged", cron="0 2 * * *", timezone="Europe/Paris")
    api.update(job, cron="0 6 * * *", reason="later")
    url = reverse("admin:schedapp_job_history", args=[job.pk])

    page = client.get(url)
    assert page.status_code == 200
    body = page.content.decode()
    assert "later" in body and "0 2 * * *" in body and "0 6 * * *" in body
    assert "next fire times before" in body and "06:00" in body and "02:00" in body

    created = JobChange.objects.get(job_id=job.pk, action="created")
    restore = reverse("admin:schedapp_job_restore", args=[job.pk, created.pk])
    assert client.post(restore, {"reason": "too late"}).status_code == 302
    job.refresh_from_db()
    assert job.cron == "0 2 * * *"
    assert trail(job)[-1] == ("restored", "admin", "dave", "too late")
    entries = history_page(job).entries
    assert [e.record.action for e in entries] == ["restored", "updated", "created"]
    assert not entries[0].restorable and entries[1].restorable


def test_restoring_needs_the_change_permission_and_a_post():
    job = api.schedule(TASK, name="guarded", interval=60)
    api.update(job, interval=120)
    created = JobChange.objects.get(job_id=job.pk, action="created")
    restore = reverse("admin:schedapp_job_restore", args=[job.pk, created.pk])
    assert admin_client("erin").get(restore).status_code == 405
    viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
    client = Client()
    client.force_login(viewer)
    assert client.post(restore).status_code == 403
    job.refresh_from_db()
    assert job.interval == timedelta(seconds=120)
