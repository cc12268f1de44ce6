"""Housekeeping that needs no setup, and Celery's beat_schedule synced at beat start."""

from __future__ import annotations

import logging
import logging.config
from datetime import timedelta

import pytest
from celery.schedules import crontab, schedule
from django.conf import settings
from django.test import override_settings

from project.celery import app
from schedapp import declared
from schedapp.db import db_now
from schedapp.lease import claim_due_jobs
from schedapp.models import Job, JobSource, JobState
from schedapp.tasks import cleanup_results

pytestmark = [pytest.mark.django_db]


@pytest.fixture
def beat_schedule(monkeypatch):
    def configure(entries):
        monkeypatch.setitem(app.conf, "beat_schedule", entries)

    return configure


@override_settings(SCHEDAPP_HOUSEKEEPING=True, SCHEDAPP_ALLOWED_TASKS=["myapp.tasks.*"])
def test_housekeeping_jobs_are_declared_by_default_even_with_a_narrow_allowlist(beat_schedule):
    beat_schedule({})
    report = declared.sync_declared_jobs()
    assert sorted(report.created) == ["schedapp-cleanup-results", "schedapp-prune-runs"]
    prune = Job.objects.get(name="schedapp-prune-runs")
    assert prune.task == "schedapp.prune_runs" and prune.source == JobSource.DECLARED
    assert prune.kwargs == {"older_than_seconds": 30 * 86400.0}
    assert prune.state == JobState.SCHEDULED


@override_settings(SCHEDAPP_HOUSEKEEPING=True, SCHEDAPP_DENIED_TASKS=["schedapp.*"])
def test_housekeeping_can_still_be_denied_explicitly(beat_schedule):
    beat_schedule({})
    report = declared.sync_declared_jobs()
    assert set(report.errors) == {"schedapp-cleanup-results", "schedapp-prune-runs"}


def test_result_cleanup_deletes_results_older_than_the_retention():
    from django_celery_results.models import TaskResult

    old = TaskResult.objects.create(task_id="old", status="SUCCESS")
    TaskResult.objects.filter(pk=old.pk).update(date_done=db_now() - timedelta(days=3))
    TaskResult.objects.create(task_id="new", status="SUCCESS")
    assert cleanup_results(older_than_seconds=86400) == 1
    assert list(TaskResult.objects.values_list("task_id", flat=True)) == ["new"]


def test_beat_schedule_entries_are_synced_as_declared_jobs_with_celerys_semantics(beat_schedule):
    beat_schedule(
        {
            "first-sunday": {
                "task": "project.tasks.record",
                "schedule": crontab(0, 9, day_of_week=0, day_of_month="1-7"),
                "options": {"queue": "reports", "priority": 5},
            },
            "every-minute": {"task": "project.tasks.record", "schedule": 60.0},
        }
    )
    report = declared.sync_declared_jobs()
    assert sorted(report.created) == ["every-minute", "first-sunday"]
    job = Job.objects.get(name="first-sunday")
    assert job.source == JobSource.DECLARED and job.cron_day_or is False
    assert job.message_options == {"queue": "reports", "priority": 5}
    assert job.next_run_at.weekday() == 6 and job.next_run_at.day <= 7
    # a beat starting again changes nothing (phase included)
    assert sorted(declared.sync_declared_jobs().unchanged) == ["every-minute", "first-sunday"]


def test_a_custom_schedule_class_in_beat_schedule_is_reported_and_not_run(beat_schedule):
    class OffsettingSchedule(schedule):
        def is_due(self, last_run_at):
            return super().is_due(last_run_at)

    beat_schedule(
        {"offset": {"task": "project.tasks.record", "schedule": OffsettingSchedule(1800)}}
    )
    report = declared.sync_declared_jobs()  # the beat logs report.errors at start
    assert not Job.objects.filter(name="offset").exists()
    (message,) = report.errors["offset"]
    assert "OffsettingSchedule" in message and "not run" in message
    assert report.errors["offset"] and "OffsettingSchedule" in report.errors["offset"][0]


# A field Celery would refuse (or misread), per entry: (field, what the entry has instead).
MALFORMED = {
    "int-args": ("args", {"args": (16)}),  # the missing comma: an int, not a tuple
    "str-args": ("args", {"args": ("hello")}),  # a str, which iterating splits into characters
    "dict-args": ("args", {"args": {"a": 1}}),  # a dict, which iterating turns into its keys
    "str-kwargs": ("kwargs", {"kwargs": "x"}),
    "str-options": ("options", {"options": "q"}),
    "nan-schedule": ("schedule", {"schedule": float("nan")}),
    "inf-schedule": ("schedule", {"schedule": float("inf")}),
    "huge-relative": ("schedule", {"schedule": timedelta(days=10**8), "relative": True}),
}


@override_settings(SCHEDAPP_HOUSEKEEPING=True)
def test_a_malformed_beat_schedule_entry_is_reported_and_the_others_still_sync(beat_schedule):
    good = {"task": "project.tasks.record", "schedule": 60.0}
    beat_schedule(
        {"fine": good, **{name: {**good, **instead} for name, (_, instead) in MALFORMED.items()}}
    )
    report = declared.sync_declared_jobs()
    assert sorted(report.created) == ["fine", "schedapp-cleanup-results", "schedapp-prune-runs"]
    assert set(report.errors) == set(MALFORMED)
    for name, (field, _) in MALFORMED.items():
        (message,) = report.errors[name]
        assert message.startswith(f"{name}.{field}: beat_schedule entry not run: {field} "), message
    assert not Job.objects.filter(name__in=list(MALFORMED)).exists()


def test_beat_cron_starting_deadline_skips_a_synced_crontabs_stale_run_until_it_is_unset(
    beat_schedule,
):
    """A crontab's missed run older than the deadline is not sent, as under Celery's beat;
    an interval entry (Celery reads the deadline in crontab only) and, once the setting is
    gone, the crontab too, keep the defaults (run_once)."""
    two_hours_ago = (db_now() - timedelta(hours=2)).replace(second=0, microsecond=0)
    beat_schedule(
        {
            "daily": {
                "task": "project.tasks.record",
                "schedule": crontab(minute=two_hours_ago.minute, hour=two_hours_ago.hour),
            },
            "every-minute": {"task": "project.tasks.record", "schedule": 60.0},
        }
    )
    with override_settings(CELERY_TIMEZONE="UTC", CELERY_BEAT_CRON_STARTING_DEADLINE=600):
        declared.sync_declared_jobs()
    daily, minutely = Job.objects.get(name="daily"), Job.objects.get(name="every-minute")
    assert (daily.misfire_policy, daily.misfire_grace) == ("run_recent", timedelta(minutes=10))
    assert (minutely.misfire_policy, minutely.misfire_grace) == ("run_once", timedelta(minutes=1))

    Job.objects.filter(pk=daily.pk).update(scheduled_for=two_hours_ago, next_run_at=two_hours_ago)
    result = claim_due_jobs("beat-1", 10)
    assert daily.pk not in {run.job_id for run in result.runs}
    daily.refresh_from_db()
    assert (daily.state, daily.missed_runs) == (JobState.SCHEDULED, 1)
    assert daily.next_run_at == two_hours_ago + timedelta(days=1)

    with override_settings(CELERY_TIMEZONE="UTC"):
        report = declared.sync_declared_jobs()
    assert report.updated["daily"] == ["misfire_grace", "misfire_policy"]
    daily.refresh_from_db()
    assert (daily.misfire_policy, daily.misfire_grace) == ("run_once", timedelta(minutes=1))
    assert daily.next_run_at == two_hours_ago + timedelta(days=1)  # its schedule did not move


def test_at_beat_start_an_entry_not_run_is_an_error_line_and_an_option_left_behind_a_warning(
    beat_schedule, tmp_path
):
    # Given an entry without a task, and one with an option schedapp does not carry over
    beat_schedule(
        {
            "no-task": {"schedule": 60.0},
            "countdown": {
                "task": "project.tasks.record",
                "schedule": 60.0,
                "options": {"queue": "q", "countdown": 5},
            },
        }
    )
    # (loading the tasks modules runs Celery's Django fixup, which configures Django's logging
    # again: the beat's log is a file handler of that configuration)
    log_file = tmp_path / "beat.log"
    handler = {"class": "logging.FileHandler", "filename": str(log_file)}
    config = {
        "version": 1,
        "disable_existing_loggers": False,
        "handlers": {"file": handler},
        "loggers": {"schedapp": {"handlers": ["file"], "level": "INFO", "propagate": False}},
    }
    try:
        with override_settings(LOGGING=config):
            logging.config.dictConfig(config)
            declared.sync_declared_jobs()
    finally:
        logging.config.dictConfig(settings.LOGGING)
    lines = log_file.read_text().splitlines()
    # Then the beat's log names each, as migrating.md says
    assert "declared job no-task is invalid: " in "\n".join(lines)
    assert lines.count("beat_schedule entry countdown: options ignored: countdown") == 1
    assert Job.objects.get(name="countdown").message_options == {"queue": "q"}


def test_result_cleanup_without_a_retention_uses_celerys_result_expires(monkeypatch):
    from django_celery_results.models import TaskResult

    for task_id, age in (("two-days", timedelta(days=2)), ("two-hours", timedelta(hours=2))):
        result = TaskResult.objects.create(task_id=task_id, status="SUCCESS")
        TaskResult.objects.filter(pk=result.pk).update(date_done=db_now() - age)
    assert cleanup_results() == 1  # result_expires: one day by default
    monkeypatch.setitem(app.conf, "result_expires", 3600)
    assert cleanup_results() == 1
    assert not TaskResult.objects.exists()
