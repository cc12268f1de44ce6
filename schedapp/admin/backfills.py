"""Backfills in the admin: the "Backfill..." form of a job (``api.backfill``, validated with
the API's field-named errors) and the backfills page, each backfill's progress (occurrences
decided of its total, dispatched, already done, throttle, state, ETA), refreshed every few
seconds while one is running, with a Cancel button (``api.cancel_backfill``). Both recorded
in the audit trail as the admin user's."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from .. import api
from ..display import local_time
from ..lease.backfill import BACKFILL_OVERLAP, DEFAULT_OVERLAP
from ..models import Backfill, BackfillState, Job
from .filters import RunJobFilter
from .operations import acting_in_admin, error_text
from .runs import ReadOnlyAdmin

REFRESH_SECONDS = 3


class BackfillForm(forms.Form):
    start = forms.DateTimeField(help_text="The first time of the range (server time zone).")
    end = forms.DateTimeField(help_text="The last time of the range, included; not after now.")
    overlap = forms.ChoiceField(choices=[(o, o) for o in BACKFILL_OVERLAP], initial=DEFAULT_OVERLAP)
    max_per_second = forms.FloatField(initial=10.0, help_text="Runs dispatched per second.")
    rerun = forms.BooleanField(
        required=False, help_text="Run again occurrences that already succeeded."
    )
    reason = forms.CharField(required=False, max_length=500)

    def backfill(self, job: Job) -> Backfill | None:
        """The backfill through the API; its errors become the form's, on their fields."""
        data = self.cleaned_data
        try:
            return api.backfill(
                job,
                data["start"],
                data["end"],
                overlap=data["overlap"],
                max_per_second=data["max_per_second"],
                rerun=data["rerun"],
                reason=data["reason"],
            )
        except ValidationError as exc:
            for field, errors in exc.message_dict.items():
                self.add_error(field if field in self.fields else None, errors)
            return None


def can_backfill(request: HttpRequest) -> bool:
    return request.user.has_perm("schedapp.change_job")


class BackfillAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "job_link",
        "range_col",
        "throttle",
        "state_col",
        "progress_col",
    )
    list_filter = ("state", RunJobFilter)
    list_select_related = ("job",)
    search_fields = ("=job__id", "job__name")
    list_per_page = 50
    show_full_result_count = False
    change_list_template = "admin/schedapp/backfill/change_list.html"
    actions = ["cancel_selected"]
    fields = (
        "job",
        "start",
        "end",
        "overlap",
        "max_per_second",
        "rerun",
        "state",
        "cursor",
        "total",
        "decided",
        "dispatched",
        "already_done",
        "in_flight",
        "overlapped",
        "cancelled_count",
        "created_by",
        "reason",
        "created_at",
        "finished_at",
    )
    readonly_fields = fields

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm("schedapp.view_job") or can_backfill(request)

    @admin.display(description="job")
    def job_link(self, obj: Backfill) -> str:
        url = reverse("admin:schedapp_job_change", args=[obj.job_id])
        return format_html('<a href="{}">{}</a>', url, obj.job.name)

    @admin.display(description="range")
    def range_col(self, obj: Backfill) -> str:
        return format_html(
            '<span class="nowrap">{}</span><br><span class="nowrap">to {}</span>{}',
            local_time(obj.start, obj.job.timezone),
            local_time(obj.end, obj.job.timezone),
            " (rerun)" if obj.rerun else "",
        )

    @admin.display(description="overlap, throttle")
    def throttle(self, obj: Backfill) -> str:
        return f"{obj.overlap}, {obj.max_per_second:g}/s"

    @admin.display(description="state")
    def state_col(self, obj: Backfill) -> str:
        return format_html("{}<br>{}", obj.get_state_display(), self.cancel_button(obj))

    @admin.display(description="progress, ETA")
    def progress_col(self, obj: Backfill) -> str:
        pct = round(100 * obj.progress)
        others = [
            f"{n} {label}"
            for n, label in (
                (obj.already_done, "already done"),
                (obj.in_flight, "in flight"),
                (obj.overlapped, "overlapped"),
                (obj.cancelled_count, "cancelled"),
            )
            if n
        ]
        return format_html(
            '<progress max="100" value="{}"></progress> {} / {} ({}%), {}<br>{} dispatched{}',
            pct,
            obj.decided,
            obj.total,
            pct,
            self.eta(obj),
            obj.dispatched,
            "".join(f", {o}" for o in others),
        )

    @admin.display(description="ETA")
    def eta(self, obj: Backfill) -> str:
        if obj.state != BackfillState.RUNNING:
            return f"{obj.state} {obj.finished_at:%H:%M:%S}" if obj.finished_at else obj.state
        left = timedelta(seconds=round((obj.total - obj.decided) / obj.max_per_second))
        return f"about {left}"

    @admin.display(description="")
    def cancel_button(self, obj: Backfill) -> str:
        if obj.state != BackfillState.RUNNING:
            return ""
        url = reverse("admin:schedapp_backfill_cancel", args=[obj.pk])
        # A button of the changelist's own form (a form cannot hold another), posted to
        # the cancel view with the form's CSRF token.
        return format_html(
            '<button type="submit" class="schedapp-cancel-backfill" formaction="{}" '
            'formmethod="post">Cancel</button>',
            url,
        )

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        running = Backfill.objects.filter(state=BackfillState.RUNNING).exists()
        context = {**(extra_context or {}), "refresh": REFRESH_SECONDS if running else None}
        return super().changelist_view(request, context)

    def get_urls(self) -> list:
        return [
            path(
                "start/<int:job_id>/",
                self.admin_site.admin_view(self.start_view),
                name="schedapp_backfill_start",
            ),
            path(
                "<int:pk>/cancel/",
                self.admin_site.admin_view(self.cancel_view),
                name="schedapp_backfill_cancel",
            ),
            *super().get_urls(),
        ]

    def start_view(self, request: HttpRequest, job_id: int) -> HttpResponse:
        """The "Backfill..." form of one job."""
        if not can_backfill(request):
            raise PermissionDenied
        job = get_object_or_404(Job, pk=job_id)
        form = BackfillForm(request.POST or None)
        if request.method == "POST" and form.is_valid():
            with acting_in_admin(request, form.cleaned_data["reason"]):
                record = form.backfill(job)
            if record is not None:
                messages.success(
                    request, f"Backfill {record.pk} of {job.name}: {record.total} occurrence(s)."
                )
                url = reverse("admin:schedapp_backfill_changelist")
                return HttpResponseRedirect(f"{url}?job={job.pk}")
        context = {
            **self.admin_site.each_context(request),
            "title": f"Backfill {job.name}",
            "job": job,
            "form": form,
            "opts": self.model._meta,
        }
        return TemplateResponse(request, "admin/schedapp/backfill/start.html", context)

    def cancel_view(self, request: HttpRequest, pk: int) -> HttpResponse:
        if request.method != "POST":
            return HttpResponseRedirect(reverse("admin:schedapp_backfill_changelist"))
        if not can_backfill(request):
            raise PermissionDenied
        record = get_object_or_404(Backfill, pk=pk)
        with acting_in_admin(request):
            api.cancel_backfill(record)
        messages.success(request, f"Backfill {pk} cancelled.")
        return HttpResponseRedirect(reverse("admin:schedapp_backfill_changelist"))

    @admin.action(description="Cancel selected backfills")
    def cancel_selected(self, request: HttpRequest, queryset: QuerySet) -> None:
        if not can_backfill(request):
            raise PermissionDenied
        with acting_in_admin(request):
            for record in queryset.filter(state=BackfillState.RUNNING):
                try:
                    api.cancel_backfill(record)
                except Exception as exc:  # one that cannot be cancelled: say so, go on
                    messages.error(request, f"Backfill {record.pk}: {error_text(exc)}")
        messages.success(request, "Cancelled.")
