"""Validation of job input, shared by the API, the admin form, imports and declared jobs.

Every error names its field and says what is wrong, and all of a job's errors are reported at
once, as a ``django.core.exceptions.ValidationError`` keyed by field.
"""

from __future__ import annotations

import math
from datetime import timedelta
from fnmatch import fnmatchcase
from functools import lru_cache
from typing import Any

from django.core.exceptions import ValidationError

from .conf import get_settings
from .exceptions import ScheduleError
from .models import MAX_PRIORITY, MIN_PRIORITY
from .policies import MISFIRE_POLICIES
from .schedules import Schedule, parse_cron, parse_interval, parse_run_at, parse_timezone

MAX_INT = 2**31 - 1
NAME_MAX = 200
SCHEDULE_FIELDS = ("run_at", "cron", "interval")
# Fields a job accepts, beyond task/args/kwargs/schedule: ``schedule(**policy)`` takes these.
POLICY_FIELDS = (
    "retry_backoff",
    "retry_backoff_max",
    "misfire_policy",
    "misfire_grace",
    "misfire_max_catchup",
)
JOB_FIELDS = (
    "task",
    "args",
    "kwargs",
    "run_at",
    "cron",
    "interval",
    "timezone",
    "name",
    "priority",
    "queue",
    "max_retries",
    "jitter",
    "lease_seconds",
    *POLICY_FIELDS,
)


def name_taken(name: str) -> str:
    """The message for a job name already in use (the API and the admin form say the same)."""
    return f"a job named {name!r} already exists."


def celery_app() -> Any:
    """The Celery app jobs are validated against and published through."""
    path = get_settings().CELERY_APP
    if path:
        from celery.utils.imports import symbol_by_name

        return symbol_by_name(path)
    from celery import current_app

    return current_app._get_current_object()


@lru_cache(maxsize=1)
def _discovered(app_id: int) -> bool:
    celery_app().loader.import_default_modules()  # autodiscover tasks.py of every Django app
    return True


def task_not_allowed(name: str) -> str | None:
    """Why the allowlist refuses this task, or None. Checked when a job is written, and again
    whenever it is about to run (the allowlist may have changed since)."""
    settings = get_settings()
    return _allowlist_problem(name, settings.ALLOWED_TASKS, settings.DENIED_TASKS)


@lru_cache(maxsize=4096)
def _allowlist_problem(name: str, allowed: tuple[str, ...], denied: tuple[str, ...]) -> str | None:
    if any(fnmatchcase(name, p) for p in denied) or not any(fnmatchcase(name, p) for p in allowed):
        return f"task {name!r} is not allowed (SCHEDAPP_ALLOWED_TASKS)."
    return None


def task_problem(name: str) -> str | None:
    """Why a job may not run this task, or None if it may: allowed, and registered with the
    Celery app (where jobs are written; a beat only checks the allowlist)."""
    problem = task_not_allowed(name)
    if problem:
        return problem
    app = celery_app()
    _discovered(id(app))
    if name not in app.tasks:
        return f"task {name!r} is not registered with the Celery app."
    return None


class _Errors:
    def __init__(self) -> None:
        self.by_field: dict[str, list[str]] = {}

    def add(self, field: str, message: str) -> None:
        self.by_field.setdefault(field, []).append(message)

    def raise_if_any(self) -> None:
        if self.by_field:
            raise ValidationError(self.by_field)


def validate_job(values: dict[str, Any], *, check_task: bool = True) -> dict[str, Any]:
    """Check and normalise a job's fields; returns the values to store.

    ``values`` holds the job's full field set (callers merge defaults and existing values
    first). Raises ValidationError with every problem found, keyed by field.
    """
    unknown = set(values) - set(JOB_FIELDS)
    errors = _Errors()
    for field in sorted(unknown):
        errors.add(field, f"unknown option {field!r}; known options: {', '.join(JOB_FIELDS)}.")
    out: dict[str, Any] = {}

    task = values.get("task")
    if not isinstance(task, str) or not task.strip():
        errors.add("task", "must be the name of a registered Celery task.")
    elif len(task) > 200:
        errors.add("task", "must be at most 200 characters.")
    else:
        problem = task_problem(task.strip()) if check_task else None
        if problem:
            errors.add("task", problem)
        out["task"] = task.strip()

    _check_payload(values, errors, out)
    _check_schedule(values, errors, out)

    name = values.get("name")
    if not isinstance(name, str) or not name.strip():
        errors.add("name", "must be a non-empty string.")
    elif len(name) > NAME_MAX:
        errors.add("name", f"must be at most {NAME_MAX} characters.")
    elif any(ord(c) < 32 for c in name) or "\x00" in name:
        errors.add("name", "must not contain control characters.")
    else:
        out["name"] = name

    queue = values.get("queue", "")
    if queue is None:
        queue = ""
    if not isinstance(queue, str) or len(queue) > 200 or any(c.isspace() for c in queue):
        errors.add("queue", "must be a queue name without spaces (at most 200 characters).")
    else:
        out["queue"] = queue

    for field, low, high in (
        ("priority", MIN_PRIORITY, MAX_PRIORITY),
        ("max_retries", 0, 10_000),
        ("jitter", 0, 7 * 86400),
        ("lease_seconds", 1, 7 * 86400),
        ("misfire_max_catchup", 1, 100_000),
    ):
        value = values.get(field)
        if isinstance(value, bool) or not isinstance(value, int):
            errors.add(field, f"must be a whole number, got {type(value).__name__}.")
        elif not low <= value <= high:
            qualifier = "negative" if value < 0 and low >= 0 else "out of range"
            errors.add(field, f"{value} is {qualifier}; expected {low} to {high}.")
        else:
            out[field] = value

    for field, minimum in (
        ("retry_backoff", timedelta(0)),
        ("retry_backoff_max", timedelta(0)),
        ("misfire_grace", timedelta(0)),
    ):
        value = values.get(field)
        duration = _duration(value)
        if duration is None:
            errors.add(field, "must be a duration (timedelta or seconds).")
        elif duration < minimum:
            errors.add(field, "must not be negative.")
        elif duration > timedelta(days=365):
            errors.add(field, "must be at most a year.")
        else:
            out[field] = duration
    if (
        "retry_backoff" in out
        and "retry_backoff_max" in out
        and out["retry_backoff_max"] < out["retry_backoff"]
    ):
        errors.add("retry_backoff_max", "must not be shorter than retry_backoff.")

    policy = values.get("misfire_policy")
    if policy not in MISFIRE_POLICIES:
        errors.add("misfire_policy", f"{policy!r} is not one of {', '.join(MISFIRE_POLICIES)}.")
    else:
        out["misfire_policy"] = policy

    errors.raise_if_any()
    return out


def _duration(value: Any) -> timedelta | None:
    if isinstance(value, timedelta):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        try:
            return timedelta(seconds=value)
        except OverflowError:
            return None
    return None


def _check_schedule(values: dict[str, Any], errors: _Errors, out: dict[str, Any]) -> None:
    try:
        timezone: str | None = parse_timezone(values.get("timezone"))
        out["timezone"] = timezone
    except ScheduleError as exc:
        errors.add(exc.field, exc.message)
        timezone = None
    given = [f for f in SCHEDULE_FIELDS if values.get(f) not in (None, "")]
    if len(given) != 1:
        message = "needs exactly one schedule: run_at (one-off), cron or interval" + (
            f"; got {', '.join(given)}." if given else "; got none."
        )
        for field in given or ["run_at", "cron", "interval"]:
            errors.add(field, message)
        return
    out.update(run_at=None, cron="", interval=None)
    try:
        if given == ["run_at"]:
            out["run_at"] = parse_run_at(values["run_at"]).at
        elif given == ["interval"]:
            out["interval"] = parse_interval(values["interval"]).every
        else:  # with an invalid zone, still check the expression itself
            if isinstance(values["cron"], str) and len(values["cron"]) > 200:
                raise ScheduleError("cron", "must be at most 200 characters.")
            out["cron"] = parse_cron(values["cron"], timezone or "UTC").expr
    except ScheduleError as exc:
        errors.add(exc.field, exc.message)


def stored_schedule(values: dict[str, Any]) -> Schedule:
    """The schedule of validated values (as returned by ``validate_job``)."""
    from .claims import schedule_of

    return schedule_of(values["run_at"], values["cron"], values["timezone"], values["interval"])


def _check_payload(values: dict[str, Any], errors: _Errors, out: dict[str, Any]) -> None:
    settings = get_settings()
    args = values.get("args", [])
    kwargs = values.get("kwargs", {})
    if args is None:
        args = []
    if kwargs is None:
        kwargs = {}
    ok = True
    if not isinstance(args, list | tuple):
        errors.add("args", f"must be a list of positional arguments, got {type(args).__name__}.")
        ok = False
    else:
        problem = _json_problem(list(args), "args", 0, settings.MAX_PAYLOAD_DEPTH)
        if problem:
            errors.add("args", problem)
            ok = False
    if not isinstance(kwargs, dict):
        errors.add(
            "kwargs", f"must be a mapping of keyword arguments, got {type(kwargs).__name__}."
        )
        ok = False
    else:
        bad = [k for k in kwargs if not isinstance(k, str) or not k.isidentifier()]
        if bad:
            errors.add("kwargs", f"keys must be Python identifiers; bad keys: {bad[:5]!r}.")
            ok = False
        else:
            problem = _json_problem(kwargs, "kwargs", 0, settings.MAX_PAYLOAD_DEPTH)
            if problem:
                errors.add("kwargs", problem)
                ok = False
    if not ok:
        return
    import json

    size = len(json.dumps([list(args), kwargs], ensure_ascii=False).encode())
    if size > settings.MAX_PAYLOAD_BYTES:
        field = "kwargs" if len(json.dumps(kwargs).encode()) > size / 2 else "args"
        errors.add(
            field,
            f"args and kwargs take {size} bytes as JSON; the limit is "
            f"{settings.MAX_PAYLOAD_BYTES} (SCHEDAPP_MAX_PAYLOAD_BYTES).",
        )
        return
    out["args"] = _plain(list(args))
    out["kwargs"] = _plain(kwargs)


def _json_problem(value: Any, path: str, depth: int, max_depth: int) -> str | None:
    """Why ``value`` is not plain JSON (None if it is); paths name the offending element."""
    if depth > max_depth:
        return f"{path} is nested deeper than {max_depth} levels."
    if value is None or isinstance(value, bool | str):
        if isinstance(value, str) and "\x00" in value:
            return f"{path} contains a NUL character, which PostgreSQL's JSON cannot store."
        if isinstance(value, str) and any(0xD800 <= ord(c) <= 0xDFFF for c in value):
            return f"{path} contains a lone surrogate, which is not valid Unicode."
        return None
    if isinstance(value, int):
        return None if abs(value) < 2**63 else f"{path} is an integer too large for JSON."
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{path} is {value}, which JSON cannot carry."
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            problem = _json_problem(item, f"{path}[{i}]", depth + 1, max_depth)
            if problem:
                return problem
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"{path} has a non-string key {key!r}; JSON object keys are strings."
            problem = _json_problem(key, f"{path} key", depth + 1, max_depth) or _json_problem(
                item, f"{path}[{key!r}]", depth + 1, max_depth
            )
            if problem:
                return problem
        return None
    return f"{path} is a {type(value).__name__}, which is not JSON-serialisable."


def _plain(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value
