"""Bulk scheduling against real PostgreSQL: the API's rules and messages, all or nothing,
duplicate names traced to their specs, streaming in chunks, first fire times as schedule()'s.

Most tests run through each writer: COPY in binary (the default) and in text format, and the
``bulk_create`` path that other databases take (forced here on PostgreSQL)."""

from __future__ import annotations

import signal
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from schedapp import api, bulk
from schedapp.db import db_now
from schedapp.models import Job, Occurrence
from schedapp.store import PortableStore

pytestmark = pytest.mark.django_db

TASK = "project.tasks.record"
SOON = datetime(2030, 1, 1, tzinfo=UTC)


@pytest.fixture(params=["copy-binary", "copy-text", "orm"])
def writer(request, monkeypatch) -> str:
    if request.param == "orm":
        monkeypatch.setattr(bulk, "get_store", PortableStore)
    else:
        monkeypatch.setattr(bulk, "COPY_FORMAT", request.param.removeprefix("copy-"))
    return request.param


def once(i: int, **options) -> dict:
    return {"task": TASK, "run_at": SOON, "name": f"job-{i}", "args": [i], **options}


def refused(specs, **kwargs) -> dict[str, list[str]]:
    before = Job.objects.count()
    with pytest.raises(ValidationError) as info:
        api.schedule_many(specs, **kwargs)
    assert Job.objects.count() == before, "nothing may be written when a spec is refused"
    return info.value.message_dict


def test_one_bad_spec_in_a_late_chunk_rejects_the_lot(writer):
    # Given 1,000 specs streamed in chunks of 100, one of them bad in the eighth chunk
    def specs():
        for i in range(1000):
            yield once(i, cron="* * * * *") if i == 750 else once(i)

    # When they are scheduled, then nothing is written and the error names spec and field
    errors = refused(specs(), chunk_size=100)
    assert errors == {
        "750.cron": [
            "needs exactly one schedule: run_at (one-off), cron, interval or solar_event; "
            "got run_at, cron."
        ],
        "750.run_at": [
            "needs exactly one schedule: run_at (one-off), cron, interval or solar_event; "
            "got run_at, cron."
        ],
    }


def test_every_bad_spec_is_reported_with_schedules_own_messages(writer):
    specs = [
        once(0),
        once(1, max_retries=-1, queue="has space"),
        {"task": "project.tasks.nope", "interval": 0.5, "name": "x"},
        once(3, kwargs={"not an identifier": 1}),
        "not a mapping",
        once(5, source="elsewhere"),
    ]
    errors = refused(specs)
    for index in (1, 2, 3):
        spec = dict(specs[index])
        with pytest.raises(ValidationError) as single:
            api.schedule(spec.pop("task"), **spec)
        expected = {f"{index}.{f}": m for f, m in single.value.message_dict.items()}
        assert {k: v for k, v in errors.items() if k.startswith(f"{index}.")} == expected
    assert errors["4.__all__"] == ["must be a mapping of job options."]
    assert "is not one of" in errors["5.source"][0]
    assert not any(key.startswith("0.") for key in errors)


def test_duplicate_names_within_a_chunk_and_across_chunks_name_the_first_spec(writer):
    # Given chunks of 10: spec 2 invalid (so chunk 0 skips it), "dup" at 5, 8 and 25
    specs = [once(i) for i in range(30)]
    specs[2]["cron"] = "bad"
    for i in (5, 8, 25):
        specs[i]["name"] = "dup"
    errors = refused(specs, chunk_size=10)
    assert errors["8.name"] == ["duplicates the name of spec 5."]
    assert errors["25.name"] == ["duplicates the name of spec 5."]  # traced through chunk 0
    assert "2.cron" in errors and "5.name" not in errors
    assert set(errors) == {"2.cron", "2.run_at", "8.name", "25.name"}


def test_a_duplicate_of_a_spec_in_a_chunk_that_already_had_clashes(writer):
    # Given a name taken before the call, and chunks of 10 where chunk 1 has that name at 12
    # (so it is checked, then written without spec 12) and chunk 2 repeats spec 17's name
    api.schedule(TASK, run_at=SOON, name="taken")
    specs = [once(i) for i in range(30)]
    specs[12]["name"] = "taken"
    specs[17]["name"] = specs[27]["name"] = "twice"
    errors = refused(specs, chunk_size=10)
    assert errors == {
        "12.name": ["a job named 'taken' already exists."],
        "27.name": ["duplicates the name of spec 17."],
    }


def test_a_spec_with_other_problems_that_repeats_a_name_is_told_both(writer):
    # Given chunks of 10: "dup" at 3, then at 6 and 25 (each also with a bad field), a name
    # taken before the call at 14 with a bad cron, and an invalid spec 2 whose name spec 7
    # repeats: an invalid spec is not written, so it holds no name
    api.schedule(TASK, run_at=SOON, name="taken")
    specs = [once(i) for i in range(30)]
    specs[3]["name"] = "dup"
    specs[6].update(name="dup", max_retries=-1)
    specs[25].update(name="dup", queue="has space")
    specs[14] = {"task": TASK, "cron": "61 25 * * *", "name": "taken"}
    specs[2].update(name="first", jitter=-1)
    specs[7]["name"] = "first"
    errors = refused(specs, chunk_size=10)
    assert errors["6.name"] == ["duplicates the name of spec 3."]
    assert errors["25.name"] == ["duplicates the name of spec 3."]
    assert errors["14.name"] == ["a job named 'taken' already exists."]
    assert "6.max_retries" in errors and "25.queue" in errors and "14.cron" in errors
    assert "minute 61 is out of range (0-59)" in errors["14.cron"][0]
    assert set(errors) == {
        "2.jitter",
        "6.max_retries",
        "6.name",
        "14.cron",
        "14.name",
        "25.queue",
        "25.name",
    }


def test_names_taken_by_existing_jobs_are_reported_per_spec(writer):
    api.schedule(TASK, run_at=SOON, name="job-3")
    api.schedule(TASK, run_at=SOON, name="job-40")
    errors = refused([once(i) for i in range(50)], chunk_size=20)
    assert errors == {
        "3.name": ["a job named 'job-3' already exists."],
        "40.name": ["a job named 'job-40' already exists."],
    }
    assert Job.objects.count() == 2


# Five chunks of 1,000 in the default run (the rule does not depend on the size: a chunk is
# read, then written); of 10,000 through COPY under exhaustive, which the ORM is too slow for.
@pytest.mark.parametrize(
    "n", [5_000, pytest.param(50_000, marks=pytest.mark.exhaustive)], ids=["5000", "50000"]
)
def test_a_stream_of_specs_is_written_in_chunks_holding_one_chunk_at_most(writer, monkeypatch, n):
    if writer == "orm" and n > 5_000:
        pytest.skip("the ORM writer's stream is the 5,000 one")
    # Given a generator of n specs, each a dict that counts how many of its kind live
    alive = {"now": 0, "most": 0}

    class Spec(dict):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            alive["now"] += 1
            alive["most"] = max(alive["most"], alive["now"])

        def __del__(self):
            alive["now"] -= 1

    chunks = []
    writer_class = bulk._OrmWriter if writer == "orm" else bulk._CopyWriter
    original = writer_class.write_chunk

    def counting(self, first, rows):
        chunks.append(first)
        return original(self, first, rows)

    monkeypatch.setattr(writer_class, "write_chunk", counting)
    specs = (Spec(task=TASK, run_at=SOON, args=[i], name=f"s-{i}") for i in range(n))

    # When they are scheduled in five chunks
    created = api.schedule_many(specs, chunk_size=n // 5)

    # Then every job is there, the specs came in five chunks, and no more than one chunk of
    # them was alive at once (a chunk is read before its COPY, each spec let go once encoded)
    assert created == n == Job.objects.count()
    assert chunks[:5] == [0, n // 5, 2 * n // 5, 3 * n // 5, 4 * n // 5]
    assert alive["most"] <= n // 5 + 1
    sample = Job.objects.get(name=f"s-{n - 1}")
    assert (sample.args, sample.run_at, sample.next_run_at) == ([n - 1], SOON, SOON)


def test_first_fire_times_are_those_schedule_computes(writer):
    paris = ZoneInfo("Europe/Paris")
    kinds = [
        {"cron": "0 9 * * 1-5", "timezone": "Europe/Paris"},
        {"cron": "*/10 * * * * *"},
        {"cron": "30 2 * * *", "timezone": "America/New_York"},
        {"interval": 300},
        {"interval": timedelta(days=1)},
        {"run_at": datetime(2020, 1, 1, tzinfo=paris)},  # in the past: due now
        {"run_at": datetime(2031, 6, 1, 12, tzinfo=paris)},
    ]
    # In one transaction, both read the same database clock
    with transaction.atomic():
        singles = [api.schedule(TASK, name=f"single-{i}", **kind) for i, kind in enumerate(kinds)]
        api.schedule_many({"task": TASK, "name": f"bulk-{i}", **k} for i, k in enumerate(kinds))
        for i, single in enumerate(singles):
            many = Job.objects.get(name=f"bulk-{i}")
            assert (many.scheduled_for, many.next_run_at) == (
                single.scheduled_for,
                single.next_run_at,
            ), kinds[i]
            assert (many.cron, many.timezone, many.interval, many.run_at) == (
                single.cron,
                single.timezone,
                single.interval,
                single.run_at,
            )


def test_the_two_readings_of_a_repeated_wall_time_stay_two_instants(writer):
    # Given the hour Paris repeats when summer time ends, read once in each offset (fold)
    first = datetime(2031, 10, 26, 2, 30, tzinfo=ZoneInfo("Europe/Paris"))
    second = first.replace(fold=1)
    # When both are scheduled in one call (equal as Python compares them, one hour apart)
    api.schedule_many([once(1, run_at=first), once(2, run_at=second)])
    # Then each job runs at its own instant, as api.schedule would store it
    runs = {j.name: j.run_at for j in Job.objects.filter(name__in=["job-1", "job-2"])}
    assert runs == {
        "job-1": datetime(2031, 10, 26, 0, 30, tzinfo=UTC),
        "job-2": datetime(2031, 10, 26, 1, 30, tzinfo=UTC),
    }


@override_settings(
    SCHEDAPP_NOTIFICATIONS={
        "pager": {"type": "email", "to": ["p@example.com"]},
        "ops.mail": {"type": "email", "to": ["o@example.com"]},
    }
)
def test_awkward_values_survive_the_trip_as_schedule_stores_them(writer):
    # Backslashes, quotes, non-ASCII and nested JSON: what COPY's formats must escape or not
    awkward = {
        "args": ["a\\b", 'quote " and \\" ', "tab\tnew\nline", "日本", "🌙", 1.5, -(2**62), None],
        "kwargs": {"nested": {"list": [True, False, {"deep": "\\\\"}]}, "empty": {}, "e": "é"},
        "queue": "q\\1",
        "priority": 9,
        "max_retries": 9,
        "retry_backoff": timedelta(days=1, seconds=3),
        "retry_backoff_max": timedelta(days=2),
        "misfire_grace": 0.25,
        "catchup_window": timedelta(days=1, seconds=3, microseconds=7),  # days stay days
        "overlap": "buffer_all",
        "max_buffer": 7,
        "max_concurrent": 7,
        "timezone": "America/Argentina/Buenos_Aires",
        "message_options": {"routing_key": "rk\\1", "headers": {"x-tenant": 'é \\ "t"'}},
        "description": "tab\there, line\nbreak,\r\nback \\ slash 夜",
        "tags": ["Team-EU", "billing", " nightly ", "billing"],
        "notify": ["pager", "ops.mail", "pager"],
    }
    with transaction.atomic():
        single = api.schedule(TASK, run_at=SOON, name="single \\ 'x' 夜", **awkward)
        api.schedule_many([{"task": TASK, "run_at": SOON, "name": "bulk \\ 'x' 夜", **awkward}])
    single_row = Job.objects.values().get(pk=single.pk)
    bulk_row = Job.objects.values().get(name="bulk \\ 'x' 夜")
    ignore = {"id", "name", "created_at", "updated_at"}
    assert {k: v for k, v in bulk_row.items() if k not in ignore} == {
        k: v for k, v in single_row.items() if k not in ignore
    }
    assert bulk_row["args"][0] == "a\\b" and bulk_row["queue"] == "q\\1"
    assert bulk_row["tags"] == ["billing", "nightly", "team-eu"]
    assert bulk_row["notify"] == ["ops.mail", "pager"]


@override_settings(SCHEDAPP_DEFAULT_CATCHUP_WINDOW=timedelta(hours=1))
def test_catch_up_windows_are_written_as_schedule_writes_them(writer):
    # Given specs with no window said (the default: an hour), none, and a window in seconds
    windows = {"default": {}, "none": {"catchup_window": None}, "float": {"catchup_window": 90.5}}
    specs = [{"task": TASK, "interval": 60, "name": name, **w} for name, w in windows.items()]
    # When they are scheduled in bulk
    api.schedule_many(specs)
    # Then each holds the window api.schedule would have given it
    stored = dict(Job.objects.values_list("name", "catchup_window"))
    assert stored == {"default": timedelta(hours=1), "none": None, "float": timedelta(seconds=90.5)}
    for name, w in windows.items():
        single = api.schedule(TASK, interval=60, name=f"single-{name}", **w)
        assert single.catchup_window == stored[name], name


def test_a_bad_catch_up_window_rejects_the_lot_naming_spec_and_field(writer):
    specs = [
        once(0, catchup_window=3600),
        once(1, catchup_window=0),
        once(2, catchup_window=30),  # shorter than the default grace (60 s)
        once(3, catchup_window="an hour"),
    ]
    errors = refused(specs)
    assert sorted(errors) == ["1.catchup_window", "2.catchup_window", "3.catchup_window"]
    assert "more than 0" in errors["1.catchup_window"][0]
    assert "shorter than misfire_grace" in errors["2.catchup_window"][0]
    assert "must be a duration" in errors["3.catchup_window"][0]


def test_overlap_policies_and_fixed_delays_are_written_as_schedule_writes_them(writer):
    specs = [
        {"task": TASK, "interval": 60, "name": "default"},
        {"task": TASK, "interval": 60, "name": "skip", "overlap": "skip", "fixed_delay": True},
        {
            "task": TASK,
            "cron": "0 * * * *",
            "name": "all",
            "overlap": "buffer_all",
            "max_buffer": 3,
        },
        {
            "task": TASK,
            "interval": 60,
            "name": "concurrent",
            "overlap": "allow_all",
            "max_concurrent": 4,
        },
    ]
    api.schedule_many(specs)
    stored = {
        n: (o, b, f, c)
        for n, o, b, f, c in Job.objects.values_list(
            "name", "overlap", "max_buffer", "fixed_delay", "max_concurrent"
        )
    }
    assert stored == {
        "default": ("buffer_one", 100, False, 10),
        "skip": ("skip", 100, True, 10),
        "all": ("buffer_all", 3, False, 10),
        "concurrent": ("allow_all", 100, False, 4),
    }
    errors = refused(
        [
            {"task": TASK, "cron": "0 * * * *", "name": "a", "fixed_delay": True},
            {"task": TASK, "run_at": SOON, "name": "b", "overlap": "allow_all"},
            {"task": TASK, "interval": 60, "name": "c", "max_buffer": 0},
            {"task": TASK, "interval": 60, "name": "d", "max_concurrent": 0},
        ]
    )
    assert sorted(errors) == ["0.fixed_delay", "1.overlap", "2.max_buffer", "3.max_concurrent"]


def test_unnamed_jobs_get_names_unique_within_the_call(writer):
    api.schedule_many([{"task": TASK, "interval": 60} for _ in range(3)])
    names = sorted(Job.objects.values_list("name", flat=True))
    assert len(set(names)) == 3 and all(n.startswith(f"{TASK}-") for n in names)
    assert sorted(name.rsplit("-", 1)[1] for name in names) == ["0", "1", "2"]


def test_beats_are_woken_once_for_the_earliest_job(writer):
    early = db_now() - timedelta(hours=1)  # in the past: the earliest due time of them all
    specs = [
        once(0),
        {"task": TASK, "interval": 60, "name": "every"},
        once(1, run_at=early),
        {"task": TASK, "cron": "* * * * *", "name": "cron"},
    ]
    with CaptureQueriesContext(connection) as queries:
        api.schedule_many(specs)
    notifies = [q["sql"] for q in queries.captured_queries if "pg_notify" in q["sql"]]
    assert len(notifies) == 1
    assert f"{early.timestamp():.6f}" in notifies[0]


def test_nothing_to_schedule_writes_and_wakes_nothing(writer):
    with CaptureQueriesContext(connection) as queries:
        assert api.schedule_many([]) == 0
    assert not any("pg_notify" in q["sql"] for q in queries.captured_queries)


def test_a_flood_of_bad_specs_stops_reading_after_a_thousand(writer):
    read = []

    def specs():
        for i in range(5000):
            read.append(i)
            yield once(i, max_retries=-1)

    errors = refused(specs(), chunk_size=2000)
    # reading stops at the end of the chunk in which the thousandth bad spec was found
    assert len(read) == 2000
    assert errors["__all__"] == ["stopped after 1000 bad specs; the rest were not checked."]
    assert "999.max_retries" in errors and "1000.max_retries" not in errors


def test_chunk_size_must_be_positive():
    with pytest.raises(ValueError):
        api.schedule_many([once(0)], chunk_size=0)


def test_the_database_clock_sets_created_at(writer):
    with transaction.atomic():
        now = db_now()
        api.schedule_many([once(0)])
        job = Job.objects.get()
    if writer != "orm":  # the ORM stamps created_at with this host's clock, as schedule() does
        assert job.created_at == job.updated_at == now


@pytest.mark.parametrize(
    ("depth", "args", "kwargs", "refused_field"),
    [
        (0, [1], {}, "args"),  # an item sits at depth 1
        (0, [], {"k": 1}, "kwargs"),  # so does a key
        (1, [1, "a"], {"k": 2}, None),
        (1, [[1]], {}, "args"),
        (2, [[1]], {"k": [2]}, None),
    ],
)
def test_the_payload_depth_limit_holds_for_flat_payloads_too(
    writer, depth, args, kwargs, refused_field
):
    # Flat payloads take a shortcut past the full JSON walk; it must not skip the depth limit
    spec = {"task": TASK, "run_at": SOON, "args": args, "kwargs": kwargs, "name": "d"}
    with override_settings(SCHEDAPP_MAX_PAYLOAD_DEPTH=depth):
        if refused_field is None:
            assert api.schedule_many([spec]) == 1
            return
        errors = refused([spec])
        with pytest.raises(ValidationError) as single:
            api.schedule(TASK, run_at=SOON, args=args, kwargs=kwargs, name="d")
    assert errors == {f"0.{f}": m for f, m in single.value.message_dict.items()}
    assert "nested deeper" in errors[f"0.{refused_field}"][0]


def test_an_error_inside_the_input_propagates_and_writes_nothing(writer):
    # Given a generator that fails in its third chunk, after two chunks were written
    def specs():
        for i in range(250):
            if i == 230:
                raise RuntimeError("the source went away")
            yield once(i)

    with pytest.raises(RuntimeError, match="went away"):
        api.schedule_many(specs(), chunk_size=100)
    # Then nothing is left, and the connection works
    assert Job.objects.count() == 0
    assert api.schedule_many([once(0)]) == 1


def test_specs_may_query_the_database_while_they_are_read(writer):
    """A generator over a queryset or the database clock: each chunk is read before its COPY
    starts (a query in the middle of a COPY would wait on the connection forever)."""
    api.schedule_many(once(i) for i in range(3))
    source = Job.objects.order_by("id")

    def alarm(signum, frame):
        raise TimeoutError("schedule_many hung reading its specs")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(30)
    try:
        created = api.schedule_many(
            {"task": TASK, "run_at": db_now() + timedelta(hours=1), "name": f"copy-of-{job.name}"}
            for job in source.iterator(chunk_size=2)
        )
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert created == 3
    assert Job.objects.filter(name__startswith="copy-of-job-").count() == 3


def test_calendars_are_written_as_schedule_writes_them(writer):
    # Given a calendar, and specs naming it (by name and as the object) or none
    weekends = api.save_calendar("weekends", {"weekdays": ["sat", "sun"]})
    specs = [
        {
            "task": TASK,
            "cron": "0 9 * * *",
            "name": "rolled",
            "calendar": "weekends",
            "calendar_roll": "next_business_day",
        },
        {
            "task": TASK,
            "interval": 3600,
            "name": "deferred",
            "calendar": weekends,
            "calendar_mode": "exclude",
            "calendar_roll": "defer",
        },
        {"task": TASK, "cron": "0 9 * * *", "name": "plain"},
    ]
    # When they are scheduled in bulk
    api.schedule_many(specs)
    # Then each holds the calendar, mode, roll and first run api.schedule gives it
    columns = ("calendar_id", "calendar_mode", "calendar_roll", "scheduled_for")
    stored = {row[0]: row[1:] for row in Job.objects.values_list("name", *columns)}
    assert stored["rolled"][:3] == (weekends.pk, "exclude", "next_business_day")
    assert stored["deferred"][:3] == (weekends.pk, "exclude", "defer")
    assert stored["plain"][:3] == (None, "exclude", "skip")
    single = api.schedule(
        TASK,
        cron="0 9 * * *",
        name="single",
        calendar="weekends",
        calendar_roll="next_business_day",
    )
    assert single.scheduled_for == stored["rolled"][3]
    assert single.scheduled_for.weekday() < 5
    deferred = Job.objects.get(name="deferred")
    assert deferred.scheduled_for.weekday() < 5
    assert deferred.interval_anchor is not None  # its phase: the first occurrence
    assert (deferred.scheduled_for - deferred.interval_anchor) % timedelta(hours=1) == timedelta(
        0
    ) or deferred.scheduled_for.weekday() == 0  # or deferred to Monday's midnight
    # and a bad calendar option refuses the lot, naming spec and field
    errors = refused(
        [
            {"task": TASK, "cron": "0 9 * * *", "name": "a", "calendar": "no-such"},
            {"task": TASK, "cron": "0 9 * * *", "name": "b", "calendar_roll": "defer"},
        ]
    )
    assert sorted(errors) == ["0.calendar", "1.calendar_roll"]


DEADLINE_COLUMNS = (
    "start_deadline",
    "skip_late",
    "max_runtime",
    "revoke_overrun",
    "finish_by",
    "alert_after_failures",
)


@override_settings(SCHEDAPP_DEADLINES={"start_deadline": 120, "alert_after_failures": 5})
def test_deadlines_are_written_as_schedule_writes_them(writer):
    # Given the defaults from SCHEDAPP_DEADLINES, a job clearing them, and one setting each
    given = {
        "default": {},
        "none": {"start_deadline": None, "alert_after_failures": None},
        "all": {
            "start_deadline": 30.5,
            "skip_late": True,
            "max_runtime": timedelta(minutes=10),
            "revoke_overrun": True,
            "finish_by": "09:30",
            "alert_after_failures": 3,
        },
    }
    specs = [{"task": TASK, "interval": 60, "name": name, **d} for name, d in given.items()]
    # When they are scheduled in bulk
    api.schedule_many(specs)
    # Then each holds what api.schedule would have given it
    for name, d in given.items():
        bulk_row = Job.objects.filter(name=name).values(*DEADLINE_COLUMNS).get()
        single = api.schedule(TASK, interval=60, name=f"single-{name}", **d)
        assert bulk_row == {c: getattr(single, c) for c in DEADLINE_COLUMNS}, name
    assert Job.objects.get(name="default").start_deadline == timedelta(seconds=120)
    assert Job.objects.get(name="none").alert_after_failures is None
    assert str(Job.objects.get(name="all").finish_by) == "09:30:00"


def test_a_bad_deadline_rejects_the_lot_naming_spec_and_field(writer):
    errors = refused(
        [once(0, start_deadline=10), once(1, max_runtime=-1), once(2, finish_by="noon")]
    )
    assert sorted(errors) == ["1.max_runtime", "2.finish_by"]


def test_what_a_calendar_excluded_before_the_first_run_is_recorded_as_schedule_records_it(writer):
    # Given a calendar closing the next three days, and jobs under it in chunks of two, some
    # skipping the closed days' occurrences, some rolling them to the next open day
    today = db_now().date()
    closed = [(today + timedelta(days=n)).isoformat() for n in range(0, 4)]
    api.save_calendar("closed", {"dates": closed})
    specs = [
        {
            "task": TASK,
            "cron": "0 9 * * *",
            "name": f"bulk-{roll}-{i}",
            "timezone": "UTC",
            "calendar": "closed",
            "calendar_roll": roll,
        }
        for i in range(3)
        for roll in ("skip", "next_business_day")
    ] + [{"task": TASK, "cron": "0 9 * * *", "name": "plain", "timezone": "UTC"}]
    # When they are scheduled in bulk, and one of each alone
    assert api.schedule_many(specs, chunk_size=2) == 7
    for roll in ("skip", "next_business_day"):
        single = {k: v for k, v in specs[0].items() if k not in ("task", "name")}
        api.schedule(TASK, name=f"single-{roll}", **{**single, "calendar_roll": roll})

    # Then each bulk job's ledger holds what api.schedule records for the same job: the
    # occurrences the calendar excluded or merged before its first run, in the same call
    def records(name: str) -> list[tuple]:
        return list(
            Occurrence.objects.filter(job__name=name)
            .order_by("scheduled_for")
            .values_list("scheduled_for", "last", "count", "fate", "detail")
        )

    for roll, fate in (("skip", "excluded"), ("next_business_day", "merged")):
        expected = records(f"single-{roll}")
        assert expected and {r[3] for r in expected} == {fate}
        for i in range(3):
            assert records(f"bulk-{roll}-{i}") == expected, (roll, i)
    assert set(
        Occurrence.objects.filter(job__name__startswith="bulk-").values_list(
            "decided_by", flat=True
        )
    ) == {"schedule_many"}
    assert not Occurrence.objects.filter(job__name="plain").exists()


def test_jobs_without_calendars_cost_no_ledger_statement(writer):
    # A chunk of jobs without calendars: no name lookup, no ledger insert (the cost of
    # bulk scheduling is what it was before calendars were recorded)
    specs = [{"task": TASK, "interval": 60, "name": f"plain-{i}"} for i in range(50)]
    with CaptureQueriesContext(connection) as queries:
        assert api.schedule_many(specs, chunk_size=20) == 50
    said = " ".join(q["sql"] for q in queries.captured_queries)
    assert "schedapp_occurrence" not in said
