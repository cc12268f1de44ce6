"""Solar events (sunrise, sunset, dawns, dusks, solar noon) as fire times: pure, no clock.

The events and their definitions are Celery's (``celery.schedules.solar``), so an imported
Celery ``solar`` entry fires when Celery would have fired it: the sun's upper limb (sunrise,
sunset) or its centre (dawns and dusks) crossing a horizon, with no atmospheric refraction
modelled beyond the standard -0:34 of sunrise and sunset, at sea level; solar noon is the sun's
transit. Computed with the optional ``ephem`` package, imported only when a solar schedule is
used.

An event is the instant its function crosses zero (the sun's altitude less the horizon, or its
hour angle for noon), solved for within its whole UTC minute, then rounded to the
second: the same event is the same second wherever a search starts. (ephem's own rising,
setting and transit searches stop within a tenth of a second of it, at a point that depends on
the search start, so an event whose fraction of a second is near one half came out one second
apart from two starts: two fire times, one event.) Rising and setting are found by scanning the
sun's altitude in steps no longer than the time it takes to reach the horizon at its fastest,
so a day where the sun only grazes the horizon (near a pole, around an equinox) is not missed,
as ephem's search, which gives up on such a day, would miss it. Where an event does not happen
on a day (the midnight sun, the polar night, the white nights of an astronomical dawn), the
search goes on, for up to a year and a day; an event that does not happen within that never
happens there (the sun's course repeats yearly), and ``next_event`` returns None. At the poles
themselves only solar noon is an event (the sun's course there is no daily one).
"""

from __future__ import annotations

import math
from collections.abc import Callable
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
_MINUTES_A_DAY = 1440
_MINUTE = 1 / _MINUTES_A_DAY  # in ephem's dates, which count days
_MIN_STEP = _MINUTE  # the scan's shortest step: a dip of the sun under a minute may be missed
_SOLVE_STEPS = 12  # at most; two or three do
_PRECISION = 1e-3 / 86400  # a millisecond, in days
# The sun's altitude changes by at most (Earth's turn) x cos(latitude) + (its declination's
# change, under 0.41 degree a day), in radians a day; with a margin for the rest (parallax,
# the equation of time, the sun's changing radius), each far smaller.
_MARGIN = 1.1
_DECLINATION_RATE = math.radians(0.41)


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
    after = after.astimezone(UTC)
    # From a second earlier: an event just before ``after`` may round to after it.
    start = float(ephem.Date((after - _SECOND).replace(tzinfo=None)))
    end = start + SEARCH_DAYS
    if method == "next_transit":
        signed = _hour_angle(observer, sun)
        find: Callable[[float, float], float | None] = _transit_finder(observer, sun, signed)
    else:
        if abs(latitude) >= 90:
            return None
        signed = _altitude(observer, sun, use_center, rising=method == "next_rising")
        rate = _MARGIN * (2 * math.pi * math.cos(math.radians(latitude)) + _DECLINATION_RATE)
        find = _crossing_finder(signed, rate)
    while start < end:
        root = find(start, end)
        if root is None:
            return None
        when = _to_second(ephem.Date(root).datetime())
        if when > after:
            return when
        start = max(root, start) + _MINUTE
    return None


def _altitude(observer: Any, sun: Any, use_center: bool, rising: bool) -> Callable[[float], float]:
    """The sun's altitude above the event's horizon (radians), negated for a setting, so
    that the event is where it goes from below zero to zero or above."""
    sign = 1.0 if rising else -1.0
    horizon = float(observer.horizon)

    def signed(day: float) -> float:
        observer.date = day
        sun.compute(observer)
        target = horizon if use_center else horizon - float(sun.radius)
        return sign * (float(sun.alt) - target)

    return signed


def _hour_angle(observer: Any, sun: Any) -> Callable[[float], float]:
    """The sun's hour angle in (-pi, pi]: from below zero to zero or above at its transit."""

    def signed(day: float) -> float:
        observer.date = day
        sun.compute(observer)
        return math.remainder(float(sun.ha), 2 * math.pi)

    return signed


def _crossing_finder(
    signed: Callable[[float], float], rate: float
) -> Callable[[float, float], float | None]:
    """The first crossing after ``start`` (before ``end``) by a scan whose steps the sun
    cannot cross the horizon within: ``rate`` bounds how fast ``signed`` changes, so a step
    ends short of a crossing but for the shortest (``_MIN_STEP``), which may end past one."""

    def find(start: float, end: float) -> float | None:
        day, value = start, signed(start)
        while day < end:
            nxt = day + max(_MIN_STEP, abs(value) / rate)
            nxt_value = signed(nxt)
            if value < 0 <= nxt_value:  # interpolated: within a second of it, as a rule
                return _root(signed, day + (nxt - day) * value / (value - nxt_value))
            day, value = nxt, nxt_value
        return None

    return find


def _transit_finder(
    observer: Any, sun: Any, signed: Callable[[float], float]
) -> Callable[[float, float], float | None]:
    """ephem's next transit (it always has one), made exact by ``_root``."""

    def find(start: float, end: float) -> float | None:
        approx = float(observer.next_transit(sun, start=start))
        return _root(signed, approx) if approx < end else None

    return find


def _root(signed: Callable[[float], float], near: float) -> float:
    """The crossing within a couple of minutes of ``near``, solved inside its whole UTC
    minute (its cell of the minute grid, the one where ``signed`` goes from below zero to
    zero or above), so that the result depends on the crossing only, not on ``near``."""
    cell = math.floor(near * _MINUTES_A_DAY)
    for first in (cell, cell - 1, cell + 1, cell - 2, cell + 2):
        lo, hi = first / _MINUTES_A_DAY, (first + 1) / _MINUTES_A_DAY
        f_lo, f_hi = signed(lo), signed(hi)
        if f_lo < 0 <= f_hi:
            return _solve(signed, lo, hi, f_lo, f_hi)
    return near  # not where it was said to be: keep what was found


def _solve(
    signed: Callable[[float], float], lo: float, hi: float, f_lo: float, f_hi: float
) -> float:
    """The zero of ``signed`` in [lo, hi] by regula falsi (the Illinois variant): within a
    minute the sun's altitude and hour angle are all but straight lines, so a few steps
    leave it under a millisecond; the same steps from the same cell give the same result."""
    x, side = lo, 0
    for _ in range(_SOLVE_STEPS):
        x = lo - f_lo * (hi - lo) / (f_hi - f_lo)
        f_x = signed(x)
        if f_x < 0:
            lo, f_lo = x, f_x
            if side < 0:
                f_hi /= 2
            side = -1
        else:
            hi, f_hi = x, f_x
            if side > 0:
                f_lo /= 2
            side = 1
        if hi - lo < _PRECISION or f_x == 0:
            break
    return x


def _to_second(naive_utc: datetime) -> datetime:
    rounded = naive_utc + timedelta(microseconds=500_000)
    return rounded.replace(microsecond=0, tzinfo=UTC)


@lru_cache(maxsize=1024)
def ever_happens(event: str, latitude: float, longitude: float) -> bool:
    """Whether the event happens at all at this place (it may not at or near a pole)."""
    return next_event(event, latitude, longitude, datetime(2001, 1, 1, tzinfo=UTC)) is not None
