"""The job table's CHECK constraints in their shorter form (schedapp/sql/checks.sql, migration
0049) are the same rules as Django's, and the migrated database holds exactly that file.

The rule is Django's constraint in schedapp.models (what SQLite holds and Django's own
validation checks) or, for a duration's upper bound, migration 0016's; PostgreSQL holds a
shorter expression of it, cheaper to rebuild on each statement that writes a job. Both are
evaluated by PostgreSQL on the same rows, at and beyond every bound (a time a microsecond
either side of its range, in another zone, infinite; a duration of a microsecond below and
above zero, in months against days; NaN and the infinities of a coordinate; every choice and
a near miss; each combination of the schedule columns), and must pass and refuse the same
rows. A CHECK passes a NULL result, so both are compared as such.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from datetime import datetime, timedelta
from functools import cache

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.migrations.executor import MigrationExecutor
from django.db.models import CheckConstraint, Q
from hypothesis import given, settings
from hypothesis import strategies as st

from schedapp import api
from schedapp.models import (
    DURATION_COLUMNS,
    DURATION_MAX,
    TIME_COLUMNS,
    DstPolicy,
    Job,
    JobState,
    MisfirePolicy,
)
from schedapp.sql import job_checks
from tests import examples

pytestmark = [pytest.mark.django_db, pytest.mark.postgresql]

BEFORE = ("schedapp", "0048_partitioned_ledger")
AFTER = ("schedapp", "0049_compact_job_checks")
CHECKS = """
SELECT conname, pg_get_constraintdef(oid), convalidated FROM pg_constraint
WHERE contype = 'c' AND conrelid = %s::regclass
"""

TIMES = [
    None,
    "-infinity",
    "infinity",
    "0044-03-15 BC",
    "0001-01-01 23:59:59.999999+00",
    "0001-01-02 00:00:00+00",
    "0001-01-02 00:00:00+01",  # 0001-01-01 23:00 UTC: before the range
    "0001-01-02 00:00:00.000001+00",
    "2026-12-06 12:00:00+00",
    "9999-12-29 23:59:59.999999+00",
    "9999-12-30 00:00:00+00",
    "9999-12-30 00:00:00+01",  # 9999-12-29 23:00 UTC: inside
    "9999-12-30 00:00:00-01",  # 9999-12-30 01:00 UTC: after
    "9999-12-30 00:00:00.000001+00",
]
DURATIONS = [
    None,
    "-1 microsecond",
    "0",
    "1 microsecond",
    "1 month",
    "1 month -30 days",  # compared as 0
    "-1 month 31 days",
    "899999999 days 23:59:59.999999",
    "900000000 days",
    "900000000 days 00:00:00.000001",
    "30000000 mons 1 day",
    "-178000000 years",
    "178000000 years",
]
COORDINATES = [None, "NaN", "Infinity", "-Infinity", "-180.5", "-180", "-90.000001", "-90", "0"]
COORDINATES += ["90", "90.000001", "180", "180.0000001"]
CHOICES = {"state": JobState, "misfire_policy": MisfirePolicy, "dst_policy": DstPolicy}


def _job(name: str = "probe") -> Job:
    return api.schedule("project.tasks.record", cron="0 8 * * *", name=name)


@cache
def _rules() -> dict[str, str]:
    """Each shortened constraint's rule as Django writes it for PostgreSQL."""
    readable = [
        CheckConstraint(
            name=f"schedapp_job_{column}_readable",
            condition=Q(**{f"{column}__isnull": True}) | Q(**{f"{column}__lte": DURATION_MAX}),
        )
        for column in DURATION_COLUMNS
    ]  # as migration 0016 (and 0020, 0036 after it) added them, PostgreSQL's alone
    by_name = {c.name: c for c in [*Job._meta.constraints, *readable]}
    with connection.schema_editor() as editor:
        sql = {name: by_name[name].constraint_sql(Job, editor) for name in job_checks()}
    return {name: text.split(" CHECK ", 1)[1] for name, text in sql.items()}


def _probes() -> list[dict[str, str | None]]:
    """One row's changes per probe: every bound of every shortened rule, from both sides."""
    probes: list[dict[str, str | None]] = []
    probes += [{column: value} for column in TIME_COLUMNS for value in TIMES]
    probes += [{column: value} for column in DURATION_COLUMNS for value in DURATIONS]
    probes += [{column: v} for column in ("latitude", "longitude") for v in COORDINATES]
    for column, choices in CHOICES.items():
        values = [*choices.values, "", "bogus", choices.values[0].upper(), choices.values[0] + " "]
        probes += [{column: value} for value in values]
    schedule_columns = {
        "run_at": [None, "2026-12-06 12:00:00+00"],
        "cron": ["", "0 8 * * *"],
        "interval": [None, "1 minute"],
        "solar_event": ["", "sunset"],
        "latitude": [None, "51.5"],
        "longitude": [None, "-0.1"],
    }
    for values in itertools.product(*schedule_columns.values()):
        probes.append(dict(zip(schedule_columns, values, strict=True)))
    return probes


@pytest.fixture
def probe() -> Iterator[str]:
    """A table shaped as schedapp_job, without its checks or NOT NULLs, holding a job's row
    changed by each probe in turn."""
    _fill_probe("probe", _job(), _probes())
    yield "probe"
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE probe")


def _fill_probe(table: str, job: Job, changes: list[dict[str, str | None]]) -> None:
    """``table``, shaped as schedapp_job without its checks or NOT NULLs, with ``job``'s row
    once per entry of ``changes``, changed by it."""
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TEMP TABLE {table} (LIKE schedapp_job)")
        cursor.execute(  # a NULL probes every time column, created_at's too
            "SELECT string_agg(format('ALTER COLUMN %%I DROP NOT NULL', attname), ', ') "
            "FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 AND attnotnull",
            [table],
        )
        cursor.execute(f"ALTER TABLE {table} {cursor.fetchone()[0]}")
        cursor.executemany(
            f"INSERT INTO {table} SELECT (jsonb_populate_record(j, %s::jsonb)).* "
            "FROM schedapp_job j WHERE j.id = %s",
            [(json.dumps(change), job.pk) for change in changes],
        )


def _compare(rule: str, short: str, table: str = "probe") -> tuple[int, int, int]:
    """Over ``table``'s rows: how many the two tell apart, how many the short form refuses,
    and how many it passes."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT count(*) FILTER (WHERE coalesce(({rule}), true) "
            f"IS DISTINCT FROM coalesce(({short}), true)), "
            f"count(*) FILTER (WHERE NOT coalesce(({short}), true)), "
            f"count(*) FILTER (WHERE coalesce(({short}), true)) FROM {table}"
        )
        return cursor.fetchone()


def test_each_shortened_check_passes_and_refuses_exactly_what_djangos_rule_does(probe):
    rules = _rules()
    assert set(rules) == set(job_checks()) and len(rules) == 31
    for name, short in job_checks().items():
        differ, refused, passed = _compare(rules[name], short)
        assert differ == 0, f"{name}: {differ} rows told apart from {rules[name]}"
        # ... and the rows probe the rule from both sides: some refused, some passed
        assert refused > 0 and passed > 0, (name, refused, passed)


_NEAR = [DURATION_MAX, timedelta(0), -timedelta(microseconds=1), timedelta(microseconds=1)]


@settings(max_examples=examples(60), deadline=None)
@given(
    column=st.sampled_from([*TIME_COLUMNS, *DURATION_COLUMNS, "latitude", "longitude"]),
    time=st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31)),
    offset=st.integers(-14 * 60, 14 * 60),
    duration=st.timedeltas() | st.sampled_from(_NEAR),
    degrees=st.floats(-400, 400) | st.sampled_from([-180.0, -90.0, 90.0, 180.0]),
)
def test_the_shortened_checks_agree_with_djangos_on_any_value(
    column, time, offset, duration, degrees
):
    """Values anywhere in and around each range (a time in any offset from UTC), one column
    at a time, in a job's row copied to a table without the constraints: refused by the short
    form exactly when Django's rule refuses it."""
    if column in TIME_COLUMNS:
        sign = "+" if offset >= 0 else "-"
        value = f"{time.isoformat()}{sign}{abs(offset) // 60:02d}:{abs(offset) % 60:02d}"
    elif column in DURATION_COLUMNS:
        d = duration
        value = f"{d.days} days {d.seconds} seconds {d.microseconds} microseconds"
    else:
        value = repr(degrees)
    own = (f"schedapp_job_{column}_in_range", f"schedapp_job_{column}_readable")
    names = [name for name in own if name in job_checks()]
    assert names
    with transaction.atomic():
        _fill_probe("one", Job.objects.first() or _job(), [{column: value}])
        for name in names:
            differ, _, _ = _compare(_rules()[name], job_checks()[name], table="one")
            assert differ == 0, (name, value)
        transaction.set_rollback(True)


def test_the_migrated_database_holds_the_checks_in_schedapp_sql_all_validated():
    with connection.cursor() as cursor:
        cursor.execute(CHECKS, ["schedapp_job"])
        migrated = {name: (text, valid) for name, text, valid in cursor.fetchall()}
        # checks.sql's forms, as PostgreSQL prints them, from a scratch table
        cursor.execute("CREATE TEMP TABLE written (LIKE schedapp_job)")
        for name, condition in job_checks().items():
            cursor.execute(f"ALTER TABLE written ADD CONSTRAINT {name} CHECK ({condition})")
        cursor.execute(CHECKS, ["written"])
        written = {name: text for name, text, _ in cursor.fetchall()}
        cursor.execute("DROP TABLE written")
    assert {name: migrated[name][0] for name in written} == written
    assert all(valid for _, valid in migrated.values()), migrated
    assert len(migrated) == 51  # the other 20 as Django wrote them


def _definitions() -> dict[str, str]:
    with connection.cursor() as cursor:
        cursor.execute(CHECKS, ["schedapp_job"])
        return {name: text for name, text, valid in cursor.fetchall() if valid}


@pytest.mark.django_db(transaction=True)
def test_the_migration_swaps_each_form_under_a_short_lock_both_ways_and_keeps_every_job():
    jobs = [_job(name) for name in "abc"]
    shortened = set(job_checks())
    after = _definitions()
    executor = MigrationExecutor(connection)
    try:
        # Given the database before 0049: Django's forms, validated
        executor.migrate([BEFORE])
        before = _definitions()
        assert set(before) == set(after) and len(before) == 51
        changed = {name for name in before if before[name] != after[name]}
        assert changed == shortened
        assert " OR " in before["schedapp_job_one_schedule"]
        # When migrated forward: the short forms, validated, under the same names ...
        MigrationExecutor(connection).migrate([AFTER])
        assert _definitions() == after
        # ... every job kept, and the rules still refuse, by name
        assert Job.objects.filter(pk__in=[j.pk for j in jobs]).count() == 3
        with pytest.raises(IntegrityError, match="schedapp_job_interval_in_range"):
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(
                    "UPDATE schedapp_job SET cron = '', \"interval\" = '0' WHERE id = %s",
                    [jobs[0].pk],
                )
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
    assert _definitions() == after
