"""The rules of a job's options (queue, priority, retries, backoff, misfire policy, catch-up
window, overlap policy) and of its Celery message options (``message_options``, as
``apply_async`` takes them).

Each verdict depends on the given values only, so bulk scheduling judges one combination
once and shares the ``Options`` object between every job that has it (usually the defaults).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import time, timedelta
from typing import Any

from .fields import DEADLINE_FIELDS, MESSAGE_OPTIONS
from .message import RUN_HEADERS
from .models import MAX_PRIORITY, MIN_PRIORITY
from .payload import CONTROL_CHARS, LONE_SURROGATE, type_name
from .policies import MAX_DELAY, MISFIRE_POLICIES, OVERLAP_POLICIES, WHEN_RETRIES_EXHAUSTED

# Headers a job may not set: the protocol's own, kombu's (``compression`` names how the body
# is compressed: a worker would decompress a body sent as it is) and schedapp's fencing headers.
RESERVED_HEADERS = frozenset(
    "lang task id shadow eta expires group group_index retries timelimit root_id parent_id "
    "argsrepr kwargsrepr origin ignore_result replaced_task_nesting stamped_headers stamps "
    "compression".split()
) | frozenset(RUN_HEADERS)
# Fields whose checks depend on their own values only: judged once per distinct combination
# when many jobs share them (they usually do: the defaults).
OPTION_FIELDS = (
    "queue",
    "priority",
    "max_retries",
    "jitter",
    "lease_seconds",
    "misfire_max_catchup",
    "retry_backoff",
    "retry_backoff_max",
    "misfire_grace",
    "misfire_policy",
    "when_retries_exhausted",
    "catchup_window",
    "overlap",
    "max_buffer",
    "fixed_delay",
    "max_concurrent",
    *DEADLINE_FIELDS,
)
MAX_BUFFER = 100_000  # as misfire_max_catchup: each buffered occurrence is a run to come
# allow_all: runs of one job in flight at once, each a lease renewed and a worker slot held.
MAX_CONCURRENT = 1_000


@dataclass(frozen=True)
class Options:
    """The verdict on one combination of option values: what to store, and what is wrong."""

    values: dict[str, Any]
    errors: tuple[tuple[str, str], ...]


def message_options_verdict(value: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """(the options to store, what is wrong): the apply_async options a job may set."""
    unknown = sorted(set(value) - set(MESSAGE_OPTIONS))
    if unknown:
        return {}, f"unknown option(s) {unknown}; known: {', '.join(MESSAGE_OPTIONS)}."
    for field in ("queue", "routing_key", "exchange"):
        name = value.get(field)
        if name is not None and (
            not isinstance(name, str) or len(name) > 200 or CONTROL_CHARS.search(name)
        ):
            return {}, f"{field} must be a name without control characters (at most 200)."
        if field == "queue" and name is not None and (not name or " " in name):
            return {}, "queue must be a queue name without spaces."
    priority = value.get("priority")
    if priority is not None and (
        isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= 255
    ):
        return {}, "priority (the message's) must be a whole number from 0 to 255."
    expires = value.get("expires")
    if expires is not None and (
        isinstance(expires, bool)
        or not isinstance(expires, int | float)
        or not 0 < expires <= 366 * 86400
    ):
        return {}, "expires must be a number of seconds, more than 0 and at most a year."
    for field in ("time_limit", "soft_time_limit"):
        limit = value.get(field)
        if limit is not None and (
            isinstance(limit, bool)
            or not isinstance(limit, int | float)
            or not 0 < limit <= 366 * 86400  # False for NaN
        ):
            return {}, f"{field} must be a number of seconds, more than 0 and at most a year."
    headers = value.get("headers")
    if headers is not None:
        if not isinstance(headers, dict):
            return {}, f"headers must be a mapping, got {type_name(headers)}."
        reserved = sorted(k for k in headers if k in RESERVED_HEADERS)
        if reserved:
            return {}, f"headers may not set {reserved}: Celery's and schedapp's own."
    return {k: v for k, v in value.items() if v is not None}, None


def options_verdict(given: tuple[Any, ...]) -> Options:
    """The verdict on one combination of option values, given in ``OPTION_FIELDS`` order."""
    values = dict(zip(OPTION_FIELDS, given, strict=True))
    out: dict[str, Any] = {}
    errors: list[tuple[str, str]] = []

    queue = values["queue"]
    if queue is None:
        queue = ""
    if (
        not isinstance(queue, str)
        or len(queue) > 200
        or any(c.isspace() for c in queue)
        or CONTROL_CHARS.search(queue)  # NUL cannot be stored, and no broker wants the others
        or LONE_SURROGATE.search(queue)
    ):
        errors.append(
            ("queue", "must be a queue name without spaces or control characters (at most 200).")
        )
    else:
        out["queue"] = queue

    for field, low, high in (
        ("priority", MIN_PRIORITY, MAX_PRIORITY),
        ("max_retries", 0, 10_000),
        ("jitter", 0, 7 * 86400),
        ("lease_seconds", 1, 7 * 86400),
        ("misfire_max_catchup", 1, 100_000),
        ("max_buffer", 1, MAX_BUFFER),
        ("max_concurrent", 1, MAX_CONCURRENT),
    ):
        value = values[field]
        if isinstance(value, bool) or not isinstance(value, int):
            errors.append((field, f"must be a whole number, got {type_name(value)}."))
        elif not low <= value <= high:
            qualifier = "negative" if value < 0 and low >= 0 else "out of range"
            errors.append((field, f"{value} is {qualifier}; expected {low} to {high}."))
        else:
            out[field] = value

    for field in ("retry_backoff", "retry_backoff_max", "misfire_grace"):
        duration = _duration(values[field])
        if duration is None:
            errors.append((field, "must be a duration (timedelta or seconds)."))
        elif duration < timedelta(0):
            errors.append((field, "must not be negative."))
        elif duration > MAX_DELAY:
            errors.append((field, "must be at most a year."))
        else:
            out[field] = duration
    if (
        "retry_backoff" in out
        and "retry_backoff_max" in out
        and out["retry_backoff_max"] < out["retry_backoff"]
    ):
        errors.append(("retry_backoff_max", "must not be shorter than retry_backoff."))

    window = values["catchup_window"]
    if window is None:  # no window
        out["catchup_window"] = None
    else:
        problem, duration = _window_problem(window, out.get("misfire_grace"))
        if problem:
            errors.append(("catchup_window", problem))
        else:
            out["catchup_window"] = duration

    policy = values["misfire_policy"]
    if policy not in MISFIRE_POLICIES:
        errors.append(
            ("misfire_policy", f"{policy!r} is not one of {', '.join(MISFIRE_POLICIES)}.")
        )
    else:
        out["misfire_policy"] = policy

    overlap = values["overlap"]
    if overlap not in OVERLAP_POLICIES:
        errors.append(("overlap", f"{overlap!r} is not one of {', '.join(OVERLAP_POLICIES)}."))
    else:
        out["overlap"] = overlap
    if not isinstance(values["fixed_delay"], bool):
        errors.append(
            ("fixed_delay", f"must be True or False, got {type_name(values['fixed_delay'])}.")
        )
    else:
        out["fixed_delay"] = values["fixed_delay"]

    exhausted = values["when_retries_exhausted"]
    if exhausted not in WHEN_RETRIES_EXHAUSTED:
        errors.append(
            (
                "when_retries_exhausted",
                f"{exhausted!r} is not one of {', '.join(WHEN_RETRIES_EXHAUSTED)}.",
            )
        )
    else:
        out["when_retries_exhausted"] = exhausted
    _deadlines(values, out, errors)
    return Options(out, tuple(errors))


def _deadlines(values: dict[str, Any], out: dict[str, Any], errors: list[tuple[str, str]]) -> None:
    """The deadline fields (docs/semantics.md, Deadlines): each optional, None for none."""
    for field in ("start_deadline", "max_runtime"):
        value = values[field]
        if value is None:
            out[field] = None
            continue
        duration = _duration(value)
        if duration is None:
            errors.append((field, "must be a duration (timedelta or seconds), or None."))
        elif duration <= timedelta(0):
            errors.append((field, "must be more than 0 (None: no deadline)."))
        elif duration > MAX_DELAY:
            errors.append((field, "must be at most a year."))
        else:
            out[field] = duration
    for field in ("skip_late", "revoke_overrun"):
        if values[field] is None:  # left out of a partial field set: off
            out[field] = False
        elif not isinstance(values[field], bool):
            errors.append((field, f"must be True or False, got {type_name(values[field])}."))
        else:
            out[field] = values[field]
    if out.get("skip_late") and values["start_deadline"] is None:
        errors.append(("skip_late", "needs a start_deadline: late is counted from it."))
    if out.get("revoke_overrun") and values["max_runtime"] is None:
        errors.append(("revoke_overrun", "needs a max_runtime: overrunning is counted from it."))
    finish_by = values["finish_by"]
    if isinstance(finish_by, str):
        try:
            finish_by = time.fromisoformat(finish_by)
        except ValueError:
            errors.append(("finish_by", f"{values['finish_by']!r} is not a time such as '09:00'."))
            finish_by = False
    if finish_by is None or isinstance(finish_by, time):
        if finish_by is not None and finish_by.tzinfo is not None:
            errors.append(("finish_by", "must be a wall-clock time, in the job's zone: no offset."))
        else:
            out["finish_by"] = finish_by
    elif finish_by is not False:
        errors.append(("finish_by", f"must be a time such as '09:00', got {type_name(finish_by)}."))
    count = values["alert_after_failures"]
    if count is None:
        out["alert_after_failures"] = None
    elif isinstance(count, bool) or not isinstance(count, int):
        errors.append(("alert_after_failures", f"must be a whole number, got {type_name(count)}."))
    elif not 1 <= count <= 10_000:
        errors.append(("alert_after_failures", f"{count} is out of range; expected 1 to 10000."))
    else:
        out["alert_after_failures"] = count


def _window_problem(value: Any, grace: timedelta | None) -> tuple[str | None, timedelta | None]:
    """(what is wrong, the window): a catch-up window is more than 0, at most a year, and not
    shorter than the misfire grace: the claim only looks at occurrences missed beyond the
    grace, so a shorter window could never act."""
    duration = _duration(value)
    if duration is None:
        return "must be a duration (timedelta or seconds), or None for no window.", None
    if duration <= timedelta(0):
        return "must be more than 0 (None: no window).", None
    if duration > MAX_DELAY:
        return "must be at most a year.", None
    if grace is not None and duration < grace:
        return (
            f"must not be shorter than misfire_grace ({grace}): only occurrences missed by "
            "more than the grace are looked at, so a shorter window could never act."
        ), None
    return None, duration


def _duration(value: Any) -> timedelta | None:
    """``value`` as a duration (a timedelta, or finite seconds), or None if it is not one."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        try:
            return timedelta(seconds=value)
        except OverflowError:
            return None
    return None
