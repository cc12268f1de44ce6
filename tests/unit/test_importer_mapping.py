"""``importer.map_beat_entry``: one ``beat_schedule`` item to a job spec, without a database."""

from __future__ import annotations

import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from celery import Celery
from celery.schedules import crontab, schedule, solar

from schedapp import importer
from schedapp.schedules import parse_cron


def test_a_crontab_maps_to_cron_in_the_given_zone_with_args_and_carried_options():
    item = importer.map_beat_entry(
        "report",
        {
            "task": "project.tasks.record",
            "schedule": crontab(minute=0, hour=7, day_of_week="mon-fri"),
            "args": ("report",),
            "options": {"queue": "reports", "expires": 30},
        },
        "Europe/Paris",
    )
    assert item.problem is None
    assert item.spec == {
        "cron": "0 7 * * mon-fri",
        "timezone": "Europe/Paris",
        "cron_day_or": False,  # Celery's crontab: both day fields must match
        "dst_policy": "gap_end+first",  # SCHEDAPP_IMPORT_DST_POLICY's default: schedapp's rule
        "args": ["report"],
        "kwargs": {},
        "message_options": {"queue": "reports", "expires": 30},
        # Celery beat's failures: no retry, the next occurrence comes anyway
        "max_retries": 0,
        "when_retries_exhausted": "next_occurrence",
        # Celery beat has no catch-up window: none, whatever the default says
        "catchup_window": None,
    }
    assert item.notes == []


def test_intervals_map_from_numbers_timedeltas_and_schedule_objects():
    for value in (90, 90.0, timedelta(seconds=90), schedule(run_every=90)):
        item = importer.map_beat_entry("x", {"task": "t", "schedule": value}, "UTC")
        assert item.spec["interval"] == timedelta(seconds=90), value


def test_blanks_inside_a_crontab_field_do_not_split_the_cron_field():
    # hustlzp/blogbar: crontab(hour='0, 6, 12, 18', minute=30); Celery reads 0,6,12,18
    item = importer.map_beat_entry(
        "grab", {"task": "t", "schedule": crontab(hour="0, 6, 12, 18", minute=30)}, "UTC"
    )
    assert item.spec["cron"] == "30 0,6,12,18 * * *"
    assert parse_cron(item.spec["cron"], "UTC").expr == "30 0,6,12,18 * * *"


def test_an_entry_without_a_task_is_reported():
    item = importer.map_beat_entry("x", {"schedule": 60}, "UTC")
    assert item.problem == "an entry needs a 'task' and a 'schedule'"


class _FirstRunLater(schedule):
    """Like MIT ODL's OffsettingSchedule: the first run is offset, then a plain interval."""

    def is_due(self, last_run_at):  # type: ignore[no-untyped-def]
        return super().is_due(last_run_at)


class _OwnZoneCrontab(crontab):
    """Like django-celery-beat's TzAwareCrontab: due by a clock of its own."""

    def remaining_estimate(self, last_run_at, ffwd=None):  # type: ignore[no-untyped-def]
        return super().remaining_estimate(last_run_at)


class _RenamedCrontab(crontab):
    """A subclass that changes nothing about timing."""


def test_subclasses_that_time_themselves_are_reported_not_mapped_as_their_base():
    for value in (_FirstRunLater(run_every=60), _OwnZoneCrontab(minute=0)):
        item = importer.map_beat_entry("x", {"task": "t", "schedule": value}, "UTC")
        assert item.spec == {}
        assert item.problem is not None
        assert f"{type(value).__name__} decides when it is due by its own code" in item.problem


def test_a_subclass_that_keeps_celerys_timing_maps_like_its_base():
    item = importer.map_beat_entry("x", {"task": "t", "schedule": _RenamedCrontab(minute=5)}, "UTC")
    assert item.problem is None
    assert item.spec["cron"] == "5 * * * *"


HOURLY = {"task": "t", "schedule": crontab(minute=0)}
MISFIRE = ("misfire_policy", "misfire_grace")


def test_a_crontab_under_beat_cron_starting_deadline_runs_a_missed_run_only_within_it():
    item = importer.map_beat_entry("x", HOURLY, "UTC", deadline=600)
    assert item.problem is None
    assert [item.spec[key] for key in MISFIRE] == ["run_recent", timedelta(seconds=600)]
    unset = importer.map_beat_entry("x", HOURLY, "UTC", deadline=None)  # Celery's default
    assert not set(MISFIRE) & set(unset.spec)  # the job's defaults: run_once, as before


def test_the_deadline_is_read_from_the_celery_apps_configuration(settings):
    settings.CELERY_BEAT_CRON_STARTING_DEADLINE = 90.5
    item = importer.map_beat_entry("x", HOURLY, "UTC")
    assert [item.spec[key] for key in MISFIRE] == ["run_recent", timedelta(seconds=90.5)]


@pytest.mark.parametrize(
    "entry",
    [
        {"schedule": 60},
        {"schedule": schedule(run_every=60)},
        {"schedule": timedelta(days=1), "relative": True},  # a cron, but no crontab
        {"schedule": solar("sunset", 48.85, 2.35)},
    ],
    ids=["number", "schedule", "relative-day", "solar"],
)
def test_the_deadline_leaves_schedules_other_than_crontab_alone(entry):
    """Celery reads it in crontab.is_due only."""
    item = importer.map_beat_entry("x", {"task": "t", **entry}, "UTC", deadline=600)
    assert item.problem is None and not set(MISFIRE) & set(item.spec)
    assert importer.map_beat_entry("x", {"task": "t", **entry}, "UTC", deadline="x").spec


@pytest.mark.parametrize(
    "deadline", ["600", -1, float("nan"), float("inf"), True, 366 * 86400, timedelta(minutes=10)]
)
def test_a_deadline_celery_could_not_use_is_reported_on_each_crontab(deadline):
    item = importer.map_beat_entry("x", HOURLY, "UTC", deadline=deadline)
    assert item.problem is not None
    assert item.problem.startswith("beat_cron_starting_deadline must be a number of seconds")


NOW = datetime(2026, 1, 15, 10, 17, 3, tzinfo=UTC)


def test_relative_anchors_intervals_at_celerys_boundary_and_is_ignored_on_a_crontab():
    every = importer.map_beat_entry(
        "x", {"task": "t", "schedule": timedelta(minutes=5), "relative": True}, "UTC", NOW
    )
    assert every.spec["interval"] == timedelta(minutes=5)
    assert every.spec["interval_anchor"] == datetime(2026, 1, 15, 10, 22, tzinfo=UTC)
    tab = importer.map_beat_entry(
        "x", {"task": "t", "schedule": crontab(minute="*/20"), "relative": True}, "UTC", NOW
    )
    assert tab.notes == [] and "interval_anchor" not in tab.spec


def test_a_schedule_objects_own_relative_flag_is_the_one_celery_uses():
    own = importer.map_beat_entry(
        "x", {"task": "t", "schedule": schedule(run_every=300, relative=True)}, "UTC", NOW
    )
    assert own.spec["interval_anchor"] == datetime(2026, 1, 15, 10, 22, tzinfo=UTC)
    entry_only = importer.map_beat_entry(
        "x", {"task": "t", "schedule": schedule(run_every=300), "relative": True}, "UTC", NOW
    )
    assert "interval_anchor" not in entry_only.spec  # beat keeps the object: no rounding


def test_first_sunday_of_the_month_keeps_celerys_and():
    """Imported as an OR, day_of_week=0 with day_of_month=1-7 ran on every one of days 1-7
    and on every Sunday: 45 extra runs out of 50."""
    from schedapp.models import schedule_of
    from schedapp.schedules import fire_times

    item = importer.map_beat_entry(
        "x", {"task": "t", "schedule": crontab(0, 9, day_of_week=0, day_of_month="1-7")}, "UTC"
    )
    assert item.spec["cron_day_or"] is False
    times = list(fire_times(schedule_of(item.spec), NOW, limit=12))
    assert all(t.weekday() == 6 and t.day <= 7 for t in times)  # first Sundays only
    assert len({(t.year, t.month) for t in times}) == 12


def test_a_solar_entry_maps_to_a_solar_job():
    from celery.schedules import solar

    item = importer.map_beat_entry(
        "x", {"task": "t", "schedule": solar("sunset", -37.81, 144.96)}, "UTC", NOW
    )
    assert item.problem is None
    assert item.spec["solar_event"] == "sunset"
    assert (item.spec["latitude"], item.spec["longitude"]) == (-37.81, 144.96)


def test_a_custom_subclass_is_refused_with_a_clear_message_not_turned_into_an_interval():
    class OffsettingSchedule(schedule):
        def __init__(self, run_every, offset):
            super().__init__(run_every=run_every)
            self.offset = offset

        def is_due(self, last_run_at):
            return super().is_due(last_run_at)

    value = OffsettingSchedule(timedelta(minutes=30), timedelta(minutes=15))
    item = importer.map_beat_entry("x", {"task": "t", "schedule": value}, "UTC", NOW)
    assert item.problem is not None and "OffsettingSchedule" in item.problem
    assert "refuses" in item.problem and not item.spec


zone_app: Any = None  # the Celery app SCHEDAPP_CELERY_APP names in the zone tests


@pytest.fixture
def celery_app_named(settings: Any, monkeypatch: pytest.MonkeyPatch) -> Callable[..., Any]:
    """Makes a new Celery app, configured from Django's settings (namespace CELERY) as the
    project's is or only in code, and names it in SCHEDAPP_CELERY_APP."""

    def make(from_django: bool, **conf: Any) -> Any:
        app = Celery("zones", set_as_current=False)
        if from_django:
            app.config_from_object("django.conf:settings", namespace="CELERY")
        app.conf.update(conf)
        monkeypatch.setattr(sys.modules[__name__], "zone_app", app)
        return app

    settings.SCHEDAPP_CELERY_APP = f"{__name__}:zone_app"
    return make


@pytest.mark.parametrize(
    ("from_django", "celery_timezone", "zone"),
    [
        (False, None, "UTC"),  # enable_utc, nothing set: UTC whatever Django's TIME_ZONE
        (True, None, "Europe/Paris"),  # Celery's conf.timezone falls back to TIME_ZONE
        (False, "America/New_York", "America/New_York"),
        (True, "America/New_York", "America/New_York"),
    ],
)
def test_a_crontab_runs_in_the_zone_celerys_own_beat_uses_for_the_app(
    settings, celery_app_named, from_django, celery_timezone, zone
):
    """crontab(hour=7, minute=30) fires at 07:30 in Celery's ``app.timezone`` (the oracle, of
    a new app so not cached), whatever Django's TIME_ZONE says beside it."""
    from schedapp.models import schedule_of
    from schedapp.schedules import fire_times

    settings.TIME_ZONE = "Europe/Paris"
    del settings.CELERY_TIMEZONE  # the project sets it to TIME_ZONE
    if celery_timezone and from_django:
        settings.CELERY_TIMEZONE = celery_timezone
    conf = {"timezone": celery_timezone} if celery_timezone and not from_django else {}
    app = celery_app_named(from_django, **conf)
    spec, problem = importer.map_celery_schedule(crontab(hour=7, minute=30))
    assert problem is None
    assert spec["timezone"] == app.timezone.key == zone
    (first,) = fire_times(schedule_of(spec), NOW, limit=1)
    local = NOW.astimezone(ZoneInfo(zone))
    day = local.date() if local.hour < 7 else local.date() + timedelta(days=1)
    assert first == datetime(day.year, day.month, day.day, 7, 30, tzinfo=ZoneInfo(zone))


def test_a_crontab_without_utc_or_a_zone_runs_in_local_time_which_is_djangos_time_zone(
    settings, celery_app_named
):
    """enable_utc=False and no zone Celery can see: Celery uses the local time zone, which
    under Django is TIME_ZONE (Django sets TZ from it)."""
    settings.TIME_ZONE = "Europe/Paris"
    celery_app_named(False, enable_utc=False)
    assert importer.map_celery_schedule(crontab(hour=7))[0]["timezone"] == "Europe/Paris"


def test_time_limits_in_an_entrys_options_are_carried_as_message_options():
    """Beat schedules often give apply_async time limits; they were reported as ignored and
    the job ran without them."""
    item = importer.map_beat_entry(
        "crunch",
        {
            "task": "t",
            "schedule": 600,
            "options": {"time_limit": 300, "soft_time_limit": 240.5, "queue": "slow"},
        },
        "UTC",
    )
    assert item.problem is None
    assert item.spec["message_options"] == {
        "queue": "slow",
        "time_limit": 300,
        "soft_time_limit": 240.5,
    }
    assert (item.ignored, item.notes) == ([], [])


def test_the_time_limits_a_job_may_carry_are_checked_as_celery_takes_them():
    from schedapp.option_rules import message_options_verdict

    assert message_options_verdict({"time_limit": 60, "soft_time_limit": 50})[1] is None
    for bad in (0, -1, "60", True, float("inf")):
        assert "time_limit" in (message_options_verdict({"time_limit": bad})[1] or ""), bad
