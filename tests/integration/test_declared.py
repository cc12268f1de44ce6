"""Jobs declared in code (SCHEDAPP_JOBS and @periodic), synced when a beat starts."""

from __future__ import annotations

from datetime import timedelta

import pytest
from celery import shared_task
from django.core.exceptions import ValidationError
from django.test import override_settings

from schedapp import api, declared
from schedapp.db import db_now
from schedapp.models import Job, JobSource, JobState

pytestmark = [pytest.mark.django_db]

JOBS = {
    "nightly": {
        "task": "project.tasks.record",
        "cron": "0 2 * * *",
        "timezone": "Europe/Paris",
        "kwargs": {"label": "nightly"},
    },
    "every-minute": {"task": "project.tasks.noop", "interval": 60, "priority": 5},
}


@pytest.fixture(autouse=True)
def empty_registry():
    saved = list(declared._registry)
    declared.clear_registry()
    yield
    declared.clear_registry()
    declared._registry.extend(saved)


def snapshot() -> dict[str, tuple]:
    return {
        j.name: (j.pk, j.state, j.next_run_at, j.updated_at, j.cron, j.interval, j.priority)
        for j in Job.objects.all()
    }


def test_sync_creates_declared_jobs_and_a_second_sync_changes_nothing():
    with override_settings(SCHEDAPP_JOBS=JOBS):
        report = declared.sync_declared_jobs()
        assert sorted(report.created) == ["every-minute", "nightly"]
        first = snapshot()
        again = declared.sync_declared_jobs()
    assert not again.changed and sorted(again.unchanged) == ["every-minute", "nightly"]
    assert snapshot() == first  # not even next_run_at or updated_at moved
    nightly = Job.objects.get(name="nightly")
    assert (nightly.source, nightly.cron, nightly.timezone, nightly.kwargs) == (
        JobSource.DECLARED,
        "0 2 * * *",
        "Europe/Paris",
        {"label": "nightly"},
    )
    assert Job.objects.get(name="every-minute").interval == timedelta(seconds=60)


def test_a_changed_declaration_updates_the_job_and_only_a_new_schedule_moves_next_run():
    with override_settings(SCHEDAPP_JOBS=JOBS):
        declared.sync_declared_jobs()
    before = snapshot()
    changed = {
        **JOBS,
        "nightly": {**JOBS["nightly"], "kwargs": {"label": "v2"}},
        "every-minute": {"task": "project.tasks.noop", "interval": 120},
    }
    with override_settings(SCHEDAPP_JOBS=changed):
        report = declared.sync_declared_jobs()
    assert report.updated == {
        "nightly": ["kwargs"],
        "every-minute": ["cron", "interval", "priority", "run_at", "solar_event", "timezone"],
    }
    after = snapshot()
    assert Job.objects.get(name="nightly").kwargs == {"label": "v2"}
    assert after["nightly"][2] == before["nightly"][2]  # same next run
    minute = Job.objects.get(name="every-minute")
    assert (minute.interval, minute.priority) == (timedelta(seconds=120), 0)  # back to default


def test_a_removed_declaration_pauses_the_job_and_keeps_it():
    with override_settings(SCHEDAPP_JOBS=JOBS):
        declared.sync_declared_jobs()
    api.schedule("project.tasks.record", interval=60, name="not-declared")
    with override_settings(SCHEDAPP_JOBS={"nightly": JOBS["nightly"]}):
        report = declared.sync_declared_jobs()
        assert report.paused == ["every-minute"]
        assert Job.objects.get(name="every-minute").state == JobState.PAUSED
        assert Job.objects.get(name="not-declared").state == JobState.SCHEDULED
        assert declared.sync_declared_jobs().paused == []  # idempotent
    # Declared again by a newer set of declarations: the job its sync paused comes back
    again = {**JOBS, "nightly": {**JOBS["nightly"], "kwargs": {"label": "nightly", "v": 2}}}
    with override_settings(SCHEDAPP_JOBS=again):
        report = declared.sync_declared_jobs()
    assert (report.resumed, report.waiting) == (["every-minute"], [])
    assert Job.objects.get(name="every-minute").state == JobState.SCHEDULED


def test_a_bad_declaration_names_job_and_field_and_the_others_still_sync():
    with pytest.raises(ValidationError) as caught:
        declared.declared_values("broken", {"task": "project.tasks.record", "cron": "99 * * * *"})
    assert list(caught.value.message_dict) == ["broken.cron"]

    bad = {
        **JOBS,
        "broken": {"task": "project.tasks.record", "cron": "99 * * * *"},
        "typo": {"task": "project.tasks.record", "interval": 5, "prority": 1},
        "not-allowed": {"task": "celery.backend_cleanup", "interval": 5},
    }
    with override_settings(SCHEDAPP_JOBS=bad):
        report = declared.sync_declared_jobs()
    assert sorted(report.created) == ["every-minute", "nightly"]
    assert report.errors["broken"][0].startswith("broken.cron: ")
    assert report.errors["typo"] == ["typo.prority: unknown option 'prority'."]
    assert "not allowed" in report.errors["not-allowed"][0]
    assert not Job.objects.filter(name__in=["broken", "typo", "not-allowed"]).exists()


def test_a_job_of_another_source_with_a_declared_name_is_left_alone():
    mine = api.schedule("project.tasks.record", interval=3600, name="nightly")
    with override_settings(SCHEDAPP_JOBS=JOBS):
        report = declared.sync_declared_jobs()
    assert "nightly" in report.conflicts
    mine.refresh_from_db()
    assert (mine.source, mine.interval, mine.cron) == (JobSource.API, timedelta(hours=1), "")


def test_the_periodic_decorator_declares_a_job_for_its_task():
    @declared.periodic(cron="*/15 * * * *", name="refresh-cache", queue="low")
    @shared_task(name="project.tasks.test_declared_refresh")
    def refresh() -> None:
        pass

    @declared.periodic(interval=timedelta(hours=1))
    @shared_task(name="project.tasks.test_declared_hourly")
    def hourly() -> None:
        pass

    report = declared.sync_declared_jobs()
    assert sorted(report.created) == ["project.tasks.test_declared_hourly", "refresh-cache"]
    job = Job.objects.get(name="refresh-cache")
    assert (job.task, job.cron, job.queue, job.source) == (
        "project.tasks.test_declared_refresh",
        "*/15 * * * *",
        "low",
        JobSource.DECLARED,
    )
    assert Job.objects.get(name="project.tasks.test_declared_hourly").interval == timedelta(hours=1)
    # The same name in the setting too: reported, not guessed
    with override_settings(SCHEDAPP_JOBS={"refresh-cache": JOBS["nightly"]}):
        report = declared.sync_declared_jobs()
    message = "declared more than once (SCHEDAPP_JOBS, @periodic, Celery's beat_schedule)"
    assert message in report.errors["refresh-cache"][0]
    with pytest.raises(ValueError, match="declared twice"):
        declared.periodic(cron="* * * * *", name="refresh-cache")(refresh)


def test_the_demo_projects_declarations_are_valid():
    from project import settings as demo

    assert demo.SCHEDAPP_JOBS, "the demo declares its nightly prune"
    for name, spec in demo.SCHEDAPP_JOBS.items():
        values = declared.declared_values(name, spec)
        assert values["task"] == spec["task"]


def test_a_declared_interval_keeps_its_not_before_on_every_later_sync():
    """A start a week ahead must survive each beat start, or the job fires a week early."""
    start = db_now().replace(microsecond=0) + timedelta(days=7)
    jobs = {"weekly-start": {"task": "project.tasks.noop", "interval": 3600, "not_before": start}}
    with override_settings(SCHEDAPP_JOBS=jobs):
        assert declared.sync_declared_jobs().created == ["weekly-start"]
        job = Job.objects.get(name="weekly-start")
        first = (job.not_before, job.interval_anchor, job.next_run_at, job.updated_at)
        assert job.not_before == start and job.next_run_at >= start
        for _ in range(2):
            report = declared.sync_declared_jobs()
            assert (report.updated, report.unchanged) == ({}, ["weekly-start"])
    job.refresh_from_db()
    assert (job.not_before, job.interval_anchor, job.next_run_at, job.updated_at) == first


def test_a_declared_catch_up_window_is_synced_like_any_field():
    # Given a declaration with a window in seconds, and an @periodic one with a timedelta
    @declared.periodic(interval=60, name="windowed-periodic", catchup_window=timedelta(hours=2))
    @shared_task(name="project.tasks.test_declared_windowed")
    def windowed() -> None:
        pass

    jobs = {"windowed": {**JOBS["every-minute"], "catchup_window": 3600}}
    with override_settings(SCHEDAPP_JOBS=jobs):
        assert sorted(declared.sync_declared_jobs().created) == ["windowed", "windowed-periodic"]
        assert not declared.sync_declared_jobs().changed  # the same window: nothing to do
    stored = dict(Job.objects.values_list("name", "catchup_window"))
    assert stored == {"windowed": timedelta(hours=1), "windowed-periodic": timedelta(hours=2)}
    before = snapshot()["windowed"]
    # When the window changes, only it is updated: the next run stays
    with override_settings(SCHEDAPP_JOBS={"windowed": {**jobs["windowed"], "catchup_window": 60}}):
        assert declared.sync_declared_jobs().updated == {"windowed": ["catchup_window"]}
    job = Job.objects.get(name="windowed")
    assert (job.catchup_window, job.next_run_at) == (timedelta(minutes=1), before[2])
    # And left out again, it is the default: no window
    with override_settings(SCHEDAPP_JOBS={"windowed": JOBS["every-minute"]}):
        assert declared.sync_declared_jobs().updated == {"windowed": ["catchup_window"]}
    assert Job.objects.get(name="windowed").catchup_window is None


@override_settings(SCHEDAPP_DEFAULT_CATCHUP_WINDOW=timedelta(hours=1))
def test_a_declaration_may_say_no_window_where_the_default_is_one():
    jobs = {"default": JOBS["every-minute"], "none": {**JOBS["nightly"], "catchup_window": None}}
    with override_settings(SCHEDAPP_JOBS=jobs):
        declared.sync_declared_jobs()
        assert sorted(declared.sync_declared_jobs().unchanged) == ["default", "none"]
    stored = dict(Job.objects.values_list("name", "catchup_window"))
    assert stored == {"default": timedelta(hours=1), "none": None}


@pytest.mark.parametrize(
    ("window", "says"),
    [
        (0, "more than 0"),
        (-60, "more than 0"),
        (30, "shorter than misfire_grace"),
        ("1 hour", "must be a duration"),
    ],
)
def test_a_bad_declared_window_names_job_and_field(window, says):
    spec = {**JOBS["every-minute"], "catchup_window": window}
    with pytest.raises(ValidationError) as caught:
        declared.declared_values("bad-window", spec)
    assert list(caught.value.message_dict) == ["bad-window.catchup_window"]
    assert says in caught.value.message_dict["bad-window.catchup_window"][0]
    with override_settings(SCHEDAPP_JOBS={"bad-window": spec}):
        report = declared.sync_declared_jobs()
    assert report.errors["bad-window"][0].startswith("bad-window.catchup_window: ")
    assert not Job.objects.filter(name="bad-window").exists()


def test_a_declared_job_follows_a_declared_calendar_and_a_second_sync_changes_nothing():
    api.save_calendar("weekends", {"weekdays": ["sat", "sun"]})
    jobs = {
        "payroll": {
            "task": "project.tasks.record",
            "cron": "0 9 * * *",
            "timezone": "UTC",
            "calendar": "weekends",
            "calendar_roll": "next_business_day",
        }
    }
    with override_settings(SCHEDAPP_JOBS=jobs):
        assert declared.sync_declared_jobs().created == ["payroll"]
        first = snapshot()
        again = declared.sync_declared_jobs()
    assert not again.changed and snapshot() == first
    job = Job.objects.get(name="payroll")
    assert (job.calendar.name, job.calendar_roll) == ("weekends", "next_business_day")
    assert job.scheduled_for.weekday() < 5
    bad = {"payroll": {**jobs["payroll"], "calendar": "no-such"}}
    with override_settings(SCHEDAPP_JOBS=bad):
        report = declared.sync_declared_jobs()
    assert "payroll.calendar" in str(report.errors) or "calendar" in str(report.errors)
