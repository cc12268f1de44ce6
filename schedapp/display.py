"""Human-readable schedules and times, for the admin, the status command and previews.

Everything here is computed in Python from a job's own fields, so a changelist page of a
hundred jobs costs no query per row.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any

from .exceptions import ScheduleError
from .schedules import Cron, Schedule, get_zone, parse_timezone, zone_names

PREVIEW_COUNT = 5


@lru_cache(maxsize=1)
def timezone_names() -> list[str]:
    """Every zone a job may name, sorted (offered in the job form): the ones
    ``parse_timezone`` accepts, so the form never offers a zone it then refuses."""
    return sorted(zone_names())


@lru_cache(maxsize=4096)
def describe_cron(expr: str) -> str:
    """'0 0 * * 1-5' -> 'At 00:00, Monday through Friday' (cron-descriptor, 24-hour clock)."""
    try:
        from cron_descriptor import ExpressionDescriptor, Options

        options = Options()
        options.use_24hour_time_format = True
        options.verbose = False
        return str(ExpressionDescriptor(expr, options).get_description())
    except Exception:  # an expression cron-descriptor cannot read: show it as is
        return f"cron {expr}"


def describe_interval(every: timedelta) -> str:
    """timedelta(minutes=90) -> 'Every 1 hour 30 minutes'."""
    seconds = every.total_seconds()
    if seconds <= 0:
        return "Never"
    parts: list[str] = []
    remaining = int(seconds)
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60), ("second", 1)):
        amount, remaining = divmod(remaining, size)
        if amount:
            parts.append(f"{amount} {unit}{'' if amount == 1 else 's'}")
    fraction = seconds - int(seconds)
    if fraction:
        parts.append(f"{fraction:.3f} s")
    if len(parts) == 1 and parts[0].startswith("1 "):
        return f"Every {parts[0][2:]}"
    return "Every " + " ".join(parts)


def describe_schedule(
    run_at: datetime | None,
    cron: str,
    interval: timedelta | None,
    timezone: str,
    *,
    day_or: bool = True,
    solar_event: str = "",
    latitude: float | None = None,
    longitude: float | None = None,
    not_before: datetime | None = None,
    expires_at: datetime | None = None,
) -> str:
    """The schedule of a job in plain words, with its time zone where it matters."""
    if run_at is not None:
        return f"Once, at {local_time(run_at, timezone)}"
    if cron:
        text = f"{describe_cron(cron)} ({timezone})"
        if not day_or and _both_days_restricted(cron):
            # cron-descriptor reads the two day fields as cron's OR; Celery requires both
            text += ", only on days matching both the day of month and the day of week"
    elif solar_event:
        text = f"At {solar_event} at latitude {latitude}, longitude {longitude}"
    elif interval is not None:
        text = describe_interval(interval)
    else:
        return "No schedule"
    if not_before is not None:
        text += f", not before {local_time(not_before, timezone)}"
    if expires_at is not None:
        text += f", until {local_time(expires_at, timezone)}"
    return text


def _both_days_restricted(cron: str) -> bool:
    parts = cron.split()
    if len(parts) == 6:
        parts = parts[1:]
    return len(parts) == 5 and parts[2] not in ("*", "?") and parts[4] not in ("*", "?")


def job_schedule_text(job: Any) -> str:
    return describe_schedule(
        job.run_at,
        job.cron,
        job.interval,
        job.timezone,
        day_or=job.cron_day_or,
        solar_event=job.solar_event,
        latitude=job.latitude,
        longitude=job.longitude,
        not_before=job.not_before,
        expires_at=job.expires_at,
    )


def safe_zone(name: str) -> Any:
    """The job's zone, or UTC if the stored name is unknown to this host."""
    try:
        return get_zone(parse_timezone(name))
    except (ScheduleError, ValueError):
        return get_zone("UTC")


def local_time(value: datetime | None, timezone: str, seconds: bool = False) -> str:
    """An instant as wall-clock time in ``timezone``: '2026-05-04 09:00 CEST'."""
    if value is None:
        return "-"
    local = value.astimezone(safe_zone(timezone))
    fmt = "%Y-%m-%d %H:%M:%S %Z" if seconds else "%Y-%m-%d %H:%M %Z"
    return local.strftime(fmt)


def preview_text(value: datetime, timezone: str) -> str:
    """One previewed fire time: wall time, zone abbreviation and UTC offset."""
    local = value.astimezone(safe_zone(timezone))
    offset = local.strftime("%z")
    return f"{local:%a %Y-%m-%d %H:%M:%S} {local.tzname()} (UTC{offset[:3]}:{offset[3:]})"


def dst_note(schedule: Schedule, at: datetime) -> str:
    """Why a cron's fire time is not at a wall time it names, or is in the repeated hour: its
    DST rule (a time the clocks skipped runs at the gap's end; a repeated one at one offset or
    both). "" for any other time, and for intervals (absolute durations)."""
    if not isinstance(schedule, Cron):
        return ""
    local = at.astimezone(schedule.tz)
    sets = schedule.sets
    if local.hour not in sets.hours or local.minute not in sets.minutes:
        return "moved by its DST rule (the clocks skipped the time it names)"
    naive = local.replace(tzinfo=None)
    first = naive.replace(tzinfo=schedule.tz, fold=0).utcoffset()
    second = naive.replace(tzinfo=schedule.tz, fold=1).utcoffset()
    if first != second:
        which = "first" if local.utcoffset() == first else "second"
        return f"in the repeated hour: its {which} offset (DST rule {schedule.dst_policy})"
    return ""


WAITING = "waiting"


def run_status(status: str, retry_at: datetime | None) -> str:
    """A retry of an allow_all occurrence waits as a run row with status ``dispatched``
    until a beat sends it at its ``retry_at``: people read it as waiting, not as sent."""
    return WAITING if retry_at is not None and status == "dispatched" else status


def run_status_label(status: str, retry_at: datetime | None, stale: bool = False) -> str:
    shown = run_status(status, retry_at)
    if shown == WAITING:
        return "waiting for its retry"
    return f"{status} (stale)" if stale else status


def duration_text(value: timedelta | None) -> str:
    if value is None:
        return "-"
    seconds = value.total_seconds()
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    return str(timedelta(seconds=round(seconds)))


def seconds_text(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 120:
        return f"{value:.1f} s"
    return str(timedelta(seconds=round(value)))
