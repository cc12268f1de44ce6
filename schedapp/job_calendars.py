"""A job's calendar as the rules use it (``policies.OnCalendar``): the stored calendar read,
its references resolved, parsed once and cached.

The cache is keyed by the calendar's id, its ``updated_at`` and the newest ``updated_at`` of
any calendar (a calendar it refers to may have changed), so a burst of jobs under one calendar
reads the calendars once per batch (``for_rows``: one query) and parses each once per process
until one changes. A calendar that cannot be read raises ScheduleError (field ``calendar``):
the beat quarantines that job, never crashes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from functools import lru_cache
from typing import Any

from django.db.models import Max

from . import calendars
from .exceptions import ScheduleError
from .models import Calendar
from .policies import OnCalendar
from .schedules import get_zone

# (id, updated_at, newest) -> parsed calendar; a few hundred calendars at most in practice.
_CACHE_SIZE = 256


def resolve(value: object, field: str = "calendar") -> Calendar | None:
    """The stored calendar a job names: a ``Calendar``, its name, or None (no calendar).
    Raises ScheduleError naming ``field`` for anything else or an unknown name."""
    if value is None or value == "":
        return None
    if isinstance(value, Calendar):
        if value.pk is None:
            raise ScheduleError(field, f"calendar {value.name!r} is not saved.")
        return value
    if isinstance(value, str):
        found = Calendar.objects.filter(name=value.strip()).first()
        if found is None:
            raise ScheduleError(field, f"no calendar is named {value!r}.")
        return found
    if isinstance(value, int) and not isinstance(value, bool):
        found = Calendar.objects.filter(pk=value).first()
        if found is None:
            raise ScheduleError(field, f"no calendar has id {value}.")
        return found
    raise ScheduleError(field, f"must be a calendar or its name, got {type(value).__name__}.")


def _newest() -> datetime | None:
    return Calendar.objects.aggregate(newest=Max("updated_at"))["newest"]


@lru_cache(maxsize=_CACHE_SIZE)
def _parsed(calendar_id: int, updated_at: datetime, newest: datetime | None) -> calendars.Calendar:
    row = Calendar.objects.filter(pk=calendar_id).values("name", "definition").first()
    if row is None:
        raise ScheduleError("calendar", f"calendar {calendar_id} no longer exists.")

    def definition(name: str) -> object | None:
        return Calendar.objects.filter(name=name).values_list("definition", flat=True).first()

    try:
        return calendars.parse_calendar(row["name"], row["definition"], definition)
    except ScheduleError as exc:
        raise ScheduleError("calendar", f"{row['name']!r} cannot be read: {exc}") from exc


def parsed(calendar: Calendar, newest: datetime | None = None) -> calendars.Calendar:
    """``calendar`` parsed (cached while neither it nor any calendar changes)."""
    return _parsed(calendar.pk, calendar.updated_at, newest if newest is not None else _newest())


def on_calendar(
    calendar: calendars.Calendar | None, mode: str, roll: str, timezone: str
) -> OnCalendar | None:
    if calendar is None:
        return None
    return OnCalendar(
        calendars.Attached(
            calendar, calendars.parse_mode(mode or None), calendars.parse_roll(roll or None)
        ),
        get_zone(timezone),
    )


def for_job(job: Any) -> OnCalendar | None:
    """The calendar a ``Job`` follows (None: none)."""
    if getattr(job, "calendar_id", None) is None:
        return None
    return on_calendar(
        parsed(job.calendar), job.calendar_mode, job.calendar_roll, job.timezone or "UTC"
    )


def for_rows(rows: Iterable[Mapping[str, Any]]) -> dict[int, calendars.Calendar]:
    """The calendars a batch of rows (the claim's, a reaper's) follow, by id: read in one
    query, each parsed at most once (the cache). A calendar that cannot be read is left out:
    ``for_row`` then raises for its rows alone."""
    ids = {r["calendar_id"] for r in rows if r.get("calendar_id") is not None}
    if not ids:
        return {}
    stamps = dict(Calendar.objects.filter(pk__in=ids).values_list("id", "updated_at"))
    newest = _newest()
    out: dict[int, calendars.Calendar] = {}
    for calendar_id, updated_at in stamps.items():
        try:
            out[calendar_id] = _parsed(calendar_id, updated_at, newest)
        except ScheduleError:
            continue
    return out


def for_row(row: Mapping[str, Any], read: Mapping[int, calendars.Calendar]) -> OnCalendar | None:
    """A row's calendar out of ``for_rows``'s batch; ScheduleError (field ``calendar``) when it
    could not be read, so the caller quarantines the row."""
    calendar_id = row.get("calendar_id")
    if calendar_id is None:
        return None
    calendar = read.get(calendar_id)
    if calendar is None:
        raise ScheduleError("calendar", f"calendar {calendar_id} cannot be read.")
    return on_calendar(
        calendar, row.get("calendar_mode", ""), row.get("calendar_roll", ""), row["timezone"]
    )
