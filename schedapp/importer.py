"""Import schedules from Celery beat (``CELERY_BEAT_SCHEDULE``) and django-celery-beat.

A team switches in one step: every entry that maps is created as a job (source "imported")
through ``api.schedule``; every entry that does not is reported with the reason, and nothing
is half-imported. Importing is idempotent by name: a name that exists is skipped (or, with
``update=True``, an imported job is brought in line with the source, each in a short
transaction of its own once the new jobs are in).

Mapping, with Celery's semantics:

* ``crontab`` -> cron ``minute hour day_of_month month_of_year day_of_week`` (from crontab's
  ``_orig_*`` attributes, the values it was given), in the Celery app's time zone, with
  ``cron_day_or=False``: when both day fields are restricted, a day must match both, as
  Celery requires. django-celery-beat's ``CrontabSchedule`` -> the same, in its own zone.
  With the app's ``beat_cron_starting_deadline`` set, a crontab (only: Celery's other
  schedules ignore it) gets ``misfire_policy="run_recent"`` with the deadline as its
  ``misfire_grace``: after an outage its latest missed run is sent once if it is at most
  that old, else nothing is sent until the next one, as Celery's ``crontab.is_due`` decides.
* ``timedelta``, a number of seconds, ``schedule(run_every=...)`` and ``IntervalSchedule``
  -> interval; ``relative=True`` -> an interval anchored where Celery rounds its runs to
  (``relative_interval``). ``solar`` and ``SolarSchedule`` -> a solar job.
  ``ClockedSchedule`` -> a one-off ``run_at``.
* A subclass of ``crontab``, ``solar`` or ``schedule`` that decides by its own code when it
  is due (its own ``is_due``, ``remaining_estimate`` or ``now``), and anything else -> not
  mapped (reported; ``schedapp_import --strict`` exits non-zero).
* args, kwargs and the entry's ``options`` (queue, routing_key, exchange, priority, expires,
  headers, time_limit, soft_time_limit) -> the job's message options, sent as apply_async sends
  them; other options are reported as ignored. args that are not a list or tuple, kwargs or
  options that are not a mapping, and a schedule that is not a finite number of seconds -> not
  mapped (a deliberate difference where Celery's beat would take a str's characters or a dict's
  keys for the args; where it fails at each send, on a number). django-celery-beat's
  ``description`` -> the job's; ``start_time``/``expires`` -> ``not_before``/``expires_at``; its
  ``expire_seconds``, priority, exchange, routing key and headers -> message options; an
  interval's ``last_run_at`` -> its phase (``interval_anchor``). A disabled ``PeriodicTask``
  becomes a paused job; a ``one_off`` one runs once, at its next fire time, unless it already ran:
  one with a ``total_run_count``, or disabled with its clocked time past (what django-celery-beat
  leaves of a one-off it sent) is left out, and reported; so is a row named as a
  ``CELERY_BEAT_SCHEDULE`` entry (django-celery-beat's copy of it: the entry is synced, or
  imported with ``--from-settings``, not its copy).
* Failures, as Celery beat has them: beat sends the next occurrence whatever the last one did
  and never retries one (a task's own ``autoretry_for``/``self.retry`` are the task's, and
  schedapp runs them as database-side retries of the occurrence). So every imported job (and
  every job declared through ``beat_schedule``) gets ``max_retries=0`` and
  ``when_retries_exhausted="next_occurrence"`` (``CELERY_FAILURES``): a failed occurrence is
  recorded and the job waits for its next one, it is neither run again nor set aside as
  dead. ``schedapp_import --retries N --on-exhausted dead`` asks for schedapp's own policy
  instead (``with_failure_policy``). A one-off (``ClockedSchedule``, ``one_off``) has no next
  occurrence: failed, it goes dead (a dead letter; it never fires again, as under Celery).
* Celery beat has no catch-up window: every imported job (and every job declared through
  ``beat_schedule``) gets ``catchup_window=None`` (``CELERY_WINDOW``), whatever
  ``SCHEDAPP_DEFAULT_CATCHUP_WINDOW`` says.

django-celery-beat is never a dependency: it is imported only when asked for.
"""

from __future__ import annotations

import json
import math
import reprlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from celery import schedules as celery_schedules
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction

from . import api, audit
from .celeryapp import celery_app
from .conf import get_settings
from .db import db_now
from .display import describe_schedule, job_schedule_text, local_time, preview_text
from .exceptions import ScheduleError
from .fields import (
    JOB_FIELDS,
    MESSAGE_OPTIONS,
    SCHEDULE_DETAIL_FIELDS,
    SCHEDULE_FIELDS,
    changed_fields,
    with_defaults,
)
from .models import Job, JobSource
from .policies import NEXT_OCCURRENCE, RUN_RECENT, WHEN_RETRIES_EXHAUSTED
from .schedules import (
    DEFAULT_DST_POLICY,
    Interval,
    Schedule,
    fire_times,
    first_fire_time,
    next_fire_time,
    parse_cron,
    parse_solar,
    with_window,
)
from .validation import job_defaults, stored_schedule, validate_job

BEAT_SCHEDULE = "CELERY_BEAT_SCHEDULE"
DJANGO_CELERY_BEAT = "django-celery-beat"
# Celery beat's handling of a failed run: no retry of the occurrence, the next one comes anyway.
CELERY_FAILURES: dict[str, Any] = {"max_retries": 0, "when_retries_exhausted": NEXT_OCCURRENCE}
# Celery beat has no catch-up window: an imported job has none, whatever
# SCHEDAPP_DEFAULT_CATCHUP_WINDOW says (a crontab's deadline, its misfire grace, could exceed
# that window and make the job invalid).
CELERY_WINDOW: dict[str, Any] = {"catchup_window": None}


@dataclass
class Candidate:
    """One source entry, mapped (``spec``) or not (``problem``)."""

    name: str
    origin: str
    task: str | None = None
    spec: dict[str, Any] = field(default_factory=dict)
    paused: bool = False
    notes: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)  # source settings with no equivalent
    problem: str | None = None
    problem_field: str = "schedule"  # the entry's field the problem is in
    # Deliberately not imported: (why in a word, the reason in full), e.g. ALREADY_RAN
    left_out: tuple[str, str] | None = None


ALREADY_RAN = "already ran"
IN_BEAT_SCHEDULE = "in CELERY_BEAT_SCHEDULE"
HOUSEKEEPING = "done by schedapp's housekeeping"
BACKEND_CLEANUP = "celery.backend_cleanup"  # every Celery beat's own entry, result expiry


@dataclass
class ImportReport:
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # the name exists
    unchanged: list[str] = field(default_factory=list)  # --update: already in line
    unmapped: dict[str, str] = field(default_factory=dict)  # no schedapp equivalent
    invalid: dict[str, list[str]] = field(default_factory=dict)  # refused by validation
    notes: dict[str, list[str]] = field(default_factory=dict)
    ignored: dict[str, list[str]] = field(default_factory=dict)  # settings without equivalent
    # Deliberately not imported (a one-off that already ran...): name -> (kind, reason)
    left_out: dict[str, tuple[str, str]] = field(default_factory=dict)
    # What a job created (dry run) or updated would be: lines shown under its name
    details: dict[str, list[str]] = field(default_factory=dict)
    dry_run: bool = False
    now: datetime | None = None  # the database's, read once for a dry run's fire times

    @property
    def complete(self) -> bool:
        """Everything was mapped, valid and carried over (``--strict`` asks for this)."""
        return not (self.unmapped or self.invalid or self.ignored)

    def lines(self) -> list[str]:
        verb = "would create" if self.dry_run else "created"
        updated = "would update" if self.dry_run else "updated"
        out: list[str] = []
        for name in self.created:
            out += [f"{verb}: {name}", *(f"    {line}" for line in self.details.get(name, ()))]
        for name in self.updated:
            out += [f"{updated}: {name}", *(f"    {line}" for line in self.details.get(name, ()))]
        out += [f"skipped (a job with this name exists): {name}" for name in self.skipped]
        out += [f"unchanged: {name}" for name in self.unchanged]
        out += [f"NOT MAPPED {name}: {reason}" for name, reason in self.unmapped.items()]
        out += [f"INVALID {name}: {'; '.join(msgs)}" for name, msgs in self.invalid.items()]
        out += [f"not imported, {kind}: {n}: {why}" for n, (kind, why) in self.left_out.items()]
        out += [f"note {name}: {note}" for name, notes in self.notes.items() for note in notes]
        kinds: dict[str, int] = {}
        for kind, _ in self.left_out.values():
            kinds[kind] = kinds.get(kind, 0) + 1
        out.append(
            f"{len(self.created)} {verb}, {len(self.updated)} {updated}, "
            f"{len(self.skipped)} skipped, {len(self.unmapped)} not mapped, "
            f"{len(self.invalid)} invalid"
            + "".join(f", {count} {kind}" for kind, count in kinds.items())
        )
        return out


# --- CELERY_BEAT_SCHEDULE ----------------------------------------------------------------------


def beat_schedule_from_settings() -> Mapping[str, Any]:
    schedule = getattr(settings, BEAT_SCHEDULE, None)
    if schedule is None:
        schedule = celery_app().conf.beat_schedule
    return schedule or {}


def _cron_part(value: Any) -> str:
    if isinstance(value, str):
        # Celery reads "0, 6, 12" as 0,6,12 (it splits on commas and int() strips blanks);
        # in a cron expression the blanks would split the field.
        return "".join(value.split())
    if isinstance(value, int):
        return str(value)
    if isinstance(value, Iterable):
        return ",".join(str(v) for v in sorted(value))
    return str(value)


def crontab_expression(schedule: Any) -> str:
    """A ``celery.schedules.crontab`` as a 5-field cron expression."""
    parts = [
        getattr(schedule, f"_orig_{part}", "*")
        for part in ("minute", "hour", "day_of_month", "month_of_year", "day_of_week")
    ]
    return " ".join(_cron_part(p) for p in parts)


def _app_timezone() -> str:
    """The zone Celery's beat runs a crontab in (``app.timezone``): ``conf.timezone`` (which
    falls back to TIME_ZONE only in a configuration read from Django's settings), else UTC
    under ``enable_utc`` (the default), else local time, which Django sets to TIME_ZONE.
    Read from the configuration rather than ``app.timezone``, which Celery caches."""
    conf = celery_app().conf
    zone = conf.timezone or ("UTC" if conf.enable_utc else settings.TIME_ZONE or "UTC")
    return str(getattr(zone, "key", zone))


def map_celery_schedule(
    value: Any, timezone: str | None = None, *, relative: bool = False, now: datetime | None = None
) -> tuple[dict[str, Any] | None, str | None]:
    """(schedule fields, None) or (None, why it cannot be mapped), with Celery's semantics.

    ``timezone`` is the Celery app's zone, which a crontab runs in; None reads it from the
    settings, and only when a crontab needs it. A crontab keeps Celery's day rule (both day
    fields must match: ``cron_day_or=False``); ``relative`` (a number's entry flag, or the
    schedule's own) anchors an interval at the boundary Celery rounds to, from ``now`` (the
    instant beat starts; default: the clock).
    """
    # crontab and solar subclass schedule
    for base in (celery_schedules.crontab, celery_schedules.solar, celery_schedules.schedule):
        if isinstance(value, base) and _times_its_own_way(value, base):
            return None, (
                f"{type(value).__name__} decides when it is due by its own code (a custom "
                f"subclass of celery's {base.__name__}); schedapp cannot reproduce its fire "
                "times and refuses it rather than guess (declare it as a cron or an interval)"
            )
    if isinstance(value, celery_schedules.solar):
        return {"solar_event": value.event, "latitude": value.lat, "longitude": value.lon}, None
    if isinstance(value, celery_schedules.crontab):
        return {
            "cron": crontab_expression(value),
            "timezone": timezone or _app_timezone(),
            "cron_day_or": False,
            "dst_policy": get_settings().IMPORT_DST_POLICY,
        }, None
    if isinstance(value, celery_schedules.schedule):
        every, relative = value.run_every, bool(value.relative)
    elif isinstance(value, timedelta):
        every = value
    elif isinstance(value, int | float) and not isinstance(value, bool):
        # Celery's beat fails on these at start (timedelta refuses them): refused here, not raised
        if not math.isfinite(value):
            return None, f"schedule {value!r} is not a finite number of seconds"
        try:
            every = timedelta(seconds=value)
        except OverflowError:
            return None, f"schedule {value!r} is more seconds than a timedelta holds"
    else:
        return None, f"schedule of type {type(value).__name__} is not supported"
    if relative:
        try:
            return relative_interval(every, timezone or _app_timezone(), now), None
        except OverflowError:  # its first run, rounded, is past the year 9999
            return None, f"schedule {every} is too long to run relative=True"
    return {"interval": every}, None


def relative_interval(every: timedelta, zone: str, now: datetime | None = None) -> dict[str, Any]:
    """Celery's ``relative=True``: each run rounded down to the interval's unit (minute, hour,
    local midnight), so runs fall on those boundaries, ``floor(every / unit)`` units apart.

    A whole day is local midnight (a cron, exact across DST); several days an interval from
    a local midnight (an hour off Celery's across a DST change); under a minute, as given.
    """
    from zoneinfo import ZoneInfo

    if every < timedelta(minutes=1):
        return {"interval": every}
    start = (now or datetime.now(UTC)).astimezone(UTC)
    tz = ZoneInfo(zone)
    if every >= timedelta(days=1):
        days = every // timedelta(days=1)
        if days == 1:
            return {"cron": "0 0 * * *", "timezone": zone}
        local = (start.astimezone(tz) + timedelta(days=days)).replace(tzinfo=None)
        midnight = datetime(local.year, local.month, local.day, tzinfo=tz)
        return {"interval": timedelta(days=days), "interval_anchor": midnight.astimezone(UTC)}
    unit = timedelta(hours=1) if every >= timedelta(hours=1) else timedelta(minutes=1)
    period = (every // unit) * unit
    local = (start + every).astimezone(tz)
    rounded = local.replace(second=0, microsecond=0)
    if unit == timedelta(hours=1):
        rounded = rounded.replace(minute=0)
    first = rounded.astimezone(UTC)
    if first <= start:
        first += unit
    spec: dict[str, Any] = {"interval": period, "interval_anchor": first}
    if first - start > period:  # 90 minutes: hourly runs, the first one 60 to 90 minutes away
        spec["not_before"] = first
    return spec


def _times_its_own_way(value: Any, base: type) -> bool:
    """Whether a subclass replaces how Celery decides the schedule is due.

    Such a class (an offset first run, a zone of its own, a database lookup) only looks like
    its base: mapping it as one would import a different schedule without a word.
    """
    cls = type(value)
    return any(
        getattr(cls, name) is not getattr(base, name)
        for name in ("is_due", "remaining_estimate", "now")
    )


DEADLINE_SETTING = "beat_cron_starting_deadline"
_FROM_APP: Any = object()  # map_beat_entry's deadline: read the Celery app's setting


def cron_starting_deadline() -> Any:
    """Celery's ``beat_cron_starting_deadline`` (seconds; None, the default: no deadline), read
    from the app's configuration at each import or sync, as crontab reads it at each check."""
    return celery_app().conf.get(DEADLINE_SETTING)


def cron_deadline_options(deadline: Any) -> tuple[dict[str, Any], str | None]:
    """The misfire options of a crontab job under ``deadline`` (none without one), or why the
    setting cannot be one: Celery's beat fails at every check on anything but a number, and
    a negative one never lets a crontab run; refused here, with the setting named.

    ``run_recent`` with the deadline as grace is what ``crontab.is_due`` does with it: a
    crontab whose latest missed run is more than the deadline before now is not due until
    its next run; within it, it is sent once, however many runs before it were missed.
    """
    if deadline is None:
        return {}, None
    if (
        isinstance(deadline, bool)
        or not isinstance(deadline, int | float)
        or not 0 <= deadline <= 365 * 86400  # False for NaN too
    ):
        return {}, (
            f"{DEADLINE_SETTING} must be a number of seconds from 0 to a year (365 days), "
            f"not {type(deadline).__name__} {reprlib.repr(deadline)}"
        )
    return {"misfire_policy": RUN_RECENT, "misfire_grace": timedelta(seconds=deadline)}, None


def map_beat_entry(
    name: str,
    entry: Any,
    timezone: str | None = None,
    now: datetime | None = None,
    deadline: Any = _FROM_APP,
) -> Candidate:
    """One ``beat_schedule`` item as a candidate job, mapped or not. Touches no database.

    Pure when ``timezone`` (the Celery app's zone), ``now`` (beat's start, which a relative
    interval's phase follows) and ``deadline`` (``beat_cron_starting_deadline``, read only
    for a crontab) are given, so the differential test against Celery's own scheduler maps
    entries exactly as an import does. ``options`` become the job's message options (what
    apply_async would send); any other key is reported as ignored.
    """
    item = Candidate(name=str(name), origin=BEAT_SCHEDULE)
    if not isinstance(entry, Mapping) or not entry.get("task"):
        item.problem = "an entry needs a 'task' and a 'schedule'"
        return item
    item.task = str(entry["task"])
    schedule, problem = map_celery_schedule(
        entry.get("schedule"), timezone, relative=bool(entry.get("relative")), now=now
    )
    if schedule is None:
        item.problem = problem
        return item
    if isinstance(entry.get("schedule"), celery_schedules.crontab):
        misfire, problem = cron_deadline_options(
            cron_starting_deadline() if deadline is _FROM_APP else deadline
        )
        if problem:
            item.problem = problem
            return item
        schedule = {**schedule, **misfire}
    # Empty means none, as in Celery's beat. Otherwise args must be a list or a tuple: Celery's
    # beat fails at every send on a number and sends a str's characters or a dict's keys as the
    # arguments (almost always a missing comma); refused here once, with the entry's name.
    fields = {key: entry.get(key) or empty for key, (empty, _, _) in _ENTRY_FIELDS.items()}
    for key, (_, kinds, what) in _ENTRY_FIELDS.items():
        value = fields[key]
        if not isinstance(value, kinds):
            item.problem_field = key
            item.problem = (
                f"{key} must be {what}, not "
                f"{type(value).__name__} {reprlib.repr(value)}"
            )
            return item
    item.spec.update(schedule)
    item.spec.update(CELERY_FAILURES)
    item.spec.update(CELERY_WINDOW)
    item.spec["args"] = list(fields["args"])
    item.spec["kwargs"] = dict(fields["kwargs"])
    options = dict(fields["options"])
    message: dict[str, Any] = {}
    for key in MESSAGE_OPTIONS:
        if options.get(key) is not None:
            message[key] = options.pop(key)
    if isinstance(message.get("expires"), datetime):  # an instant: nothing is sent after it
        item.spec["expires_at"] = message.pop("expires")
    if message:
        item.spec["message_options"] = message
    ignored = sorted(options)
    if ignored:
        item.ignored += ignored
        item.notes.append(f"options ignored: {', '.join(ignored)}")
    return item


# An entry's field: (its value when empty, the types Celery takes, those types in words).
_ENTRY_FIELDS: dict[str, tuple[Any, Any, str]] = {
    "args": ((), (list, tuple), "a list or a tuple"),
    "kwargs": ({}, Mapping, "a mapping"),
    "options": ({}, Mapping, "a mapping"),
}


def from_beat_schedule(
    entries: Mapping[str, Any],
    now: datetime | None = None,
    last_runs: Mapping[str, datetime] | None = None,
) -> list[Candidate]:
    """Candidates from a ``CELERY_BEAT_SCHEDULE`` dict. ``last_runs`` (``read_beat_state``)
    keeps each interval's phase: its next run is one interval after the last one Celery
    beat sent, as Celery would have sent it, instead of one interval after the import."""
    items = [map_beat_entry(str(name), entry, now=now) for name, entry in entries.items()]
    for item in items:
        last = (last_runs or {}).get(item.name)
        if item.problem or last is None or "interval" not in item.spec:
            continue
        if "interval_anchor" in item.spec:  # relative: its rounded phase stands
            continue
        item.spec["interval_anchor"] = last
        item.notes.append(f"phase kept from the beat state file: last sent {last.isoformat()}")
    return items


def read_beat_state(path: str) -> dict[str, datetime]:
    """Each entry's ``last_run_at`` from Celery beat's state file (``celerybeat-schedule``,
    a ``shelve`` written by ``PersistentScheduler``), as aware UTC instants.

    The file is Celery's own format, a shelve of pickled entries: reading it unpickles, so
    give only the state file of your own beat (it is read once, by this command, never by a
    beat or worker).
    """
    import shelve

    found: dict[str, datetime] = {}
    with shelve.open(path, flag="r") as store:  # the operator's own file
        for name, entry in (store.get("entries") or {}).items():
            last = getattr(entry, "last_run_at", None)
            if isinstance(last, datetime):
                if last.tzinfo is None:  # Celery stores naive times in UTC when utc is on
                    last = last.replace(tzinfo=UTC)
                found[str(name)] = last.astimezone(UTC)
    return found


# --- django-celery-beat ------------------------------------------------------------------------


def from_django_celery_beat() -> list[Candidate]:
    """Candidates from django-celery-beat's ``PeriodicTask`` rows (installed and migrated)."""
    try:
        from django_celery_beat.models import PeriodicTask
    except (ImportError, RuntimeError) as exc:  # not installed, or not in INSTALLED_APPS
        raise RuntimeError(
            "django-celery-beat is not available: install it and add 'django_celery_beat' to "
            f"INSTALLED_APPS to import its schedules ({exc})"
        ) from exc
    now = db_now()
    deadline = cron_starting_deadline()
    entries = {str(name) for name in beat_schedule_from_settings()}
    rows = PeriodicTask.objects.select_related("interval", "crontab", "solar", "clocked")
    found = []
    for row in rows.order_by("name"):
        item = _periodic_task(row, now, deadline)
        if row.name in entries:
            # django-celery-beat's DatabaseScheduler copies beat_schedule into its table at
            # each start. Imported, the copy would hold the entry's name, and the beats' sync
            # of the entry (a declared job) would leave it alone: edits of the entry ignored.
            item.left_out = (
                IN_BEAT_SCHEDULE,
                "a copy of the CELERY_BEAT_SCHEDULE entry of that name (django-celery-beat "
                "copies the entries into its table at each start); schedapp's beats sync the "
                "entry itself, or import it with --from-settings",
            )
        found.append(item)
    return found


def _periodic_task(row: Any, now: datetime, deadline: Any = None) -> Candidate:
    item = Candidate(name=row.name, origin=DJANGO_CELERY_BEAT, task=row.task)
    if row.task == BACKEND_CLEANUP:
        # Celery's beat installs it for result expiry, and django-celery-beat keeps it as a
        # row; schedapp's allowlist denies celery.* and its housekeeping does the same work
        item.left_out = (
            HOUSEKEEPING,
            f"Celery beat's own {BACKEND_CLEANUP} (django-celery-beat keeps it as a row); "
            "the housekeeping job schedapp-cleanup-results deletes expired results instead "
            "(SCHEDAPP_HOUSEKEEPING, on by default; or schedule schedapp.cleanup_results)",
        )
        return item
    if row.crontab_id:
        tab = row.crontab
        item.spec["cron"] = " ".join(
            str(getattr(tab, f))
            for f in ("minute", "hour", "day_of_month", "month_of_year", "day_of_week")
        )
        item.spec["timezone"] = str(getattr(tab.timezone, "key", tab.timezone))
        item.spec["cron_day_or"] = False  # django-celery-beat runs Celery's crontab
        item.spec["dst_policy"] = get_settings().IMPORT_DST_POLICY
        if not row.one_off:  # its crontab's is_due is Celery's, deadline included
            misfire, problem = cron_deadline_options(deadline)
            if problem:
                item.problem = problem
                return item
            item.spec.update(misfire)
    elif row.interval_id:
        item.spec["interval"] = timedelta(**{row.interval.period: row.interval.every})
        last = _aware(row.last_run_at)
        if last is not None:  # its runs fall one interval after the last one it sent
            item.spec["interval_anchor"] = last
            item.notes.append(
                f"phase kept from django-celery-beat's last_run_at: last sent {last.isoformat()}"
            )
    elif row.clocked_id:
        item.spec["run_at"] = _aware(row.clocked.clocked_time)
    elif row.solar_id:
        item.spec.update(
            solar_event=row.solar.event,
            latitude=float(row.solar.latitude),
            longitude=float(row.solar.longitude),
        )
    else:
        item.problem = "the periodic task has no schedule"
        return item
    for field_name in ("args", "kwargs"):
        text = getattr(row, field_name) or ("[]" if field_name == "args" else "{}")
        try:
            item.spec[field_name] = json.loads(text)
        except ValueError as exc:
            item.problem = f"{field_name} is not valid JSON: {exc}"
            return item
    item.spec["queue"] = row.queue or ""
    if getattr(row, "description", ""):  # for people: what the task is for
        item.spec["description"] = row.description
    item.spec.update(CELERY_FAILURES)
    item.spec.update(CELERY_WINDOW)
    message: dict[str, Any] = {}
    for key in ("exchange", "routing_key", "priority"):  # priority: the message's
        if getattr(row, key, None) not in (None, ""):
            message[key] = getattr(row, key)
    if row.expire_seconds:
        message["expires"] = row.expire_seconds
    if row.headers and row.headers.strip() not in ("{}", ""):
        try:
            message["headers"] = json.loads(row.headers)
        except ValueError as exc:
            item.problem = f"headers is not valid JSON: {exc}"
            return item
    if message:
        item.spec["message_options"] = message
    if "run_at" not in item.spec:
        if row.start_time:
            item.spec["not_before"] = row.start_time
        if row.expires:
            item.spec["expires_at"] = row.expires
    elif row.expires and row.expires < item.spec["run_at"]:
        item.problem = "a clocked task that expires before its time: it would never run"
        return item
    item.paused = not row.enabled
    if row.one_off and row.total_run_count:
        item.left_out = (
            ALREADY_RAN,
            f"a one-off task that already ran (total_run_count {row.total_run_count})",
        )
    elif row.one_off and not row.enabled and item.spec.get("run_at", now) < now:
        # What django-celery-beat leaves of a one-off it sent: disabled, with its count and
        # last_run_at reset. Imported paused, a resume would have sent it a second time.
        item.left_out = (
            ALREADY_RAN,
            "a one-off task that already ran: disabled, its time "
            f"({item.spec['run_at']:%Y-%m-%d %H:%M:%S %Z}) past, as django-celery-beat leaves "
            "a one-off it sent (it resets total_run_count and last_run_at); if it never "
            "ran, schedule it again with schedapp.api.schedule or the admin",
        )
    elif row.one_off and "run_at" not in item.spec:
        _make_one_off(item, now)
        if not row.enabled and not item.problem:
            item.notes.append(
                "disabled one-off: django-celery-beat disables a one-off once it has sent "
                "it, so it may have run; imported paused, a resume sends it once"
            )
    return item


def _aware(value: datetime | None) -> datetime | None:
    """A django-celery-beat time as an aware UTC instant: without USE_TZ, Django stores it
    naive, in TIME_ZONE."""
    if value is None:
        return None
    if value.tzinfo is None:
        from django.utils import timezone as django_tz

        value = django_tz.make_aware(value, django_tz.get_default_timezone())
    return value.astimezone(UTC)


def _make_one_off(item: Candidate, now: datetime) -> None:
    """A one-off crontab/interval task runs once, at its next fire time."""
    schedule: Schedule
    try:
        if "cron" in item.spec:
            schedule = parse_cron(
                item.spec.pop("cron"),
                item.spec.get("timezone") or "UTC",
                day_or=item.spec.pop("cron_day_or", True),
                dst_policy=item.spec.pop("dst_policy", DEFAULT_DST_POLICY),
            )
        elif "solar_event" in item.spec:
            schedule = parse_solar(
                item.spec.pop("solar_event"), item.spec.pop("latitude"), item.spec.pop("longitude")
            )
        else:
            schedule = Interval(item.spec.pop("interval"), item.spec.pop("interval_anchor", None))
    except ScheduleError as exc:
        item.problem = f"{exc.field}: {exc.message}"
        return
    schedule = with_window(schedule, item.spec.pop("not_before", None), None)
    run_at = next_fire_time(schedule, now)
    expires = item.spec.pop("expires_at", None)
    if run_at is None or (expires is not None and run_at > expires):
        item.problem = "a one-off task whose time is past its expiry: it would never run"
        return
    item.spec["run_at"] = run_at
    item.notes.append(f"one_off: runs once at {item.spec['run_at']:%Y-%m-%d %H:%M:%S %Z}")


def with_failure_policy(
    candidates: Iterable[Candidate],
    *,
    retries: int | None = None,
    when_exhausted: str | None = None,
) -> list[Candidate]:
    """The candidates with ``max_retries`` and/or ``when_retries_exhausted`` set to these
    (None: Celery's, ``CELERY_FAILURES``), for an operator who wants schedapp's retries and
    dead letters rather than Celery beat's "the next one comes anyway"."""
    if when_exhausted is not None and when_exhausted not in WHEN_RETRIES_EXHAUSTED:
        raise ValueError(
            f"when_retries_exhausted {when_exhausted!r} is not one of "
            f"{', '.join(WHEN_RETRIES_EXHAUSTED)}"
        )
    items = list(candidates)
    for item in items:
        if item.problem:
            continue
        if retries is not None:
            item.spec["max_retries"] = retries
        if when_exhausted is not None:
            item.spec["when_retries_exhausted"] = when_exhausted
    return items


# --- writing -----------------------------------------------------------------------------------


def import_candidates(
    candidates: Iterable[Candidate], *, update: bool = False, dry_run: bool = False
) -> ImportReport:
    """Create (or update) a job per mapped candidate; everything else goes in the report.

    New jobs are created in one transaction (all or none). With ``update``, each existing
    job is then updated in a transaction of its own, its row locked for milliseconds: one
    transaction over every update held the rows of running jobs for the whole import, and
    their lease renewals, which skip locked rows, let healthy leases lapse.
    """
    with audit.acting(source="imported", reason="imported from Celery beat's schedule"):
        return _import_candidates(candidates, update=update, dry_run=dry_run)


def _import_candidates(
    candidates: Iterable[Candidate], *, update: bool = False, dry_run: bool = False
) -> ImportReport:
    """``import_candidates``'s work, inside its audit actor."""
    report = ImportReport(dry_run=dry_run)
    updates: list[Candidate] = []
    with transaction.atomic():
        for item in candidates:
            if item.notes:
                report.notes[item.name] = item.notes
            if item.left_out:
                report.left_out[item.name] = item.left_out
                continue
            if item.ignored:
                report.ignored[item.name] = item.ignored
            if item.problem:
                report.unmapped[item.name] = item.problem
                continue
            try:
                if _write(item, update, report) and not dry_run:
                    updates.append(item)
            except ValidationError as exc:
                report.invalid[item.name] = _invalid(exc)
        if dry_run:
            transaction.set_rollback(True)
    for item in updates:
        try:
            with transaction.atomic():
                existing = Job.objects.select_for_update().filter(name=item.name).first()
                changes = _changes(item, existing)[1] if existing is not None else {}
                if not changes or existing is None or existing.source != JobSource.IMPORTED:
                    report.unchanged.append(item.name)  # changed or removed meanwhile
                    continue
                api.update(existing.pk, **changes)
            report.updated.append(item.name)
        except ValidationError as exc:
            report.invalid[item.name] = _invalid(exc)
    return report


def _invalid(exc: ValidationError) -> list[str]:
    return [f"{k}: {' '.join(v)}" for k, v in exc.message_dict.items()]


def _changes(item: Candidate, existing: Job) -> tuple[dict[str, Any], dict[str, Any]]:
    """The imported job as the source entry has it (validated), and the fields that differ."""
    merged = {f: getattr(existing, f) for f in JOB_FIELDS}
    merged.update(run_at=None, cron="", interval=None, interval_anchor=None, task=item.task)
    merged.update(solar_event="", latitude=None, longitude=None, cron_day_or=True)
    merged.update(dst_policy=DEFAULT_DST_POLICY)
    merged.update(not_before=None, expires_at=None, message_options={})
    merged.update(item.spec)
    if "interval_anchor" not in item.spec and merged["interval"] == existing.interval:
        # The source gives no phase: the one the job took at its first run stays (a new
        # interval still gets a new one, as api.update resets it with the schedule).
        merged["interval_anchor"] = existing.interval_anchor
    elif _same_phase(merged.get("interval_anchor"), existing, merged["interval"]):
        # A last run whole intervals later (the old scheduler ran on): the same phase,
        # no change to make
        merged["interval_anchor"] = existing.interval_anchor
    cleaned = validate_job(merged)
    return cleaned, changed_fields(existing, cleaned)


def _write(item: Candidate, update: bool, report: ImportReport) -> bool:
    """Create the job, or report it; True: an existing job to update (read without a lock,
    written afterwards in its own short transaction; a dry run only reports it)."""
    existing = Job.objects.filter(name=item.name).first()
    if existing is not None:
        if not update or existing.source != JobSource.IMPORTED:
            report.skipped.append(item.name)
            return False
        cleaned, changes = _changes(item, existing)
        if not changes:
            report.unchanged.append(item.name)
            return False
        report.details[item.name] = update_lines(existing, cleaned, changes)
        if report.dry_run:
            report.updated.append(item.name)
            return False
        return True
    if report.dry_run:  # validated as api.schedule would, and nothing written: no id taken
        if item.name in report.details:  # an earlier candidate of this run takes the name
            report.skipped.append(item.name)
            return False
        if report.now is None:
            report.now = db_now()
        report.details[item.name] = preview_lines(item, report.now)
        report.created.append(item.name)
        return False
    with transaction.atomic():
        job = api.schedule(item.task or "", name=item.name, source=JobSource.IMPORTED, **item.spec)
        if item.paused:
            api.pause(job.pk)
    report.created.append(item.name)
    return False


def _same_phase(anchor: Any, job: Job, interval: Any) -> bool:
    """Whether ``anchor`` gives ``job``'s interval the phase it has."""
    if not isinstance(anchor, datetime) or job.interval_anchor is None:
        return False
    if not isinstance(interval, timedelta) or interval != job.interval or not interval:
        return False
    return (anchor - job.interval_anchor) % interval == timedelta(0)


# --- what a dry run shows ----------------------------------------------------------------------

PREVIEW_TIMES = 3  # next fire times shown per entry


def preview_lines(item: Candidate, now: datetime) -> list[str]:
    """What the job of ``item`` would be, in words: its task and payload, its schedule, zone
    and next fire times, its message options. Raises ValidationError where ``api.schedule``
    would, without writing (a dry run takes no job id)."""
    values = validate_job(
        with_defaults(job_defaults(), {**item.spec, "task": item.task, "name": item.name})
    )
    schedule = stored_schedule(values)
    try:
        first = first_fire_time(schedule, now)  # a one-off in the past: due at once
    except ScheduleError as exc:  # an expiry already passed
        raise ValidationError({exc.field: [exc.message]}) from exc
    times = [first, *fire_times(schedule, first, limit=PREVIEW_TIMES - 1)]
    zone = values["timezone"]
    lines = [
        f"task: {values['task']} args {values['args']!r} kwargs {values['kwargs']!r}",
        f"schedule: {_schedule_text(values)}",
        f"zone: {zone}",
        "next: " + "; ".join(preview_text(t, zone) for t in times),
        f"message options: {_options_text(values['message_options'])}",
    ]
    if first <= now:
        lines[3] += " (past: sent at the first beat tick)"
    if values["queue"]:
        lines.append(f"queue: {values['queue']}")
    if values["description"]:
        lines.append(f"description: {values['description']!r}")
    lines.append(f"on failure: {failure_text(values)}")
    if "misfire_policy" in item.spec:
        lines.append(f"misfire: {values['misfire_policy']}, grace {values['misfire_grace']}")
    if item.paused:
        lines.append("paused: disabled in django-celery-beat (resume the job to run it)")
    return lines


def update_lines(job: Job, values: Mapping[str, Any], changes: Mapping[str, Any]) -> list[str]:
    """What ``--update`` changes in ``job``, field by field (the schedule in words)."""
    lines: list[str] = []
    schedule = (*SCHEDULE_FIELDS, *SCHEDULE_DETAIL_FIELDS, "timezone", "interval_anchor")
    before, after = job_schedule_text(job), _schedule_text(values)
    if before != after:
        lines.append(f"schedule: {before} -> {after}")
    for name in changes:
        old, new = getattr(job, name), values[name]
        if name in schedule and (before != after or old == new):
            continue  # said in words above, or only restated with the whole schedule
        if name == "message_options":
            lines.append(f"message options: {_options_text(old)} -> {_options_text(new)}")
        elif isinstance(old, datetime) or isinstance(new, datetime):
            zone = values.get("timezone") or job.timezone
            lines.append(f"{name}: {local_time(old, zone, True)} -> {local_time(new, zone, True)}")
        else:
            lines.append(f"{name}: {old!r} -> {new!r}")
    return lines


def _schedule_text(values: Mapping[str, Any]) -> str:
    return describe_schedule(
        values.get("run_at"),
        values.get("cron") or "",
        values.get("interval"),
        values.get("timezone") or "UTC",
        day_or=values.get("cron_day_or", True),
        solar_event=values.get("solar_event") or "",
        latitude=values.get("latitude"),
        longitude=values.get("longitude"),
        not_before=values.get("not_before"),
        expires_at=values.get("expires_at"),
    )


def failure_text(values: Mapping[str, Any]) -> str:
    """What a failed occurrence of the job leads to, in words (a dry run says it before a
    team switches: Celery beat never retries an occurrence, schedapp's default does)."""
    retries = values["max_retries"]
    tries = "no retry" if not retries else f"up to {retries} retr{'y' if retries == 1 else 'ies'}"
    if values["when_retries_exhausted"] == NEXT_OCCURRENCE:
        return f"{tries}; the next occurrence runs (as under Celery beat)"
    return f"{tries}, then the job is dead (a dead letter)"


def _options_text(options: Mapping[str, Any] | None) -> str:
    if not options:
        return "(none)"
    return ", ".join(f"{key}={value}" for key, value in options.items())
