"""The Python API: validation errors name the field and write nothing; state operations."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from zoneinfo import ZoneInfo

import pytest
from celery import shared_task
from django.core.exceptions import ValidationError
from django.test import override_settings

from schedapp import api, lease
from schedapp.db import db_now
from schedapp.exceptions import JobStateError
from schedapp.models import Job, JobRun, JobState, RunStatus
from schedapp.schedules import next_fire_time, parse_cron

pytestmark = pytest.mark.django_db(transaction=True)

TASK = "project.tasks.record"
SOON = datetime(2030, 1, 1, tzinfo=UTC)
EAST = timezone(timedelta(hours=5))
WEST = timezone(timedelta(hours=-5))
LAST_HOUR = datetime(9999, 12, 31, 23, tzinfo=UTC)


def errors_of(call) -> dict[str, list[str]]:
    with pytest.raises(ValidationError) as info:
        call()
    assert Job.objects.count() == 0, "nothing may be written when validation fails"
    return info.value.message_dict


def errors_among_jobs(call) -> dict[str, list[str]]:
    """The errors of a call that fails, whatever else the database holds."""
    count = Job.objects.count()
    with pytest.raises(ValidationError) as info:
        call()
    assert Job.objects.count() == count
    return info.value.message_dict


@pytest.mark.parametrize(
    ("kwargs", "field", "fragment"),
    [
        ({"cron": "61 * * * *"}, "cron", "not a valid cron expression"),
        (
            {"cron": "61 25 * * *"},
            "cron",
            "minute 61 is out of range (0-59); hour 25 is out of range (0-23)",
        ),
        ({"cron": "* * * *"}, "cron", "has 4 fields"),
        ({"cron": "0 0 30 2 *"}, "cron", "never fires"),
        ({"cron": "0 9 * * 5#6"}, "cron", "day of week field: '5#6': #6 does not exist"),
        ({"cron": "0 0 9 * * LW"}, "cron", "day of week field: 'LW'"),
        ({"cron": "0 9 * L *"}, "cron", "month field: 'L'"),
        ({"cron": "0 9 LW,15 * *"}, "cron", "day of month field: 'LW' stands alone"),
        ({"cron": "0 9 * * L"}, "cron", "day of week field: 'L' alone"),
        ({"cron": "0 9 32W * *"}, "cron", "day of month 32 is out of range (1-31)"),
        ({"cron": "0 9 * * 8L"}, "cron", "day of week 8 is out of range (0-7)"),
        ({"cron": "0 9 * * 1,5#3"}, "cron", "day of week field: '1,5#3' is not valid"),
        ({"cron": "*/5 * * * *", "timezone": "Mars/Olympus_Mons"}, "timezone", "unknown time zone"),
        ({"run_at": datetime(2030, 1, 1)}, "run_at", "timezone-aware"),
        ({}, "run_at", "exactly one schedule"),
        ({"run_at": SOON, "cron": "* * * * *"}, "cron", "exactly one schedule"),
        ({"run_at": SOON, "interval": 5}, "interval", "exactly one schedule"),
        ({"interval": 0.5}, "interval", "at least one second"),
        ({"interval": -5}, "interval", "at least one second"),
        ({"run_at": SOON, "args": [object()]}, "args", "not JSON-serialisable"),
        ({"run_at": SOON, "args": [{1, 2}]}, "args", "set, which is not JSON"),
        ({"run_at": SOON, "kwargs": {"x": Decimal("1.5")}}, "kwargs", "Decimal"),
        ({"run_at": SOON, "kwargs": {"x": float("nan")}}, "kwargs", "JSON cannot carry"),
        ({"run_at": SOON, "kwargs": {"x": {1: "a"}}}, "kwargs", "non-string key"),
        ({"run_at": SOON, "kwargs": {"not an identifier": 1}}, "kwargs", "identifiers"),
        ({"run_at": SOON, "args": "abc"}, "args", "must be a list"),
        ({"run_at": SOON, "kwargs": [1]}, "kwargs", "must be a mapping"),
        ({"run_at": SOON, "args": ["a\x00b"]}, "args", "NUL"),
        ({"run_at": SOON, "max_retries": -1}, "max_retries", "negative"),
        ({"run_at": SOON, "jitter": -3}, "jitter", "negative"),
        ({"run_at": SOON, "lease_seconds": 0}, "lease_seconds", "out of range"),
        ({"run_at": SOON, "retry_backoff": -1}, "retry_backoff", "negative"),
        ({"run_at": SOON, "priority": True}, "priority", "whole number"),
        ({"run_at": SOON, "misfire_policy": "sometimes"}, "misfire_policy", "not one of"),
        ({"run_at": SOON, "name": ""}, "name", "non-empty"),
        ({"run_at": SOON, "queue": "has space"}, "queue", "without spaces"),
        ({"run_at": SOON, "surprise": 1}, "surprise", "unknown option"),
        ({"run_at": SOON, "catchup_window": 0}, "catchup_window", "more than 0"),
        ({"run_at": SOON, "catchup_window": timedelta(0)}, "catchup_window", "more than 0"),
        ({"run_at": SOON, "catchup_window": -3600}, "catchup_window", "more than 0"),
        ({"run_at": SOON, "catchup_window": 1e-7}, "catchup_window", "more than 0"),
        ({"run_at": SOON, "catchup_window": 30}, "catchup_window", "shorter than misfire_grace"),
        (
            {"run_at": SOON, "catchup_window": 120, "misfire_grace": 121},
            "catchup_window",
            "shorter than misfire_grace (0:02:01)",
        ),
        ({"run_at": SOON, "catchup_window": "1h"}, "catchup_window", "must be a duration"),
        ({"run_at": SOON, "catchup_window": True}, "catchup_window", "must be a duration"),
        ({"run_at": SOON, "catchup_window": float("nan")}, "catchup_window", "must be a duration"),
        ({"run_at": SOON, "catchup_window": 1e300}, "catchup_window", "must be a duration"),
        ({"run_at": SOON, "catchup_window": timedelta(days=366)}, "catchup_window", "a year"),
    ],
)
def test_bad_input_is_rejected_naming_the_field(kwargs, field, fragment):
    messages = errors_of(lambda: api.schedule(TASK, **kwargs))
    assert field in messages, messages
    assert any(fragment in m for m in messages[field]), messages[field]


@pytest.mark.parametrize(
    "cron", ["0 9 L * *", "0 9 LW * *", "0 0 9 15W * *", "0 9 * * FRI#2", "0 0 9 * * fril"]
)
def test_each_cron_day_form_is_scheduled_as_written_with_its_first_fire(cron):
    job = api.schedule(TASK, cron=cron, timezone="America/New_York", name=cron)
    job.refresh_from_db()
    assert job.cron == cron
    schedule = parse_cron(cron, "America/New_York")
    assert job.next_run_at == next_fire_time(schedule, job.created_at)


def test_an_unregistered_task_is_rejected():
    messages = errors_of(lambda: api.schedule("project.tasks.nope", run_at=SOON))
    assert "not registered" in messages["task"][0]


def test_a_task_outside_the_allowlist_is_rejected():
    with override_settings(SCHEDAPP_ALLOWED_TASKS=["project.tasks.add"]):
        messages = errors_of(lambda: api.schedule(TASK, run_at=SOON))
    assert "not allowed" in messages["task"][0]


def test_celery_internal_tasks_are_denied_by_default():
    messages = errors_of(lambda: api.schedule("celery.backend_cleanup", run_at=SOON))
    assert "not allowed" in messages["task"][0]


def test_payload_size_is_limited():
    with override_settings(SCHEDAPP_MAX_PAYLOAD_BYTES=1000):
        messages = errors_of(lambda: api.schedule(TASK, run_at=SOON, args=["x" * 2000]))
    assert "limit is 1000" in messages["args"][0]


def test_all_problems_are_reported_together():
    messages = errors_of(
        lambda: api.schedule("nope", cron="bad", max_retries=-2, timezone="Nowhere/Land")
    )
    assert {"task", "cron", "max_retries", "timezone"} <= set(messages)


def test_duplicate_names_are_rejected_and_nothing_else_changes():
    api.schedule(TASK, run_at=SOON, name="nightly")
    with pytest.raises(ValidationError) as info:
        api.schedule(TASK, run_at=SOON, name="nightly")
    assert "already exists" in info.value.message_dict["name"][0]
    assert Job.objects.count() == 1


def test_schedule_many_is_all_or_nothing_with_indexed_errors():
    specs = [{"task": TASK, "run_at": SOON, "name": f"j{i}"} for i in range(5)]
    specs[3]["cron"] = "* * * * *"
    with pytest.raises(ValidationError) as info:
        api.schedule_many(specs)
    assert "3.cron" in info.value.message_dict
    assert Job.objects.count() == 0
    specs[3].pop("cron")
    assert api.schedule_many(specs) == 5


def test_schedule_many_inserts_thousands_in_bulk(django_assert_max_num_queries):
    specs = ({"task": TASK, "interval": 60, "kwargs": {"i": i}} for i in range(3000))
    with django_assert_max_num_queries(12):
        created = api.schedule_many(specs)
    assert created == 3000 and Job.objects.count() == 3000


def test_first_run_times():
    now = db_now()
    past = api.schedule(TASK, run_at=now - timedelta(hours=1), name="past")
    assert past.next_run_at == now - timedelta(hours=1)  # due at the next tick
    every = api.schedule(TASK, interval=timedelta(minutes=5), name="every")
    assert now < every.next_run_at <= db_now() + timedelta(minutes=5)
    cron = api.schedule(TASK, cron="0 9 * * 1-5", timezone="Europe/Paris", name="cron")
    local = cron.next_run_at.astimezone(ZoneInfo("Europe/Paris"))
    assert (local.hour, local.minute) == (9, 0) and local.isoweekday() <= 5
    jittered = api.schedule(TASK, run_at=now, jitter=30, name="jittered")
    assert now <= jittered.next_run_at <= now + timedelta(seconds=30)
    assert jittered.scheduled_for == now


def test_update_replaces_the_schedule_and_recomputes_next_run():
    job = api.schedule(TASK, cron="0 0 1 1 *", name="yearly")
    updated = api.update(job, interval=10)
    assert (updated.cron, updated.interval) == ("", timedelta(seconds=10))
    assert updated.next_run_at <= db_now() + timedelta(seconds=10)
    with pytest.raises(ValidationError) as info:
        api.update(job.pk, cron="nonsense")
    assert "cron" in info.value.message_dict
    assert Job.objects.get(pk=job.pk).interval == timedelta(seconds=10)  # unchanged


def test_update_with_none_gives_an_option_the_default_schedule_would_have_given_it():
    # Given a job whose options were set, including an expiry window
    job = api.schedule(
        TASK,
        interval=60,
        name="opts",
        max_retries=7,
        priority=9,
        lease_seconds=120,
        expires_at=SOON,
    )
    # When an update passes None for them (as `schedule` reads None: "the default")
    updated = api.update(job, max_retries=None, priority=None, lease_seconds=None, expires_at=None)
    # Then each takes the default a new job gets, and the window is cleared
    fresh = api.schedule(TASK, interval=60, name="defaults")
    for field in ("max_retries", "priority", "lease_seconds", "expires_at"):
        assert getattr(updated, field) == getattr(fresh, field), field
        assert getattr(Job.objects.get(pk=job.pk), field) == getattr(fresh, field), field
    assert updated.expires_at is None
    # while None for the task itself is still an error naming it, and changes nothing
    with pytest.raises(ValidationError) as info:
        api.update(job, task=None, max_retries=5)
    assert "task" in info.value.message_dict
    assert Job.objects.get(pk=job.pk).max_retries == fresh.max_retries


def test_a_catch_up_window_is_stored_as_given_and_none_is_no_window():
    # Given jobs with a window as a timedelta, as seconds (int and float), and none
    given = {"delta": timedelta(hours=2), "int": 3600, "float": 90.5, "none": None}
    jobs = {k: api.schedule(TASK, interval=60, name=k, catchup_window=v) for k, v in given.items()}
    plain = api.schedule(TASK, interval=60, name="plain")
    # Then each is stored as a duration (None: no window, also the default)
    stored = dict(Job.objects.values_list("name", "catchup_window"))
    assert stored == {
        "delta": timedelta(hours=2),
        "int": timedelta(hours=1),
        "float": timedelta(seconds=90.5),
        "none": None,
        "plain": None,
    }
    assert jobs["int"].catchup_window == timedelta(hours=1) and plain.catchup_window is None
    # A window as long as the grace is accepted: the grace is the window's lower bound
    same = api.schedule(TASK, interval=60, name="same", misfire_grace=600, catchup_window=600)
    assert same.catchup_window == same.misfire_grace == timedelta(minutes=10)


def test_update_changes_or_removes_a_catch_up_window_and_checks_it_against_the_grace():
    job = api.schedule(TASK, interval=60, name="windowed", catchup_window=3600)
    assert api.update(job, catchup_window=7200).catchup_window == timedelta(hours=2)
    # None removes the window (it is not "the default" here: no window is a value)
    assert api.update(job, catchup_window=None).catchup_window is None
    assert Job.objects.get(pk=job.pk).catchup_window is None
    api.update(job, catchup_window=600)
    # A grace raised past the window is refused, naming the window, and changes nothing
    with pytest.raises(ValidationError) as info:
        api.update(job, misfire_grace=900)
    assert list(info.value.message_dict) == ["catchup_window"]
    assert "shorter than misfire_grace" in info.value.message_dict["catchup_window"][0]
    row = Job.objects.get(pk=job.pk)
    assert (row.catchup_window, row.misfire_grace) == (timedelta(minutes=10), timedelta(minutes=1))
    # ... while both raised together are fine
    both = api.update(job, misfire_grace=900, catchup_window=900)
    assert (both.catchup_window, both.misfire_grace) == (timedelta(minutes=15),) * 2


@override_settings(SCHEDAPP_DEFAULT_CATCHUP_WINDOW=1800)
def test_the_default_window_applies_to_new_jobs_unless_one_says_none():
    # Given a default window of half an hour (seconds, as the setting may be given)
    job = api.schedule(TASK, interval=60, name="default")
    none = api.schedule(TASK, interval=60, name="none", catchup_window=None)
    assert job.catchup_window == timedelta(minutes=30)
    assert none.catchup_window is None  # a job can still say "no window"
    # Then an update of something else keeps each, and a copy of the one without keeps none
    assert api.update(none, priority=3).catchup_window is None
    assert api.update(job, priority=3).catchup_window == timedelta(minutes=30)
    assert api.duplicate(none).catchup_window is None
    assert api.duplicate(job).catchup_window == timedelta(minutes=30)
    # And a job whose grace the default window is shorter than is told so, naming the window
    messages = errors_among_jobs(lambda: api.schedule(TASK, interval=60, misfire_grace=3600))
    assert "shorter than misfire_grace" in messages["catchup_window"][0]


def test_pause_resume_cancel_requeue_and_run_now():
    job = api.schedule(TASK, run_at=SOON, name="one")
    assert api.pause(job).state == JobState.PAUSED
    with pytest.raises(JobStateError):
        api.pause(job)
    with pytest.raises(JobStateError):
        api.run_now(job)
    assert api.resume(job.pk).state == JobState.SCHEDULED
    now_job = api.run_now(job)
    assert now_job.next_run_at <= db_now()
    with pytest.raises(JobStateError):
        api.requeue(job)
    cancelled = api.cancel(job)
    assert cancelled.state == JobState.CANCELLED and cancelled.next_run_at is None
    assert api.cancel(job).state == JobState.CANCELLED  # idempotent
    with pytest.raises(JobStateError):
        api.resume(job)


def test_cancel_of_a_dispatched_job_fences_its_message():
    job = api.schedule(TASK, run_at=db_now(), name="soon")
    (run,) = lease.claim_due_jobs("b", 10).runs
    api.cancel(job)
    assert JobRun.objects.get(pk=run.run_id).status == RunStatus.CANCELLED
    assert lease.admit_run(job.pk, run.token, "w", "a1") is not lease.DoorVerdict.ADMITTED
    # a completion arriving anyway (the message ran elsewhere) changes nothing
    assert lease.complete_run(job.pk, run.token, lease.SUCCEEDED).completion is (
        lease.Completion.ALREADY_RECORDED
    )
    assert Job.objects.get(pk=job.pk).state == JobState.CANCELLED


def test_requeue_brings_a_dead_job_back_with_its_retry_count_reset():
    job = api.schedule(TASK, run_at=db_now(), name="fails", max_retries=0)
    (run,) = lease.claim_due_jobs("b", 10).runs
    lease.admit_run(job.pk, run.token, "w", "a1")
    lease.complete_run(job.pk, run.token, lease.FAILED, error="boom")
    job.refresh_from_db()
    assert (job.state, job.last_error) == (JobState.DEAD, "boom")
    requeued = api.requeue(job)
    assert (requeued.state, requeued.retry_count) == (JobState.SCHEDULED, 0)
    assert requeued.next_run_at <= db_now()


def test_duplicate_copies_task_schedule_and_policy():
    job = api.schedule(
        TASK,
        cron="*/5 * * * *",
        kwargs={"label": "x"},
        name="orig",
        max_retries=7,
        priority=3,
        catchup_window=timedelta(hours=6),
    )
    copy = api.duplicate(job)
    assert copy.pk != job.pk and copy.name.startswith("orig (copy")
    assert (copy.cron, copy.kwargs, copy.max_retries, copy.priority, copy.catchup_window) == (
        "*/5 * * * *",
        {"label": "x"},
        7,
        3,
        timedelta(hours=6),
    )


# --- the ends of datetime ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"run_at": datetime(1, 1, 1, tzinfo=EAST)}, "run_at"),
        ({"run_at": datetime(9999, 12, 31, 23, 59, 59, tzinfo=WEST)}, "run_at"),
        ({"run_at": datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC), "jitter": 100}, "run_at"),
        ({"interval": 60, "interval_anchor": datetime(1, 1, 1, tzinfo=EAST)}, "interval_anchor"),
        ({"interval": 60, "not_before": datetime(1, 1, 1, tzinfo=EAST)}, "not_before"),
        ({"cron": "0 0 * * *", "expires_at": LAST_HOUR.replace(tzinfo=WEST)}, "expires_at"),
        ({"cron": "0 0 * * *", "not_before": LAST_HOUR}, "not_before"),
    ],
)
def test_a_time_outside_the_supported_range_is_a_field_error(kwargs, field):
    messages = errors_of(lambda: api.schedule(TASK, **kwargs))
    assert any("out of the supported range" in m for m in messages[field]), messages
    bulk = errors_of(lambda: api.schedule_many([{"task": TASK, **kwargs}]))
    assert bulk[f"0.{field}"] == messages[field]
    job = api.schedule(TASK, interval=60, name="kept")
    with pytest.raises(ValidationError) as info:
        api.update(job, **kwargs)
    assert info.value.message_dict[field] == messages[field]
    assert Job.objects.get(pk=job.pk).interval == timedelta(seconds=60)


def test_the_ends_of_the_supported_range_are_accepted_with_any_zone_and_jitter():
    first = api.schedule(
        TASK, run_at=datetime(2, 1, 1, tzinfo=UTC), timezone="Pacific/Kiritimati", name="first"
    )
    last = api.schedule(
        TASK,
        run_at=datetime(9998, 12, 31, 23, 59, 59, tzinfo=UTC),
        timezone="Pacific/Kiritimati",
        jitter=7 * 86400,
        name="last",
    )
    assert first.next_run_at == datetime(2, 1, 1, tzinfo=UTC)
    assert last.next_run_at >= last.run_at


@pytest.mark.parametrize("cron", ["0 0 31 12 *", "0 0 29 2 *", "0 12 L * 1#2,1#4"])
def test_a_first_occurrence_past_the_supported_range_is_a_field_error(cron):
    # from the last instant of the range, the first occurrence is in year 9999 (where a jitter
    # overflows) or past the end of datetime
    start = datetime(9998, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)
    messages = errors_of(lambda: api.schedule(TASK, cron=cron, not_before=start))
    assert any("out of the supported range" in m for m in messages["cron"]), messages


# --- generated names fit the name's limit -----------------------------------------------------


def test_a_copy_of_a_job_with_a_long_name_gets_a_name_that_fits():
    job = api.schedule(TASK, interval=60, name="n" * 200)
    first, second = api.duplicate(job), api.duplicate(job)
    for copy in (first, second):
        assert len(copy.name) == 200
        assert copy.name.startswith("n" * 150) and " (copy " in copy.name
    assert first.name != second.name


LONG_TASK = "project.tasks." + "t" * 186  # 200 characters, the most a task name may have


@shared_task(name=LONG_TASK)
def long_named_task() -> None:
    pass


def test_an_unnamed_job_of_a_long_named_task_gets_a_name_that_fits():
    single = api.schedule(LONG_TASK, interval=60)
    assert api.schedule_many([{"task": LONG_TASK, "interval": 60} for _ in range(2)]) == 2
    names = [single.name, *Job.objects.exclude(pk=single.pk).values_list("name", flat=True)]
    assert len(set(names)) == 3
    for name in names:
        assert len(name) <= 200 and name.startswith(LONG_TASK[:150])
    assert sorted(n.rsplit("-", 1)[1] for n in names[1:]) == ["0", "1"]
