"""Validation of job input, shared by the API, the admin form, imports and declared jobs.

Every error names its field and says what is wrong, and all of a job's errors are reported at
once, as a ``django.core.exceptions.ValidationError`` keyed by field.

The rules live in ``JobValidator``; ``validate_job`` runs them for one job, and bulk
scheduling runs the same object over many jobs, where it remembers the verdict on what jobs
share (task names, zones, cron expressions, intervals, options), so the rules cannot drift
between the single and the bulk path.
"""

from __future__ import annotations

import json
import json.encoder
import math
import operator
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from fnmatch import fnmatchcase
from functools import lru_cache
from typing import Any, TypedDict

from celery import current_app
from celery.utils.imports import symbol_by_name
from django.core.exceptions import ImproperlyConfigured, ValidationError

from .conf import get_settings
from .exceptions import ScheduleError
from .message import RUN_HEADERS
from .models import MAX_PRIORITY, MIN_PRIORITY, JobSource, field_default, schedule_of
from .policies import MAX_DELAY, MISFIRE_POLICIES, WHEN_RETRIES_EXHAUSTED
from .schedules import (
    Cron,
    Interval,
    Once,
    Schedule,
    parse_cron,
    parse_interval,
    parse_run_at,
    parse_solar,
    parse_timezone,
    with_window,
)

MAX_INT = 2**31 - 1
NAME_MAX = 200
SCHEDULE_FIELDS = ("run_at", "cron", "interval", "solar_event")
# The fields of one schedule kind beyond its main one, and of any recurring schedule.
SCHEDULE_DETAIL_FIELDS = ("cron_day_or", "latitude", "longitude", "not_before", "expires_at")
# The columns of Celery's semantics (migration 0007), which the claim and the bulk COPY carry.
CELERY_FIELDS = (
    "cron_day_or",
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
# Headers a job may not set: the protocol's own, kombu's (``compression`` names how the body
# is compressed: a worker would decompress a body sent as it is) and schedapp's fencing headers.
RESERVED_HEADERS = frozenset(
    "lang task id shadow eta expires group group_index retries timelimit root_id parent_id "
    "argsrepr kwargsrepr origin ignore_result replaced_task_nesting stamped_headers stamps "
    "compression".split()
) | frozenset(RUN_HEADERS)


class JobOptions(TypedDict, total=False):
    """A job's editable fields other than its task: what ``api.schedule`` takes as options.

    The one list of a job's fields: ``JOB_FIELDS`` is read from it, and the API, the admin
    form, declared jobs and the importer all take their field list from ``JOB_FIELDS``.
    None means "the default" for every option but the schedule ones.
    """

    args: Iterable[Any]
    kwargs: Mapping[str, Any] | None
    description: str | None
    run_at: datetime | None
    cron: str | None
    interval: timedelta | float | None
    interval_anchor: datetime | None
    solar_event: str | None
    cron_day_or: bool
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


class JobChanges(JobOptions, total=False):
    """What ``api.update`` takes: any option, and the task."""

    task: str


JOB_FIELDS: tuple[str, ...] = ("task", *JobOptions.__annotations__)
# The options that shape what happens after a run (retries, misfires).
POLICY_FIELDS = (
    "retry_backoff",
    "retry_backoff_max",
    "when_retries_exhausted",
    "misfire_policy",
    "misfire_grace",
    "misfire_max_catchup",
)
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
)
_KNOWN_FIELDS = frozenset(JOB_FIELDS)
_option_values = operator.itemgetter(*OPTION_FIELDS)
# Types whose equal values always get the same verdict and the same message, so a verdict on
# one value may be reused for another equal one (a custom __eq__ could lie; these cannot).
_PLAIN_TYPES = frozenset({int, float, str, bool, type(None), timedelta})
# A schedule field is given unless None or "", which a datetime or a number never equals.
_NEVER_EMPTY = frozenset({datetime, timedelta, int, float})
_CONTROL = re.compile(r"[\x00-\x1f]")
_SURROGATE = re.compile("[\ud800-\udfff]")
_CACHE_LIMIT = 4096


def _json_encoder() -> Callable[[Any], str]:
    """``json.dumps(value, ensure_ascii=False)`` for a validated payload, several times faster:
    the C encoder built once, not per call (a validated payload has no cycles, no NaN and
    nothing but JSON types, so no check is lost)."""
    make = json.encoder.c_make_encoder  # type: ignore[attr-defined]
    if make is None:  # no C accelerator: the standard encoder
        return json.JSONEncoder(ensure_ascii=False, check_circular=False).encode
    encode = make(None, None, json.encoder.encode_basestring, None, ": ", ", ", False, False, True)
    return lambda value: "".join(encode(value, 0))


_encode_json = _json_encoder()


def name_taken(name: str) -> str:
    """The message for a job name already in use (the API and the admin form say the same)."""
    return f"a job named {name!r} already exists."


def generated_name(stem: str, suffix: str) -> str:
    """``stem + suffix`` cut to a job name's limit by shortening the stem: the suffix is what
    makes the name unique, and nobody should get a name error for a name they did not give."""
    return stem[: max(0, NAME_MAX - len(suffix))] + suffix


def job_defaults() -> dict[str, Any]:
    """Every optional field's value when the caller gives none (or None): the model's
    defaults (several read SCHEDAPP_* settings), no schedule and no name."""
    defaults = {f: field_default(f) for f in JOB_FIELDS if f != "task"}
    defaults.update(run_at=None, cron=None, interval=None, solar_event=None, name=None)
    del defaults["interval_anchor"]
    return defaults


def changed_fields(job: Any, values: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of ``values`` that differ from ``job``'s, with the whole schedule (and its
    zone) when any part of it changed: a new schedule replaces the old one whole, so an update
    must say all of it. What the admin, declared jobs and the importer pass to
    ``api.update``."""
    changes = {f: v for f, v in values.items() if getattr(job, f) != v}
    if any(f in changes for f in (*_WHOLE_SCHEDULE, *SCHEDULE_DETAIL_FIELDS)):
        changes.update({f: values[f] for f in _WHOLE_SCHEDULE if f in values})
    return changes


_WHOLE_SCHEDULE = (*SCHEDULE_FIELDS, "timezone")


def with_defaults(defaults: Mapping[str, Any], given: Mapping[str, Any]) -> dict[str, Any]:
    """``defaults`` overridden by what the caller gave (``task`` included); None means "the
    default" for every field but the schedule ones (there: "not this kind of schedule")."""
    if None not in given.values():  # the common case, merged in one step
        return {**defaults, "task": None, **given}
    values = dict(defaults)
    values["task"] = None
    for key, value in given.items():
        if value is None and key in defaults and key not in SCHEDULE_FIELDS:
            continue
        values[key] = value
    return values


def source_problem(source: Any) -> str | None:
    """Why ``source`` is not a job's source ("api", "admin", ...), or None."""
    if source not in JobSource.values:
        return f"{source!r} is not one of {JobSource.values}."
    return None


def celery_app() -> Any:
    """The Celery app jobs are validated against and published through."""
    path = get_settings().CELERY_APP
    if path:
        return symbol_by_name(path)
    return current_app._get_current_object()


@lru_cache(maxsize=1)
def _discovered(app_id: int) -> bool:
    celery_app().loader.import_default_modules()  # autodiscover tasks.py of every Django app
    return True


def registered_tasks() -> list[str]:
    """Names of the tasks registered with the Celery app, Celery's own left out.

    Celery imports the projects' ``tasks.py`` modules lazily: read before that, the registry
    holds only Celery's built-ins (a fresh web process offered no task at all), so the
    modules are imported first, once per app."""
    app = celery_app()
    _discovered(id(app))
    return sorted(name for name in list(app.tasks) if not name.startswith("celery."))


def task_not_allowed(name: str) -> str | None:
    """Why the allowlist refuses this task, or None. Checked when a job is written, and again
    whenever it is about to run (the allowlist may have changed since)."""
    settings = get_settings()
    allowed = settings.ALLOWED_TASKS
    if settings.HOUSEKEEPING:  # schedapp's own housekeeping, unless denied explicitly
        allowed = (*allowed, "schedapp.prune_runs", "schedapp.cleanup_results")
    return _allowlist_problem(name, allowed, settings.DENIED_TASKS)


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


@dataclass(frozen=True)
class Options:
    """The verdict on one combination of option values: what to store, and what is wrong."""

    values: dict[str, Any]
    errors: tuple[tuple[str, str], ...]


@dataclass(slots=True)
class Checked:
    """One job's verdict, before anything is raised.

    ``values`` are the values to store but the options (``args`` and ``kwargs`` as given:
    ``to_store`` adds the options and copies the payload); ``errors`` the problems by field
    (empty if none). For a valid payload, ``args_json`` and ``kwargs_json`` are its JSON text
    (encoded once, for the size limit and for bulk writes); ``schedule`` is the parsed
    schedule; ``options`` the verdict on the option fields, one object shared by every job
    with the same options.
    """

    values: dict[str, Any]
    errors: dict[str, list[str]]
    args_json: str | None = None
    kwargs_json: str | None = None
    schedule: Schedule | None = None
    options: Options | None = None

    def to_store(self) -> dict[str, Any]:
        """All the values to store, the payload copied (the caller's lists stay theirs)."""
        assert self.options is not None
        out = {**self.values, **self.options.values}
        out["args"] = _plain(out["args"])
        out["kwargs"] = _plain(out["kwargs"])
        return out


class JobValidator:
    """The rules of a job's fields, in one place: ``validate_job`` runs them for one job,
    ``schedapp.bulk`` for many.

    Over many jobs it remembers its verdict per task name (allowlist and registry), per time
    zone, per cron expression and zone, per interval and per combination of options, so a
    million jobs cost one check of each distinct value plus the per-job fields (name,
    payload, ``run_at``). A validator lives for one call: the next call reads settings and
    the task registry afresh.
    """

    def __init__(self, *, check_task: bool = True) -> None:
        settings = get_settings()
        self.check_task = check_task
        self.max_payload_bytes = settings.MAX_PAYLOAD_BYTES
        self.max_payload_depth = settings.MAX_PAYLOAD_DEPTH
        self._tasks: dict[Any, tuple[str | None, str | None]] = {}
        self._zones: dict[Any, tuple[str | None, str | None]] = {}
        self._crons: dict[Any, Cron | ScheduleError] = {}
        self._intervals: dict[Any, Interval | ScheduleError] = {}
        self._run_ats: dict[tuple[datetime, int], Once | ScheduleError] = {}
        self._message_options: dict[str, tuple[dict[str, Any], str | None]] = {}
        self._options: dict[Any, Options] = {}
        self._last_options: tuple[tuple[Any, ...], Options] | None = None

    def validate(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """Check and normalise a job's fields (see ``validate_job``)."""
        checked = self.check(values)
        if checked.errors:
            raise ValidationError(checked.errors)
        return checked.to_store()

    def check(self, values: Mapping[str, Any]) -> Checked:
        """Every problem of a job's fields, keyed by field, without raising."""
        errors: dict[str, list[str]] = {}
        if not _KNOWN_FIELDS.issuperset(values):
            for field in sorted(values.keys() - _KNOWN_FIELDS, key=str):
                _add(
                    errors,
                    field,
                    f"unknown option {field!r}; known options: {', '.join(JOB_FIELDS)}.",
                )
        checked = Checked({}, errors)
        self._check_task(values.get("task"), checked)
        self._check_payload(values, checked)
        self._check_schedule(values, checked)
        self._check_message_options(values.get("message_options"), checked)
        _check_name(values.get("name"), checked)
        _check_description(values.get("description"), checked)
        self._check_options(values, checked)
        return checked

    # --- task --------------------------------------------------------------------------------

    def _check_task(self, task: Any, checked: Checked) -> None:
        cacheable = type(task) is str
        verdict = self._tasks.get(task) if cacheable else None
        if verdict is None:
            verdict = self._task_verdict(task)
            if cacheable:
                _remember(self._tasks, task, verdict)
        cleaned, problem = verdict
        if problem:
            _add(checked.errors, "task", problem)
        if cleaned is not None:
            checked.values["task"] = cleaned

    def _task_verdict(self, task: Any) -> tuple[str | None, str | None]:
        if not isinstance(task, str) or not task.strip():
            return None, "must be the name of a registered Celery task."
        if len(task) > 200:
            return None, "must be at most 200 characters."
        cleaned = task.strip()
        return cleaned, task_problem(cleaned) if self.check_task else None

    # --- args and kwargs ---------------------------------------------------------------------

    def _check_payload(self, values: Mapping[str, Any], checked: Checked) -> None:
        errors = checked.errors
        args = values.get("args", [])
        kwargs = values.get("kwargs", {})
        if args is None:
            args = []
        if kwargs is None:
            kwargs = {}
        depth = self.max_payload_depth
        flat = depth >= 1  # items sit at depth 1: the flat shortcut needs that to be allowed
        ok = True
        if type(args) is not list and not isinstance(args, list | tuple):
            _add(errors, "args", f"must be a list of positional arguments, got {_kind(args)}.")
            ok = False
        elif not (flat and _flat_plain(args)):
            problem = _json_problem(args, "args", 0, depth)
            if problem:
                _add(errors, "args", problem)
                ok = False
        if type(kwargs) is not dict and not isinstance(kwargs, dict):
            _add(errors, "kwargs", f"must be a mapping of keyword arguments, got {_kind(kwargs)}.")
            ok = False
        elif kwargs:
            bad = [k for k in kwargs if not isinstance(k, str) or not k.isidentifier()]
            if bad:
                _add(errors, "kwargs", f"keys must be Python identifiers; bad keys: {bad[:5]!r}.")
                ok = False
            # identifiers hold no NUL and no surrogate: only the values need a look
            elif not (flat and _flat_plain(kwargs.values())):
                problem = _json_problem(kwargs, "kwargs", 0, depth)
                if problem:
                    _add(errors, "kwargs", problem)
                    ok = False
        if not ok:
            return
        # Encoded once: the size limit measures the very text that bulk writes then store.
        args_json = _encode_json(args) if args else "[]"
        kwargs_json = _encode_json(kwargs) if kwargs else "{}"
        size = 4 + (len(args_json) if args_json.isascii() else len(args_json.encode()))
        size += len(kwargs_json) if kwargs_json.isascii() else len(kwargs_json.encode())
        # = len(json.dumps([args, kwargs], ensure_ascii=False).encode())
        if size > self.max_payload_bytes:
            field = "kwargs" if len(json.dumps(kwargs).encode()) > size / 2 else "args"
            _add(
                errors,
                field,
                f"args and kwargs take {size} bytes as JSON; the limit is "
                f"{self.max_payload_bytes} (SCHEDAPP_MAX_PAYLOAD_BYTES).",
            )
            return
        checked.values["args"], checked.values["kwargs"] = args, kwargs
        checked.args_json, checked.kwargs_json = args_json, kwargs_json

    # --- schedule ----------------------------------------------------------------------------

    def _check_schedule(self, values: Mapping[str, Any], checked: Checked) -> None:
        errors, out = checked.errors, checked.values
        zone = values.get("timezone")
        cacheable = type(zone) is str
        zone_verdict = self._zones.get(zone) if cacheable else None
        if zone_verdict is None:
            try:
                zone_verdict = (parse_timezone(zone), None)
            except ScheduleError as exc:
                zone_verdict = (None, exc.message)
            if cacheable:
                _remember(self._zones, zone, zone_verdict)
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
            return
        out.update(
            run_at=None,
            cron="",
            interval=None,
            interval_anchor=None,
            solar_event="",
            latitude=None,
            longitude=None,
            cron_day_or=True,
            not_before=None,
            expires_at=None,
        )
        kind = given[0]
        day_or = values.get("cron_day_or", True)
        if day_or is None:
            day_or = True
        if not isinstance(day_or, bool):
            _add(errors, "cron_day_or", f"must be True or False, got {_kind(day_or)}.")
            day_or = True
        out["cron_day_or"] = day_or
        if kind != "solar_event":
            for field in ("latitude", "longitude"):
                if values.get(field) is not None:
                    _add(errors, field, "only a solar schedule (solar_event) has a place.")
        anchor = values.get("interval_anchor")
        if anchor is not None and kind != "interval":
            _add(errors, "interval_anchor", "only an interval schedule has an anchor.")
            anchor = None
        schedule: Schedule | ScheduleError
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
            checked.schedule = schedule
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
            checked.schedule = schedule
        elif isinstance(schedule, Cron):
            out["cron"] = schedule.expr
            checked.schedule = schedule
        else:
            out.update(
                solar_event=schedule.event, latitude=schedule.latitude, longitude=schedule.longitude
            )
            checked.schedule = schedule
        _check_window(values, checked)

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
                _remember(self._run_ats, key, verdict)
        return verdict

    def _interval(self, value: Any) -> Interval | ScheduleError:
        cacheable = type(value) in _PLAIN_TYPES
        key = (type(value), value)
        verdict = self._intervals.get(key) if cacheable else None
        if verdict is None:
            try:
                verdict = parse_interval(value)
            except ScheduleError as exc:
                verdict = exc
            if cacheable:
                _remember(self._intervals, key, verdict)
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
                _remember(self._crons, key, verdict)
        return verdict

    # --- message options ---------------------------------------------------------------------

    def _check_message_options(self, value: Any, checked: Checked) -> None:
        if value is None or (type(value) is dict and not value):
            checked.values["message_options"] = {}
            return
        if not isinstance(value, dict):
            _add(checked.errors, "message_options", f"must be a mapping, got {_kind(value)}.")
            return
        problem = _json_problem(value, "message_options", 0, 4)
        if problem is None:
            key = _encode_json(value)
            verdict = self._message_options.get(key)
            if verdict is None:
                verdict = _remember(self._message_options, key, _message_options_verdict(value))
            cleaned, problem = verdict
        if problem:
            _add(checked.errors, "message_options", problem)
        else:
            checked.values["message_options"] = _plain(cleaned)

    # --- options -----------------------------------------------------------------------------

    def _check_options(self, values: Mapping[str, Any], checked: Checked) -> None:
        try:
            given = _option_values(values)
        except KeyError:  # not a full field set: a missing option is None, as .get() says
            given = tuple(map(values.get, OPTION_FIELDS))
        last = self._last_options
        if last is not None and all(map(operator.is_, given, last[0])):
            options = last[1]  # the very same objects as the previous job's (the defaults)
        else:
            options = self._options_of(given)
            self._last_options = (given, options)
        for field, message in options.errors:
            _add(checked.errors, field, message)
        checked.options = options

    def _options_of(self, given: tuple[Any, ...]) -> Options:
        types = tuple(map(type, given))
        if _PLAIN_TYPES.issuperset(types):
            key = (given, types)
            options = self._options.get(key)
            if options is None:
                options = _remember(self._options, key, _options_verdict(given))
            return options
        return _options_verdict(given)


def validate_job(values: Mapping[str, Any], *, check_task: bool = True) -> dict[str, Any]:
    """Check and normalise a job's fields; returns the values to store.

    ``values`` holds the job's full field set (callers merge defaults and existing values
    first). Raises ValidationError with every problem found, keyed by field.
    """
    return JobValidator(check_task=check_task).validate(values)


def stored_schedule(values: Mapping[str, Any]) -> Schedule:
    """The schedule of validated values (as returned by ``validate_job``)."""
    return schedule_of(values)


def _add(errors: dict[str, list[str]], field: str, message: str) -> None:
    errors.setdefault(field, []).append(message)


def _remember(cache: dict[Any, Any], key: Any, value: Any) -> Any:
    """Cache ``value``; a cache past its limit starts again, so a stream of distinct values
    holds no more than a few thousand verdicts."""
    if len(cache) >= _CACHE_LIMIT:
        cache.clear()
    cache[key] = value
    return value


def _kind(value: Any) -> str:
    return type(value).__name__


def _check_name(name: Any, checked: Checked) -> None:
    if not isinstance(name, str) or not name.strip():
        _add(checked.errors, "name", "must be a non-empty string.")
    elif len(name) > NAME_MAX:
        _add(checked.errors, "name", f"must be at most {NAME_MAX} characters.")
    elif _CONTROL.search(name):
        _add(checked.errors, "name", "must not contain control characters.")
    elif _SURROGATE.search(name):  # not storable: UTF-8 cannot encode it
        _add(checked.errors, "name", "contains a lone surrogate, which is not valid Unicode.")
    else:
        checked.values["name"] = name


DESCRIPTION_MAX = 10_000


def _check_description(description: Any, checked: Checked) -> None:
    """Free text for people (None: none); what PostgreSQL can store: no NUL, valid Unicode."""
    if description is None:
        checked.values["description"] = ""
    elif not isinstance(description, str):
        _add(checked.errors, "description", f"must be a string, got {_kind(description)}.")
    elif len(description) > DESCRIPTION_MAX:
        _add(checked.errors, "description", f"must be at most {DESCRIPTION_MAX} characters.")
    elif "\x00" in description:
        _add(checked.errors, "description", "must not contain NUL characters.")
    elif _SURROGATE.search(description):
        _add(checked.errors, "description", "contains a lone surrogate: not valid Unicode.")
    else:
        checked.values["description"] = description


def _check_window(values: Mapping[str, Any], checked: Checked) -> None:
    """``not_before`` and ``expires_at``: aware instants, in order, on a recurring schedule
    (django-celery-beat's ``start_time`` and ``expires``)."""
    bounds: dict[str, datetime] = {}
    for field in ("not_before", "expires_at"):
        value = values.get(field)
        if value is None:
            continue
        try:
            bounds[field] = parse_run_at(value, field=field).at
        except ScheduleError as exc:
            _add(checked.errors, exc.field, exc.message)
    if not bounds:
        return
    schedule = checked.schedule
    if schedule is None:
        return
    if isinstance(schedule, Once):
        for field in bounds:
            _add(checked.errors, field, "only a recurring schedule has a start or an expiry.")
        return
    start, end = bounds.get("not_before"), bounds.get("expires_at")
    if start is not None and end is not None and end <= start:
        _add(checked.errors, "expires_at", "must be later than not_before.")
        return
    checked.values.update(bounds)
    checked.schedule = with_window(schedule, start, end)


def _message_options_verdict(value: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """(the options to store, what is wrong): the apply_async options a job may set."""
    unknown = sorted(set(value) - set(MESSAGE_OPTIONS))
    if unknown:
        return {}, f"unknown option(s) {unknown}; known: {', '.join(MESSAGE_OPTIONS)}."
    for field in ("queue", "routing_key", "exchange"):
        name = value.get(field)
        if name is not None and (
            not isinstance(name, str) or len(name) > 200 or _CONTROL.search(name)
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
            return {}, f"headers must be a mapping, got {_kind(headers)}."
        reserved = sorted(k for k in headers if k in RESERVED_HEADERS)
        if reserved:
            return {}, f"headers may not set {reserved}: Celery's and schedapp's own."
    return {k: v for k, v in value.items() if v is not None}, None


def _options_verdict(given: tuple[Any, ...]) -> Options:
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
        or _CONTROL.search(queue)  # NUL cannot be stored, and no broker wants the others
        or _SURROGATE.search(queue)
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
    ):
        value = values[field]
        if isinstance(value, bool) or not isinstance(value, int):
            errors.append((field, f"must be a whole number, got {_kind(value)}."))
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

    policy = values["misfire_policy"]
    if policy not in MISFIRE_POLICIES:
        errors.append(
            ("misfire_policy", f"{policy!r} is not one of {', '.join(MISFIRE_POLICIES)}.")
        )
    else:
        out["misfire_policy"] = policy

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
    return Options(out, tuple(errors))


def _duration(value: Any) -> timedelta | None:
    if isinstance(value, timedelta):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        try:
            return timedelta(seconds=value)
        except OverflowError:
            return None
    return None


def _json_problem(value: Any, path: str, depth: int, max_depth: int) -> str | None:
    """Why ``value`` is not plain JSON (None if it is); paths name the offending element.

    Containers vet their plain scalar items inline (the common case, and the per-job cost
    of bulk scheduling); anything else goes through the full rules below, which alone
    write the messages."""
    if depth > max_depth:
        return f"{path} is nested deeper than {max_depth} levels."
    if value is None or isinstance(value, bool | str):
        if isinstance(value, str) and "\x00" in value:
            return f"{path} contains a NUL character, which PostgreSQL's JSON cannot store."
        if isinstance(value, str) and _SURROGATE.search(value):
            return f"{path} contains a lone surrogate, which is not valid Unicode."
        return None
    if isinstance(value, int):
        return None if abs(value) < 2**63 else f"{path} is an integer too large for JSON."
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{path} is {value}, which JSON cannot carry."
    inline = depth < max_depth  # items sit one level deeper: vet them inline only if allowed
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            if inline and _plain_scalar(item):
                continue
            problem = _json_problem(item, f"{path}[{i}]", depth + 1, max_depth)
            if problem:
                return problem
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"{path} has a non-string key {key!r}; JSON object keys are strings."
            if inline and _plain_scalar(key) and _plain_scalar(item):
                continue
            problem = _json_problem(key, f"{path} key", depth + 1, max_depth) or _json_problem(
                item, f"{path}[{key!r}]", depth + 1, max_depth
            )
            if problem:
                return problem
        return None
    return f"{path} is a {_kind(value)}, which is not JSON-serialisable."


def _flat_plain(items: Iterable[Any]) -> bool:
    """True if every item is a JSON scalar the full rules accept: the common flat payload,
    vetted in one loop (False only means "ask ``_json_problem``")."""
    for item in items:
        kind = type(item)
        if kind is int:
            if -(2**63) < item < 2**63:
                continue
        elif kind is str:
            if "\x00" not in item and (item.isascii() or not _SURROGATE.search(item)):
                continue
        elif kind is float:
            if math.isfinite(item):
                continue
        elif item is None or kind is bool:
            continue
        return False
    return True


def _plain_scalar(value: Any) -> bool:
    """A JSON scalar the full rules would accept (a shortcut: False sends it through them)."""
    kind = type(value)
    if kind is str:
        return "\x00" not in value and not _SURROGATE.search(value)
    if kind is int:
        return -(2**63) < value < 2**63
    if kind is float:
        return math.isfinite(value)
    return value is None or kind is bool


def _plain(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


# --- SCHEDAPP_* settings --------------------------------------------------------------------

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
    if not isinstance(s.HOUSEKEEPING, bool):
        found.append(f"SCHEDAPP_HOUSEKEEPING must be True or False, not {s.HOUSEKEEPING!r}.")
    if s.HOUSEKEEPING:
        try:
            parse_cron(s.HOUSEKEEPING_CRON, "UTC")
        except ScheduleError as exc:
            found.append(f"SCHEDAPP_HOUSEKEEPING_CRON {s.HOUSEKEEPING_CRON!r}: {exc.message}")
    if not isinstance(s.RUN_RETENTION, timedelta) or s.RUN_RETENTION <= timedelta(0):
        found.append(f"SCHEDAPP_RUN_RETENTION must be a duration above 0, not {s.RUN_RETENTION!r}.")
    result = s.RESULT_RETENTION
    if result is not None and (not isinstance(result, timedelta) or result < timedelta(0)):
        found.append(f"SCHEDAPP_RESULT_RETENTION must be None or a duration, not {result!r}.")
    if not isinstance(s.JOBS, Mapping):
        found.append(f"SCHEDAPP_JOBS must be a mapping of job name to options, not {s.JOBS!r}.")
    found.extend(_default_problems())
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
            f"SCHEDAPP_DEFAULT_{field.upper()}: {' '.join(messages)}"
            for field, messages in exc.message_dict.items()
        ]
    return []


def refuse_bad_settings(process: str) -> None:
    """A beat or a worker does not start on settings it cannot keep its promises with
    (Celery runs no Django system checks before a beat starts)."""
    problems = settings_problems()
    if problems:
        raise ImproperlyConfigured(f"schedapp: this {process} cannot start: " + " ".join(problems))
