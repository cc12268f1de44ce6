"""A job's fields: the one list of them (``JobOptions``), and the groups other modules name.

Pure (no database, no broker): the API, bulk scheduling, the stores, the admin, declared
jobs and the importer all need these lists, and none of them should have to import the
validation rules (or Django's models) to get them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, time, timedelta
from typing import Any, TypedDict

SCHEDULE_FIELDS = ("run_at", "cron", "interval", "solar_event")
# Fields where None, given, is the value and not "the default": a schedule field's None is
# "not this kind of schedule"; a catch-up window's is "no window", which a job must be able
# to say when SCHEDAPP_DEFAULT_CATCHUP_WINDOW sets one; a calendar's is "no calendar".
# A deadline's None is "no deadline" (SCHEDAPP_DEADLINES may set one for new jobs).
DEADLINE_FIELDS = (
    "start_deadline",
    "skip_late",
    "max_runtime",
    "revoke_overrun",
    "finish_by",
    "alert_after_failures",
)
NONE_IS_A_VALUE = (
    *SCHEDULE_FIELDS,
    "catchup_window",
    "calendar",
    "start_deadline",
    "max_runtime",
    "finish_by",
    "alert_after_failures",
)
# The fields of a job's calendar: a change to any of them recomputes its next run.
CALENDAR_FIELDS = ("calendar", "calendar_mode", "calendar_roll")
# The fields of one schedule kind beyond its main one, and of any recurring schedule.
SCHEDULE_DETAIL_FIELDS = (
    "cron_day_or",
    "dst_policy",
    "latitude",
    "longitude",
    "not_before",
    "expires_at",
)
# The columns of Celery's semantics (migration 0007) and a cron's DST policy (0023), which the
# claim and the bulk COPY carry; message_options last (the COPY encodes it on its own).
CELERY_FIELDS = (
    "cron_day_or",
    "dst_policy",
    "solar_event",
    "latitude",
    "longitude",
    "not_before",
    "expires_at",
    "message_options",
)
# Per-job Celery message options, as apply_async takes them (over the task's own options).
MESSAGE_OPTIONS = (
    "queue",
    "routing_key",
    "exchange",
    "priority",
    "expires",
    "headers",
    # the message's timelimit header: a prefork worker kills (hard) or interrupts (soft) the
    # task after so many seconds, over the task's own limits
    "time_limit",
    "soft_time_limit",
)


class JobOptions(TypedDict, total=False):
    """A job's editable fields other than its task: what ``api.schedule`` takes as options.

    The one list of a job's fields: ``JOB_FIELDS`` is read from it, and the API, the admin
    form, declared jobs and the importer all take their field list from ``JOB_FIELDS``.
    None means "the default" for every option but ``NONE_IS_A_VALUE``'s (the schedule ones,
    and ``catchup_window``, where None is no window).
    """

    args: Iterable[Any]
    kwargs: Mapping[str, Any] | None
    description: str | None
    tags: Iterable[str] | None
    notify: Iterable[str] | None
    run_at: datetime | None
    cron: str | None
    interval: timedelta | float | None
    interval_anchor: datetime | None
    solar_event: str | None
    cron_day_or: bool
    dst_policy: str | None
    latitude: float | None
    longitude: float | None
    not_before: datetime | None
    expires_at: datetime | None
    message_options: Mapping[str, Any] | None
    timezone: str | None
    name: str | None
    priority: int
    queue: str | None
    max_retries: int | None
    jitter: int
    lease_seconds: int | None
    retry_backoff: timedelta | float | None
    retry_backoff_max: timedelta | float | None
    when_retries_exhausted: str | None
    misfire_policy: str | None
    misfire_grace: timedelta | float | None
    misfire_max_catchup: int | None
    catchup_window: timedelta | float | None
    overlap: str | None
    max_buffer: int | None
    max_concurrent: int | None
    fixed_delay: bool
    # A stored calendar (``schedapp.models.Calendar``, or its name) the job follows, how
    # (``exclude`` / ``only``) and what an excluded occurrence does (``calendars.ROLLS``).
    calendar: Any
    calendar_mode: str | None
    calendar_roll: str | None
    start_deadline: timedelta | float | None
    skip_late: bool
    max_runtime: timedelta | float | None
    revoke_overrun: bool
    finish_by: time | str | None
    alert_after_failures: int | None


class JobChanges(JobOptions, total=False):
    """What ``api.update`` takes: any option, and the task."""

    task: str


JOB_FIELDS: tuple[str, ...] = ("task", *JobOptions.__annotations__)


def changed_fields(job: Any, values: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of ``values`` that differ from ``job``'s, with the whole schedule (and its
    zone) when any part of it changed: a new schedule replaces the old one whole, so an update
    must say all of it. What the admin, declared jobs and the importer pass to
    ``api.update``."""
    changes = {f: v for f, v in values.items() if not _same(f, getattr(job, f), v)}
    if any(f in changes for f in (*_WHOLE_SCHEDULE, *SCHEDULE_DETAIL_FIELDS)):
        changes.update({f: values[f] for f in _WHOLE_SCHEDULE if f in values})
    return changes


_WHOLE_SCHEDULE = (*SCHEDULE_FIELDS, "timezone")


def _same(field: str, current: Any, value: Any) -> bool:
    """A calendar is the same by its name (a stored calendar, or the name the audit trail and
    declarations give)."""
    if field == "calendar":
        return getattr(current, "name", current) == getattr(value, "name", value)
    return bool(current == value)


def with_defaults(defaults: Mapping[str, Any], given: Mapping[str, Any]) -> dict[str, Any]:
    """``defaults`` overridden by what the caller gave (``task`` included); None means "the
    default" for every field but ``NONE_IS_A_VALUE``'s (there: "not this kind of schedule",
    "no catch-up window")."""
    if None not in given.values():  # the common case, merged in one step
        return {**defaults, "task": None, **given}
    values = dict(defaults)
    values["task"] = None
    for key, value in given.items():
        if value is None and key in defaults and key not in NONE_IS_A_VALUE:
            continue
        values[key] = value
    return values
