"""The job admin: the changelist, the job page and its form, its actions.

Built for tables of millions of rows: changelists never count a whole table
(``filters.LargeTablePaginator``), never run a query per row (the schedule text, the
next run in the job's zone and the last outcome come from the job row itself), and their
filters never ``SELECT DISTINCT`` over the job table. Every change to a job goes through
``schedapp.api``: the form validates with the API's rules, saving calls ``api.schedule`` /
``api.update``, and actions and buttons call ``api.run_now``, ``api.pause`` and friends.
"""

from __future__ import annotations

import re
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import QuerySet
from django.db.models.functions import Left
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from .. import api, audit
from ..display import job_schedule_text, local_time, timezone_names
from ..exceptions import JobStateError
from ..fields import CALENDAR_FIELDS, DEADLINE_FIELDS, JOB_FIELDS, changed_fields
from ..models import Job, JobRun, JobSource, JobState
from .filters import (
    LargeTablePaginator,
    QueueFilter,
    ScheduleKindFilter,
    TagFilter,
    TaskFilter,
    allowed_registered_tasks,
)
from .forms import JobForm, TaskPickerWidget, preview_for
from .operations import OPERATIONS, acting_in_admin, error_text, make_action
from .runs import badge, runs_summary
from .views import JobViewsMixin

__all__ = ["DELETE_RUNS_MAX", "JobAdmin"]

_EDITABLE = (
    (None, {"fields": ("name", "task", "description", "tags", "args", "kwargs")}),
    (
        "Schedule",
        {
            "fields": (
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
                "timezone",
                "fire_preview",
            ),
            "description": "Give exactly one of cron, interval, run_at or a solar event.",
        },
    ),
    ("Delivery", {"fields": ("priority", "queue", "message_options", "lease_seconds", "jitter")}),
    (
        "Retries, misfires and overlaps",
        {
            "fields": (
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
            ),
            "classes": ("collapse",),
        },
    ),
    (
        "Deadlines and notifications",
        {
            "fields": (*DEADLINE_FIELDS, "notify"),
            "classes": ("collapse",),
        },
    ),
)
# A calendar, like the window below: folded unless the job (or the form sent back) has one.
_CALENDAR = CALENDAR_FIELDS
# Optional, rarely set: folded unless the job (or the form sent back) has one. With Django
# 6.1's labels above the fields, their date and time inputs took ~430 px of every job page.
_WINDOW = ("not_before", "expires_at")
# The status header above the form says the state, next and last run, retries and the last
# error's first line: the State section has them in full (and the whole error), folded; the
# latest runs stay open.
_STATUS = (
    ("Runs", {"fields": ("runs",)}),
    (
        "State",
        {
            "fields": (
                "state_badge",
                "source",
                "next_run",
                "occurrence",
                "retry_count",
                "missed_runs",
                "failed_occurrences",
                "last_run",
                "last_error_text",
            ),
            "classes": ("collapse",),
        },
    ),
    (
        "Lease",
        {
            "fields": ("claimed_by", "lease_expiry", "token", "unstarted_dispatches"),
            "classes": ("collapse",),
        },
    ),
    ("Record", {"fields": ("created", "updated"), "classes": ("collapse",)}),
)
# The schedule kinds, the fields each one uses, and how the kind chooser names them. The
# other fields of the Schedule section (time zone, window) apply to every kind.
SCHEDULE_KINDS = (
    ("cron", "A cron expression", ("cron", "cron_day_or", "dst_policy")),
    ("interval", "Every interval", ("interval", "interval_anchor", "fixed_delay")),
    ("once", "Once, at a time", ("run_at",)),
    ("solar", "At a solar event", ("solar_event", "latitude", "longitude")),
)
# Deleting a job deletes its runs in the same statement: above this, prune first.
DELETE_RUNS_MAX = 100_000
_BREAK_AFTER = re.compile(r"(?<=[.@:/])")
_STATUS_FIELDS = tuple(f for _title, spec in _STATUS for f in spec["fields"])


def schedule_kind(job: Job | None) -> str:
    """The kind of schedule a job has ('cron' for a new one)."""
    if job is None or job.cron:
        return "cron"
    if job.interval is not None:
        return "interval"
    if job.run_at is not None:
        return "once"
    return "solar" if job.solar_event else "cron"


def _has_window(request: HttpRequest, job: Job | None) -> bool:
    """Whether the job has a not-before or an end, or the form sent back typed one in."""
    if job is not None and any(getattr(job, name) is not None for name in _WINDOW):
        return True
    sent = request.POST if request.method == "POST" else {}
    return any(sent.get(f"{name}_{part}") for name in _WINDOW for part in (0, 1))


def _has_calendar(request: HttpRequest, job: Job | None) -> bool:
    """Whether the job follows a calendar, or the form sent back one chosen."""
    if job is not None and job.calendar_id is not None:
        return True
    return bool(request.method == "POST" and request.POST.get("calendar"))


def kind_chooser(selected: str) -> str:
    """The Schedule section's description: the rule, and a chooser of the kind whose fields
    the page shows (``job_form.js``; hidden without the script, which then shows them all)."""
    options = format_html_join(
        "",
        '<option value="{}" data-fields="{}"{}>{}</option>',
        (
            (kind, " ".join(fields), mark_safe(" selected") if kind == selected else "", label)
            for kind, label, fields in SCHEDULE_KINDS
        ),
    )
    return format_html(
        '<span id="schedapp-kind-box" hidden><label for="schedapp-schedule-kind">Schedule kind'
        '</label> <select id="schedapp-schedule-kind">{}</select> </span>'
        "<span>Give exactly one of cron, interval, run_at or a solar event.</span>",
        options,
    )


def breakable(text: str) -> str:
    """``text`` escaped, with a line-break opportunity after each dot, @, colon or slash."""
    return format_html_join(mark_safe("<wbr>"), "{}", ((p,) for p in _BREAK_AFTER.split(text)))


class JobAdmin(JobViewsMixin, admin.ModelAdmin):
    form = JobForm
    change_form_template = "admin/schedapp/job/change_form.html"
    change_list_template = "admin/schedapp/job/change_list.html"
    list_display = (
        "name",
        "task_name",
        "schedule",
        "state_badge",
        "next_run",
        "last_run",
        "lease",
        "retries",
    )
    list_filter = ("state", TagFilter, TaskFilter, QueueFilter, ScheduleKindFilter, "source")
    search_fields = ("name", "task")
    search_help_text = "Name or task contains ..."
    sortable_by = ("name",)  # the unique index delivers it; other columns would sort the table
    list_per_page = 100
    paginator = LargeTablePaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER  # facets count every filter option: not at this scale
    actions = [*(make_action(op) for op in OPERATIONS), "backfill_one"]

    @admin.action(description="Backfill… (one job)", permissions=["change"])
    def backfill_one(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
        """The "Backfill..." form of the one job selected (a backfill is of one job)."""
        ids = list(queryset.values_list("pk", flat=True)[:2])
        if len(ids) != 1:
            self.message_user(request, "Select one job to backfill.", messages.WARNING)
            return None
        return HttpResponseRedirect(reverse("admin:schedapp_backfill_start", args=[ids[0]]))

    class Media:
        js = ("schedapp/job_form.js",)

    # --- permissions: Django's model permissions plus the custom ones of Job.Meta ---------

    def has_run_permission(self, request: HttpRequest, obj: Job | None = None) -> bool:
        return request.user.has_perm("schedapp.run_job")

    def has_pause_permission(self, request: HttpRequest, obj: Job | None = None) -> bool:
        return request.user.has_perm("schedapp.pause_job")

    def has_cancel_permission(self, request: HttpRequest, obj: Job | None = None) -> bool:
        return request.user.has_perm("schedapp.cancel_job")

    def has_requeue_permission(self, request: HttpRequest, obj: Job | None = None) -> bool:
        return request.user.has_perm("schedapp.requeue_job")

    def _may(self, request: HttpRequest, permission: str) -> bool:
        return bool(getattr(self, f"has_{permission}_permission")(request))

    def get_actions(self, request: HttpRequest, action_location: Any = None) -> dict[str, Any]:
        # Django 6.1 passes where the actions are shown (and warns about an override without
        # the parameter); 5.2 and 6.0 know no such thing.
        if action_location is None:
            actions = super().get_actions(request)
        else:
            actions = super().get_actions(request, action_location=action_location)
        # Deleting jobs in bulk would cascade to their history in one transaction: cancel them,
        # and let schedapp_prune remove history in batches.
        actions.pop("delete_selected", None)
        return actions

    # --- changelist -----------------------------------------------------------------------

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        queryset = super().get_queryset(request)
        match = getattr(request, "resolver_match", None)
        if match is not None and match.url_name == "schedapp_job_changelist":
            # Rows carry up to 64 KB of arguments and 10 KB of error: a page needs neither.
            queryset = queryset.defer("args", "kwargs", "last_error").annotate(
                last_error_head=Left("last_error", 300)
            )
        return queryset

    def get_list_display(self, request: HttpRequest) -> tuple[str, ...]:
        if request.GET.get("state__exact") == JobState.DEAD:  # the dead-letter view
            return (
                "name",
                "task_name",
                "schedule",
                "state_badge",
                "last_run",
                "retries",
                "last_error_head_text",
            )
        return self.list_display

    # Dotted task names, host names and zone names are long words: the list breaks them after
    # a dot, @ or slash (<wbr>), so that at 1,400 px every column fits without scrolling.
    @admin.display(description="task")
    def task_name(self, job: Job) -> str:
        return breakable(job.task)

    @admin.display(description="retries")
    def retries(self, job: Job) -> int:
        return job.retry_count

    @admin.display(description="schedule")
    def schedule(self, job: Job) -> str:
        return breakable(job_schedule_text(job))

    @admin.display(description="state")
    def state_badge(self, job: Job) -> str:
        return badge(job.state, job.get_state_display())

    @admin.display(description="next run")
    def next_run(self, job: Job) -> str:
        """In the job's zone, on the list and the job page alike; only a scheduled job has
        one (a paused job's stored time is where it resumes from, a dead one never fires)."""
        if job.next_run_at is None or job.state != JobState.SCHEDULED:
            return "-"
        return format_html(
            '<span title="{} UTC">{}</span>',
            job.next_run_at.strftime("%Y-%m-%d %H:%M:%S"),
            local_time(job.next_run_at, job.timezone),
        )

    @admin.display(description="last run")
    def last_run(self, job: Job) -> str:
        if job.last_run_at is None:
            return "-"
        return format_html(
            "{} {}",
            local_time(job.last_run_at, job.timezone),
            badge(job.last_status, job.last_status) if job.last_status else "",
        )

    @admin.display(description="lease")
    def lease(self, job: Job) -> str:
        if not job.claimed_by:
            return "-"
        return format_html(
            "{}<br><small>until {}</small>",
            breakable(job.claimed_by),
            local_time(job.lease_expires_at, job.timezone, seconds=True),
        )

    @admin.display(description="last error")
    def last_error_head_text(self, job: Job) -> str:
        head = getattr(job, "last_error_head", None)
        head = job.last_error[:300] if head is None else head
        return format_html('<span style="white-space: pre-wrap">{}</span>', head or "-")

    # --- the job page ---------------------------------------------------------------------

    def get_form(
        self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any
    ) -> Any:
        form = super().get_form(request, obj, change, **kwargs)
        task = form.base_fields.get("task")
        if task is not None and isinstance(task.widget, TaskPickerWidget):
            task.widget.registered = allowed_registered_tasks()
        return form

    def get_fieldsets(self, request: HttpRequest, obj: Job | None = None) -> Any:
        first, (title, schedule), *rest = _EDITABLE
        schedule = {**schedule, "description": kind_chooser(schedule_kind(obj))}
        window: dict[str, Any] = {"fields": _WINDOW}
        if not _has_window(request, obj):
            window["classes"] = ("collapse",)
        calendar: dict[str, Any] = {"fields": _CALENDAR}
        if not _has_calendar(request, obj):
            calendar["classes"] = ("collapse",)
        reason = ("Why", {"fields": ("change_reason",)})
        editable = (
            first,
            (title, schedule),
            ("Calendar (optional)", calendar),
            ("Window (optional)", window),
            *rest,
            reason,
        )
        return editable if obj is None else (*editable, *_STATUS)

    def get_readonly_fields(self, request: HttpRequest, obj: Job | None = None) -> Any:
        return ("fire_preview",) if obj is None else ("fire_preview", *_STATUS_FIELDS)

    @admin.display(description="schedule in words, next fire times")
    def fire_preview(self, job: Job) -> str:
        times = getattr(job, "_schedapp_preview", None)
        if times is None and job.pk:
            values = {f: getattr(job, f) for f in JOB_FIELDS}
            try:
                times = preview_for(values, scheduled_for=job.scheduled_for)
            except Exception:
                times = []
        note = ""
        if job.pk and job.state in (JobState.CANCELLED, JobState.SUCCEEDED, JobState.PAUSED):
            note = f"(the job is {job.state}: nothing fires until it is resumed or run)"
        if job.pk and job.state == JobState.DEAD:
            note = "(the job is dead: nothing fires until it is requeued or run)"
        return format_html(
            '<div class="schedapp-preview" data-url="{}">'
            '<p id="schedapp-preview-words">{}</p>'
            '<ol id="schedapp-preview-list">{}</ol><p class="help">{}</p>'
            '<p id="schedapp-preview-error" class="errornote" style="display: none"></p>'
            '<button type="button" class="button" id="schedapp-preview-button">'
            "Preview next 5 fire times</button></div>",
            reverse("admin:schedapp_job_preview"),
            job_schedule_text(job) if job.pk else "",
            format_html_join("", "<li>{}</li>", ((t,) for t in times or ())),
            note,
        )

    @admin.display(description="occurrence")
    def occurrence(self, job: Job) -> str:
        """The occurrence the next run belongs to (next run = occurrence + jitter/backoff)."""
        return local_time(job.scheduled_for, job.timezone, seconds=True)

    @admin.display(description="created at")
    def created(self, job: Job) -> str:
        return local_time(job.created_at, job.timezone, seconds=True)

    @admin.display(description="updated at")
    def updated(self, job: Job) -> str:
        return local_time(job.updated_at, job.timezone, seconds=True)

    @admin.display(description="lease expires")
    def lease_expiry(self, job: Job) -> str:
        return local_time(job.lease_expires_at, job.timezone, seconds=True)

    @admin.display(description="last error")
    def last_error_text(self, job: Job) -> str:
        if not job.last_error:
            return "-"
        return format_html('<pre style="white-space: pre-wrap; margin: 0">{}</pre>', job.last_error)

    @admin.display(description="runs")
    def runs(self, job: Job) -> str:
        return runs_summary(job)

    def _form_context(self, request: HttpRequest, job: Job | None) -> dict[str, Any]:
        context: dict[str, Any] = {"schedapp_buttons": []}
        editable = (
            self.has_add_permission(request)
            if job is None
            else self.has_change_permission(request, job)
        )
        if editable:
            context["schedapp_tasks"] = allowed_registered_tasks()
            context["schedapp_timezones"] = timezone_names()
        if job is not None:
            context["schedapp_status"] = self._status(job)
            context["schedapp_buttons"] = [
                {"op": op, "url": reverse("admin:schedapp_job_operation", args=[job.pk, op.slug])}
                for op in OPERATIONS
                if job.state in op.states and self._may(request, op.permission)
            ]
        return context

    def _status(self, job: Job) -> dict[str, Any]:
        """The job page's header: what a person asks first, above the form."""
        lines = (job.last_error or "").strip().splitlines()
        first_line = lines[0][:300] if lines else ""
        return {
            "badge": self.state_badge(job),
            "dead": job.state == JobState.DEAD,
            "next_run": self.next_run(job),
            "last_run": self.last_run(job),
            "retries": job.retry_count,
            "max_retries": job.max_retries,
            "missed": job.missed_runs,
            "last_error": first_line,
            "schedule": job_schedule_text(job),
            "runs_url": f"{reverse('admin:schedapp_jobrun_changelist')}?job={job.pk}",
            "timeline_url": reverse("admin:schedapp_job_timeline", args=[job.pk]),
        }

    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: dict | None = None,
    ) -> HttpResponse:
        job = self.get_object(request, unquote(object_id)) if object_id else None
        context = {**(extra_context or {}), **self._form_context(request, job)}
        try:
            return super().changeform_view(request, object_id, form_url, context)
        except (ValidationError, JobStateError) as exc:  # lost a race after the form checks
            self.message_user(request, error_text(exc), messages.ERROR)
            return HttpResponseRedirect(request.get_full_path())

    def save_model(self, request: HttpRequest, obj: Job, form: JobForm, change: bool) -> None:
        values = dict(form.job_values)
        reason = form.cleaned_data.get("change_reason") or ""
        # The form said whether the task is allowed; one unknown to this process is kept.
        with acting_in_admin(request, reason):
            if not change:
                task = values.pop("task")
                job = api.schedule(task, source=JobSource.ADMIN, unregistered_ok=True, **values)
            else:
                changes = changed_fields(obj, values)
                job = api.update(obj.pk, unregistered_ok=True, **changes) if changes else obj
        if form.task_warning:
            self.message_user(request, form.task_warning, messages.WARNING)
        for field in Job._meta.concrete_fields:
            setattr(obj, field.attname, getattr(job, field.attname))
        obj._state.adding = False
        obj._state.db = job._state.db

    def delete_model(self, request: HttpRequest, obj: Job) -> None:
        if obj.state == JobState.RUNNING:
            raise PermissionDenied("cancel a running job before deleting it")
        with transaction.atomic(), acting_in_admin(request):
            audit.record_deleted(obj)
            super().delete_model(request, obj)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet) -> None:
        with transaction.atomic(), acting_in_admin(request):
            for job in queryset:
                audit.record_deleted(job)
            super().delete_queryset(request, queryset)

    def get_deleted_objects(self, objs: Any, request: HttpRequest) -> Any:
        """Summarise instead of listing every run of the job (there may be millions), and
        refuse what would be one long cascading DELETE: a running job, or a huge history."""
        jobs = list(objs)
        runs = JobRun.objects.filter(job__in=jobs).values("id")[: DELETE_RUNS_MAX + 1].count()
        too_many = runs > DELETE_RUNS_MAX
        runs_text = f"more than {DELETE_RUNS_MAX:,}" if too_many else f"{runs:,}"
        protected = [
            f"{j.name} is running: cancel it first" for j in jobs if j.state == JobState.RUNNING
        ]
        if too_many:
            protected.append(f"{runs_text} runs: prune the history first (schedapp_prune)")
        perms_needed = set() if self.has_delete_permission(request) else {"job"}
        summary = [f"{j.name} and its run history ({runs_text} runs)" for j in jobs]
        return summary, {"jobs": len(jobs), "runs": runs}, perms_needed, protected
