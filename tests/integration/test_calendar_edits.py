"""A calendar edited after jobs follow it (issue 31): their next runs follow the new
definition at once, not only from the run after. Expected runs come from the oracle of
test_job_calendars (a business day is a weekday that is not a holiday)."""

from __future__ import annotations

import threading
from datetime import date, timedelta

import pytest
from django.db import transaction
from django.db.models.functions import Now

from schedapp import api, calendar_edits
from schedapp.db import db_now
from schedapp.models import Calendar, Job, JobState, Occurrence
from tests.integration.test_job_calendars import next_business_nine, payroll
from tests.rowlocks import other_connection

pytestmark = [pytest.mark.django_db]


def office(holidays: list[date]) -> dict:
    weekends = {"weekdays": ["sat", "sun"]}
    if not holidays:
        return {"union": [weekends]}
    return {"union": [weekends, {"dates": [d.isoformat() for d in holidays]}]}


def edit(captured, holidays: list[date]) -> None:
    with captured(execute=True):
        api.save_calendar("office", office(holidays))


def test_an_edit_that_makes_the_next_run_a_holiday_moves_it(django_capture_on_commit_callbacks):
    api.save_calendar("office", office([]))
    job = payroll(calendar_roll="skip")
    old = job.scheduled_for
    assert old == next_business_nine(db_now(), [])
    edit(django_capture_on_commit_callbacks, [old.date()])
    job.refresh_from_db()
    assert job.scheduled_for == next_business_nine(db_now(), [old.date()])
    assert job.scheduled_for > old and job.next_run_at == job.scheduled_for
    (record,) = Occurrence.objects.filter(job=job, decided_by="calendar office edited")
    assert (record.scheduled_for, record.fate) == (old, "excluded")


def test_an_edit_that_frees_a_day_brings_the_run_forward_and_a_referring_calendar_follows(
    django_capture_on_commit_callbacks,
):
    first = next_business_nine(db_now(), []).date()
    api.save_calendar("office", office([first]))
    api.save_calendar("group", {"calendar": "office"})
    direct = payroll(calendar_roll="skip")
    through = payroll(name="through", calendar="group", calendar_roll="skip")
    assert direct.scheduled_for.date() != first and through.scheduled_for.date() != first
    edit(django_capture_on_commit_callbacks, [])
    for job in (direct, through):
        job.refresh_from_db()
        assert job.scheduled_for == next_business_nine(db_now(), [])


def test_a_run_in_flight_a_retry_and_a_paused_job_are_left_alone(
    django_capture_on_commit_callbacks,
):
    api.save_calendar("office", office([]))
    running = payroll(name="running", calendar_roll="skip")
    retrying = payroll(name="retrying", calendar_roll="skip")
    paused = payroll(name="paused", calendar_roll="skip")
    old = running.scheduled_for
    Job.objects.filter(pk=running.pk).update(
        state=JobState.RUNNING,
        claimed_by="beat-1",
        lease_expires_at=db_now() + timedelta(hours=1),
        token=1,
    )
    Job.objects.filter(pk=retrying.pk).update(retry_count=1)
    Job.objects.filter(pk=paused.pk).update(state=JobState.PAUSED)
    edit(django_capture_on_commit_callbacks, [old.date()])
    for job in (running, retrying, paused):
        job.refresh_from_db()
        assert job.scheduled_for == old


def test_an_edit_rolled_back_moves_nothing(django_capture_on_commit_callbacks):
    api.save_calendar("office", office([]))
    job = payroll(calendar_roll="skip")
    old = job.scheduled_for
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        try:
            with transaction.atomic():
                api.save_calendar("office", office([old.date()]))
                raise RuntimeError
        except RuntimeError:
            pass
    assert callbacks == []
    job.refresh_from_db()
    assert job.scheduled_for == old


def test_an_unchanged_definition_moves_nothing(django_capture_on_commit_callbacks):
    api.save_calendar("office", office([]))
    payroll(calendar_roll="skip")
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        api.save_calendar("office", office([]), description="same days")
    assert callbacks == []


@pytest.mark.django_db(transaction=True)
def test_a_job_locked_by_a_claim_is_retried_in_batches_and_the_rest_are_not_held():
    api.save_calendar("office", office([]))
    jobs = [payroll(name=f"p{i}", calendar_roll="skip") for i in range(7)]
    old = jobs[0].scheduled_for
    api.save_calendar("office", office([old.date()]))  # autocommit: recomputed already
    for job in jobs:
        job.refresh_from_db()
        assert job.scheduled_for > old
    api.save_calendar("office", office([]))
    for job in jobs:
        job.refresh_from_db()
        assert job.scheduled_for == old
    # A claim holds one job's row while the edit runs: the others move in batches of 3; the
    # held one is retried and moves once the lock is gone.
    held = jobs[3]
    with other_connection() as other:
        other.execute("select id from schedapp_job where id = %s for update", [held.pk])
        Calendar.objects.filter(name="office").update(
            definition=office([old.date()]), updated_at=Now()
        )
        release = threading.Timer(0.5, other.rollback)
        release.start()
        try:
            done = calendar_edits.recompute_following(
                held.calendar_id,
                "office",
                batch_size=3,
                retries=20,
                pause=timedelta(milliseconds=100),
            )
        finally:
            release.join()
    assert (done.moved, done.busy, done.unschedulable) == (7, (), ())
    for job in jobs:
        job.refresh_from_db()
        assert job.scheduled_for == next_business_nine(db_now(), [old.date()])


@pytest.mark.django_db(transaction=True)
def test_a_job_locked_past_every_retry_is_reported_busy_and_keeps_its_run():
    api.save_calendar("office", office([]))
    jobs = [payroll(name=f"p{i}", calendar_roll="skip") for i in range(3)]
    old = jobs[0].scheduled_for
    with other_connection() as other:
        other.execute("select id from schedapp_job where id = %s for update", [jobs[1].pk])
        Calendar.objects.filter(name="office").update(
            definition=office([old.date()]), updated_at=Now()
        )
        done = calendar_edits.recompute_following(
            jobs[0].calendar_id, "office", retries=1, pause=timedelta(milliseconds=10)
        )
    assert (done.moved, done.busy) == (2, (jobs[1].pk,))
    jobs[1].refresh_from_db()
    assert jobs[1].scheduled_for == old


def test_an_edit_in_the_admin_or_by_a_declared_sync_moves_the_run(
    admin_client, django_capture_on_commit_callbacks
):
    import json

    from django.urls import reverse

    from schedapp import declared

    declared.sync_declared_calendars({"office": office([])})
    job = payroll(calendar_roll="skip")
    old = job.scheduled_for
    office_row = Calendar.objects.get(name="office")
    with django_capture_on_commit_callbacks(execute=True):
        response = admin_client.post(
            reverse("admin:schedapp_calendar_change", args=[office_row.pk]),
            {"name": "office", "description": "", "definition": json.dumps(office([old.date()]))},
        )
    assert response.status_code == 302
    job.refresh_from_db()
    moved = job.scheduled_for
    assert moved == next_business_nine(db_now(), [old.date()])
    with django_capture_on_commit_callbacks(execute=True):
        report = declared.sync_declared_calendars({"office": office([old.date(), moved.date()])})
    assert report.updated == ["office"]
    job.refresh_from_db()
    assert job.scheduled_for == next_business_nine(db_now(), [old.date(), moved.date()])


def test_a_job_the_edit_leaves_no_run_is_quarantined_with_the_reason(
    django_capture_on_commit_callbacks,
):
    today = db_now().date()
    window = [today + timedelta(days=d) for d in range(1, 4)]
    api.save_calendar("window", {"dates": [d.isoformat() for d in window]})
    job = payroll(calendar="window", calendar_mode="only", calendar_roll="skip")
    with django_capture_on_commit_callbacks(execute=True):
        api.save_calendar("window", {"dates": [(today - timedelta(days=30)).isoformat()]})
    job.refresh_from_db()
    assert job.state == JobState.DEAD and job.last_status == "quarantined"
    assert "calendar 'window' edited" in job.last_error


@pytest.mark.django_db(transaction=True)
def test_a_run_brought_forward_wakes_a_beat_sleeping_until_the_old_one():
    from schedapp.store import get_store

    first = next_business_nine(db_now(), []).date()
    api.save_calendar("office", office([first]))
    job = payroll(calendar_roll="skip")
    listener = get_store().listen()
    assert listener is not None
    try:
        # a beat sleeping until the job's run, waking for nothing due later
        wake_at = job.scheduled_for.timestamp()
        while listener.wait(0.1, wake_at_db=wake_at):
            pass  # what the setup itself notified
        api.save_calendar("office", office([]))  # autocommit: the run moves forward now
        assert listener.wait(5.0, wake_at_db=wake_at) is True
    finally:
        listener.close()
    job.refresh_from_db()
    assert job.scheduled_for.date() == first


def test_a_row_written_behind_the_apis_back_is_quarantined_and_the_others_move(
    django_capture_on_commit_callbacks,
):
    api.save_calendar("office", office([]))
    bad = payroll(name="bad", calendar_roll="skip")
    good = payroll(name="good", calendar_roll="skip")
    old = good.scheduled_for
    Job.objects.filter(pk=bad.pk).update(cron="61 9 * * *")
    edit(django_capture_on_commit_callbacks, [old.date()])
    bad.refresh_from_db()
    good.refresh_from_db()
    assert bad.state == JobState.DEAD and "calendar 'office' edited" in bad.last_error
    assert good.scheduled_for == next_business_nine(db_now(), [old.date()])
