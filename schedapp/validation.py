"""Validation of job input, shared by the API, the admin form, imports and declared jobs.

Every error names its field and says what is wrong, and all of a job's errors are reported at
once, as a ``django.core.exceptions.ValidationError`` keyed by field.

The rules live in ``JobValidator``; ``validate_job`` runs them for one job, and bulk
scheduling runs the same object over many jobs, where it remembers the verdict on what jobs
share (task names, zones, cron expressions, intervals, options), so the rules cannot drift
between the single and the bulk path.

The schedule fields' rules are in ``schedule_checks``, the JSON rules of the payload in
``payload``, the option and message option verdicts in ``option_rules``, the task allowlist
in ``celeryapp``, the field lists in ``fields``.
"""

from __future__ import annotations

import json
import operator
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date
from typing import Any

from django.core.exceptions import ValidationError

from . import calendars, job_calendars
from .celeryapp import task_problem
from .conf import get_settings
from .exceptions import ScheduleError
from .fields import JOB_FIELDS
from .models import Calendar, CalendarReference, JobSource, field_default, schedule_of
from .notify.channels import read_channels
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
from .schedule_checks import PLAIN_TYPES, ScheduleChecks, remember
from .schedules import Interval, Once, Schedule

NAME_MAX = 200
_KNOWN_FIELDS = frozenset(JOB_FIELDS)
_option_values = operator.itemgetter(*OPTION_FIELDS)


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

    def __init__(
        self, *, check_task: bool = True, calendars: job_calendars.Known | None = None
    ) -> None:
        settings = get_settings()
        self.check_task = check_task
        # The stored calendars, read beforehand (bulk scheduling: no query during its COPY);
        # None: each job's calendar is read from the database.
        self.calendars = calendars
        self.max_payload_bytes = settings.MAX_PAYLOAD_BYTES
        self.max_payload_depth = settings.MAX_PAYLOAD_DEPTH
        self._tasks: dict[Any, tuple[str | None, str | None]] = {}
        self._schedules = ScheduleChecks()
        self._message_options: dict[str, tuple[dict[str, Any], str | None]] = {}
        self._options: dict[Any, Options] = {}
        self._last_options: tuple[tuple[Any, ...], Options] | None = None
        self._channels: frozenset[str] | None = None  # read when a job names one

    def _check_notify(self, notify: Any, checked: Checked) -> None:
        """Channels of ``SCHEDAPP_NOTIFICATIONS`` this job's events also go to (None: none):
        a list of their names, each configured, sorted and once each."""
        if not notify:
            checked.values["notify"] = []
            return
        if isinstance(notify, str) or not isinstance(notify, list | tuple | set | frozenset):
            kind = type_name(notify)
            _add(checked.errors, "notify", f"must be a list of channel names, got {kind}.")
            return
        if self._channels is None:
            self._channels = frozenset(read_channels(get_settings().NOTIFICATIONS)[0])
        names = set()
        for name in notify:
            if not isinstance(name, str) or name.strip() not in self._channels:
                known = ", ".join(sorted(self._channels)) or "none"
                _add(
                    checked.errors,
                    "notify",
                    f"{name!r} is not a channel of SCHEDAPP_NOTIFICATIONS (configured: {known}).",
                )
                return
            names.add(name.strip())
        checked.values["notify"] = sorted(names)

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
        checked.schedule = self._schedules.check(values, errors, checked.values)
        self._check_message_options(values.get("message_options"), checked)
        _check_name(values.get("name"), checked)
        _check_description(values.get("description"), checked)
        _check_tags(values.get("tags"), checked)
        self._check_notify(values.get("notify"), checked)
        self._check_options(values, checked)
        _check_fixed_delay(checked)
        _check_calendar(values, checked, self.calendars)
        _check_allow_all(checked)
        return checked

    # --- task --------------------------------------------------------------------------------

    def _check_task(self, task: Any, checked: Checked) -> None:
        cacheable = type(task) is str
        verdict = self._tasks.get(task) if cacheable else None
        if verdict is None:
            verdict = self._task_verdict(task)
            if cacheable:
                remember(self._tasks, task, verdict)
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
                verdict = remember(self._message_options, key, message_options_verdict(value))
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
        if PLAIN_TYPES.issuperset(types):
            key = (given, types)
            options = self._options.get(key)
            if options is None:
                options = remember(self._options, key, options_verdict(given))
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


def _check_fixed_delay(checked: Checked) -> None:
    """A fixed delay counts an interval from the end of each run: a cron, solar or one-off
    schedule has no interval to count."""
    assert checked.options is not None
    if checked.options.values.get("fixed_delay") and checked.schedule is not None:
        if not isinstance(checked.schedule, Interval):
            _add(checked.errors, "fixed_delay", "needs an interval schedule (interval=...).")


def _check_calendar(
    values: Mapping[str, Any], checked: Checked, known: job_calendars.Known | None = None
) -> None:
    """The job's calendar: a stored one (or its name), a mode and a roll that make sense
    together and with the schedule. Whether it leaves the job a run is checked where its
    first run is computed (``policies.first_run``, field ``calendar``), on the database's
    clock."""
    errors = checked.errors
    try:
        calendar = job_calendars.resolve(values.get("calendar"), known=known)
    except ScheduleError as exc:
        _add(errors, exc.field, exc.message)
        return
    for field, parse in (
        ("calendar_mode", calendars.parse_mode),
        ("calendar_roll", calendars.parse_roll),
    ):
        try:
            checked.values[field] = parse(values.get(field), field)
        except ScheduleError as exc:
            _add(errors, exc.field, exc.message)
    checked.values["calendar"] = calendar
    if errors:
        return
    mode, roll = checked.values["calendar_mode"], checked.values["calendar_roll"]
    if calendar is None:
        for field, value, default in (
            ("calendar_mode", mode, calendars.DEFAULT_MODE),
            ("calendar_roll", roll, calendars.DEFAULT_ROLL),
        ):
            if value != default:
                _add(errors, field, f"{value!r} needs a calendar (none is given).")
        return
    if isinstance(checked.schedule, Once):
        _add(
            errors,
            "calendar",
            "a one-off (run_at) runs at its time; a calendar is for a recurring schedule.",
        )
    try:
        job_calendars.parsed(calendar, known=known)
    except ScheduleError as exc:
        _add(errors, "calendar", exc.message)


def _check_allow_all(checked: Checked) -> None:
    """allow_all moves the job on to its next occurrence as each run is claimed: a one-off has
    none, and a fixed delay counts from a run's end, which allow_all does not wait for."""
    assert checked.options is not None
    values = checked.options.values
    if values.get("overlap") != "allow_all":
        return
    if isinstance(checked.schedule, Once):
        _add(checked.errors, "overlap", "allow_all needs a recurring schedule, not run_at.")
    if values.get("fixed_delay"):
        _add(
            checked.errors,
            "fixed_delay",
            "cannot be used with overlap allow_all: a fixed delay waits for the end of a run, "
            "allow_all does not.",
        )


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


TAGS_MAX = 20
TAG_LENGTH_MAX = 64
# A letter or digit first, then letters, digits and - _ . : / = (no comma or space: the
# admin's form separates tags with them); stored lowercased.
TAG_PATTERN = re.compile(r"[a-z0-9][a-z0-9_.:/=-]*")


def _check_tags(tags: Any, checked: Checked) -> None:
    """Labels grouping jobs (metrics, alert routing, the admin's filter): a list of short
    words, lowercased, each once, sorted (None: none)."""
    if tags is None:
        checked.values["tags"] = []
        return
    if isinstance(tags, str) or not isinstance(tags, list | tuple | set | frozenset):
        _add(checked.errors, "tags", f"must be a list of labels, got {type_name(tags)}.")
        return
    found: set[str] = set()
    for tag in tags:
        if not isinstance(tag, str):
            _add(checked.errors, "tags", f"each must be a string, got {type_name(tag)}.")
            return
        word = tag.strip().lower()
        if not 0 < len(word) <= TAG_LENGTH_MAX or not TAG_PATTERN.fullmatch(word):
            _add(
                checked.errors,
                "tags",
                f"{tag!r} is not a label: 1 to {TAG_LENGTH_MAX} letters, digits and "
                "- _ . : / =, starting with a letter or digit.",
            )
            return
        found.add(word)
    if len(found) > TAGS_MAX:
        _add(checked.errors, "tags", f"at most {TAGS_MAX} labels, got {len(found)}.")
        return
    checked.values["tags"] = sorted(found)


# --- calendars ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CheckedCalendar:
    """A calendar's values to store, its parsed form and the names its definition refers to."""

    values: dict[str, Any]
    calendar: calendars.Calendar
    references: frozenset[str]


def validate_calendar(
    name: Any, definition: Any, description: Any = "", *, instance: Any = None, today: date
) -> CheckedCalendar:
    """Check a calendar (``schedapp.calendars`` reads its definition); raises ValidationError
    keyed by field, the definition's by its path (``definition.union[1].holidays.country``).

    References resolve against the stored calendars, with this one's new definition in place
    of its stored one, so a cycle through any of them is refused. A calendar that excludes
    every day of the next two years (``calendars.SEARCH_DAYS``) is refused: nothing could run
    under it. A calendar others refer to keeps its name (they name it)."""
    errors: dict[str, list[str]] = {}
    checked = Checked({}, errors)
    _check_name(name, checked)
    _check_description(description, checked)
    if "name" in checked.values:
        others = Calendar.objects.filter(name=name)
        if instance is not None and instance.pk is not None:
            others = others.exclude(pk=instance.pk)
            if instance.name != name and CalendarReference.objects.filter(target=instance).exists():
                users = Calendar.objects.filter(references=instance).values_list("name", flat=True)
                _add(
                    errors,
                    "name",
                    f"{instance.name!r} is named by {', '.join(sorted(users))}: it keeps its name.",
                )
        if others.exists():
            _add(errors, "name", f"a calendar named {name!r} already exists.")
    parsed = None
    if isinstance(name, str):
        stored = instance.name if instance is not None and instance.pk is not None else name

        def resolve(other: str) -> object | None:
            if other in (name, stored):
                return definition
            return Calendar.objects.filter(name=other).values_list("definition", flat=True).first()

        try:
            parsed = calendars.parse_calendar(name, definition, resolve)
            calendars.check_allows_something(parsed.rule, today)
        except ScheduleError as exc:
            _add(errors, exc.field, exc.message)
            parsed = None
        except (TypeError, ValueError, RecursionError) as exc:  # a definition no rule reads
            _add(errors, "definition", f"cannot be read as a calendar: {exc}.")
            parsed = None
    if errors or parsed is None:
        raise ValidationError(errors or {"name": ["must be a non-empty string."]})
    values = {**checked.values, "definition": definition}
    return CheckedCalendar(values, parsed, frozenset(calendars.references(definition)))
