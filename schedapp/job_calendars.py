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
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Max

from . import calendars
from .exceptions import ScheduleError
from .models import Calendar
from .policies import OnCalendar
from .schedules import get_zone

# Parsed calendars kept, at most; a few hundred calendars at most in practice.
_CACHE_SIZE = 256


@dataclass(frozen=True)
class Known:
    """Every stored calendar, read in one query before a bulk write: ``schedule_many``'s rows
    are checked while its COPY holds the connection, where no other statement may run."""

    by_name: dict[str, Calendar]
    by_id: dict[int, Calendar]
    newest: datetime | None

    def definition(self, name: str) -> object | None:
        found = self.by_name.get(name)
        return None if found is None else found.definition


def known() -> Known:
    rows = list(Calendar.objects.all())
    newest = max((c.updated_at for c in rows), default=None)
    return Known({c.name: c for c in rows}, {c.pk: c for c in rows}, newest)


def resolve(value: object, field: str = "calendar", known: Known | None = None) -> Calendar | None:
    """The stored calendar a job names: a ``Calendar``, its name, or None (no calendar).
    Raises ScheduleError naming ``field`` for anything else or an unknown name. ``known``:
    look in it instead of the database."""
    if value is None or value == "":
        return None
    if isinstance(value, Calendar):
        if value.pk is None:
            raise ScheduleError(field, f"calendar {value.name!r} is not saved.")
        return value
    if isinstance(value, str):
        name = value.strip()
        if known is not None:
            found = known.by_name.get(name)
        else:
            found = Calendar.objects.filter(name=name).first()
        if found is None:
            raise ScheduleError(field, f"no calendar is named {value!r}.")
        return found
    if isinstance(value, int) and not isinstance(value, bool):
        if known is not None:
            found = known.by_id.get(value)
        else:
            found = Calendar.objects.filter(pk=value).first()
        if found is None:
            raise ScheduleError(field, f"no calendar has id {value}.")
        return found
    raise ScheduleError(field, f"must be a calendar or its name, got {type(value).__name__}.")


def _newest() -> datetime | None:
    return Calendar.objects.aggregate(newest=Max("updated_at"))["newest"]


# (id, updated_at, newest) -> the parsed calendar
_PARSED: dict[tuple[int, datetime, datetime | None], calendars.Calendar] = {}


def _parsed(
    calendar_id: int, updated_at: datetime, newest: datetime | None, known: Known | None = None
) -> calendars.Calendar:
    key = (calendar_id, updated_at, newest)
    found = _PARSED.get(key)
    if found is not None:
        return found
    if known is not None:
        stored = known.by_id.get(calendar_id)
        row = None if stored is None else {"name": stored.name, "definition": stored.definition}
        definition: Any = known.definition
    else:
        row = Calendar.objects.filter(pk=calendar_id).values("name", "definition").first()

        def definition(name: str) -> object | None:
            return Calendar.objects.filter(name=name).values_list("definition", flat=True).first()

    if row is None:
        raise ScheduleError("calendar", f"calendar {calendar_id} no longer exists.")
    try:
        parsed = calendars.parse_calendar(row["name"], row["definition"], definition)
    except ScheduleError as exc:
        raise ScheduleError("calendar", f"{row['name']!r} cannot be read: {exc}") from exc
    if len(_PARSED) >= _CACHE_SIZE:
        _PARSED.clear()
    _PARSED[key] = parsed
    return parsed


def parsed(
    calendar: Calendar, newest: datetime | None = None, known: Known | None = None
) -> calendars.Calendar:
    """``calendar`` parsed (cached while neither it nor any calendar changes)."""
    if known is not None:
        return _parsed(calendar.pk, calendar.updated_at, known.newest, known)
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
