"""Validation of job input, shared by the API, the admin form, imports and declared jobs.

Every error names its field and says what is wrong, and all of a job's errors are reported at
once, as a ``django.core.exceptions.ValidationError`` keyed by field.

The rules live in ``JobValidator``; ``validate_job`` runs them for one job, and bulk
scheduling runs the same object over many jobs, where it remembers the verdict on what jobs
share (task names, zones, cron expressions, intervals, options), so the rules cannot drift
between the single and the bulk path.

The field lists are in ``fields``, the JSON rules of the payload in ``payload``, the option
and message option verdicts in ``option_rules``, the task allowlist in ``celeryapp``.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.core.exceptions import ValidationError

from .celeryapp import task_problem
from .conf import get_settings
from .exceptions import ScheduleError
from .fields import JOB_FIELDS
from .models import JobSource, field_default, schedule_of
from .option_rules import OPTION_FIELDS, Options, message_options_verdict, options_verdict
from .payload import (
    CONTROL_CHARS,
    LONE_SURROGATE,
    encode_json,
    flat_plain,
    json_problem,
    plain,
    type_name,
)
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

NAME_MAX = 200
_KNOWN_FIELDS = frozenset(JOB_FIELDS)
_option_values = operator.itemgetter(*OPTION_FIELDS)
# Types whose equal values always get the same verdict and the same message, so a verdict on
# one value may be reused for another equal one (a custom __eq__ could lie; these cannot).
_PLAIN_TYPES = frozenset({int, float, str, bool, type(None), timedelta})
# A schedule field is given unless None or "", which a datetime or a number never equals.
_NEVER_EMPTY = frozenset({datetime, timedelta, int, float})
_CACHE_LIMIT = 4096


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


def source_problem(source: Any) -> str | None:
    """Why ``source`` is not a job's source ("api", "admin", ...), or None."""
    if source not in JobSource.values:
        return f"{source!r} is not one of {JobSource.values}."
    return None


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
        out["args"] = plain(out["args"])
        out["kwargs"] = plain(out["kwargs"])
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
            _add(errors, "args", f"must be a list of positional arguments, got {type_name(args)}.")
            ok = False
        elif not (flat and flat_plain(args)):
            problem = json_problem(args, "args", 0, depth)
            if problem:
                _add(errors, "args", problem)
                ok = False
        if type(kwargs) is not dict and not isinstance(kwargs, dict):
            got = type_name(kwargs)
            _add(errors, "kwargs", f"must be a mapping of keyword arguments, got {got}.")
            ok = False
        elif kwargs:
            bad = [k for k in kwargs if not isinstance(k, str) or not k.isidentifier()]
            if bad:
                _add(errors, "kwargs", f"keys must be Python identifiers; bad keys: {bad[:5]!r}.")
                ok = False
            # identifiers hold no NUL and no surrogate: only the values need a look
            elif not (flat and flat_plain(kwargs.values())):
                problem = json_problem(kwargs, "kwargs", 0, depth)
                if problem:
                    _add(errors, "kwargs", problem)
                    ok = False
        if not ok:
            return
        # Encoded once: the size limit measures the very text that bulk writes then store.
        args_json = encode_json(args) if args else "[]"
        kwargs_json = encode_json(kwargs) if kwargs else "{}"
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
            _add(errors, "cron_day_or", f"must be True or False, got {type_name(day_or)}.")
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
            _add(checked.errors, "message_options", f"must be a mapping, got {type_name(value)}.")
            return
        problem = json_problem(value, "message_options", 0, 4)
        if problem is None:
            key = encode_json(value)
            verdict = self._message_options.get(key)
            if verdict is None:
                verdict = _remember(self._message_options, key, message_options_verdict(value))
            cleaned, problem = verdict
        if problem:
            _add(checked.errors, "message_options", problem)
        else:
            checked.values["message_options"] = plain(cleaned)

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
                options = _remember(self._options, key, options_verdict(given))
            return options
        return options_verdict(given)


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


def _check_name(name: Any, checked: Checked) -> None:
    if not isinstance(name, str) or not name.strip():
        _add(checked.errors, "name", "must be a non-empty string.")
    elif len(name) > NAME_MAX:
        _add(checked.errors, "name", f"must be at most {NAME_MAX} characters.")
    elif CONTROL_CHARS.search(name):
        _add(checked.errors, "name", "must not contain control characters.")
    elif LONE_SURROGATE.search(name):  # not storable: UTF-8 cannot encode it
        _add(checked.errors, "name", "contains a lone surrogate, which is not valid Unicode.")
    else:
        checked.values["name"] = name


DESCRIPTION_MAX = 10_000


def _check_description(description: Any, checked: Checked) -> None:
    """Free text for people (None: none); what PostgreSQL can store: no NUL, valid Unicode."""
    if description is None:
        checked.values["description"] = ""
    elif not isinstance(description, str):
        _add(checked.errors, "description", f"must be a string, got {type_name(description)}.")
    elif len(description) > DESCRIPTION_MAX:
        _add(checked.errors, "description", f"must be at most {DESCRIPTION_MAX} characters.")
    elif "\x00" in description:
        _add(checked.errors, "description", "must not contain NUL characters.")
    elif LONE_SURROGATE.search(description):
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
