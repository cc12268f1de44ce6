"""``manage.py schedapp_backfill``: the backfill API from a shell, times read in the job's zone,
bad input refused naming the option with nothing written."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from io import StringIO
from zoneinfo import ZoneInfo

import pytest
from django.core.management import CommandError, call_command

from schedapp import api
from schedapp.db import db_now
from schedapp.models import Backfill, BackfillState, JobChange

pytestmark = pytest.mark.django_db

PARIS = ZoneInfo("Europe/Paris")


def hourly_in_paris():
    return api.schedule(
        "project.tasks.record", name="hourly-paris", cron="0 * * * *", timezone="Europe/Paris"
    )


def command(*args: str) -> str:
    out = StringIO()
    call_command("schedapp_backfill", *args, stdout=out)
    return out.getvalue()


def yesterday_in_paris() -> tuple[datetime, datetime]:
    day = (db_now().astimezone(PARIS) - timedelta(days=1)).date()
    return (
        datetime(day.year, day.month, day.day, 8, tzinfo=PARIS),
        datetime(day.year, day.month, day.day, 10, tzinfo=PARIS),
    )


def test_it_starts_a_backfill_reading_times_in_the_jobs_zone_and_records_why() -> None:
    job = hourly_in_paris()
    start, end = yesterday_in_paris()
    naive = [t.replace(tzinfo=None).isoformat() for t in (start, end)]
    out = command(
        "hourly-paris", "--start", naive[0], "--end", naive[1], "--max-per-second", "5",
        "--reason", "the outage", "--json",
    )
    (row,) = json.loads(out)
    record = Backfill.objects.get(pk=row["id"])
    assert (record.start, record.end) == (start.astimezone(UTC), end.astimezone(UTC))
    assert record.total == row["total"] == 3  # 08:00, 09:00 and 10:00 in Paris
    assert record.max_per_second == 5 and record.state == BackfillState.RUNNING
    change = JobChange.objects.get(job_id=job.pk, action=JobChange.Action.BACKFILL)
    assert change.reason == "the outage"
    # An offset given is kept: the same range by the job's id, in UTC.
    utc = [t.astimezone(UTC).isoformat() for t in (start, end)]
    text = command(str(job.pk), "--start", utc[0], "--end", utc[1], "--rerun")
    second = Backfill.objects.exclude(pk=record.pk).get()
    assert (second.start, second.end, second.rerun) == (record.start, record.end, True)
    assert f"backfill {second.pk} of job {job.pk}: running, 0/3 decided" in text


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["--max-per-second", "0"], "--max-per-second"),
        (["--end", "2001-01-01T00:00"], "--end"),
        (["--start", "yesterday"], "--start"),
    ],
)
def test_bad_input_is_refused_naming_the_option_and_nothing_is_written(args, names) -> None:
    hourly_in_paris()
    start, end = yesterday_in_paris()
    given = {"--start": start.isoformat(), "--end": end.isoformat()}
    for option, value in zip(args[::2], args[1::2], strict=True):
        given[option] = value
    flat = [part for pair in given.items() for part in pair]
    with pytest.raises(CommandError, match=names):
        command("hourly-paris", *flat)
    assert not Backfill.objects.exists()
    assert not JobChange.objects.filter(action=JobChange.Action.BACKFILL).exists()


def test_it_lists_and_cancels() -> None:
    job = hourly_in_paris()
    start, end = yesterday_in_paris()
    record = api.backfill(job, start, end)
    (listed,) = json.loads(command("hourly-paris", "--list", "--json"))
    assert (listed["id"], listed["state"], listed["total"]) == (record.pk, "running", 3)
    command("--cancel", str(record.pk), "--reason", "enough")
    record.refresh_from_db()
    assert record.state == BackfillState.CANCELLED
    assert JobChange.objects.get(action=JobChange.Action.BACKFILL_CANCEL).reason == "enough"
    with pytest.raises(CommandError, match="no backfill with id"):
        command("--cancel", str(record.pk + 1000))
    with pytest.raises(CommandError, match="no job with id or name"):
        command("nobody", "--start", start.isoformat(), "--end", end.isoformat())
