"""Celery's semantics on jobs: AND days, solar, a start/expiry window, message options;
``schedapp_import --strict``; django-celery-beat's clocked, one_off, start_time, expires."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from celery.schedules import schedule
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command
from django.test import override_settings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedapp import api, importer
from schedapp.db import db_now
from schedapp.fields import with_defaults
from schedapp.models import Job
from schedapp.schedules import next_fire_time
from schedapp.validation import job_defaults, validate_job
from tests import examples

pytestmark = [pytest.mark.django_db]
TASK = "project.tasks.record"


def test_a_cron_with_celerys_and_runs_on_first_sundays_only():
    job = api.schedule(TASK, cron="0 9 1-7 * sun", timezone="UTC", cron_day_or=False)
    assert job.next_run_at.weekday() == 6 and job.next_run_at.day <= 7
    nxt = next_fire_time(Job.objects.get(pk=job.pk).schedule, job.next_run_at)
    assert nxt.weekday() == 6 and nxt.day <= 7 and nxt.month != job.next_run_at.month


def test_a_solar_job_is_due_at_its_event():
    job = api.schedule(TASK, solar_event="sunset", latitude=48.85, longitude=2.35)
    job = Job.objects.get(pk=job.pk)
    assert job.schedule_kind == "solar"
    assert job.next_run_at == next_fire_time(job.schedule, db_now())


def test_a_window_starts_and_ends_the_schedule():
    start = db_now() + timedelta(days=3)
    job = api.schedule(TASK, interval=3600, not_before=start, expires_at=start + timedelta(hours=2))
    job = Job.objects.get(pk=job.pk)
    assert job.next_run_at == start  # never before not_before
    last = next_fire_time(job.schedule, next_fire_time(job.schedule, start))
    assert last == start + timedelta(hours=2)
    assert next_fire_time(job.schedule, last) is None  # then the job finishes


def test_an_expiry_already_past_is_refused_on_its_field():
    with pytest.raises(ValidationError) as exc:
        api.schedule(TASK, interval=60, expires_at=datetime(2001, 1, 1, tzinfo=UTC))
    assert "expires_at" in exc.value.message_dict


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ({"queue": "a b"}, "queue"),
        ({"priority": 256}, "priority"),
        ({"expires": -1}, "expires"),
        ({"headers": {"id": "x"}}, "headers may not set"),
        # a worker would decompress a body sent as it is (kombu reads the body's compression
        # from this header)
        ({"headers": {"compression": "application/x-gzip"}}, "headers may not set"),
        ({"routing": "x"}, "unknown option"),
    ],
)
def test_message_options_errors_name_the_field(options, needle):
    with pytest.raises(ValidationError) as exc:
        api.schedule(TASK, interval=60, message_options=options)
    assert needle in " ".join(exc.value.message_dict["message_options"])


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers(-300, 300) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=6,
)


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    options=st.dictionaries(
        st.sampled_from(["queue", "routing_key", "exchange", "priority", "expires", "headers"])
        | st.text(max_size=4),
        JSONISH,
        max_size=4,
    ),
    day_or=st.one_of(st.booleans(), st.none(), st.integers(), st.text(max_size=2)),
)
def test_new_fields_validate_or_fail_on_their_own_field(options, day_or):
    values = with_defaults(
        job_defaults(),
        {
            "task": TASK,
            "name": "x",
            "interval": 60,
            "message_options": options,
            "cron_day_or": day_or,
        },
    )
    try:
        cleaned = validate_job(values, check_task=False)
    except ValidationError as exc:
        assert set(exc.message_dict) <= {"message_options", "cron_day_or"}
    else:
        assert set(cleaned["message_options"]) <= set(importer.MESSAGE_OPTIONS)
        assert cleaned["cron_day_or"] in (True, False)


class OffsettingSchedule(schedule):
    def is_due(self, last_run_at):
        return super().is_due(last_run_at)


@override_settings(
    CELERY_BEAT_SCHEDULE={
        "ok": {"task": TASK, "schedule": 60.0},
        "offset": {"task": TASK, "schedule": OffsettingSchedule(timedelta(minutes=30))},
    }
)
def test_strict_import_exits_non_zero_on_an_unmapped_entry():
    with pytest.raises(CommandError, match="1 not mapped"):
        call_command("schedapp_import", "--strict", "--dry-run")
    call_command("schedapp_import", "--dry-run")  # without --strict: reported only


def test_django_celery_beat_window_clocked_and_one_off_are_mapped():
    # django-celery-beat does not install beside every Django schedapp supports (noxfile.py)
    dcb = pytest.importorskip("django_celery_beat.models")
    ClockedSchedule, IntervalSchedule, PeriodicTask = (
        dcb.ClockedSchedule,
        dcb.IntervalSchedule,
        dcb.PeriodicTask,
    )

    start = db_now() + timedelta(days=1)
    every = IntervalSchedule.objects.create(every=10, period="minutes")
    PeriodicTask.objects.create(
        name="windowed",
        task=TASK,
        interval=every,
        start_time=start,
        expires=start + timedelta(days=1),
        priority=4,
    )
    clocked = ClockedSchedule.objects.create(clocked_time=start)
    PeriodicTask.objects.create(name="clocked", task=TASK, clocked=clocked, one_off=True)
    report = importer.import_candidates(importer.from_django_celery_beat())
    assert sorted(report.created) == ["clocked", "windowed"], report.lines()
    windowed = Job.objects.get(name="windowed")
    assert (windowed.not_before, windowed.expires_at) == (start, start + timedelta(days=1))
    assert windowed.message_options == {"priority": 4}  # the message priority
    assert windowed.next_run_at == start
    assert Job.objects.get(name="clocked").run_at == start


def test_an_import_with_beat_state_keeps_each_intervals_phase(tmp_path, monkeypatch):
    from celery.beat import PersistentScheduler

    from project.celery import app

    # Given Celery beat's own state file, in which "ping" (every 10 min) last ran at `last`
    monkeypatch.setitem(
        app.conf, "beat_schedule", {"ping": {"task": TASK, "schedule": timedelta(minutes=10)}}
    )
    path = str(tmp_path / "celerybeat-schedule")
    beat = PersistentScheduler(app=app, schedule_filename=path)
    last = (db_now() - timedelta(minutes=3)).replace(microsecond=0)
    entries = beat._store["entries"]
    entries["ping"] = entries["ping"]._next_instance(last)
    beat._store["entries"] = entries
    beat.sync()
    beat.close()
    # When it is imported with --beat-state
    with override_settings(CELERY_BEAT_SCHEDULE=dict(app.conf.beat_schedule)):
        call_command("schedapp_import", "--beat-state", path)
    # Then the job runs when Celery would have: one interval after the last run, not after now
    job = Job.objects.get(name="ping")
    assert job.next_run_at == last + timedelta(minutes=10)
    # ... and a failed run is not retried, the next one comes anyway (issue 29 item 1)
    assert (job.max_retries, job.when_retries_exhausted) == (0, "next_occurrence")


def test_a_row_written_without_message_options_gets_an_empty_mapping():
    """Rows inserted by SQL that omits the column (bulk tools, benches) must read as {}: a
    default stored as the JSON string "{}" made every dispatch of them fail to route."""
    from django.db import connection

    job = api.schedule(TASK, interval=60)
    with connection.cursor() as cursor:
        cursor.execute("UPDATE schedapp_job SET message_options = DEFAULT WHERE id = %s", [job.pk])
        cursor.execute("SELECT message_options::text FROM schedapp_job WHERE id = %s", [job.pk])
        assert cursor.fetchone()[0] == "{}"
