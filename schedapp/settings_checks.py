"""Checks of the ``SCHEDAPP_*`` settings, run by the system checks and before a beat or a
worker starts.

Apart from ``conf.py``, which only reads the settings, because the defaults new jobs take
are checked as a job's fields are: this module needs job validation, and ``conf`` must not.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from django.core.exceptions import ImproperlyConfigured, ValidationError

from .conf import get_settings
from .exceptions import ScheduleError
from .fields import DEADLINE_FIELDS
from .notify.channels import read_channels
from .schedules import parse_cron, parse_dst_policy
from .validation import job_defaults, validate_job

_POSITIVE = ("BATCH_SIZE", "MAX_PAYLOAD_BYTES", "MAX_PAYLOAD_DEPTH")
_POSITIVE_SECONDS = (
    "MAX_SLEEP",
    "MIN_SLEEP",
    "BEAT_TRANSACTION_TIMEOUT",
    "NODE_HEARTBEAT",
    "LEASE_HEARTBEAT",
    "DB_TIMEOUT",
)
_DISPATCH_LOGS = ("each", "batch", "off")


def settings_problems() -> list[str]:
    """Every problem with the ``SCHEDAPP_*`` settings: what a beat or a worker refuses to
    start on (``refuse_bad_settings``)."""
    return core_problems() + notification_problems()


def notification_problems() -> list[str]:
    """What is wrong with ``SCHEDAPP_NOTIFICATIONS`` (a channel, its key and the problem) and
    ``SCHEDAPP_NOTIFY_IN_BEAT``: a channel that cannot send would fail every message for
    good, and a team would learn of it only when an alert did not come."""
    s = get_settings()
    found = read_channels(s.NOTIFICATIONS)[1]
    if not isinstance(s.NOTIFY_IN_BEAT, bool):
        found.append(f"SCHEDAPP_NOTIFY_IN_BEAT must be True or False, not {s.NOTIFY_IN_BEAT!r}.")
    return found


def core_problems() -> list[str]:
    """What is wrong with the ``SCHEDAPP_*`` settings, one line each naming the setting: a
    beat with a batch of 0 would claim nothing, a heartbeat of 0 would renew in a busy loop,
    a pattern list given as one string would match single characters. The defaults new jobs
    take are checked as a job's fields are. Empty when all is well."""
    s = get_settings()
    found: list[str] = []
    for name in _POSITIVE:
        value = getattr(s, name)
        if not _number(value) or value < 1:
            found.append(f"SCHEDAPP_{name} must be a whole number of at least 1, not {value!r}.")
    for name in _POSITIVE_SECONDS:
        value = getattr(s, name)
        if not _number(value, (int, float)) or not value > 0:
            found.append(f"SCHEDAPP_{name} must be a number of seconds above 0, not {value!r}.")
    if s.DISPATCH_LOG not in _DISPATCH_LOGS:
        found.append(
            f"SCHEDAPP_DISPATCH_LOG must be one of {_DISPATCH_LOGS}, not {s.DISPATCH_LOG!r}."
        )
    burst = s.DISPATCH_LOG_BURST
    if not _number(burst) or burst < 0:
        found.append(
            f"SCHEDAPP_DISPATCH_LOG_BURST must be a whole number, 0 or more, not {burst!r}."
        )
    for name in ("ALLOWED_TASKS", "DENIED_TASKS"):
        value = getattr(s, name)
        if not isinstance(value, tuple) or not all(isinstance(p, str) for p in value):
            found.append(
                f"SCHEDAPP_{name} must be a list of task name patterns, not {value!r}"
                + (f" (write [{value!r}])." if isinstance(value, str) else ".")
            )
    port = s.METRICS_PORT
    if port is not None and (not isinstance(port, int) or not 0 < port < 65536):
        found.append(f"SCHEDAPP_METRICS_PORT must be None or a port number, not {port!r}.")
    if not isinstance(s.AUDIT, bool):
        found.append(f"SCHEDAPP_AUDIT must be True or False, not {s.AUDIT!r}.")
    if not isinstance(s.HOUSEKEEPING, bool):
        found.append(f"SCHEDAPP_HOUSEKEEPING must be True or False, not {s.HOUSEKEEPING!r}.")
    if s.HOUSEKEEPING:
        try:
            parse_cron(s.HOUSEKEEPING_CRON, "UTC")
        except ScheduleError as exc:
            found.append(f"SCHEDAPP_HOUSEKEEPING_CRON {s.HOUSEKEEPING_CRON!r}: {exc.message}")
    if not isinstance(s.RUN_RETENTION, timedelta) or s.RUN_RETENTION <= timedelta(0):
        found.append(f"SCHEDAPP_RUN_RETENTION must be a duration above 0, not {s.RUN_RETENTION!r}.")
    if not isinstance(s.HISTORY_PARTITION, timedelta) or s.HISTORY_PARTITION <= timedelta(0):
        found.append(
            f"SCHEDAPP_HISTORY_PARTITION must be a duration above 0, not {s.HISTORY_PARTITION!r}."
        )
    result = s.RESULT_RETENTION
    if result is not None and (not isinstance(result, timedelta) or result < timedelta(0)):
        found.append(f"SCHEDAPP_RESULT_RETENTION must be None or a duration, not {result!r}.")
    try:
        parse_dst_policy(s.IMPORT_DST_POLICY, "SCHEDAPP_IMPORT_DST_POLICY")
    except ScheduleError as exc:
        found.append(f"SCHEDAPP_IMPORT_DST_POLICY: {exc.message}")
    if not isinstance(s.JOBS, Mapping):
        found.append(f"SCHEDAPP_JOBS must be a mapping of job name to options, not {s.JOBS!r}.")
    if not isinstance(s.CALENDARS, Mapping):
        found.append(
            f"SCHEDAPP_CALENDARS must be a mapping of calendar name to definition, "
            f"not {s.CALENDARS!r}."
        )
    deadlines = s.DEADLINES
    if not isinstance(deadlines, Mapping):
        found.append(
            f"SCHEDAPP_DEADLINES must be a mapping of deadline to value, not {deadlines!r}."
        )
    else:
        unknown = sorted(str(k) for k in set(deadlines) - set(DEADLINE_FIELDS))
        if unknown:
            found.append(
                f"SCHEDAPP_DEADLINES: unknown deadline(s) {unknown}; known: "
                f"{', '.join(DEADLINE_FIELDS)}."
            )
        else:
            found.extend(_default_problems())
    if not _number(s.DEADLINE_CHECK, (int, float)) or not s.DEADLINE_CHECK > 0:
        found.append(
            f"SCHEDAPP_DEADLINE_CHECK must be a number of seconds above 0, "
            f"not {s.DEADLINE_CHECK!r}."
        )
    return found


def _number(value: Any, kinds: tuple[type, ...] = (int,)) -> bool:
    """Whether ``value`` is one of ``kinds`` (whole numbers unless told), and not a bool,
    which is an int too."""
    return isinstance(value, kinds) and not isinstance(value, bool)


def _default_problems() -> list[str]:
    """The DEFAULT_* settings, validated as the fields of a job that takes them all."""
    try:
        validate_job(
            {
                **job_defaults(),
                "task": "schedapp.settings_check",
                "interval": 60,
                "name": "defaults",
            },
            check_task=False,
        )
    except ValidationError as exc:
        return [
            (
                f"SCHEDAPP_DEADLINES[{field!r}]: "
                if field in DEADLINE_FIELDS
                else f"SCHEDAPP_DEFAULT_{field.upper()}: "
            )
            + " ".join(messages)
            for field, messages in exc.message_dict.items()
        ]
    return []


def refuse_bad_settings(process: str) -> None:
    """A beat or a worker does not start on settings it cannot keep its promises with
    (Celery runs no Django system checks before a beat starts)."""
    problems = settings_problems()
    if problems:
        raise ImproperlyConfigured(f"schedapp: this {process} cannot start: " + " ".join(problems))
