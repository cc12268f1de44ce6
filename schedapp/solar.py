"""Solar events (sunrise, sunset, dawns, dusks, solar noon) as fire times: pure, no clock.

The events and their definitions are Celery's (``celery.schedules.solar``), so an imported
Celery ``solar`` entry fires when Celery would have fired it: the sun's upper limb (sunrise,
sunset) or its centre (dawns and dusks) crossing a horizon, with no atmospheric refraction
modelled beyond the standard -0:34 of sunrise and sunset, at sea level; solar noon is the sun's
transit. Computed with the optional ``ephem`` package, imported only when a solar schedule is
used.

Fire times are rounded to the nearest second, so the set of occurrences does not depend on
where a search starts. Where an event does not happen on a day (the midnight sun, the polar
night, the white nights of an astronomical dawn), the search goes on from the next day, for up
to a year, as Celery's does; an event that does not happen within a year never happens there
(the sun's course repeats yearly), and ``next_event`` returns None.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from types import ModuleType
from typing import Any

# event: (ephem Observer method, horizon in degrees:minutes, measured at the sun's centre)
EVENTS: dict[str, tuple[str, str, bool]] = {
    "dawn_astronomical": ("next_rising", "-18", True),
    "dawn_nautical": ("next_rising", "-12", True),
    "dawn_civil": ("next_rising", "-6", True),
    "sunrise": ("next_rising", "-0:34", False),
    "solar_noon": ("next_transit", "0", False),
    "sunset": ("next_setting", "-0:34", False),
    "dusk_civil": ("next_setting", "-6", True),
    "dusk_nautical": ("next_setting", "-12", True),
    "dusk_astronomical": ("next_setting", "-18", True),
}
SEARCH_DAYS = 367  # a year and a day: every event that happens somewhere happens in a year
_SECOND = timedelta(seconds=1)


class EphemMissing(ImportError):
    """The optional ``ephem`` package is not installed."""


def load_ephem() -> ModuleType:
    try:
        import ephem
    except ImportError as exc:
        raise EphemMissing("ephem") from exc
    return ephem  # type: ignore[no-any-return]


def next_event(event: str, latitude: float, longitude: float, after: datetime) -> datetime | None:
    """The first occurrence strictly after ``after`` (aware), in UTC, whole seconds."""
    ephem = load_ephem()
    method, horizon, use_center = EVENTS[event]
    observer = ephem.Observer()
    observer.lat = math.radians(latitude)  # a float is read as radians, a string as degrees
    observer.lon = math.radians(longitude)
    observer.elevation = 0
    observer.pressure = 0  # no refraction model: the horizons above include it
    observer.horizon = horizon
    sun = ephem.Sun()
    find = getattr(observer, method)
    options: dict[str, Any] = {"use_center": True} if use_center else {}
    after = after.astimezone(UTC)
    # From a second earlier: an event just before ``after`` may round to after it.
    start = ephem.Date((after - _SECOND).replace(tzinfo=None))
    for _ in range(SEARCH_DAYS):
        try:
            found = find(sun, start=start, **options)
        except ephem.CircumpolarError:  # not today: look again from the next solar midnight
            start = observer.next_antitransit(sun, start=start)
            continue
        when = _to_second(found.datetime())
        if when > after:
            return when
        start = ephem.Date(found + ephem.minute)
    return None


def _to_second(naive_utc: datetime) -> datetime:
    rounded = naive_utc + timedelta(microseconds=500_000)
    return rounded.replace(microsecond=0, tzinfo=UTC)


@lru_cache(maxsize=1024)
def ever_happens(event: str, latitude: float, longitude: float) -> bool:
    """Whether the event happens at all at this place (it may not at or near a pole)."""
    return next_event(event, latitude, longitude, datetime(2001, 1, 1, tzinfo=UTC)) is not None
