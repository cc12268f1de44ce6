"""Importing Celery beat's schedule and django-celery-beat's periodic tasks."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime, timedelta
from io import StringIO
from zoneinfo import ZoneInfo

import pytest
from celery.schedules import crontab, schedule, solar
from django.core.management import call_command
from django.test import override_settings

from schedapp import importer, lease
from schedapp.db import db_now
from schedapp.models import Job, JobSource, JobState

pytestmark = [pytest.mark.django_db]

BEAT_SCHEDULE = {
    "weekday-report": {
        "task": "project.tasks.record",
        "schedule": crontab(minute=0, hour=7, day_of_week="mon-fri"),
        "args": ("report",),
        "options": {"queue": "reports", "priority": 5, "expires": 30},
    },
    "twice-hourly": {
        "task": "project.tasks.record",
        "schedule": crontab(minute=[0, 30]),
        "kwargs": {"label": "half"},
    },
    "every-ten-seconds": {"task": "project.tasks.noop", "schedule": 10.0},
    "every-five-minutes": {"task": "project.tasks.noop", "schedule": timedelta(minutes=5)},
    "schedule-object": {"task": "project.tasks.noop", "schedule": schedule(run_every=90)},
    "at-dawn": {"task": "project.tasks.noop", "schedule": solar("dawn_civil", 48.85, 2.35)},
    "no-task": {"schedule": 60},
    "unknown-task": {"task": "project.tasks.missing", "schedule": 60},
}


def run(*args: str) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command("schedapp_import", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_crontab_expressions_keep_the_original_fields():
    assert importer.crontab_expression(crontab(minute=0, hour="*/3", day_of_week="mon-fri")) == (
        "0 */3 * * mon-fri"
    )
    assert importer.crontab_expression(crontab(minute={30, 0}, hour=[2, 1])) == "0,30 1,2 * * *"
    assert importer.crontab_expression(crontab()) == "* * * * *"


def test_import_from_celery_beat_schedule_maps_crontab_timedelta_and_numbers():
    with override_settings(CELERY_BEAT_SCHEDULE=BEAT_SCHEDULE, CELERY_TIMEZONE="Europe/Paris"):
        out, err = run()

    jobs = {job.name: job for job in Job.objects.all()}
    assert set(jobs) == {
        "weekday-report",
        "twice-hourly",
        "every-ten-seconds",
        "every-five-minutes",
        "schedule-object",
        "at-dawn",
    }
    report = jobs["weekday-report"]
    assert (report.cron, report.args, report.cron_day_or, report.message_options) == (
        "0 7 * * mon-fri",
        ["report"],
        False,  # Celery's crontab
        {"queue": "reports", "priority": 5, "expires": 30},  # as apply_async takes them
    )
    assert report.priority == 0  # the claim priority is not the message's
    assert report.source == JobSource.IMPORTED and report.state == JobState.SCHEDULED
    assert report.next_run_at.astimezone(ZoneInfo(report.timezone)).hour == 7
    assert jobs["twice-hourly"].cron == "0,30 * * * *"
    assert jobs["twice-hourly"].kwargs == {"label": "half"}
    assert jobs["every-ten-seconds"].interval == timedelta(seconds=10)
    assert jobs["every-five-minutes"].interval == timedelta(minutes=5)
    assert jobs["schedule-object"].interval == timedelta(seconds=90)
    # Reported: what could not be mapped, and why
    assert (jobs["at-dawn"].solar_event, jobs["at-dawn"].latitude) == ("dawn_civil", 48.85)
    assert "NOT MAPPED no-task: an entry needs a 'task'" in err
    assert "INVALID unknown-task: task: task 'project.tasks.missing' is not registered" in err
    assert "6 created, 0 updated, 0 skipped, 1 not mapped, 1 invalid" in out


def test_crontab_jobs_take_the_celery_app_time_zone():
    with override_settings(CELERY_BEAT_SCHEDULE={"x": BEAT_SCHEDULE["weekday-report"]}):
        run()
    from schedapp.celeryapp import celery_app

    expected = str(celery_app().conf.timezone or "UTC")
    assert Job.objects.get(name="x").timezone == getattr(expected, "key", expected)


def test_import_is_idempotent_by_name_and_update_follows_changes():
    with override_settings(CELERY_BEAT_SCHEDULE=BEAT_SCHEDULE):
        run()
        before = {j.name: (j.pk, j.next_run_at) for j in Job.objects.all()}
        out, _ = run()
    assert "0 created, 0 updated, 6 skipped" in out
    assert {j.name: (j.pk, j.next_run_at) for j in Job.objects.all()} == before

    changed = {**BEAT_SCHEDULE, "every-ten-seconds": {"task": "project.tasks.noop", "schedule": 20}}
    with override_settings(CELERY_BEAT_SCHEDULE=changed):
        out, _ = run("--update")
    assert "updated: every-ten-seconds" in out
    assert Job.objects.get(name="every-ten-seconds").interval == timedelta(seconds=20)
    assert Job.objects.get(name="weekday-report").next_run_at == before["weekday-report"][1]
    assert "unchanged: weekday-report" in out


def test_update_of_an_unchanged_interval_entry_keeps_its_phase():
    """The entry gives no phase: re-importing it must not move the job's to now."""
    entries = {"ten-minutes": {"task": "project.tasks.noop", "schedule": timedelta(minutes=10)}}
    with override_settings(CELERY_BEAT_SCHEDULE=entries):
        run()
        job = Job.objects.get(name="ten-minutes")
        before = (job.interval_anchor, job.next_run_at, job.updated_at)
        for _ in range(2):
            out, _ = run("--update")
            assert "unchanged: ten-minutes" in out and "0 updated" in out
    job.refresh_from_db()
    assert (job.interval_anchor, job.next_run_at, job.updated_at) == before


def test_a_malformed_entry_is_not_mapped_and_the_others_are_imported():
    """Celery refuses args that are not a list or tuple: an import must not guess."""
    entries = {
        "fine": {"task": "project.tasks.record", "schedule": 60, "args": ["a"]},
        "comma": {"task": "project.tasks.record", "schedule": 60, "args": ("hello")},
        "nan": {"task": "project.tasks.record", "schedule": float("nan")},
    }
    with override_settings(CELERY_BEAT_SCHEDULE=entries):
        _, err = run()
    assert list(Job.objects.values_list("name", "args")) == [("fine", ["a"])]
    assert "NOT MAPPED comma: args must be a list or a tuple" in err
    assert "NOT MAPPED nan: schedule " in err


def test_update_never_touches_a_job_created_by_someone_else():
    from schedapp import api

    api.schedule("project.tasks.record", interval=3600, name="twice-hourly")
    with override_settings(CELERY_BEAT_SCHEDULE=BEAT_SCHEDULE):
        out, _ = run("--update")
    assert "skipped (a job with this name exists): twice-hourly" in out
    job = Job.objects.get(name="twice-hourly")
    assert (job.source, job.interval) == (JobSource.API, timedelta(hours=1))


def test_dry_run_writes_nothing():
    with override_settings(CELERY_BEAT_SCHEDULE=BEAT_SCHEDULE):
        out, _ = run("--dry-run")
    assert "would create: weekday-report" in out
    assert not Job.objects.exists()


# --- beat_cron_starting_deadline -------------------------------------------------------------


def missed_since(name: str, occurrence: datetime) -> Job:
    """The job as a beat finds it after an outage: due at ``occurrence``, long past."""
    Job.objects.filter(name=name).update(scheduled_for=occurrence, next_run_at=occurrence)
    return Job.objects.get(name=name)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("deadline", [None, 600])
def test_a_crontab_missed_beyond_the_cron_starting_deadline_is_skipped_as_celery_skips_it(deadline):
    """Celery's crontab is not due when its latest missed run is older than the deadline;
    without the setting, a missed run is sent once (run_once, as before)."""
    two_hours_ago = (db_now() - timedelta(hours=2)).replace(second=0, microsecond=0)
    entries = {
        "daily": {
            "task": "project.tasks.record",
            "schedule": crontab(minute=two_hours_ago.minute, hour=two_hours_ago.hour),
        }
    }
    with override_settings(
        CELERY_BEAT_SCHEDULE=entries,
        CELERY_TIMEZONE="UTC",
        CELERY_BEAT_CRON_STARTING_DEADLINE=deadline,
    ):
        run()
    missed_since("daily", two_hours_ago)

    result = lease.claim_due_jobs("beat-1", 10)

    job = Job.objects.get(name="daily")
    if deadline is None:
        assert [r.scheduled_for for r in result.runs] == [two_hours_ago]
        assert (job.misfire_policy, job.missed_runs) == ("run_once", 0)
        return
    assert (result.runs, result.skipped_misfires) == ([], 1)
    assert (job.state, job.missed_runs) == (JobState.SCHEDULED, 1)
    assert job.next_run_at == two_hours_ago + timedelta(days=1)


@pytest.mark.django_db(transaction=True)
def test_a_crontab_whose_latest_missed_run_is_within_the_deadline_runs_once_for_it():
    """Celery looks at the latest run the crontab could have had: within the deadline, it
    sends the task once, however many runs before it were missed."""
    entries = {"five": {"task": "project.tasks.record", "schedule": crontab(minute="*/5")}}
    with override_settings(
        CELERY_BEAT_SCHEDULE=entries, CELERY_TIMEZONE="UTC", CELERY_BEAT_CRON_STARTING_DEADLINE=600
    ):
        run()
    now = db_now()
    start = (now - timedelta(hours=2)).replace(second=0, microsecond=0)
    missed_since("five", start - timedelta(minutes=start.minute % 5))

    (claimed,) = lease.claim_due_jobs("beat-1", 10).runs

    latest = claimed.scheduled_for
    assert latest.minute % 5 == 0 and (latest.second, latest.microsecond) == (0, 0)
    assert timedelta(0) <= db_now() - latest < timedelta(minutes=5)
    assert Job.objects.get(name="five").missed_runs == 24  # two hours of runs, but the latest


# --- django-celery-beat ----------------------------------------------------------------------


@pytest.fixture
def periodic_tasks():
    dcb = pytest.importorskip("django_celery_beat.models")
    paris = dcb.CrontabSchedule.objects.create(
        minute="15", hour="2", day_of_week="1-5", timezone=ZoneInfo("Europe/Paris")
    )
    every = dcb.IntervalSchedule.objects.create(every=45, period=dcb.IntervalSchedule.SECONDS)
    hours = dcb.IntervalSchedule.objects.create(every=2, period=dcb.IntervalSchedule.HOURS)
    clocked = dcb.ClockedSchedule.objects.create(
        clocked_time=datetime(2031, 1, 2, 3, 4, 5, tzinfo=UTC)
    )
    sun = dcb.SolarSchedule.objects.create(event="sunset", latitude=48.85, longitude=2.35)
    create = dcb.PeriodicTask.objects.create
    create(
        name="dcb-cron",
        task="project.tasks.record",
        crontab=paris,
        kwargs=json.dumps({"label": "cron"}),
        queue="reports",
        priority=3,
    )
    create(
        name="dcb-interval", task="project.tasks.record", interval=every, args=json.dumps(["a", 1])
    )
    create(name="dcb-disabled", task="project.tasks.noop", interval=hours, enabled=False)
    create(name="dcb-clocked", task="project.tasks.noop", clocked=clocked, one_off=True)
    create(name="dcb-one-off-cron", task="project.tasks.noop", crontab=paris, one_off=True)
    create(name="dcb-solar", task="project.tasks.noop", solar=sun)
    create(name="dcb-bad-json", task="project.tasks.noop", interval=every, kwargs="{oops")
    create(
        name="dcb-ran-once",
        task="project.tasks.noop",
        clocked=clocked,
        one_off=True,
        total_run_count=1,
        enabled=False,
    )
    return dcb


def test_import_from_django_celery_beat_tables(periodic_tasks):
    out, err = run("--from-django-celery-beat")

    jobs = {job.name: job for job in Job.objects.all()}
    assert set(jobs) == {
        "dcb-cron",
        "dcb-interval",
        "dcb-disabled",
        "dcb-clocked",
        "dcb-one-off-cron",
        "dcb-solar",
    }
    cron = jobs["dcb-cron"]
    assert (cron.cron, cron.timezone, cron.kwargs, cron.queue, cron.message_options) == (
        "15 2 * * 1-5",
        "Europe/Paris",
        {"label": "cron"},
        "reports",
        {"priority": 3},  # django-celery-beat's priority is the message's
    )
    assert cron.cron_day_or is False
    assert cron.source == JobSource.IMPORTED
    local = cron.next_run_at.astimezone(ZoneInfo("Europe/Paris"))
    assert (local.hour, local.minute) == (2, 15) and local.isoweekday() <= 5
    assert jobs["dcb-interval"].interval == timedelta(seconds=45)
    assert jobs["dcb-interval"].args == ["a", 1]
    assert jobs["dcb-disabled"].state == JobState.PAUSED
    assert jobs["dcb-disabled"].interval == timedelta(hours=2)
    assert jobs["dcb-clocked"].run_at == datetime(2031, 1, 2, 3, 4, 5, tzinfo=UTC)
    one_off = jobs["dcb-one-off-cron"]
    assert one_off.run_at is not None and one_off.cron == ""
    assert one_off.run_at.astimezone(ZoneInfo("Europe/Paris")).strftime("%H:%M") == "02:15"
    assert jobs["dcb-solar"].schedule_kind == "solar"
    assert "NOT MAPPED dcb-bad-json: kwargs is not valid JSON" in err
    assert "not imported, already ran: dcb-ran-once: a one-off task that already ran" in out

    # Idempotent: a second import changes nothing
    out, _ = run("--from-django-celery-beat")
    assert "0 created, 0 updated, 6 skipped" in out
    assert Job.objects.count() == 6


def test_django_celery_beat_crontabs_take_the_deadline_too(periodic_tasks):
    """Its DatabaseScheduler runs Celery's crontab.is_due, which reads the setting."""
    with override_settings(CELERY_BEAT_CRON_STARTING_DEADLINE=300):
        run("--from-django-celery-beat")
    policies = dict(Job.objects.values_list("name", "misfire_policy"))
    assert policies.pop("dcb-cron") == "run_recent"
    assert Job.objects.get(name="dcb-cron").misfire_grace == timedelta(minutes=5)
    assert set(policies.values()) == {"run_once"}  # intervals, solar, one-offs


@override_settings(SCHEDAPP_DEFAULT_CATCHUP_WINDOW=timedelta(minutes=2))
def test_imported_jobs_have_no_catch_up_window_as_under_celery_whatever_the_default(
    periodic_tasks,
):
    """Celery beat has no window; the default one is shorter than the crontab's deadline
    (its misfire grace), which would make the job invalid had it been given."""
    with override_settings(CELERY_BEAT_CRON_STARTING_DEADLINE=300):
        out, err = run("--from-django-celery-beat")
    assert "6 created" in out and "NOT MAPPED dcb-cron" not in err
    assert set(Job.objects.values_list("catchup_window", flat=True)) == {None}


def test_both_sources_in_one_step(periodic_tasks):
    with override_settings(
        CELERY_BEAT_SCHEDULE={"beat-one": {"task": "project.tasks.noop", "schedule": 30}}
    ):
        run("--from-settings", "--from-django-celery-beat")
    assert Job.objects.filter(name__in=["beat-one", "dcb-cron"]).count() == 2


def test_the_task_allowlist_applies_to_imports_too():
    schedule_ = {
        "allowed": {"task": "project.tasks.record", "schedule": 60},
        "forbidden": {"task": "project.tasks.noop", "schedule": 60},
    }
    with override_settings(
        CELERY_BEAT_SCHEDULE=schedule_, SCHEDAPP_ALLOWED_TASKS=["project.tasks.record"]
    ):
        out, err = run()
    assert set(Job.objects.values_list("name", flat=True)) == {"allowed"}
    assert "not allowed" in out + err


# --- issue 29: what a switch from django-celery-beat must keep -------------------------------

BERLIN = ZoneInfo("Europe/Berlin")


@pytest.fixture
def schedapp_logs(monkeypatch: pytest.MonkeyPatch) -> list[logging.LogRecord]:
    """schedapp's log records, as its loggers hand them to their handlers. Not caplog: the
    logger does not propagate to pytest's, and loading the tasks modules configures Django's
    logging again, which takes a handler put on it away."""
    records: list[logging.LogRecord] = []
    call_handlers = logging.Logger.callHandlers

    def keep(self: logging.Logger, record: logging.LogRecord) -> None:
        if record.name.startswith("schedapp"):
            records.append(record)
        call_handlers(self, record)

    monkeypatch.setattr(logging.Logger, "callHandlers", keep)
    return records


def test_a_django_celery_beat_interval_keeps_its_phase_from_last_run_at():
    """A daily task last sent at 03:00 Berlin ran at the import's time of day after it."""
    dcb = pytest.importorskip("django_celery_beat.models")
    daily = dcb.IntervalSchedule.objects.create(every=1, period=dcb.IntervalSchedule.DAYS)
    local = (db_now() - timedelta(days=2)).astimezone(BERLIN)
    last = datetime(local.year, local.month, local.day, 3, tzinfo=BERLIN)
    dcb.PeriodicTask.objects.create(
        name="nightly", task="project.tasks.noop", interval=daily, last_run_at=last
    )

    out, _ = run("--from-django-celery-beat")

    job = Job.objects.get(name="nightly")
    assert job.interval_anchor == last
    assert (job.next_run_at - last) % timedelta(days=1) == timedelta(0)  # 03:00's phase
    assert db_now() < job.next_run_at <= db_now() + timedelta(days=1)
    assert "note nightly: phase kept from django-celery-beat's last_run_at" in out


def test_a_one_off_django_celery_beat_already_sent_is_not_imported_as_pending():
    """django-celery-beat disables a one-off once sent and resets its total_run_count and
    last_run_at: imported as a paused job due in the past, a resume sent it again."""
    dcb = pytest.importorskip("django_celery_beat.models")
    past = dcb.ClockedSchedule.objects.create(clocked_time=db_now() - timedelta(hours=5))
    future = dcb.ClockedSchedule.objects.create(clocked_time=db_now() + timedelta(days=5))
    create = dcb.PeriodicTask.objects.create
    create(name="sent", task="project.tasks.noop", clocked=past, one_off=True, enabled=False)
    create(name="held", task="project.tasks.noop", clocked=future, one_off=True, enabled=False)
    create(name="late", task="project.tasks.noop", clocked=past, one_off=True)  # never sent

    out, err = run("--from-django-celery-beat", "--strict")

    assert set(Job.objects.values_list("name", "state")) == {
        ("held", JobState.PAUSED),  # disabled before its time: paused, as it was
        ("late", JobState.SCHEDULED),  # enabled and past: django-celery-beat would send it
    }
    assert "not imported, already ran: sent: a one-off task that already ran" in out
    assert "1 already ran" in out and err == ""


def test_django_celery_beat_copies_of_beat_schedule_entries_are_left_to_the_entries():
    """django-celery-beat copies CELERY_BEAT_SCHEDULE into its table at each start: imported,
    each copy took the name of an entry schedapp's beats sync, and edits of the entry were
    ignored from then on."""
    dcb = pytest.importorskip("django_celery_beat.models")
    every = dcb.IntervalSchedule.objects.create(every=30, period=dcb.IntervalSchedule.SECONDS)
    create = dcb.PeriodicTask.objects.create
    create(name="beat-one", task="project.tasks.noop", interval=every)
    create(name="admin-made", task="project.tasks.noop", interval=every)
    entries = {"beat-one": {"task": "project.tasks.noop", "schedule": 30}}

    with override_settings(CELERY_BEAT_SCHEDULE=entries):
        out, err = run("--from-django-celery-beat", "--strict")

    assert list(Job.objects.values_list("name", flat=True)) == ["admin-made"]
    assert (
        "not imported, in CELERY_BEAT_SCHEDULE: beat-one: a copy of the CELERY_BEAT_SCHEDULE "
        "entry" in out
    )
    assert err == ""


def test_a_declared_name_taken_by_an_imported_job_is_named_at_sync_and_in_check(schedapp_logs):
    """Imported first, entries of CELERY_BEAT_SCHEDULE (or SCHEDAPP_JOBS) hold their names:
    each beat start logged '2 name conflicts' without naming them, check was silent, and
    edits of those entries were ignored."""
    from schedapp import checks, declared

    jobs = {
        "report": {"task": "project.tasks.record", "cron": "0 7 * * *"},
        "cleanup": {"task": "project.tasks.noop", "interval": 3600},
        "fresh": {"task": "project.tasks.noop", "interval": 60},
    }
    entries = {name: {"task": spec["task"], "schedule": 60} for name, spec in jobs.items()}
    with override_settings(CELERY_BEAT_SCHEDULE=entries):
        run()  # imported jobs now hold "report", "cleanup" and "fresh"
    Job.objects.filter(name="fresh").delete()

    with override_settings(SCHEDAPP_JOBS=jobs):
        report = declared.sync_declared_jobs()
    assert str(report) == (
        "declared jobs: 1 created, 0 updated, 0 paused, 0 unchanged, "
        "2 name conflicts (cleanup, report)"
    )
    warned = [r.getMessage() for r in schedapp_logs if r.levelname == "WARNING"]
    assert any("'report'" in m and "imported" in m and "not synced" in m for m in warned)

    Job.objects.filter(name="fresh").delete()
    with override_settings(SCHEDAPP_JOBS=jobs):
        found = checks.check_declared_names(databases=["default"])
        assert checks.check_declared_names() == []  # Django's rule: no database asked for
        err = StringIO()
        call_command("check", "--database", "default", stderr=err)
    assert [(m.id, m.obj) for m in found] == [
        ("schedapp.W012", "cleanup"),
        ("schedapp.W012", "report"),
    ]
    assert "imported" in found[0].msg and "schedapp_import" in found[0].hint
    assert "schedapp.W012" in err.getvalue()


def test_the_beat_logs_the_declared_jobs_report_without_a_doubled_prefix(schedapp_logs):
    from schedapp import beat
    from schedapp.celeryapp import celery_app

    scheduler = beat.LeaseScheduler(celery_app(), lazy=True)
    scheduler._sync_declared_jobs()
    lines = [r.getMessage() for r in schedapp_logs if "declared jobs" in r.getMessage()]
    assert lines and not any("declared jobs: declared jobs" in line for line in lines)


def test_dry_run_shows_each_entry_and_consumes_no_job_ids():
    from schedapp import api

    before = api.schedule("project.tasks.noop", interval=60, name="before").pk
    with override_settings(CELERY_BEAT_SCHEDULE=BEAT_SCHEDULE, CELERY_TIMEZONE="Europe/Paris"):
        out, _ = run("--dry-run")
    after = api.schedule("project.tasks.noop", interval=60, name="after").pk
    assert after == before + 1  # nothing inserted and rolled back
    assert set(Job.objects.values_list("name", flat=True)) == {"before", "after"}

    block = out.split("would create: weekday-report\n")[1].split("would create:")[0]
    assert "schedule: At 07:00, Monday through Friday (Europe/Paris)" in block
    assert "zone: Europe/Paris" in block
    nexts = [line for line in block.splitlines() if line.strip().startswith("next:")]
    assert len(nexts) == 1 and nexts[0].count("07:00:00 CE") == 3
    assert "message options: queue=reports, priority=5, expires=30" in block
    assert "task: project.tasks.record args ['report']" in block


def test_dry_run_says_what_a_failure_does_as_the_import_would_set_it():
    """The importers default to Celery beat's failures (no retry, the next occurrence runs);
    a dry run, read before migrating, says so for each entry, and what --retries asks for."""
    with override_settings(CELERY_BEAT_SCHEDULE=BEAT_SCHEDULE):
        out, _ = run("--dry-run")
        block = out.split("would create: weekday-report\n")[1].split("would create:")[0]
        assert "on failure: no retry; the next occurrence runs (as under Celery beat)" in block
        out, _ = run("--dry-run", "--retries", "2", "--on-exhausted", "dead")
        block = out.split("would create: weekday-report\n")[1].split("would create:")[0]
        assert "on failure: up to 2 retries, then the job is dead (a dead letter)" in block


def test_dry_run_of_an_update_shows_the_diff():
    with override_settings(CELERY_BEAT_SCHEDULE=BEAT_SCHEDULE):
        run()
    changed = {
        **BEAT_SCHEDULE,
        "every-ten-seconds": {
            "task": "project.tasks.noop",
            "schedule": 20,
            "options": {"priority": 4},
        },
    }
    with override_settings(CELERY_BEAT_SCHEDULE=changed):
        out, _ = run("--update", "--dry-run")
    block = out.split("would update: every-ten-seconds\n")[1]
    assert "schedule: Every 10 seconds -> Every 20 seconds" in block
    assert "message options: (none) -> priority=4" in block
    assert Job.objects.get(name="every-ten-seconds").interval == timedelta(seconds=10)


def test_a_dry_run_says_a_disabled_task_would_be_paused(periodic_tasks):
    out, _ = run("--from-django-celery-beat", "--dry-run")
    block = out.split("would create: dcb-disabled\n")[1].split("would create:")[0]
    assert "paused: disabled in django-celery-beat" in block
    assert not Job.objects.exists()


def test_time_limits_in_an_entrys_options_reach_its_messages():
    """apply_async's time_limit and soft_time_limit, in the options of many beat schedules,
    were dropped: the job's messages had the task's own limits (none here)."""
    from project.celery import app
    from schedapp.dispatch import resolve_route

    entries = {
        "crunch": {
            "task": "project.tasks.record",
            "schedule": 600,
            "options": {"time_limit": 300, "soft_time_limit": 240},
        }
    }
    with override_settings(CELERY_BEAT_SCHEDULE=entries):
        out, err = run("--strict")

    crunch = Job.objects.get(name="crunch")
    route = resolve_route(app, crunch.task, crunch.queue, json.dumps(crunch.message_options))
    assert (route.time_limit, route.soft_time_limit) == (300, 240)  # the message's timelimit
    assert "ignored" not in out + err


def test_a_django_celery_beat_description_is_carried_over(periodic_tasks):
    periodic_tasks.PeriodicTask.objects.filter(name="dcb-cron").update(
        description="Nightly report for the finance team"
    )
    run("--from-django-celery-beat")
    assert Job.objects.get(name="dcb-cron").description == "Nightly report for the finance team"
    assert Job.objects.get(name="dcb-interval").description == ""


def test_a_description_is_checked_as_any_field():
    from django.core.exceptions import ValidationError

    from schedapp import api

    for bad, message in ((5, "must be a string"), ("a\x00b", "NUL"), ("x" * 10_001, "at most")):
        with pytest.raises(ValidationError) as caught:
            api.schedule("project.tasks.noop", interval=60, description=bad)
        assert message in " ".join(caught.value.message_dict["description"])
    job = api.schedule("project.tasks.noop", interval=60, name="d", description=None)
    assert api.update(job.pk, description="what it is for").description == "what it is for"


def test_celery_beats_own_backend_cleanup_row_is_left_to_housekeeping():
    """django-celery-beat keeps Celery beat's celery.backend_cleanup as a row: the import
    reported it INVALID (celery.* is not allowed), and --strict failed, for work schedapp's
    housekeeping (schedapp-cleanup-results) already does."""
    dcb = pytest.importorskip("django_celery_beat.models")
    four = dcb.CrontabSchedule.objects.create(minute="0", hour="4")
    dcb.PeriodicTask.objects.create(
        name="celery.backend_cleanup", task="celery.backend_cleanup", crontab=four
    )

    out, err = run("--from-django-celery-beat", "--strict")

    assert not Job.objects.exists() and err == ""
    assert (
        "not imported, done by schedapp's housekeeping: celery.backend_cleanup: Celery beat's "
        "own celery.backend_cleanup" in out
    )


def test_update_keeps_an_interval_whose_last_run_moved_by_whole_intervals_unchanged():
    """django-celery-beat still running during the switch moves last_run_at on by one
    interval per run: the phase is the same, so --update has nothing to change."""
    dcb = pytest.importorskip("django_celery_beat.models")
    hourly = dcb.IntervalSchedule.objects.create(every=1, period=dcb.IntervalSchedule.HOURS)
    last = (db_now() - timedelta(hours=3)).replace(minute=17, second=0, microsecond=0)
    task = dcb.PeriodicTask.objects.create(
        name="hourly", task="project.tasks.noop", interval=hourly, last_run_at=last
    )
    run("--from-django-celery-beat")
    before = Job.objects.values_list("interval_anchor", "next_run_at").get(name="hourly")
    dcb.PeriodicTask.objects.filter(pk=task.pk).update(last_run_at=last + timedelta(hours=2))

    out, _ = run("--from-django-celery-beat", "--update")

    assert "unchanged: hourly" in out
    assert Job.objects.values_list("interval_anchor", "next_run_at").get(name="hourly") == before
    dcb.PeriodicTask.objects.filter(pk=task.pk).update(last_run_at=last + timedelta(minutes=30))
    out, _ = run("--from-django-celery-beat", "--update")
    assert "updated: hourly" in out  # a new phase is a change


def test_a_crontab_out_of_range_is_reported_naming_the_cron_fields():
    dcb = pytest.importorskip("django_celery_beat.models")
    bad = dcb.CrontabSchedule.objects.create(minute="61", hour="25")
    dcb.PeriodicTask.objects.create(name="dcb-61-25", task="project.tasks.record", crontab=bad)
    _, err = run("--from-django-celery-beat")
    (line,) = [line for line in err.splitlines() if "dcb-61-25" in line]
    assert "cron: '61 25 * * *' is not a valid cron expression: minute 61 is out of range" in line
    assert "hour 25 is out of range (0-23)" in line
    assert not Job.objects.filter(name="dcb-61-25").exists()
