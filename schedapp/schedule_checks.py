"""The schedule fields of a job checked: exactly one kind (``run_at``, ``cron``, ``interval``
or ``solar_event``), the details that go with it, its zone and its window.

Half of a job's rules by weight, so apart from ``validation``, which runs them through one
``ScheduleChecks`` per call. Pure (no database, no broker): the parsing is ``schedules``'s;
what this adds is which fields go together, and a verdict remembered per zone, cron
expression, interval and instant, so bulk scheduling parses each distinct value once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from .exceptions import ScheduleError
from .payload import type_name
from .schedules import (
    DEFAULT_DST_POLICY,
    Cron,
    Interval,
    Once,
    Schedule,
    parse_cron,
    parse_dst_policy,
    parse_interval,
    parse_run_at,
    parse_solar,
    parse_timezone,
    with_window,
)

# Types whose equal values always get the same verdict and the same message, so a verdict on
# one value may be reused for another equal one (a custom __eq__ could lie; these cannot).
PLAIN_TYPES = frozenset({int, float, str, bool, type(None), timedelta})
# A schedule field is given unless None or "", which a datetime or a number never equals.
_NEVER_EMPTY = frozenset({datetime, timedelta, int, float})
_CACHE_LIMIT = 4096


def remember(cache: dict[Any, Any], key: Any, value: Any) -> Any:
    """Cache ``value``; a cache past its limit starts again, so a stream of distinct values
    holds no more than a few thousand verdicts."""
    if len(cache) >= _CACHE_LIMIT:
        cache.clear()
    cache[key] = value
    return value


class ScheduleChecks:
    """The schedule rules, with the verdicts already reached; lives for one validation call."""

    def __init__(self) -> None:
        self._zones: dict[Any, tuple[str | None, str | None]] = {}
        self._crons: dict[Any, Cron | ScheduleError] = {}
        self._intervals: dict[Any, Interval | ScheduleError] = {}
        self._run_ats: dict[tuple[datetime, int], Once | ScheduleError] = {}

    def check(
        self, values: Mapping[str, Any], errors: dict[str, list[str]], out: dict[str, Any]
    ) -> Schedule | None:
        """The schedule of ``values``, or None if it has a problem (added to ``errors``); the
        schedule fields to store go into ``out``."""
        zone = values.get("timezone")
        cacheable = type(zone) is str
        zone_verdict = self._zones.get(zone) if cacheable else None
        if zone_verdict is None:
            try:
                zone_verdict = (parse_timezone(zone), None)
            except ScheduleError as exc:
                zone_verdict = (None, exc.message)
            if cacheable:
                remember(self._zones, zone, zone_verdict)
        timezone, problem = zone_verdict
        if problem:
            _add(errors, "timezone", problem)
        else:
            out["timezone"] = timezone
        run_at, cron, interval = values.get("run_at"), values.get("cron"), values.get("interval")
        solar_event = values.get("solar_event")
        given = []
        if run_at is not None and (type(run_at) in _NEVER_EMPTY or run_at != ""):
            given.append("run_at")
        if cron is not None and (type(cron) in _NEVER_EMPTY or cron != ""):
            given.append("cron")
        if interval is not None and (type(interval) in _NEVER_EMPTY or interval != ""):
            given.append("interval")
        if solar_event is not None and solar_event != "":
            given.append("solar_event")
        if len(given) != 1:
            message = "needs exactly one schedule: run_at (one-off), cron, interval or " + (
                f"solar_event; got {', '.join(given)}." if given else "solar_event; got none."
            )
            for field in given or ["run_at", "cron", "interval"]:
                _add(errors, field, message)
            return None
        out.update(
            run_at=None,
            cron="",
            interval=None,
            interval_anchor=None,
            solar_event="",
            latitude=None,
            longitude=None,
            cron_day_or=True,
            dst_policy=DEFAULT_DST_POLICY,
            not_before=None,
            expires_at=None,
        )
        kind = given[0]
        day_or = values.get("cron_day_or", True)
        if day_or is None:
            day_or = True
        if not isinstance(day_or, bool):
            _add(errors, "cron_day_or", f"must be True or False, got {type_name(day_or)}.")
            day_or = True
        out["cron_day_or"] = day_or
        try:  # kept on any schedule, as cron_day_or is: only a cron reads it
            out["dst_policy"] = dst_policy = parse_dst_policy(values.get("dst_policy"))
        except ScheduleError as exc:
            _add(errors, exc.field, exc.message)
            dst_policy = DEFAULT_DST_POLICY
        if kind != "solar_event":
            for field in ("latitude", "longitude"):
                if values.get(field) is not None:
                    _add(errors, field, "only a solar schedule (solar_event) has a place.")
        anchor = values.get("interval_anchor")
        if anchor is not None and kind != "interval":
            _add(errors, "interval_anchor", "only an interval schedule has an anchor.")
            anchor = None
        schedule: Schedule | ScheduleError
        found: Schedule | None = None
        if kind == "run_at":
            schedule = self._run_at(run_at)
        elif kind == "interval":
            schedule = self._interval(interval)
        elif kind == "solar_event":
            try:
                schedule = parse_solar(solar_event, values.get("latitude"), values.get("longitude"))
            except ScheduleError as exc:
                schedule = ScheduleError(
                    "solar_event" if exc.field == "event" else exc.field, exc.message
                )
        else:  # with an invalid zone, still check the expression itself
            schedule = self._cron(cron, timezone or "UTC", day_or)
        if isinstance(schedule, ScheduleError):
            _add(errors, schedule.field, schedule.message)
        elif isinstance(schedule, Once):
            out["run_at"] = schedule.at
            found = schedule
        elif isinstance(schedule, Interval):
            out["interval"] = schedule.every
            if anchor is not None:
                try:
                    at = parse_run_at(anchor, field="interval_anchor").at
                except ScheduleError as exc:
                    _add(errors, exc.field, exc.message)
                else:
                    out["interval_anchor"] = at
                    schedule = Interval(schedule.every, at)
            found = schedule
        elif isinstance(schedule, Cron):
            out["cron"] = schedule.expr
            found = replace(schedule, dst_policy=dst_policy)
        else:
            out.update(
                solar_event=schedule.event, latitude=schedule.latitude, longitude=schedule.longitude
            )
            found = schedule
        return _window(values, errors, out, found)

    def _run_at(self, value: Any) -> Once | ScheduleError:
        # Equal aware datetimes are the same instant, hence the same Once, but for ``fold``:
        # Python compares two readings of a repeated wall time in one zone as equal, an hour
        # apart. A naive one is never equal to an aware one, so it cannot borrow its verdict.
        cacheable = type(value) is datetime
        key = (value, value.fold) if cacheable else None
        verdict = self._run_ats.get(key) if cacheable else None
        if verdict is None:
            try:
                verdict = parse_run_at(value)
            except ScheduleError as exc:
                verdict = exc
            if cacheable:
                remember(self._run_ats, key, verdict)
        return verdict

    def _interval(self, value: Any) -> Interval | ScheduleError:
        cacheable = type(value) in PLAIN_TYPES
        key = (type(value), value)
        verdict = self._intervals.get(key) if cacheable else None
        if verdict is None:
            try:
                verdict = parse_interval(value)
            except ScheduleError as exc:
                verdict = exc
            if cacheable:
                remember(self._intervals, key, verdict)
        return verdict

    def _cron(self, value: Any, timezone: str, day_or: bool = True) -> Cron | ScheduleError:
        cacheable = type(value) is str
        key = (value, timezone, day_or)
        verdict = self._crons.get(key) if cacheable else None
        if verdict is None:
            try:
                if isinstance(value, str) and len(value) > 200:
                    raise ScheduleError("cron", "must be at most 200 characters.")
                verdict = parse_cron(value, timezone, day_or=day_or)
            except ScheduleError as exc:
                verdict = exc
            if cacheable:
                remember(self._crons, key, verdict)
        return verdict


def _window(
    values: Mapping[str, Any],
    errors: dict[str, list[str]],
    out: dict[str, Any],
    schedule: Schedule | None,
) -> Schedule | None:
    """``not_before`` and ``expires_at``: aware instants, in order, on a recurring schedule
    (django-celery-beat's ``start_time`` and ``expires``); ``schedule`` within them."""
    bounds: dict[str, datetime] = {}
    for field in ("not_before", "expires_at"):
        value = values.get(field)
        if value is None:
            continue
        try:
            bounds[field] = parse_run_at(value, field=field).at
        except ScheduleError as exc:
            _add(errors, exc.field, exc.message)
    if not bounds or schedule is None:
        return schedule
    if isinstance(schedule, Once):
        for field in bounds:
            _add(errors, field, "only a recurring schedule has a start or an expiry.")
        return schedule
    start, end = bounds.get("not_before"), bounds.get("expires_at")
    if start is not None and end is not None and end <= start:
        _add(errors, "expires_at", "must be later than not_before.")
        return schedule
    out.update(bounds)
    return with_window(schedule, start, end)


def _add(errors: dict[str, list[str]], field: str, message: str) -> None:
    errors.setdefault(field, []).append(message)
