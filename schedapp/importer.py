"""Import schedules from Celery beat (``CELERY_BEAT_SCHEDULE``) and django-celery-beat.

A team switches in one step: every entry that maps is created as a job (source "imported")
through ``api.schedule``; every entry that does not is reported with the reason, and nothing
is half-imported. Importing is idempotent by name: a name that exists is skipped (or, with
``update=True``, an imported job is brought in line with the source).

Mapping:

* ``crontab`` -> cron ``minute hour day_of_month month_of_year day_of_week`` (from crontab's
  ``_orig_*`` attributes, the values it was given), in the Celery app's time zone;
  django-celery-beat's ``CrontabSchedule`` -> the same, in its own ``timezone``.
* ``timedelta``, a number of seconds, ``schedule(run_every=...)`` and ``IntervalSchedule``
  -> interval. ``ClockedSchedule`` -> a one-off ``run_at``.
* ``solar``, a subclass of ``crontab`` or ``schedule`` that decides by its own code when it
  is due (its own ``is_due``, ``remaining_estimate`` or ``now``), and anything else -> not
  mapped (reported).
* args, kwargs, ``options.queue`` and ``options.priority`` are carried over; other options
  (``expires``, ``exchange``, ``routing_key`` ...) are listed as ignored. A disabled
  ``PeriodicTask`` becomes a paused job; a ``one_off`` one runs once, at its next fire time.

django-celery-beat is never a dependency: it is imported only when asked for.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from celery import schedules as celery_schedules
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction

from . import api
from .db import db_now
from .exceptions import ScheduleError
from .models import Job, JobSource
from .schedules import Interval, Schedule, next_fire_time, parse_cron
from .validation import JOB_FIELDS, celery_app, changed_fields, validate_job

CARRIED_OPTIONS = ("queue", "priority")
BEAT_SCHEDULE = "CELERY_BEAT_SCHEDULE"
DJANGO_CELERY_BEAT = "django-celery-beat"


@dataclass
class Candidate:
    """One source entry, mapped (``spec``) or not (``problem``)."""

    name: str
    origin: str
    task: str | None = None
    spec: dict[str, Any] = field(default_factory=dict)
    paused: bool = False
    notes: list[str] = field(default_factory=list)
    problem: str | None = None


@dataclass
class ImportReport:
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # the name exists
    unchanged: list[str] = field(default_factory=list)  # --update: already in line
    unmapped: dict[str, str] = field(default_factory=dict)  # no schedapp equivalent
    invalid: dict[str, list[str]] = field(default_factory=dict)  # refused by validation
    notes: dict[str, list[str]] = field(default_factory=dict)
    dry_run: bool = False

    def lines(self) -> list[str]:
        verb = "would create" if self.dry_run else "created"
        out = [f"{verb}: {name}" for name in self.created]
        out += [f"{'would update' if self.dry_run else 'updated'}: {n}" for n in self.updated]
        out += [f"skipped (a job with this name exists): {name}" for name in self.skipped]
        out += [f"unchanged: {name}" for name in self.unchanged]
        out += [f"NOT MAPPED {name}: {reason}" for name, reason in self.unmapped.items()]
        out += [f"INVALID {name}: {'; '.join(msgs)}" for name, msgs in self.invalid.items()]
        out += [f"note {name}: {note}" for name, notes in self.notes.items() for note in notes]
        out.append(
            f"{len(self.created)} {verb}, {len(self.updated)} updated, "
            f"{len(self.skipped)} skipped, {len(self.unmapped)} not mapped, "
            f"{len(self.invalid)} invalid"
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
    zone = celery_app().conf.timezone or settings.TIME_ZONE or "UTC"
    return str(getattr(zone, "key", zone))


def map_celery_schedule(
    value: Any, timezone: str | None = None
) -> tuple[dict[str, Any] | None, str | None]:
    """(schedule fields, None) or (None, why it cannot be mapped).

    ``timezone`` is the Celery app's zone, which a crontab runs in; None reads it from the
    settings, and only when a crontab needs it.
    """
    if isinstance(value, celery_schedules.solar):
        return None, "solar schedules (sunrise, sunset ...) have no cron equivalent"
    # crontab and solar subclass schedule
    for base in (celery_schedules.crontab, celery_schedules.schedule):
        if isinstance(value, base) and _times_its_own_way(value, base):
            return None, (
                f"{type(value).__name__} decides when it is due by its own code (a custom "
                f"subclass of celery's {base.__name__}); its fire times have no equivalent"
            )
    if isinstance(value, celery_schedules.crontab):
        return {"cron": crontab_expression(value), "timezone": timezone or _app_timezone()}, None
    if isinstance(value, celery_schedules.schedule):
        return {"interval": value.run_every}, None
    if isinstance(value, timedelta):
        return {"interval": value}, None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return {"interval": timedelta(seconds=value)}, None
    return None, f"schedule of type {type(value).__name__} is not supported"


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


def map_beat_entry(name: str, entry: Any, timezone: str | None = None) -> Candidate:
    """One ``beat_schedule`` item as a candidate job, mapped or not. Touches no database.

    Pure when ``timezone`` (the Celery app's zone) is given, so the differential test against
    Celery's own scheduler maps entries exactly as an import does.
    """
    item = Candidate(name=str(name), origin=BEAT_SCHEDULE)
    if not isinstance(entry, Mapping) or not entry.get("task"):
        item.problem = "an entry needs a 'task' and a 'schedule'"
        return item
    item.task = str(entry["task"])
    schedule, problem = map_celery_schedule(entry.get("schedule"), timezone)
    if schedule is None:
        item.problem = problem
        return item
    item.spec.update(schedule)
    item.spec["args"] = list(entry.get("args") or ())
    item.spec["kwargs"] = dict(entry.get("kwargs") or {})
    options = dict(entry.get("options") or {})
    for key in CARRIED_OPTIONS:
        if options.get(key) is not None:
            item.spec[key] = options.pop(key)
    if options:
        item.notes.append(f"options ignored: {', '.join(sorted(options))}")
    if _relative(entry) and "interval" in item.spec:  # Celery ignores it on a crontab
        item.notes.append(
            "relative=True ignored: Celery rounds each run down to the interval's unit "
            "(minute, hour or local midnight); this job counts whole intervals from the import"
        )
    return item


def _relative(entry: Mapping[str, Any]) -> bool:
    """Whether Celery rounds this entry's runs: a schedule object's own flag wins over the
    entry's (beat applies ``relative`` only when it builds the schedule from a number)."""
    value = entry.get("schedule")
    relative = isinstance(value, celery_schedules.schedule)
    return bool(value.relative if relative else entry.get("relative"))


def from_beat_schedule(entries: Mapping[str, Any]) -> list[Candidate]:
    """Candidates from a ``CELERY_BEAT_SCHEDULE`` dict."""
    return [map_beat_entry(str(name), entry) for name, entry in entries.items()]


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
    rows = PeriodicTask.objects.select_related("interval", "crontab", "solar", "clocked")
    return [_periodic_task(row, now) for row in rows.order_by("name")]


def _periodic_task(row: Any, now: datetime) -> Candidate:
    item = Candidate(name=row.name, origin=DJANGO_CELERY_BEAT, task=row.task)
    if row.crontab_id:
        tab = row.crontab
        item.spec["cron"] = " ".join(
            str(getattr(tab, f))
            for f in ("minute", "hour", "day_of_month", "month_of_year", "day_of_week")
        )
        item.spec["timezone"] = str(getattr(tab.timezone, "key", tab.timezone))
    elif row.interval_id:
        item.spec["interval"] = timedelta(**{row.interval.period: row.interval.every})
    elif row.clocked_id:
        item.spec["run_at"] = row.clocked.clocked_time
    elif row.solar_id:
        item.problem = "solar schedules (sunrise, sunset ...) have no cron equivalent"
        return item
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
    if row.priority is not None:
        item.spec["priority"] = row.priority
    item.paused = not row.enabled
    ignored = [
        f
        for f in ("exchange", "routing_key", "expires", "expire_seconds", "start_time")
        if getattr(row, f, None)
    ]
    if row.headers and row.headers.strip() not in ("{}", ""):
        ignored.append("headers")
    if ignored:
        item.notes.append(f"ignored: {', '.join(ignored)}")
    if row.one_off and row.total_run_count:
        item.problem = "a one-off task that already ran"
    elif row.one_off and "run_at" not in item.spec:
        _make_one_off(item, now)
    return item


def _make_one_off(item: Candidate, now: datetime) -> None:
    """A one-off crontab/interval task runs once, at its next fire time."""
    schedule: Schedule
    try:
        if "cron" in item.spec:
            schedule = parse_cron(item.spec.pop("cron"), item.spec.get("timezone") or "UTC")
        else:
            schedule = Interval(item.spec.pop("interval"))
    except ScheduleError as exc:
        item.problem = f"{exc.field}: {exc.message}"
        return
    item.spec["run_at"] = next_fire_time(schedule, now)
    item.notes.append(f"one_off: runs once at {item.spec['run_at']:%Y-%m-%d %H:%M:%S %Z}")


# --- writing -----------------------------------------------------------------------------------


def import_candidates(
    candidates: Iterable[Candidate], *, update: bool = False, dry_run: bool = False
) -> ImportReport:
    """Create (or update) a job per mapped candidate; everything else goes in the report."""
    report = ImportReport(dry_run=dry_run)
    with transaction.atomic():
        for item in candidates:
            if item.notes:
                report.notes[item.name] = item.notes
            if item.problem:
                report.unmapped[item.name] = item.problem
                continue
            try:
                _write(item, update, report)
            except ValidationError as exc:
                report.invalid[item.name] = [
                    f"{k}: {' '.join(v)}" for k, v in exc.message_dict.items()
                ]
        if dry_run:
            transaction.set_rollback(True)
    return report


def _write(item: Candidate, update: bool, report: ImportReport) -> None:
    existing = Job.objects.filter(name=item.name).first()
    if existing is not None:
        if not update or existing.source != JobSource.IMPORTED:
            report.skipped.append(item.name)
            return
        merged = {f: getattr(existing, f) for f in JOB_FIELDS}
        merged.update(run_at=None, cron="", interval=None, interval_anchor=None, task=item.task)
        merged.update(item.spec)
        cleaned = validate_job(merged)
        changes = changed_fields(existing, cleaned)
        if not changes:
            report.unchanged.append(item.name)
            return
        with transaction.atomic():
            api.update(existing.pk, **changes)
        report.updated.append(item.name)
        return
    with transaction.atomic():
        job = api.schedule(item.task or "", name=item.name, source=JobSource.IMPORTED, **item.spec)
        if item.paused:
            api.pause(job.pk)
    report.created.append(item.name)
