"""The job admin's own pages: the buttons of the job page, the schedule preview, the overview,
a job's occurrence timeline and the fleet's "what did not run".

All are admin views (``admin_site.admin_view``: staff login, CSRF on POST) registered by
``JobAdmin.get_urls`` under ``/admin/schedapp/job/``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
    JsonResponse,
)
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.http import url_has_allowed_host_and_scheme

from .. import api, overview
from ..exceptions import JobStateError
from ..models import JobChange, JobState
from .forms import preview_from_query
from .history import history_page
from .ledger import fleet_page, timeline_page
from .operations import BY_SLUG, acting_in_admin, apply_operation, error_text
from .runs import badge


class JobViewsMixin:
    """Mixed into ``JobAdmin`` (which provides the permission checks and ``_may``)."""

    # Provided by JobAdmin / ModelAdmin (annotations only: nothing is shadowed).
    admin_site: Any
    model: Any
    _may: Callable[[HttpRequest, str], bool]
    get_object: Callable[..., Any]
    message_user: Callable[..., None]
    has_view_or_change_permission: Callable[..., bool]
    has_add_permission: Callable[..., bool]
    has_change_permission: Callable[..., bool]

    def get_urls(self) -> list[Any]:
        wrap = self.admin_site.admin_view
        return [
            path("overview/", wrap(self.overview_view), name="schedapp_job_overview"),
            path("preview/", wrap(self.preview_view), name="schedapp_job_preview"),
            path("not-run/", wrap(self.not_run_view), name="schedapp_job_not_run"),
            path(
                "<path:object_id>/timeline/", wrap(self.timeline_view), name="schedapp_job_timeline"
            ),
            path(
                "<path:object_id>/history/<int:change_id>/restore/",
                wrap(self.restore_view),
                name="schedapp_job_restore",
            ),
            path(
                "<path:object_id>/do/<slug:slug>/",
                wrap(self.operation_view),
                name="schedapp_job_operation",
            ),
            *super().get_urls(),  # type: ignore[misc]
        ]

    def operation_view(self, request: HttpRequest, object_id: str, slug: str) -> HttpResponse:
        """A button of the job page (POST only; CSRF-checked by ``admin_view``)."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        op = BY_SLUG.get(slug)
        if op is None:
            raise Http404(f"no operation {slug!r}")
        if not self._may(request, op.permission):
            raise PermissionDenied
        job = self.get_object(request, unquote(object_id))
        if job is None:
            raise Http404("no such job")
        results = apply_operation(self, request, op, [(job.pk, job.name)])
        target = results[0].pk if (results and op.slug == "duplicate") else job.pk
        back = request.POST.get("next", "")
        if back and url_has_allowed_host_and_scheme(
            back, allowed_hosts={request.get_host()}, require_https=request.is_secure()
        ):
            return HttpResponseRedirect(back)  # the page the button was on (needs attention)
        return HttpResponseRedirect(reverse("admin:schedapp_job_change", args=[target]))

    def preview_view(self, request: HttpRequest) -> HttpResponse:
        """The next fire times of a schedule being typed (GET; computes, never writes)."""
        if not (self.has_view_or_change_permission(request) or self.has_add_permission(request)):
            raise PermissionDenied
        if request.method != "GET":
            return HttpResponseNotAllowed(["GET"])
        times, errors, words = preview_from_query(request.GET)
        return JsonResponse({"times": times, "errors": errors, "words": words})

    def overview_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        data = overview.collect()
        changelist = reverse("admin:schedapp_job_changelist")
        states = [
            {
                "state": state,
                "label": label,
                "count": data.counts.get(state, 0),
                "badge": badge(state, str(label)),
                "url": f"{changelist}?state__exact={state}",
            }
            for state, label in JobState.choices
        ]
        context = {
            **self.admin_site.each_context(request),
            "title": "Scheduler overview",
            # The change form's breadcrumbs (the template extends it): Jobs > this page.
            "original": "Scheduler overview",
            "add": False,
            "has_view_permission": True,
            "opts": self.model._meta,
            "overview": data,
            "states": states,
            "dead_url": f"{changelist}?state__exact={JobState.DEAD}",
            "runs_url": reverse("admin:schedapp_jobrun_changelist"),
            "nodes_url": reverse("admin:schedapp_node_changelist"),
            "not_run_url": reverse("admin:schedapp_job_not_run"),
            "attention_url": reverse("admin:schedapp_attention_changelist"),
            "node_groups": [("Beats", data.beats, "beats"), ("Workers", data.workers, "workers")],
        }
        return TemplateResponse(request, "admin/schedapp/overview.html", context)

    def timeline_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """A job's occurrences, newest first, and "what happened at ...?" (GET; reads)."""
        job = self.get_object(request, unquote(object_id))
        if job is None:
            raise Http404("no such job")
        if not self.has_view_or_change_permission(request, job):
            raise PermissionDenied
        page = timeline_page(job, request.GET)
        context = {
            **self.admin_site.each_context(request),
            "title": f"Timeline of {job.name}",
            "original": f"Timeline of {job.name}",
            "add": False,
            "has_view_permission": True,
            "opts": self.model._meta,
            "job": job,
            "page": page,
            "change_url": reverse("admin:schedapp_job_change", args=[job.pk]),
            "runs_url": f"{reverse('admin:schedapp_jobrun_changelist')}?job={job.pk}",
            "not_run_url": reverse("admin:schedapp_job_not_run"),
        }
        return TemplateResponse(request, "admin/schedapp/job/timeline.html", context)

    def not_run_view(self, request: HttpRequest) -> HttpResponse:
        """What did not run in the fleet lately, and the runs that did not succeed."""
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        context = {
            **self.admin_site.each_context(request),
            "title": "What did not run",
            "original": "What did not run",
            "add": False,
            "has_view_permission": True,
            "opts": self.model._meta,
            "fleet": fleet_page(request.GET),
            "overview_url": reverse("admin:schedapp_job_overview"),
        }
        return TemplateResponse(request, "admin/schedapp/not_run.html", context)

    def history_view(
        self, request: HttpRequest, object_id: str, extra_context: dict | None = None
    ) -> HttpResponse:
        """The job's audit trail (replaces the admin's LogEntry history, which saw only
        the admin's own edits)."""
        job = self.get_object(request, unquote(object_id))
        if job is None:
            raise Http404("no such job")
        if not self.has_view_or_change_permission(request, job):
            raise PermissionDenied
        context = {
            **self.admin_site.each_context(request),
            "title": f"History of {job.name}",
            "original": f"History of {job.name}",
            "add": False,
            "has_view_permission": True,
            "opts": self.model._meta,
            "job": job,
            "page": history_page(job),
            "may_restore": self.has_change_permission(request, job),
            "change_url": reverse("admin:schedapp_job_change", args=[job.pk]),
            **(extra_context or {}),
        }
        return TemplateResponse(request, "admin/schedapp/job/history.html", context)

    def restore_view(self, request: HttpRequest, object_id: str, change_id: int) -> HttpResponse:
        """Restore the version a recorded change left (POST; CSRF-checked by ``admin_view``)."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        job = self.get_object(request, unquote(object_id))
        if job is None:
            raise Http404("no such job")
        if not self.has_change_permission(request, job):
            raise PermissionDenied
        record = JobChange.objects.filter(pk=change_id, job_id=job.pk).first()
        if record is None:
            raise Http404("no such change of this job")
        reason = (request.POST.get("reason") or "").strip() or None
        history = reverse("admin:schedapp_job_history", args=[job.pk])
        try:
            with acting_in_admin(request):
                api.restore(job.pk, record, reason=reason)
        except (ValidationError, JobStateError) as exc:
            self.message_user(request, f"Not restored: {error_text(exc)}", messages.ERROR)
            return HttpResponseRedirect(history)
        self.message_user(
            request, f"Restored {job.name} to its version of {record.at:%Y-%m-%d %H:%M:%S} UTC."
        )
        return HttpResponseRedirect(history)
