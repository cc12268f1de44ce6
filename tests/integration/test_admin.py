"""The jobs changelist and the job form, through Django's test client.

Given/When/Then in comments; every assertion reads what an operator sees (HTML) or what the
database holds afterwards.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.core.exceptions import ValidationError
from django.test import override_settings
from django.urls import reverse

from schedapp import api
from schedapp.admin.forms import preview_for
from schedapp.db import db_now
from schedapp.fields import JOB_FIELDS
from schedapp.models import Calendar, Job, JobSource, JobState, field_default
from schedapp.schedules import fire_times, parse_cron

pytestmark = [pytest.mark.django_db]

CHANGELIST = "admin:schedapp_job_changelist"
ADD = "admin:schedapp_job_add"


def change_url(job: Job) -> str:
    return reverse("admin:schedapp_job_change", args=[job.pk])


def form_data(**overrides: object) -> dict[str, object]:
    """A complete, valid add/change form post, as the browser sends it."""
    data: dict[str, object] = {
        "name": "nightly-report",
        "task": "project.tasks.record",
        "args": "[]",
        "kwargs": '{"label": "nightly"}',
        "cron": "0 0 * * 1-5",
        "interval": "",
        "run_at_0": "",
        "run_at_1": "",
        "timezone": "Europe/Paris",
        "priority": "0",
        "queue": "",
        "lease_seconds": "60",
        "jitter": "0",
        "max_retries": "3",
        "retry_backoff": "00:00:10",
        "retry_backoff_max": "01:00:00",
        "misfire_policy": "run_once",
        "when_retries_exhausted": "dead",
        "misfire_grace": "00:01:00",
        "misfire_max_catchup": "100",
        "catchup_window": "",
        "overlap": "buffer_one",
        "max_buffer": "100",
        "max_concurrent": "10",
    }
    data.update(overrides)
    return data


def api_error(**spec: object) -> dict[str, list[str]]:
    """The API's own error for the same input, to compare messages with the form's."""
    task = spec.pop("task", "project.tasks.record")
    with pytest.raises(ValidationError) as caught:
        api.schedule(task, **spec)  # type: ignore[arg-type]
    return caught.value.message_dict


def form_errors(response) -> dict[str, list[str]]:  # type: ignore[no-untyped-def]
    form = response.context["adminform"].form
    return {field: list(errors) for field, errors in form.errors.items()}


# --- changelist ------------------------------------------------------------------------------


def test_changelist_shows_schedule_in_words_state_next_run_last_run_lease_and_retries(admin_client):
    # Given a weekday-midnight cron job in Paris, an interval job holding a lease, and a
    # one-off job that failed once
    cron = api.schedule(
        "project.tasks.record", cron="0 0 * * 1-5", timezone="Europe/Paris", name="weekdays"
    )
    leased = api.schedule("project.tasks.record", interval=90, name="every-90s")
    now = db_now()
    Job.objects.filter(pk=leased.pk).update(
        state=JobState.RUNNING, claimed_by="beat-a:42", lease_expires_at=now + timedelta(seconds=60)
    )
    failed = api.schedule("project.tasks.record", run_at=now + timedelta(hours=1), name="one-off")
    Job.objects.filter(pk=failed.pk).update(last_run_at=now, last_status="failed", retry_count=2)

    # When the operator opens the jobs list
    response = admin_client.get(reverse(CHANGELIST))

    # Then each row says it in plain words
    assert response.status_code == 200
    html = response.content.decode().replace("<wbr>", "")  # line-break hints, not text
    assert "At 00:00, Monday through Friday (Europe/Paris)" in html
    assert "Every 1 minute 30 seconds" in html
    assert "Once, at " in html
    # ... the next run in the job's own zone (CET or CEST: Paris)
    cron.refresh_from_db()
    paris = cron.next_run_at.astimezone(ZoneInfo("Europe/Paris"))
    assert f"{paris:%Y-%m-%d %H:%M} {paris.tzname()}" in html
    # ... the state with a colour, the lease holder, the last status and the retry count
    assert 'class="schedapp-badge schedapp-running"' in html
    assert "beat-a:42" in html
    assert 'class="schedapp-badge schedapp-failed"' in html
    row = re.search(r"<tr>(?:(?!</tr>).)*one-off(?:(?!</tr>).)*</tr>", html, re.S).group(0)
    assert '<td class="field-retries">2</td>' in row


def test_changelist_filters_by_state_task_queue_and_kind_and_searches_name_and_task(admin_client):
    api.schedule("project.tasks.record", cron="*/5 * * * *", name="alpha", queue="reports")
    api.schedule("project.tasks.noop", interval=60, name="beta")
    paused = api.schedule(
        "project.tasks.add", args=[1, 2], run_at=db_now() + timedelta(days=1), name="gamma"
    )
    api.pause(paused)
    url = reverse(CHANGELIST)

    def names(query: str) -> set[str]:
        response = admin_client.get(f"{url}?{query}")
        assert response.status_code == 200, response.content[:500]
        return {job.name for job in response.context["cl"].result_list}

    assert names("") == {"alpha", "beta", "gamma"}
    assert names("state__exact=paused") == {"gamma"}
    assert names("task=project.tasks.noop") == {"beta"}
    assert names("queue=reports") == {"alpha"}
    assert names("queue=__default__") == {"beta", "gamma"}
    assert names("kind=cron") == {"alpha"}
    assert names("kind=interval") == {"beta"}
    assert names("kind=once") == {"gamma"}
    assert names("q=bet") == {"beta"}
    assert names("q=tasks.add") == {"gamma"}
    # The filter sidebar lists registered tasks and the queues in use, without a DISTINCT scan
    response = admin_client.get(url)
    html = response.content.decode()
    assert "?task=project.tasks.record" in html
    assert "?queue=reports" in html


def test_dead_letter_view_shows_the_last_error_of_dead_jobs(admin_client):
    job = api.schedule("project.tasks.fail", interval=60, name="broken")
    api.schedule("project.tasks.record", interval=60, name="healthy")
    Job.objects.filter(pk=job.pk).update(
        state=JobState.DEAD,
        last_status="failed",
        last_error="RuntimeError: broken failed on purpose",
        last_run_at=db_now(),
        retry_count=3,
    )

    response = admin_client.get(reverse(CHANGELIST) + "?state__exact=dead")

    html = response.content.decode()
    assert [j.name for j in response.context["cl"].result_list] == ["broken"]
    assert "RuntimeError: broken failed on purpose" in html
    assert "Requeue selected jobs" in html
    # The changelist links to this view
    assert 'id="schedapp-dead-letters"' in admin_client.get(reverse(CHANGELIST)).content.decode()


# --- the job form ----------------------------------------------------------------------------


def test_adding_a_job_in_the_form_schedules_it_through_the_api(admin_client):
    # When the operator submits the add form ("Save and continue editing")
    response = admin_client.post(reverse(ADD), form_data(_continue="1"))

    # Then the job exists, marked as created in the admin, with its first run computed
    assert response.status_code == 302, form_errors(response)
    job = Job.objects.get(name="nightly-report")
    assert job.source == JobSource.ADMIN
    assert job.state == JobState.SCHEDULED
    assert job.kwargs == {"label": "nightly"}
    expected = next(fire_times(parse_cron("0 0 * * 1-5", "Europe/Paris"), job.created_at))
    assert job.next_run_at == expected
    assert response["Location"] == change_url(job)


@pytest.mark.parametrize(
    ("overrides", "field", "spec"),
    [
        ({"cron": "61 * * * *"}, "cron", {"cron": "61 * * * *"}),
        ({"cron": "0 0 30 2 *"}, "cron", {"cron": "0 0 30 2 *"}),
        ({"cron": "0 9 * * 5#6"}, "cron", {"cron": "0 9 * * 5#6"}),
        ({"cron": "0 0 9 * * LW"}, "cron", {"cron": "0 0 9 * * LW"}),
        (
            {"timezone": "Mars/Olympus"},
            "timezone",
            {"cron": "0 0 * * *", "timezone": "Mars/Olympus"},
        ),
        # A task not registered in the web process is saved with a warning (a worker may
        # have it): test_admin_daily_use. The allowlist's refusal is the API's:
        ({"task": "os.system"}, "task", {"task": "os.system", "cron": "0 0 * * *"}),
        ({"args": '{"a": 1}'}, "args", {"args": {"a": 1}, "cron": "0 0 * * *"}),
        (
            {"kwargs": '{"not valid": 1}'},
            "kwargs",
            {"kwargs": {"not valid": 1}, "cron": "0 0 * * *"},
        ),
        ({"cron": "", "interval": "300"}, None, None),
        ({"interval": "300"}, "cron", {"cron": "0 0 * * 1-5", "interval": 300}),
        ({"cron": ""}, "cron", {}),
        ({"lease_seconds": "0"}, "lease_seconds", {"cron": "0 0 * * *", "lease_seconds": 0}),
        ({"catchup_window": "0"}, "catchup_window", {"cron": "0 0 * * *", "catchup_window": 0}),
        (
            {"catchup_window": "-01:00:00"},
            "catchup_window",
            {"cron": "0 0 * * *", "catchup_window": -3600},
        ),
        (
            {"catchup_window": "00:00:30"},
            "catchup_window",
            {"cron": "0 0 * * *", "catchup_window": 30},
        ),
        (
            {"catchup_window": "367 00:00:00"},
            "catchup_window",
            {"cron": "0 0 * * *", "catchup_window": timedelta(days=367)},
        ),
        (
            {"catchup_window": "00:05:00", "misfire_grace": "00:10:00"},
            "catchup_window",
            {"cron": "0 0 * * *", "catchup_window": 300, "misfire_grace": 600},
        ),
    ],
)
def test_the_form_refuses_what_the_api_refuses_with_the_same_message(
    admin_client, overrides, field, spec
):
    response = admin_client.post(reverse(ADD), form_data(**overrides))
    if field is None:  # a valid variant, to show the others fail for their own reason
        assert response.status_code == 302
        return
    assert response.status_code == 200
    errors = form_errors(response)
    expected = api_error(name="via-api", **spec)[field]
    assert errors[field] == expected, errors
    assert not Job.objects.filter(name="nightly-report").exists()


@pytest.mark.parametrize(
    ("cron", "says"),
    [
        ("0 9 * * 5#6", "day of week field: '5#6'"),
        ("0 9 * * LW", "day of week field: 'LW'"),
        ("0 0 9 * L *", "month field: 'L'"),
        ("0 9 32W * *", "day of month 32 is out of range (1-31)"),
        ("0 9 * * 8L", "day of week 8 is out of range (0-7)"),
    ],
)
def test_a_misused_cron_day_form_is_refused_in_the_form_naming_its_field(admin_client, cron, says):
    # When the operator writes a day form in a field that does not take it
    response = admin_client.post(reverse(ADD), form_data(cron=cron))

    # Then the form shows the error on the cron field, naming the cron field at fault
    assert response.status_code == 200
    errors = form_errors(response)
    assert any(says in message for message in errors["cron"]), errors
    assert says in response.content.decode().replace("&#x27;", "'")
    assert not Job.objects.filter(name="nightly-report").exists()


@pytest.mark.parametrize("cron", ["0 9 LW * *", "0 0 9 * * FRIL", "0 9 * * 5L", "30 0 9 L * *"])
def test_a_cron_day_form_is_saved_as_written_with_its_next_run(admin_client, cron):
    # When the operator saves a job with a day form (5 or 6 fields)
    response = admin_client.post(reverse(ADD), form_data(cron=cron, _continue="1"))

    # Then it is stored as written, and its next run is the form's first fire
    assert response.status_code == 302, form_errors(response)
    job = Job.objects.get(name="nightly-report")
    assert job.cron == cron
    assert job.next_run_at == next(fire_times(parse_cron(cron, "Europe/Paris"), job.created_at))
    # And the job page previews five fire times on its days, and says which day forms exist
    page = admin_client.get(change_url(job)).content.decode()
    assert "LW (the last weekday)" in page and "FRIL (the last Friday)" in page
    preview = re.search(r'<ol id="schedapp-preview-list">(.*?)</ol>', page, re.S).group(1)
    assert len(re.findall(r"<li>", preview)) == 5


def test_a_catch_up_window_is_set_shown_and_cleared_in_the_form(admin_client):
    # When the operator adds a job with a window of an hour, typed as seconds
    response = admin_client.post(reverse(ADD), form_data(catchup_window="3600"))
    assert response.status_code == 302, form_errors(response)
    job = Job.objects.get(name="nightly-report")
    assert job.catchup_window == timedelta(hours=1)
    # Then the job page shows it with the misfire fields
    page = admin_client.get(change_url(job)).content.decode()
    misfires = page[page.index("Retries, misfires and overlaps") :]
    assert re.search(r'name="catchup_window"[^>]*value="01:00:00"', misfires), misfires[:3000]
    # And emptied, the job has no window again; a value that is no duration is a field error
    response = admin_client.post(change_url(job), form_data(catchup_window=""))
    assert response.status_code == 302, form_errors(response)
    assert Job.objects.get(pk=job.pk).catchup_window is None
    response = admin_client.post(change_url(job), form_data(catchup_window="an hour"))
    assert form_errors(response) == {"catchup_window": ["Enter a valid duration."]}


@override_settings(SCHEDAPP_DEFAULT_CATCHUP_WINDOW=timedelta(hours=2))
def test_the_add_form_offers_the_default_window_and_emptied_it_means_none(admin_client):
    page = admin_client.get(reverse(ADD)).content.decode()
    assert re.search(r'name="catchup_window"[^>]*value="02:00:00"', page)
    response = admin_client.post(reverse(ADD), form_data(catchup_window=""))
    assert response.status_code == 302, form_errors(response)
    assert Job.objects.get(name="nightly-report").catchup_window is None


def test_a_disallowed_task_is_refused_in_the_form_and_by_the_api(admin_client):
    # Given an allowlist that permits only project.tasks.record
    with override_settings(SCHEDAPP_ALLOWED_TASKS=["project.tasks.record"]):
        response = admin_client.post(reverse(ADD), form_data(task="project.tasks.noop"))
        assert response.status_code == 200
        message = "task 'project.tasks.noop' is not allowed (SCHEDAPP_ALLOWED_TASKS)."
        assert form_errors(response)["task"] == [message]
        assert api_error(task="project.tasks.noop", cron="* * * * *")["task"] == [message]
        # ... and the task list offered in the form does not suggest it
        page = admin_client.get(reverse(ADD)).content.decode()
        assert '<option value="project.tasks.record">' in page
        assert '<option value="project.tasks.noop">' not in page
    assert not Job.objects.exists()


def test_invalid_json_is_a_field_error(admin_client):
    response = admin_client.post(reverse(ADD), form_data(args="[1, 2", kwargs="{'single': 1}"))
    errors = form_errors(response)
    assert errors["args"] == ["Enter a valid JSON."]
    assert errors["kwargs"] == ["Enter a valid JSON."]
    assert not Job.objects.exists()


def test_a_name_in_use_gets_the_api_message(admin_client):
    api.schedule("project.tasks.record", interval=60, name="nightly-report")
    response = admin_client.post(reverse(ADD), form_data())
    assert form_errors(response)["name"] == api_error(name="nightly-report", interval=60)["name"]


def test_run_at_is_read_in_the_jobs_time_zone(admin_client):
    response = admin_client.post(
        reverse(ADD),
        form_data(cron="", run_at_0="2031-07-01", run_at_1="09:30:00", timezone="America/New_York"),
    )
    assert response.status_code == 302, form_errors(response)
    job = Job.objects.get(name="nightly-report")
    assert job.run_at == datetime(2031, 7, 1, 9, 30, tzinfo=ZoneInfo("America/New_York"))
    # ... and shown back in that zone on the job page
    page = admin_client.get(change_url(job)).content.decode()
    assert 'value="09:30:00"' in page
    assert "Tue 2031-07-01 09:30:00 EDT (UTC-04:00)" in page


def test_changing_the_schedule_recomputes_the_next_run_and_other_changes_keep_it(admin_client):
    job = api.schedule(
        "project.tasks.record",
        cron="0 0 * * 1-5",
        timezone="Europe/Paris",
        name="nightly-report",
        kwargs={"label": "nightly"},
    )
    before = job.next_run_at

    # When only the priority changes, the next run stays
    response = admin_client.post(change_url(job), form_data(priority="5"))
    assert response.status_code == 302, form_errors(response)
    job.refresh_from_db()
    assert (job.priority, job.next_run_at) == (5, before)

    # When the cron changes, the next run follows it
    response = admin_client.post(change_url(job), form_data(priority="5", cron="30 6 * * *"))
    assert response.status_code == 302, form_errors(response)
    job.refresh_from_db()
    assert job.cron == "30 6 * * *"
    local = job.next_run_at.astimezone(ZoneInfo("Europe/Paris"))
    assert (local.hour, local.minute) == (6, 30)


def test_lease_and_run_fields_are_read_only(admin_client):
    job = api.schedule(
        "project.tasks.record",
        cron="0 0 * * 1-5",
        timezone="Europe/Paris",
        name="nightly-report",
        kwargs={"label": "nightly"},
    )
    response = admin_client.post(
        change_url(job),
        form_data(
            claimed_by="intruder",
            token="999",
            state="dead",
            lease_expires_at_0="2030-01-01",
            next_run_at_0="2030-01-01",
            retry_count="7",
        ),
    )
    assert response.status_code == 302
    job.refresh_from_db()
    assert (job.claimed_by, job.token, job.state, job.retry_count) == ("", 0, "scheduled", 0)
    page = admin_client.get(change_url(job)).content.decode()
    for field in ("claimed_by", "lease_expires_at", "token", "state", "next_run_at"):
        assert f'name="{field}"' not in page
    assert 'class="readonly">0</div>' in page  # the token, shown


def test_job_page_previews_the_next_five_fire_times(admin_client):
    job = api.schedule(
        "project.tasks.record", cron="0 0 * * 1-5", timezone="Europe/Paris", name="weekdays"
    )
    page = admin_client.get(change_url(job)).content.decode()
    preview = re.search(r'<ol id="schedapp-preview-list">(.*?)</ol>', page, re.S).group(1)
    items = re.findall(r"<li>(.*?)</li>", preview)
    assert len(items) == 5
    assert all("00:00:00 CE" in item for item in items)
    assert not any(item.startswith(("Sat", "Sun")) for item in items)


def test_preview_endpoint_answers_for_a_schedule_being_typed(admin_client):
    url = reverse("admin:schedapp_job_preview")
    data = admin_client.get(url, {"cron": "30 2 * * *", "timezone": "Europe/Paris"}).json()
    assert len(data["times"]) == 5 and data["errors"] == {}
    assert all("02:30:00" in t for t in data["times"])
    data = admin_client.get(url, {"interval": "90", "timezone": "UTC"}).json()
    assert len(data["times"]) == 5
    data = admin_client.get(url, {"cron": "61 * * * *", "timezone": "UTC"}).json()
    assert data["times"] == []
    assert data["errors"]["cron"] == api_error(name="x", cron="61 * * * *")["cron"]
    data = admin_client.get(url, {"cron": "* * * * *", "timezone": "Nowhere"}).json()
    assert data["errors"]["timezone"] == ["unknown time zone 'Nowhere'."]
    assert admin_client.post(url, {"cron": "* * * * *"}).status_code == 405


def test_form_redisplay_after_an_error_keeps_the_preview(admin_client):
    response = admin_client.post(
        reverse(ADD), form_data(task="os.system", cron="15 4 * * *", timezone="UTC")
    )
    page = response.content.decode()
    preview = re.search(r'<ol id="schedapp-preview-list">(.*?)</ol>', page, re.S).group(1)
    assert len(re.findall(r"<li>[^<]*04:15:00 UTC", preview)) == 5


def test_the_overlap_policy_and_a_fixed_delay_are_set_in_the_form(admin_client):
    # When the operator adds an interval job that skips overlaps, counted from each run's end
    data = form_data(cron="", interval="300", overlap="skip", max_buffer="5", fixed_delay="on")
    response = admin_client.post(reverse(ADD), data)
    assert response.status_code == 302, form_errors(response)
    job = Job.objects.get(name="nightly-report")
    assert (job.overlap, job.max_buffer, job.fixed_delay) == ("skip", 5, True)
    # Then a fixed delay with a cron, an unknown policy and an empty buffer are refused, each
    # on its field, as the API refuses them
    response = admin_client.post(change_url(job), form_data(fixed_delay="on"))
    assert form_errors(response) == {"fixed_delay": ["needs an interval schedule (interval=...)."]}
    response = admin_client.post(
        change_url(job), form_data(interval="300", cron="", overlap="allow_any", max_buffer="0")
    )
    errors = form_errors(response)
    assert set(errors) == {"overlap", "max_buffer"}, errors
    assert "allow_any" in errors["overlap"][0]
    # allow_all with its bound is taken; with a fixed delay or no bound, refused on the field
    response = admin_client.post(
        change_url(job),
        form_data(
            interval="300", cron="", overlap="allow_all", max_concurrent="0", fixed_delay="on"
        ),
    )
    assert set(form_errors(response)) == {"fixed_delay", "max_concurrent"}
    response = admin_client.post(
        change_url(job), form_data(interval="300", cron="", overlap="allow_all", max_concurrent="3")
    )
    assert response.status_code == 302, form_errors(response)
    job.refresh_from_db()
    assert (job.overlap, job.max_concurrent) == ("allow_all", 3)


def test_the_form_attaches_a_calendar_and_the_preview_marks_what_it_moved(admin_client):
    # Given a calendar of weekends
    api.save_calendar("weekends", {"weekdays": ["sat", "sun"]})
    calendar_id = Calendar.objects.get(name="weekends").pk
    # When the operator adds a daily job following it, rolled to the next business day
    response = admin_client.post(
        reverse(ADD),
        form_data(
            cron="0 9 * * *",
            calendar=str(calendar_id),
            calendar_mode="exclude",
            calendar_roll="next_business_day",
        ),
    )
    assert response.status_code == 302, form_errors(response)
    job = Job.objects.get(name="nightly-report")
    assert (job.calendar_id, job.calendar_roll) == (calendar_id, "next_business_day")
    assert job.scheduled_for.astimezone(ZoneInfo("Europe/Paris")).weekday() < 5
    # Then its page previews runs on weekdays only, a weekend one marked as moved
    preview = preview_for(
        {f: getattr(job, f) for f in JOB_FIELDS},
        scheduled_for=None,
        now=datetime(2026, 12, 4, 12, tzinfo=UTC),  # a Friday after 09:00 in Paris
        count=3,
    )
    assert preview[0].startswith("Mon 2026-12-07 09:00:00 CET (UTC+01:00)"), preview
    # (Monday's own 09:00 runs for Saturday's and Sunday's too)
    assert "also stands for 2 earlier occurrence(s) merged by calendar 'weekends'" in preview[0]
    assert preview[1].startswith("Tue 2026-12-08 09:00:00") and "moved" not in preview[1]
    # ... and a deferred run says where it was moved from
    api.save_calendar("mornings", {"time_range": {"start": "06:00", "end": "12:00"}})
    deferred = {f: getattr(job, f) for f in JOB_FIELDS}
    deferred.update(calendar=Calendar.objects.get(name="mornings"), calendar_roll="defer")
    (moved,) = preview_for(
        deferred, scheduled_for=None, now=datetime(2026, 12, 4, 12, tzinfo=UTC), count=1
    )
    assert moved.startswith("Sat 2026-12-05 12:00:00 CET"), moved
    assert "moved from Sat 2026-12-05 09:00:00 CET (UTC+01:00) by calendar 'mornings'" in moved
    # And a roll with no calendar is refused on its field
    response = admin_client.post(change_url(job), form_data(calendar="", calendar_roll="defer"))
    assert "calendar_roll" in form_errors(response)


def test_the_preview_marks_a_time_its_dst_rule_moved():
    values = {f: field_default(f) for f in JOB_FIELDS}
    values.update(
        task="t",
        name="n",
        args=[],
        kwargs={},
        queue="",
        message_options={},
        cron="30 2 * * *",
        timezone="Europe/Paris",
        run_at=None,
        interval=None,
        solar_event="",
    )
    times = preview_for(
        values, scheduled_for=None, now=datetime(2026, 3, 28, 12, tzinfo=UTC), count=2
    )
    assert times[0].startswith("Sun 2026-03-29 03:00:00 CEST"), times
    assert "moved by its DST rule" in times[0]
    assert "DST" not in times[1]
    times = preview_for(
        values, scheduled_for=None, now=datetime(2026, 10, 24, 12, tzinfo=UTC), count=1
    )
    assert "repeated hour: its first offset" in times[0], times


def test_the_job_pages_read_no_server_side_cursor(admin_client, monkeypatch):
    """Behind a transaction-pooling PgBouncer a server-side cursor's portal is lost between
    statements: the job's pages (its calendar choices) must read without one."""
    from django.db import connection

    api.save_calendar("weekends", {"weekdays": ["sat", "sun"]})
    job = api.schedule("project.tasks.record", name="cursorless", cron="0 9 * * *")

    def refuse(*args, **kwargs):
        raise AssertionError("a server-side cursor (.iterator()) was opened")

    monkeypatch.setattr(connection, "chunked_cursor", refuse)
    for url in (reverse(ADD), change_url(job)):
        response = admin_client.get(url)
        assert response.status_code == 200
        assert b"weekends" in response.content
