"""Every column of the job table, every kind of value PostgreSQL accepts there that schedapp
does not write (DESIGN 25): the cases are generated from the model's fields (their type, null,
length, choices), not listed by hand, so a column added later is covered by the same rules.

Each case corrupts one job among healthy ones, by SQL, in one of two situations: the job is
due (the claim, the dispatch, the worker's completion of its failed run meet the value), or
its run started and its lease expired (the reaper, inside the claim, meets it). Whatever the
case, the database refuses the write, or the beat works as if the row were not there (the
healthy job is claimed and dispatched, nothing raises) and the bad job is quarantined
(``dead`` with the reason) or carries on with bounded values; the next beat's work is an
ordinary one."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import DatabaseError, connection, models, transaction

from schedapp import api, beat
from schedapp.celeryapp import celery_app
from schedapp.db import db_now
from schedapp.lease import admit_run, complete_run
from schedapp.models import Job, JobRun, JobState, RunStatus
from schedapp.store import PostgreSQLStore

pytestmark = [pytest.mark.django_db, pytest.mark.postgresql]
TASK = "project.tasks.record"

DEEP = 3000  # deeper than Python's recursion limit lets json parse


def _json_kinds() -> list[tuple[str, str]]:
    """A value of every JSON type, and each container nested too deep to parse."""
    return [
        ("json null", "null"),
        ("json number", "1e308"),
        ("json string", json.dumps("x")),
        ("json bool", "true"),
        ("json array", "[1, 2]"),
        ("json object", '{"a": 1}'),
        ("json array nested too deep", "[" * DEEP + "]" * DEEP),
        ("json object nested too deep", '{"a": ' * DEEP + "1" + "}" * DEEP),
    ]


INT_RANGES = {  # the column types Django gives these fields on PostgreSQL
    "SmallIntegerField": (-(2**15), 2**15 - 1),
    "PositiveSmallIntegerField": (-(2**15), 2**15 - 1),
    "IntegerField": (-(2**31), 2**31 - 1),
    "PositiveIntegerField": (-(2**31), 2**31 - 1),
    "BigIntegerField": (-(2**63), 2**63 - 1),
    "PositiveBigIntegerField": (-(2**63), 2**63 - 1),
}


def bad_values(field: models.Field) -> list[tuple[str, str, Any]]:
    """(label, SQL cast, value) for what PostgreSQL takes in ``field``'s column and the API
    never writes: NULL where nullable, each end of the type's range, values out of the range
    Python can hold, malformed shapes, strings outside the field's choices."""
    kind = field.get_internal_type()
    column_type = field.db_type(connection)
    values: list[tuple[str, Any]] = []
    if field.null:
        values.append(("NULL", None))
    if kind == "DateTimeField":
        values += [
            ("infinity", "infinity"),
            ("-infinity", "-infinity"),
            ("before year 1", "0044-03-15 00:00:00+00 BC"),
            ("after year 9999", "10000-01-01 00:00:00+00"),
            ("PostgreSQL's last year", "294276-12-31 00:00:00+00"),
            ("year 9999", "9999-12-31 23:00:00+00"),
        ]
    elif kind == "DurationField":
        values += [
            ("negative", "-1 second"),
            ("zero", "0"),
            ("in months", "1 mon"),
            ("a million years", "1000000 years"),
            ("beyond timedelta", "100000000 years"),
        ]
    elif kind in INT_RANGES:
        low, high = INT_RANGES[kind]
        values += [("minimum", low), ("-1", -1), ("maximum", high)]
    elif kind == "FloatField":
        values += [("NaN", "NaN"), ("infinity", "Infinity"), ("-infinity", "-Infinity")]
        values += [("huge", 1e308)]
    elif kind in ("CharField", "TextField"):
        values += [("empty", ""), ("control characters", "\x01\x7f\u2028")]
        if field.max_length:
            values.append(("full length", "é" * field.max_length))
        if field.choices:
            values.append(("not a choice", "bogus"))
    elif kind == "JSONField":
        values += _json_kinds()
    elif kind == "ForeignKey":  # (Job.calendar has no database constraint)
        values += [("no such row", 2**62), ("minimum", -(2**63))]
    elif kind == "TimeField":
        # PostgreSQL's day ends at 24:00:00, which Python's time cannot hold
        values += [("end of day", "24:00:00"), ("last microsecond", "23:59:59.999999")]
    elif kind == "BooleanField":
        pass  # NOT NULL: true and false are both meaningful
    else:  # a column type this generator does not know yet: add its kinds above
        raise AssertionError(f"no bad values for {field.name} ({kind})")
    return [(label, column_type, value) for label, value in values]


COLUMNS = [f for f in Job._meta.concrete_fields if not f.primary_key]
# The schedule a column belongs to, so that its values meet the code that reads them: the
# columns of one schedule kind (fields.SCHEDULE_FIELDS, SCHEDULE_DETAIL_FIELDS) are tried
# on a job of that kind, every other column on an interval job.
KINDS = {
    "run_at": {"run_at": "due"},
    "cron": {"cron": "* * * * *"},
    "timezone": {"cron": "* * * * *", "timezone": "Europe/Paris"},
    "cron_day_or": {"cron": "0 0 1 * 1"},
    "solar_event": {"solar_event": "sunrise", "latitude": 48.85, "longitude": 2.35},
    "latitude": {"solar_event": "sunrise", "latitude": 48.85, "longitude": 2.35},
    "longitude": {"solar_event": "sunrise", "latitude": 48.85, "longitude": 2.35},
    # a calendar's columns on a job that follows one (two_due_jobs saves the calendar)
    "calendar_id": {"interval": 60, "calendar": "sundays"},
    "calendar_mode": {"interval": 60, "calendar": "sundays"},
    "calendar_roll": {"interval": 60, "calendar": "sundays"},
}
# The loop of minutes runs each column's first bad value in one situation, the claim's and the
# reaper's in turn from column to column (both paths, every column); the rest of the matrix
# (some 400 cases more) is marked ``exhaustive``, which CI runs with the e2e tier.
SITUATIONS = ("due", "reaped")
CASES = [
    pytest.param(
        field.column,
        cast,
        value,
        situation,
        id=f"{field.column}-{label}-{situation}",
        marks=[pytest.mark.exhaustive] if index or situation != SITUATIONS[n % 2] else [],
    )
    for n, field in enumerate(COLUMNS)
    for index, (label, cast, value) in enumerate(bad_values(field))
    for situation in SITUATIONS
]


def two_due_jobs(schedule: dict[str, Any]) -> tuple[Job, Job]:
    """A job of the given schedule and a healthy interval job, both due a second ago."""
    due = db_now() - timedelta(seconds=1)
    if schedule.get("run_at") == "due":
        schedule = {"run_at": due}
    if "calendar" in schedule:
        api.save_calendar(schedule["calendar"], {"weekdays": ["sun"]})
    bad = api.schedule(TASK, name="bad", max_retries=2, **schedule)
    healthy = api.schedule(TASK, name="healthy", interval=60)
    Job.objects.filter(pk__in=[bad.pk, healthy.pk]).update(scheduled_for=due, next_run_at=due)
    return bad, healthy


@pytest.fixture
def scheduler(broker_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[beat.LeaseScheduler]:
    """A beat of this process, set up without its LISTEN connection or metrics server: the
    test calls its unit of work directly, so that anything it raises fails the test."""
    monkeypatch.setattr(PostgreSQLStore, "listen", lambda self: None)
    monkeypatch.setattr(beat.metrics, "start_metrics_server", lambda: None)
    scheduler = beat.LeaseScheduler(celery_app(), lazy=True)
    scheduler.setup_schedule()
    try:
        yield scheduler
    finally:
        scheduler.close()


def test_every_column_but_booleans_has_cases():
    """A column of a type the generator does not know fails here (``bad_values`` raises)."""
    without = {f.column for f in COLUMNS} - {c.values[0] for c in CASES}
    assert all(Job._meta.get_field(c).get_internal_type() == "BooleanField" for c in without)
    assert len(CASES) > 300


@pytest.mark.parametrize(("column", "cast", "value", "situation"), CASES)
def test_one_corrupt_row_never_stops_the_beat(
    scheduler, column, cast, value, situation, record_property
):
    # Given a job about to be due (or whose run started and whose lease expired), and a
    # healthy job due after it
    bad, healthy = two_due_jobs(KINDS.get(column, {"interval": 60}))
    if situation == "reaped":
        scheduler._work()
        token = Job.objects.get(pk=bad.pk).token
        assert admit_run(bad.pk, token, "w1", "a1") == "admitted"
        JobRun.objects.filter(job=healthy).delete()
        Job.objects.filter(pk=healthy.pk).update(state=JobState.SCHEDULED, token=0)
        Job.objects.filter(pk=bad.pk).update(lease_expires_at=db_now() - timedelta(seconds=1))
    # When one of its columns is given the value, behind the API's back
    try:
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute(
                    f"UPDATE schedapp_job SET {connection.ops.quote_name(column)} = %s::{cast} "
                    "WHERE id = %s",
                    [value, bad.pk],
                )
    except DatabaseError:
        record_property("outcome", "refused")
        return  # the database refuses it: nothing to survive
    # Then the beat's unit of work raises nothing, and dispatches the healthy job
    scheduler._work()
    assert JobRun.objects.filter(job=healthy, status=RunStatus.DISPATCHED).exists()
    assert scheduler.stats["publish_failures"] == 0
    # ... a worker completing the bad job's run raises nothing (a success, where the next
    # occurrence is computed; the reaped job's lost run was a failure: its retry policy ran)
    for job_id, token in JobRun.objects.filter(job=bad, status=RunStatus.DISPATCHED).values_list(
        "job_id", "token"
    ):
        admit_run(job_id, token, "w1", f"a{token}")
        complete_run(job_id, token, "succeeded")
    # ... the bad job is quarantined with the reason, or carries on, readable as ever
    state, last_status = Job.objects.values_list("state", "last_status").get(pk=bad.pk)
    record_property("outcome", "quarantined" if last_status == "quarantined" else state)
    if state == JobState.DEAD:
        assert last_status in ("quarantined", RunStatus.FAILED, RunStatus.LOST)
    else:
        Job.objects.get(pk=bad.pk)  # the admin, the API, the reaper read it whole
    # ... and the next unit of work is an ordinary one
    Job.objects.filter(pk=healthy.pk).update(
        state=JobState.SCHEDULED, next_run_at=db_now() - timedelta(seconds=1)
    )
    scheduler._work()
    assert JobRun.objects.filter(job=healthy).count() == 2
