"""Hostile input to the API: only ValidationError (or JobStateError), never a crash, and never
a half-written row."""

from __future__ import annotations

import string
from datetime import UTC, datetime, timedelta, timezone

import pytest
from django.core.exceptions import ValidationError
from django.db import transaction
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from schedapp import api
from schedapp.models import Job
from tests import examples

pytestmark = pytest.mark.django_db

FUZZ = settings(
    max_examples=examples(150),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

cron_fields = st.one_of(
    st.sampled_from(
        [
            "*",
            "*/5",
            "0",
            "59",
            "60",
            "1-5",
            "5-1",
            "1,2,3",
            "L",
            "?",
            "#",
            "0#3",
            "LW",
            "15W",
            "5L",
            "FRIL",
            "L-2",
            "5#6",
            "JAN",
            "mon-fri",
            "*/0",
            "-1",
            "99999999999",
            "",
            " ",
            "\x00",
            "é",
        ]
    ),
    st.text(alphabet=string.printable, max_size=6),
)
crons = st.one_of(
    st.lists(cron_fields, min_size=0, max_size=8).map(" ".join),
    st.text(max_size=60),
    st.sampled_from(
        [
            "@daily",
            "@reboot",
            "@every 5m",
            "0 0 30 2 *",
            "0 0 31 4 *",
            "* * * * * * *",
            "0 0 29 2 *",
        ]
    ),
)
zones = st.one_of(
    st.sampled_from(
        [
            "UTC",
            "Europe/Paris",
            "America/New_York",
            "Etc/GMT+5",
            "../../etc/passwd",
            "",
            "utc",
            "Europe/paris",
        ]
    ),
    st.text(max_size=40),
)
json_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(max_size=40),
    st.binary(max_size=10),
    st.decimals(),
)
json_like = st.recursive(
    json_leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5),
        st.dictionaries(st.one_of(st.text(max_size=10), st.integers()), inner, max_size=5),
        st.tuples(inner, inner),
        st.frozensets(st.integers(), max_size=3),
    ),
    max_leaves=30,
)
far_zones = st.sampled_from([UTC, timezone(timedelta(hours=14)), timezone(timedelta(hours=-12))])
moments = st.one_of(  # the whole of datetime: its ends are refused, never raised
    st.datetimes(),
    st.datetimes(timezones=far_zones),
    st.builds(datetime.replace, st.sampled_from([datetime.min, datetime.max]), tzinfo=far_zones),
)
numbers = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(),
    st.booleans(),
    st.none(),
    st.text(max_size=5),
)


@FUZZ
@given(
    cron=crons,
    zone=zones,
    name=st.text(max_size=250),
    args=json_like,
    kwargs=json_like,
    retries=numbers,
    jitter=numbers,
    priority=numbers,
)
def test_schedule_with_arbitrary_cron_and_payload_never_crashes(
    cron, zone, name, args, kwargs, retries, jitter, priority
):
    before = Job.objects.count()
    try:
        job = api.schedule(
            "project.tasks.record",
            cron=cron,
            timezone=zone,
            name=name or None,
            args=args,
            kwargs=kwargs,
            max_retries=retries,
            jitter=jitter,
            priority=priority,
        )
    except ValidationError as exc:
        assert exc.message_dict  # names at least one field
        assert Job.objects.count() == before
    else:
        job.refresh_from_db()
        assert job.next_run_at is not None and job.cron


@FUZZ
@given(
    run_at=moments,
    interval=st.one_of(numbers, st.timedeltas()),
    which=st.sampled_from(["run_at", "interval", "both", "none"]),
)
def test_schedule_with_arbitrary_times_never_crashes(run_at, interval, which):
    before = Job.objects.count()
    options = {
        "run_at": run_at if which in ("run_at", "both") else None,
        "interval": interval if which in ("interval", "both") else None,
    }
    try:
        api.schedule("project.tasks.record", **options)
    except ValidationError as exc:
        assert exc.message_dict
        assert Job.objects.count() == before
    else:
        assert sum(v not in (None, "") for v in options.values()) == 1


@FUZZ
@given(
    changes=st.dictionaries(
        st.sampled_from(
            [
                "cron",
                "interval",
                "run_at",
                "timezone",
                "kwargs",
                "max_retries",
                "jitter",
                "lease_seconds",
                "queue",
                "name",
                "misfire_policy",
                "when_retries_exhausted",
                "retry_backoff",
                "priority",
                "bogus",
            ]
        ),
        st.one_of(json_like, crons, zones, moments),
        max_size=4,
    )
)
def test_update_with_arbitrary_changes_never_crashes_or_half_writes(changes):
    job = api.schedule("project.tasks.record", cron="*/5 * * * *", name="fuzz-update")
    stored = Job.objects.values().get(pk=job.pk)
    try:
        api.update(job, **changes)
    except ValidationError as exc:
        assert exc.message_dict
        assert Job.objects.values().get(pk=job.pk) == stored
    Job.objects.filter(pk=job.pk).delete()


def test_deeply_nested_and_huge_payloads_get_a_clear_error():
    deep: list = []
    for _ in range(100):
        deep = [deep]
    with pytest.raises(ValidationError) as info:
        api.schedule("project.tasks.record", run_at=datetime(2030, 1, 1, tzinfo=UTC), args=deep)
    assert "nested deeper" in info.value.message_dict["args"][0]
    with pytest.raises(ValidationError) as info:
        api.schedule(
            "project.tasks.record",
            run_at=datetime(2030, 1, 1, tzinfo=UTC),
            kwargs={"blob": "x" * 200_000},
        )
    assert "SCHEDAPP_MAX_PAYLOAD_BYTES" in info.value.message_dict["kwargs"][0]
    assert Job.objects.count() == 0


def test_a_valid_but_overlong_cron_is_a_validation_error_not_a_database_error():
    minutes = ",".join(str(m) for m in range(60))
    with pytest.raises(ValidationError) as info:
        api.schedule("project.tasks.record", cron=f"{minutes} {minutes} * * * *")
    assert "at most 200" in info.value.message_dict["cron"][0]


def test_unicode_names_round_trip():
    name = "nightly 🌙 rapport — Überweisung 夜"
    job = api.schedule("project.tasks.record", cron="0 0 * * *", name=name)
    assert Job.objects.get(pk=job.pk).name == name


# --- bulk and single scheduling agree ----------------------------------------------------------

durations = st.one_of(numbers, st.timedeltas(max_value=timedelta(days=400)))
aware = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
)
# Each optional field is plausible about half the time and hostile otherwise, so that both
# accepted and refused specs come up often, and refusals of one field or of several.
SPEC_FIELDS = {
    "cron": st.one_of(st.sampled_from(["*/5 * * * *", "0 9 * * 1-5", "@daily"]), crons),
    "run_at": st.one_of(aware, moments),
    "interval": st.one_of(st.integers(1, 86400), durations),
    "timezone": st.one_of(st.sampled_from(["UTC", "Europe/Paris", "Asia/Kolkata"]), zones),
    "args": st.one_of(st.lists(st.integers(), max_size=3), json_like),
    "kwargs": st.one_of(st.dictionaries(st.sampled_from(["a", "b"]), st.text()), json_like),
    "name": st.one_of(st.none(), st.text(max_size=250)),
    "priority": st.one_of(st.integers(-5, 5), numbers),
    "queue": st.one_of(st.sampled_from(["", "fast"]), st.text(max_size=8)),
    "max_retries": st.one_of(st.integers(0, 5), numbers),
    "jitter": st.one_of(st.integers(0, 30), numbers),
    "lease_seconds": st.one_of(st.integers(1, 600), numbers),
    "retry_backoff": st.one_of(st.integers(0, 60), durations),
    "retry_backoff_max": st.one_of(st.integers(60, 3600), durations),
    "misfire_policy": st.one_of(st.sampled_from(["run_once", "skip", "run_all"]), st.text()),
    "when_retries_exhausted": st.one_of(st.sampled_from(["dead", "next_occurrence"]), st.text()),
    "misfire_grace": durations,
    "misfire_max_catchup": st.one_of(st.integers(1, 100), numbers),
    "catchup_window": st.one_of(st.none(), st.integers(60, 86400), durations),
    "overlap": st.one_of(st.sampled_from(["skip", "buffer_one", "buffer_all"]), st.text()),
    "max_buffer": st.one_of(st.integers(0, 200), numbers),
    "fixed_delay": st.one_of(st.booleans(), numbers),
    "surprise": numbers,
}
# A valid spec (half the time: the task may be bad), with up to three fields replaced or added.
bases = st.tuples(
    st.one_of(
        st.just("project.tasks.record"), st.sampled_from(["project.tasks.nope", "celery.x", ""])
    ),
    st.one_of(
        st.fixed_dictionaries({"cron": st.sampled_from(["*/5 * * * *", "0 9 * * 1-5"])}),
        st.fixed_dictionaries({"run_at": aware}),
        st.fixed_dictionaries({"interval": st.integers(1, 86400)}),
    ),
).map(lambda base: {"task": base[0], **base[1]})
changes = st.lists(st.sampled_from(sorted(SPEC_FIELDS)), max_size=3, unique=True).flatmap(
    lambda keys: st.fixed_dictionaries({key: SPEC_FIELDS[key] for key in keys})
)
specs = st.builds(lambda base, change: {**base, **change}, bases, changes)
# Fields that differ between two jobs made from one spec, by design.
UNSHARED = {"id", "created_at", "updated_at"}


def outcome(call):
    """("refused", errors by field) or ("accepted", the stored row)."""
    try:
        with transaction.atomic():
            call()
    except ValidationError as exc:
        return "refused", exc.message_dict
    return "accepted", Job.objects.values().get()


@FUZZ
@given(spec=specs)
def test_schedule_many_accepts_and_refuses_exactly_what_schedule_does(spec):
    # Given one spec, tried through schedule() and through schedule_many() in one transaction
    # (so that both read the same database clock), each rolled back after
    def single():
        options = dict(spec)
        api.schedule(options.pop("task"), **options)

    with transaction.atomic():
        one = outcome(single)
        transaction.set_rollback(True)
    with transaction.atomic():
        many = outcome(lambda: api.schedule_many([spec]))
        transaction.set_rollback(True)

    # Then both refuse with the same messages (bulk keys them by index) ...
    event(one[0])
    assert one[0] == many[0], (one, many)
    if one[0] == "refused":
        assert many[1] == {f"0.{field}": messages for field, messages in one[1].items()}
        return
    # ... or both store the same job
    ignore = set(UNSHARED)
    if not spec.get("name"):
        ignore.add("name")  # generated
    if one[1]["jitter"]:
        ignore.add("next_run_at")  # random within the jitter, checked below
        for row in (one[1], many[1]):
            spread = row["next_run_at"] - row["scheduled_for"]
            assert timedelta(0) <= spread <= timedelta(seconds=row["jitter"])
    assert {k: v for k, v in one[1].items() if k not in ignore} == {
        k: v for k, v in many[1].items() if k not in ignore
    }
