"""The admin's job form: the API's rules and messages, and a preview of the next fire times.

The form validates with ``schedapp.validation.validate_job``, the function the API calls, so
an operator reads exactly the message a developer would get from ``api.schedule``; each error
is attached to the field it names. The form never saves: the admin hands the validated values
to ``api.schedule`` / ``api.update``.

``run_at`` is typed as wall-clock time in the job's time zone (the zone chosen in the form),
like cron, not in the server's ``TIME_ZONE``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from django import forms
from django.contrib.admin.widgets import AdminSplitDateTime
from django.core.exceptions import ValidationError
from django.utils import timezone as django_tz
from django.utils.dateparse import parse_date, parse_duration, parse_time

from .. import calendars, job_calendars
from ..celeryapp import task_not_allowed, task_problem
from ..cronmath import end_of_gap, instants
from ..display import PREVIEW_COUNT, describe_schedule, dst_note, preview_text, safe_zone
from ..fields import DEADLINE_FIELDS, JOB_FIELDS, SCHEDULE_FIELDS
from ..models import Job, field_default
from ..schedules import DEFAULT_DST_POLICY, OUT_OF_RANGE, Once, fire_times
from ..validation import name_taken, stored_schedule, validate_job

FORM_FIELDS = [
    "name",
    "task",
    "description",
    "tags",
    "notify",
    "args",
    "kwargs",
    "cron",
    "cron_day_or",
    "dst_policy",
    "interval",
    "interval_anchor",
    "fixed_delay",
    "run_at",
    "solar_event",
    "latitude",
    "longitude",
    "not_before",
    "expires_at",
    "timezone",
    "calendar",
    "calendar_mode",
    "calendar_roll",
    "priority",
    "queue",
    "lease_seconds",
    "jitter",
    "max_retries",
    "retry_backoff",
    "retry_backoff_max",
    "when_retries_exhausted",
    "misfire_policy",
    "misfire_grace",
    "misfire_max_catchup",
    "catchup_window",
    "overlap",
    "max_buffer",
    "max_concurrent",
    "message_options",
    *DEADLINE_FIELDS,
]
assert set(FORM_FIELDS) == set(JOB_FIELDS)
# Typed and shown as wall-clock time in the job's zone, to the second.
WALL_TIMES = ("run_at", "interval_anchor", "not_before", "expires_at")


class WallTimeWidget(AdminSplitDateTime):
    """The admin's date and time inputs, noted as the job's wall-clock time; without the
    note of the server's zone that Django's admin adds to date-times (these are not in it)."""

    template_name = "admin/schedapp/widgets/wall_time.html"


class TagsField(forms.Field):
    """Tags typed as words separated by commas or spaces; the API's rules check each one (its
    message is the field's)."""

    widget = forms.TextInput

    def __init__(self, **kwargs: Any) -> None:
        kwargs.pop("encoder", None)  # a JSONField's form field arguments
        kwargs.pop("decoder", None)
        super().__init__(**kwargs)
        self.widget.attrs.update({"class": "vTextField", "placeholder": "billing, team-eu"})

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, list | tuple):
            return ", ".join(str(v) for v in value)
        return value

    def to_python(self, value: Any) -> list[str]:
        if isinstance(value, list | tuple):
            return list(value)
        return [word for word in re.split(r"[,\s]+", value or "") if word]


class TaskPickerWidget(forms.TextInput):
    """The task's text input with the registered tasks to pick from (``registered``, set by
    the admin per request: the Celery app's tasks that the allowlist permits)."""

    template_name = "admin/schedapp/widgets/task_picker.html"
    registered: Sequence[str] = ()

    def get_context(self, name: str, value: Any, attrs: dict[str, Any] | None) -> dict[str, Any]:
        context = super().get_context(name, value, attrs)
        context["widget"]["registered"] = self.registered
        return context


def _datalist(field: forms.Field, list_id: str) -> None:
    field.widget.attrs.update({"list": list_id, "autocomplete": "off", "class": "vTextField"})


class ListedChoices(forms.models.ModelChoiceIterator):
    """A model field's choices read with one plain query, not Django's ``.iterator()``: that
    is a server-side cursor, which a transaction-pooling PgBouncer loses between statements
    ("portal does not exist"), and schedapp asks no one to set DISABLE_SERVER_SIDE_CURSORS.
    The choices (calendars) are few."""

    def __iter__(self) -> Any:
        if self.field.empty_label is not None:
            yield ("", self.field.empty_label)
        for obj in self.queryset.all():
            yield self.choice(obj)


class JobForm(forms.ModelForm):
    change_reason = forms.CharField(
        required=False,
        max_length=1000,
        label="Reason",
        help_text="Why this change: kept in the job's history with who made it, when, and "
        "what changed.",
        widget=forms.TextInput(attrs={"class": "vTextField", "size": 80}),
    )

    class Meta:
        model = Job
        fields = FORM_FIELDS
        widgets = {"task": TaskPickerWidget, **{name: WallTimeWidget for name in WALL_TIMES}}
        field_classes = {"tags": TagsField, "notify": TagsField}
        labels = {
            "cron_day_or": "Day of month or day of week",
            "dst_policy": "Daylight saving",
            "interval_anchor": "Align the interval to",
            "run_at": "Run at",
            "not_before": "Not before",
            "expires_at": "Ends at",
            "lease_seconds": "Lease (seconds)",
            "jitter": "Jitter (seconds)",
            "catchup_window": "Catch-up window",
            "overlap": "Overlap policy",
            "max_buffer": "Buffer at most",
            "max_concurrent": "Runs in flight at most",
            "fixed_delay": "Count from the end of each run",
            "start_deadline": "Start deadline",
            "skip_late": "Skip late occurrences",
            "max_runtime": "Max runtime",
            "revoke_overrun": "Revoke an overrunning run",
            "finish_by": "Finish by",
            "alert_after_failures": "Failing after (failed attempts in a row)",
        }
        help_texts = {
            "cron": "5 fields, or 6 with seconds first, e.g. '*/10 * * * * *'. Days: L (the "
            "last), LW (the last weekday), 15W (the weekday nearest the 15th), FRI#2 (the "
            "second Friday), FRIL (the last Friday).",
            "interval": "Recurring: every ... e.g. '300' (seconds), '00:05:00' or '1 00:00:00'.",
            "catchup_window": "Optional: an occurrence missed longer ago than this (e.g. "
            "'3600' seconds or '01:00:00') is recorded as missed and not run; at least the "
            "misfire grace. Empty: no window.",
            "run_at": "One-off: wall-clock time in the job's time zone.",
            "fixed_delay": "Checked: the interval is a fixed delay, counted from the end of "
            "each run; unchecked: a fixed rate, occurrences every interval from the first.",
            "overlap": "Occurrences that come due while a run is in flight: skip them, buffer "
            "one (the next waits; if late beyond the misfire grace by then, the misfire policy "
            "decides), buffer all (each runs after it, oldest first), or cancel (revoke) / "
            "terminate (SIGTERM, prefork) the run in flight, then run the latest, or allow all: "
            "each starts on time beside the runs in flight (at most max_concurrent).",
            "start_deadline": "Optional: an occurrence not started this long after its time "
            "(e.g. '300' seconds or '00:05:00') is late. Empty: none.",
            "max_runtime": "Optional: a run still going this long after it started is "
            "overrunning. Empty: none.",
            "finish_by": "Optional: wall-clock time in the job's zone (e.g. 09:00) by which the "
            "day's occurrence must have succeeded.",
            "max_buffer": "Buffer all: at most this many wait (the most recent); older ones "
            "are dropped and recorded.",
            "max_concurrent": "Allow all: at most this many runs in flight at once (1 to "
            "1,000); an occurrence waits for a slot, then the misfire policy decides.",
            "interval_anchor": "Optional: an instant (in the job's time zone) the interval's "
            "occurrences are aligned to; empty: its first occurrence.",
            "args": 'A JSON list, e.g. [1, "two"].',
            "notify": "Notification channels (SCHEDAPP_NOTIFICATIONS) this job's events also go "
            "to, whatever their tag filters, separated by commas or spaces.",
            "tags": "Labels grouping jobs (the jobs list's filter, metrics, alerts), separated "
            "by commas or spaces: letters, digits and - _ . : / =.",
            "kwargs": 'A JSON object, e.g. {"label": "nightly"}.',
            "timezone": "IANA name, e.g. Europe/Paris; cron and run_at follow it.",
            "cron_day_or": "When both day fields are restricted (e.g. '0 9 13 * 5'): checked, "
            "a day matching either runs (cron's rule); unchecked, only a day matching both "
            "(Celery's crontab).",
            "dst_policy": "A fixed-hour time the clocks skip (spring) runs at the gap's end or "
            "is skipped; one they repeat (autumn) runs at the first offset, the second, or "
            "both. 'As Celery beat' reads a skipped time at the old offset (02:30 runs at "
            "03:30). A cron whose hour is * follows elapsed time under all but Celery's.",
            "solar_event": "Solar schedule (Celery's solar): e.g. sunrise, sunset, dawn_civil; "
            "needs latitude and longitude.",
            "not_before": "Optional: never fires before this (wall-clock time in the job's zone).",
            "expires_at": "Optional: no occurrence after this; the job then finishes.",
            "message_options": 'Celery message options, e.g. {"queue": "slow", "priority": 5, '
            '"expires": 60, "headers": {"team": "ops"}}.',
        }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.job_values: dict[str, Any] = {}
        self.task_warning = ""
        self.preview: list[str] = []
        for name in ("task", "timezone"):
            if name in self.fields:
                _datalist(self.fields[name], f"schedapp-{name}s")
        for name in ("args", "kwargs", "description", "message_options"):
            if name in self.fields:
                self.fields[name].widget.attrs.update({"rows": 2, "cols": 60})
        for name in ("dst_policy", "calendar_mode", "calendar_roll"):
            if name in self.fields:  # a post without it (a script's) keeps the default
                self.fields[name].required = False
        if "calendar" in self.fields:
            field = self.fields["calendar"]
            field.iterator = ListedChoices
            field.widget.choices = field.choices  # (the admin's wrapper passes it on)
        instance = self.instance
        for name in WALL_TIMES:  # in the job's zone
            value = getattr(instance, name)
            if instance.pk and value is not None and name in self.fields:
                local = value.astimezone(safe_zone(instance.timezone))
                self.initial[name] = local.replace(tzinfo=None)

    def full_clean(self) -> None:
        """Parse date-times in UTC, where every wall time exists once: they are the job's
        zone's (``in_zone``), and the server's zone would refuse its own DST hours."""
        with django_tz.override(UTC):
            super().full_clean()

    @property
    def adding(self) -> bool:
        return self.instance.pk is None

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
        values = self._values(data)
        self._preview(values)
        check_task = self.adding or values.get("task") != self.instance.task
        try:
            # Registration is a warning here, not an error (see _check_task).
            cleaned = validate_job(values, check_task=False)
        except ValidationError as exc:
            self._attach(exc)
            self._check_task(values.get("task"), check_task)
            return data
        if not self._check_task(cleaned["task"], check_task):
            return data
        clash = Job.objects.filter(name=cleaned["name"]).exclude(pk=self.instance.pk)
        if clash.exists():
            # The API's own message for this (api._integrity_error).
            self.add_error("name", name_taken(cleaned["name"]))
            return data
        self.job_values = cleaned
        return data

    def _check_task(self, task: Any, check: bool) -> bool:
        """The allowlist refuses (a field error); a task this web process does not register
        is kept with a warning (``task_warning``, said by the admin on save): web processes
        often import fewer task modules than the workers, as django-celery-beat allows."""
        self.task_warning = ""
        if not check or not isinstance(task, str) or "task" in self.errors:
            return True
        problem = task_not_allowed(task.strip())
        if problem:
            self.add_error("task", problem)
            return False
        if task_problem(task.strip()):
            self.task_warning = (
                f"Task {task.strip()!r} is not registered with the Celery app in this web "
                "process: the job is saved, and runs only where a worker has the task "
                "(elsewhere its runs fail as 'not registered on worker')."
            )
        return True

    def _preview(self, values: dict[str, Any]) -> None:
        """Shown again with the form (e.g. after an error elsewhere): the schedule as typed."""
        try:
            times, _errors = schedule_preview(
                values.get("cron") or "",
                values.get("interval"),
                values.get("run_at"),
                values.get("timezone") or "",
                day_or=values.get("cron_day_or", True),
                dst_policy=values.get("dst_policy") or DEFAULT_DST_POLICY,
            )
        except Exception:  # a preview never blocks a save
            times = []
        self.preview = times
        self.instance._schedapp_preview = times  # read by JobAdmin.fire_preview

    def _values(self, data: dict[str, Any]) -> dict[str, Any]:
        """All of a job's fields: what the form cleaned, else the job's (or the default)
        value for fields that already carry a form error, so each problem is said once."""
        values: dict[str, Any] = {}
        for name in JOB_FIELDS:
            if name in data:
                values[name] = data[name]
            elif self.instance.pk:
                values[name] = getattr(self.instance, name)
            else:
                values[name] = field_default(name)
        if values.get("args") is None:
            values["args"] = []
        if values.get("kwargs") is None:
            values["kwargs"] = {}
        for name in ("cron", "queue"):
            if values.get(name) is None:
                values[name] = ""
        if values.get("message_options") is None:
            values["message_options"] = {}
        for name in WALL_TIMES:
            value = data.get(name)
            if isinstance(value, datetime) and "timezone" not in self.errors:
                values[name] = self._instant(name, value, values.get("timezone") or "UTC")
        if not values.get("interval"):
            values["interval_anchor"] = None  # a phase belongs to an interval only
        return values

    def _instant(self, name: str, value: datetime, zone: str) -> datetime:
        """The instant a date-time field means. Left as shown, it keeps the stored instant:
        the form shows it to the second only, so reading it back would move the job's
        schedule and count as a reschedule (a one-off in flight would run again)."""
        stored = getattr(self.instance, name) if self.instance.pk else None
        untouched = name not in self.changed_data and "timezone" not in self.changed_data
        if stored is not None and untouched:
            return stored
        try:
            instant = in_zone(value, zone)
        except ValidationError as exc:
            self.add_error(name, exc)
            return stored or value  # said once: validation goes on with a valid instant
        if stored is not None and instant == stored.replace(microsecond=0):
            return stored  # typed again as shown
        return instant

    def _attach(self, exc: ValidationError) -> None:
        for field, messages in exc.message_dict.items():
            target = field if field in self.fields else None
            if target is not None and target in self.errors:
                continue  # the field's own parsing already said what is wrong
            self.add_error(target, messages)

    def _post_clean(self) -> None:
        # No model validation: the rules (and the messages) are the API's, checked in clean().
        # The model's constraints (e.g. "a scheduled job has next_run_at") hold for what the
        # API writes, not for the half-built instance a ModelForm would check.
        pass


def in_zone(value: datetime, zone_name: str) -> datetime:
    """Re-read a datetime's wall-clock time in ``zone_name`` (the form parsed it in UTC).

    A wall time the zone shows twice (the hour repeated when summer time ends) means its first
    instant, as a cron job at that time runs at its first (``schedules``). One the zone skips
    (spring forward) is refused with a ``ValidationError``: moving it silently would run the
    job at a time nobody typed. So is one too near the ends of ``datetime`` to read in the zone.
    """
    naive = django_tz.make_naive(value) if django_tz.is_aware(value) else value
    zone = safe_zone(zone_name)
    try:
        readings = instants(naive, zone, True)  # every instant showing it, in order
    except OverflowError as exc:  # the first or last day datetime holds, read in a far zone
        raise ValidationError(f"{naive:%Y-%m-%d %H:%M:%S} {OUT_OF_RANGE}") from exc
    if not readings:
        after = end_of_gap(naive, zone).astimezone(zone)
        raise ValidationError(
            f"{naive:%Y-%m-%d %H:%M:%S} does not exist in {zone_name}: the clocks skip it, "
            f"jumping to {after:%H:%M:%S}; enter a time outside the gap."
        )
    return readings[0].astimezone(zone)


def preview_for(
    values: dict[str, Any],
    scheduled_for: datetime | None,
    now: datetime | None = None,
    count: int = PREVIEW_COUNT,
) -> list[str]:
    """The next ``count`` fire times of validated values, as text in the job's zone.

    A saved recurring job continues from ``scheduled_for`` (its next occurrence), so an
    interval preview shows the occurrences that will really happen.
    """
    from ..db import db_now

    schedule = stored_schedule(values)
    now = now or db_now()
    zone = values["timezone"]
    if values.get("calendar") is not None and not isinstance(schedule, Once):
        return _calendar_preview(values, schedule, scheduled_for, now, count)
    if isinstance(schedule, Once):
        times = [schedule.at]
    elif scheduled_for is not None and scheduled_for > now:
        times = [scheduled_for, *fire_times(schedule, scheduled_for, limit=count - 1)]
    else:
        times = list(fire_times(schedule, now, limit=count))
    return [_marked(preview_text(t, zone), dst_note(schedule, t)) for t in times]


def _marked(text: str, note: str) -> str:
    return f"{text} — {note}" if note else text


def _calendar_preview(
    values: dict[str, Any], schedule: Any, scheduled_for: datetime | None, now: datetime, count: int
) -> list[str]:
    """The runs under the job's calendar, each moved one marked with what moved it (the
    calendar's roll, or the schedule's DST rule)."""
    cal = job_calendars.on_calendar(
        job_calendars.parsed(values["calendar"]),
        values.get("calendar_mode") or "",
        values.get("calendar_roll") or "",
        values["timezone"],
    )
    assert cal is not None
    start = now
    if scheduled_for is not None and scheduled_for > now:
        start = scheduled_for - timedelta(microseconds=1)
    out = []
    for fire in calendars.fires(schedule, cal.attached, start, cal.tz, count):
        notes = [dst_note(schedule, fire.at)]
        if fire.moved:
            was = preview_text(fire.occurrence, values["timezone"])
            notes = [f"moved from {was} by {cal.detail}"]
        merged = sum(s.count for s in fire.skipped if s.reason == "merged")
        excluded = sum(s.count for s in fire.skipped if s.reason == "excluded")
        if merged:
            notes.append(f"also stands for {merged} earlier occurrence(s) merged by {cal.detail}")
        if excluded:
            notes.append(f"{excluded} occurrence(s) before it excluded by {cal.detail}")
        note = "; ".join(n for n in notes if n)
        out.append(_marked(preview_text(fire.at, values["timezone"]), note))
    return out


def schedule_preview(
    cron: str,
    interval: Any,
    run_at: datetime | None,
    zone: str,
    *,
    day_or: bool = True,
    dst_policy: str = DEFAULT_DST_POLICY,
) -> tuple[list[str], dict[str, list[str]]]:
    """(fire times, errors by field) of a schedule alone.

    Validated by ``validate_job`` itself, so the errors read like the API's; the fields other
    than the schedule get harmless placeholders.
    """
    values: dict[str, Any] = {name: field_default(name) for name in JOB_FIELDS}
    values.update(
        task="preview",
        name="preview",
        args=[],
        kwargs={},
        queue="",
        cron=cron or "",
        cron_day_or=day_or,
        dst_policy=dst_policy,
        message_options={},
        interval=interval,
        run_at=run_at,
        timezone=zone,
    )
    try:
        cleaned = validate_job(values, check_task=False)
    except ValidationError as exc:
        relevant = (*SCHEDULE_FIELDS, "timezone", "dst_policy")
        return [], {k: v for k, v in exc.message_dict.items() if k in relevant}
    return preview_for(cleaned, scheduled_for=None), {}


def preview_from_query(params: Any) -> tuple[list[str], dict[str, list[str]], str]:
    """The preview of the schedule fields of a form still being typed (the admin's preview
    endpoint reads them from the query string, as the form names them): fire times, errors
    and the schedule in words, as the jobs list says it."""
    zone = (params.get("timezone") or "").strip()
    errors: dict[str, list[str]] = {}
    interval = None
    interval_text = (params.get("interval") or "").strip()
    if interval_text:
        interval = parse_duration(interval_text)
        if interval is None:
            errors["interval"] = ["Enter a valid duration."]
    run_at = _run_at(params, zone, errors)
    if errors:
        return [], errors, ""
    cron = (params.get("cron") or "").strip()
    raw = params.get("cron_day_or")  # a checkbox: absent means the default, cron's OR
    day_or = raw is None or raw in ("on", "true", "True", "1")
    policy = (params.get("dst_policy") or "").strip() or DEFAULT_DST_POLICY
    times, errors = schedule_preview(
        cron, interval, run_at, zone, day_or=day_or, dst_policy=policy
    )
    words = "" if errors else describe_schedule(run_at, cron, interval, zone, day_or=day_or)
    return times, errors, words


def _run_at(params: Any, zone: str, errors: dict[str, list[str]]) -> datetime | None:
    day = (params.get("run_at_0") or "").strip()
    clock = (params.get("run_at_1") or "").strip()
    if not day and not clock:
        return None
    parsed_day = parse_date(day) if day else None
    parsed_clock = parse_time(clock or "00:00:00")
    if parsed_day is None or parsed_clock is None:
        errors["run_at"] = ["Enter a valid date/time."]
        return None
    try:
        return in_zone(datetime.combine(parsed_day, parsed_clock), zone or "UTC")
    except ValidationError as exc:
        errors["run_at"] = exc.messages
        return None
