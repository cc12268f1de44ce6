"""Saving the job page changes only what the operator changed: the date-times it shows (to the
second, in the job's zone) are kept as stored when left alone, so an unrelated edit never
reschedules the job; and a wall time the zone skips is refused."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser

import pytest
from django.test import override_settings
from django.urls import reverse

from schedapp import api, lease
from schedapp.db import db_now
from schedapp.lease import DoorVerdict, admit_run, claim_due_jobs, complete_run
from schedapp.models import Job, JobState
from tests.integration.test_admin import form_data

pytestmark = [pytest.mark.django_db]


class _JobForm(HTMLParser):
    """The fields of the job form as a browser posts them: inputs, ticked boxes, textareas and
    the selected option of each select."""

    def __init__(self) -> None:
        super().__init__()
        self.data: dict[str, str] = {}
        self._in_form = False
        self._textarea: str | None = None
        self._select: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "form":
            self._in_form = a.get("id") == "job_form"
        if not self._in_form or tag not in ("input", "textarea", "select", "option"):
            return
        name = a.get("name", "")
        if tag == "input" and name and a.get("type") != "submit":
            box = a.get("type") in ("checkbox", "radio")
            if box and "checked" not in a:
                return
            self.data[name] = a.get("value", "on" if box else "")
        elif tag == "textarea":
            self._textarea = name
            self.data[name] = ""
        elif tag == "select":
            self._select = name
        elif tag == "option" and self._select:
            if self._select not in self.data or "selected" in a:
                self.data[self._select] = a.get("value", "")

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self._in_form = False
        elif tag == "textarea" and self._textarea:
            # HTML drops the newline that starts a textarea's content (Django writes one)
            self.data[self._textarea] = self.data[self._textarea].removeprefix("\n")
            self._textarea = None
        elif tag == "select":
            self._select = None

    def handle_data(self, data: str) -> None:
        if self._textarea:
            self.data[self._textarea] += data


def change_url(job: Job) -> str:
    return reverse("admin:schedapp_job_change", args=[job.pk])


def as_shown(admin_client, job: Job) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """What "Save" posts when the operator opens the job page and changes nothing."""
    parser = _JobForm()
    parser.feed(admin_client.get(change_url(job)).content.decode())
    assert "run_at_0" in parser.data and "priority" in parser.data, parser.data
    return parser.data


def save(admin_client, job: Job, **changes: str) -> None:  # type: ignore[no-untyped-def]
    response = admin_client.post(change_url(job), {**as_shown(admin_client, job), **changes})
    form = response.context["adminform"].form if response.context else None
    assert response.status_code == 302, form.errors if form else response.status_code


def refused_on(response, field: str) -> list[str]:  # type: ignore[no-untyped-def]
    """The messages of a form that was refused with errors on ``field`` alone."""
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert list(errors) == [field], errors
    return errors[field]


def test_editing_a_running_one_off_does_not_run_it_again(admin_client):
    # Given a one-off due a second ago (its run_at has microseconds), claimed and started
    when = db_now().replace(microsecond=123456) - timedelta(seconds=1)
    job = api.schedule("project.tasks.record", run_at=when, name="once")
    (run,) = claim_due_jobs("beat-1", 10).runs
    assert admit_run(job.pk, run.token, "w1", admission="w1-1") is DoorVerdict.ADMITTED

    # When the operator changes only its priority while it runs, and the run then succeeds
    save(admin_client, job, priority="5")
    assert complete_run(job.pk, run.token, lease.SUCCEEDED).applied

    # Then the job is done, its run_at exactly as it was: it will not run again
    job.refresh_from_db()
    assert (job.priority, job.state, job.run_at, job.next_run_at) == (
        5,
        JobState.SUCCEEDED,
        when,
        None,
    )


def test_changing_only_the_queue_keeps_an_interval_jobs_phase_and_next_run(admin_client):
    # Given an interval job from the API: its anchor is the instant it was created
    job = api.schedule("project.tasks.record", interval=300, name="every-5-min")
    before = Job.objects.get(pk=job.pk)
    assert before.interval_anchor.microsecond  # what the form cannot show

    # When only its queue changes in the admin
    save(admin_client, job, queue="slow")

    # Then its occurrences stay where they were
    after = Job.objects.get(pk=job.pk)
    assert after.queue == "slow"
    assert (after.interval_anchor, after.scheduled_for, after.next_run_at) == (
        before.interval_anchor,
        before.scheduled_for,
        before.next_run_at,
    )


@pytest.mark.parametrize("server_zone", ["UTC", "Europe/Paris"])
def test_an_unchanged_ambiguous_run_at_is_kept(admin_client, server_zone):
    # Given a one-off at 02:30 Paris time the second time the clocks show it (02:30+01:00)
    when = datetime(2026, 10, 25, 1, 30, tzinfo=UTC)
    job = api.schedule(
        "project.tasks.record", run_at=when, timezone="Europe/Paris", name="fall-back"
    )

    # When only its priority changes (the server's own zone has no say in the job's times)
    with override_settings(TIME_ZONE=server_zone):
        save(admin_client, job, priority="5")

    # Then it still runs at the second 02:30
    job.refresh_from_db()
    assert (job.priority, job.run_at, job.next_run_at) == (5, when, when)


def test_a_run_at_the_zone_skips_is_refused_on_its_field(admin_client):
    # Given a one-off in Paris
    job = api.schedule(
        "project.tasks.record",
        run_at=datetime(2027, 3, 1, 9, 0, tzinfo=UTC),
        timezone="Europe/Paris",
        name="spring-forward",
    )
    # When the operator moves it to 02:30 on the night the clocks jump from 02:00 to 03:00
    data = {**as_shown(admin_client, job), "run_at_0": "2027-03-28", "run_at_1": "02:30:00"}
    response = admin_client.post(change_url(job), data)

    # Then the form says why, on run_at, and the job is unchanged
    messages = refused_on(response, "run_at")
    assert "does not exist in Europe/Paris" in messages[0]
    assert Job.objects.get(pk=job.pk).run_at == datetime(2027, 3, 1, 9, 0, tzinfo=UTC)
    # ... as does the preview while it is typed
    preview = admin_client.get(
        reverse("admin:schedapp_job_preview"),
        {"run_at_0": "2027-03-28", "run_at_1": "02:30:00", "timezone": "Europe/Paris"},
    ).json()
    assert preview["errors"]["run_at"] == messages


@pytest.mark.parametrize(
    ("day", "clock", "zone"),
    [("0001-01-01", "00:00:00", "Asia/Tokyo"), ("9999-12-31", "23:59:59", "America/New_York")],
)
def test_a_run_at_beyond_the_supported_range_is_refused(admin_client, day, clock, zone):
    # When the operator adds a one-off at the very first or last second datetime holds
    data = {"cron": "", "run_at_0": day, "run_at_1": clock, "timezone": zone}
    response = admin_client.post(reverse("admin:schedapp_job_add"), form_data(**data))

    # Then the form says so on run_at, and nothing is written
    messages = refused_on(response, "run_at")
    assert "out of the supported range" in messages[0]
    assert not Job.objects.exists()
    # ... as does the preview while it is typed
    preview = admin_client.get(
        reverse("admin:schedapp_job_preview"),
        {"run_at_0": day, "run_at_1": clock, "timezone": zone},
    )
    assert preview.status_code == 200
    assert preview.json()["errors"]["run_at"] == messages


@pytest.mark.parametrize("field", ["interval_anchor", "not_before", "expires_at"])
def test_the_other_date_times_beyond_the_range_are_refused_on_their_field(admin_client, field):
    data = {
        "cron": "",
        "interval": "60",
        f"{field}_0": "0001-01-01",
        f"{field}_1": "00:00:00",
        "timezone": "Asia/Tokyo",
    }
    response = admin_client.post(reverse("admin:schedapp_job_add"), form_data(**data))
    assert "out of the supported range" in refused_on(response, field)[0]
    assert not Job.objects.exists()


def test_a_changed_ambiguous_run_at_means_its_first_reading(admin_client):
    # Given a one-off in Paris
    job = api.schedule(
        "project.tasks.record",
        run_at=datetime(2026, 10, 1, 9, 0, tzinfo=UTC),
        timezone="Europe/Paris",
        name="fall-back",
    )
    # When the operator moves it to 02:30 on the night that hour happens twice
    save(admin_client, job, run_at_0="2026-10-25", run_at_1="02:30:00")

    # Then it runs at the first 02:30 (summer time), as a cron job at 02:30 would
    job.refresh_from_db()
    assert job.run_at == datetime(2026, 10, 25, 0, 30, tzinfo=UTC)
