"""The "needs attention" page: what needs a person now (open deadline breaches by kind, and
notifications that failed to reach their channel). Read-only but for a dead job's Requeue
button, which is the job page's (``JobAdmin.operation_view``: the API, the audit trail).

Registered on the ``Attention`` proxy so the admin index lists it; its changelist is this
page and it has no other view. Who may see it: staff with view (or change) permission on
jobs, as the other schedapp pages. Reads through ``schedapp.attention`` (bounded queries).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from django.contrib import admin
from django.contrib.auth import get_permission_codename
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, QueryDict
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from .. import attention
from ..display import seconds_text
from ..models import BreachKind, Job, JobState
from .ledger import _job_time, _server_time, detail_html, timeline_url
from .runs import badge

KIND_WORDS = {
    BreachKind.LATE: "late",
    BreachKind.OVERRUNNING: "overrunning",
    BreachKind.MISSED_FINISH_BY: "missed finish_by",
    BreachKind.FAILING: "failing",
    BreachKind.DEAD: "dead",
}
KIND_COLOURS = {
    BreachKind.LATE: "#c05600",
    BreachKind.OVERRUNNING: "#b36b00",
    BreachKind.MISSED_FINISH_BY: "#8d6e00",
    BreachKind.FAILING: "#ba2121",
    BreachKind.DEAD: "#7a1010",
}


def kind_badge(kind: str) -> str:
    """A breach kind as a coloured badge, its long meaning in the tooltip."""
    return format_html(
        '<span class="schedapp-badge schedapp-{}" title="{}" style="background:{};color:#fff;'
        'padding:1px 6px;border-radius:8px;font-size:0.85em;white-space:nowrap">{}</span>',
        kind,
        BreachKind(kind).label,
        KIND_COLOURS.get(kind, "#555555"),
        KIND_WORDS.get(kind, kind),
    )


def _query(**params: str) -> str:
    kept = {k: v for k, v in params.items() if v}
    return "?" + urlencode(kept) if kept else "?"


def _older_than(text: str) -> tuple[datetime, int] | None:
    """The keyset of an "older" link (``<iso time>_<id>``); None when it is not one."""
    at, _, breach_id = text.rpartition("_")
    try:
        moment = datetime.fromisoformat(at)
        number = int(breach_id)
    except ValueError:
        return None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)), number


def attention_page(query: QueryDict, may_requeue: bool = False) -> dict[str, Any]:
    """The page's context: the filters read (an unknown kind or keyset is said, not obeyed),
    every kind's count, each listed kind's rows, the failed deliveries. A dead job still dead
    gets the job page's Requeue button when the user may requeue (the same view: the API,
    recorded in the audit trail as the admin user's)."""
    errors = []
    kind = query.get("kind", "")
    if kind and kind not in attention.KINDS:
        errors.append(f"kind: {kind!r} is not one of {', '.join(attention.KINDS)}; showing all.")
        kind = ""
    tag = query.get("tag", "").strip().lower()
    older_than = None
    if query.get("older"):
        older_than = _older_than(query["older"]) if kind else None
        if older_than is None:
            errors.append("older: not a page of one kind; showing the newest.")
    data = attention.collect((kind,) if kind else attention.KINDS, tag, older_than)
    now = data.now
    changelist = reverse("admin:schedapp_job_changelist")
    sections = []
    for page in data.kinds:
        rows = [
            {
                "job_name": b.job_name,
                "job_url": reverse("admin:schedapp_job_change", args=[b.job_id]),
                "timeline_url": timeline_url(b.job_id, b.scheduled_for),
                "job_state": badge(b.job_state, b.job_state),
                "since": _server_time(b.opened_at),
                "age": seconds_text(max((now - b.opened_at).total_seconds(), 0.0)),
                "occurrence": _job_time(b.scheduled_for, b.zone),
                "detail": detail_html(b.detail) if b.detail else "-",
                "tags": [{"name": t, "url": _query(kind=kind, tag=t)} for t in b.tags],
                "requeue_url": (
                    reverse("admin:schedapp_job_operation", args=[b.job_id, "requeue"])
                    if may_requeue and b.job_state == JobState.DEAD
                    else ""
                ),
            }
            for b in page.rows
        ]
        sections.append(
            {
                "kind": page.kind,
                "badge": kind_badge(page.kind),
                "label": BreachKind(page.kind).label,
                "count": page.count,
                "capped": page.capped,
                "url": _query(kind=page.kind, tag=tag),
                "selected": page.kind == kind,
                "listed": not kind or page.kind == kind,
                "rows": rows,
                "older_url": (
                    _query(
                        kind=page.kind,
                        tag=tag,
                        older=f"{page.older[0].isoformat()}_{page.older[1]}",
                    )
                    if page.older and kind
                    else ""
                ),
                "all_url": _query(kind=page.kind, tag=tag) if page.older and not kind else "",
            }
        )
    outbox = reverse("admin:schedapp_notification_changelist")
    return {
        "errors": errors,
        "kind": kind,
        "tag": tag,
        "now": _server_time(now),
        "sections": sections,
        "total": sum(s["count"] for s in sections),
        "any_capped": any(s["capped"] for s in sections),
        "all_url": _query(tag=tag),
        "untagged_url": _query(kind=kind),
        "newest_url": _query(kind=kind, tag=tag) if older_than else "",
        "page_size": attention.PAGE_SIZE,
        "cap": attention.COUNT_CAP,
        "failed": [
            {
                "url": reverse("admin:schedapp_notification_change", args=[n.pk]),
                "failed_at": _server_time(n.failed_at),
                "channel": n.channel,
                "kind": n.kind,
                "job_name": n.job_name,
                "job_url": (
                    reverse("admin:schedapp_job_change", args=[n.job_id]) if n.job_id else ""
                ),
                "attempts": n.attempts,
                "error": n.last_error.splitlines()[0] if n.last_error else "-",
            }
            for n in data.failed
        ],
        "failed_days": attention.FAILED_DAYS,
        "failed_url": f"{outbox}?delivery=failed",
        "channels": [
            {
                "name": c.name,
                "failures": c.failures,
                "retry_at": _server_time(c.retry_at),
                "last_message_at": _server_time(c.last_message_at),
            }
            for c in data.failing_channels
        ],
        "overview_url": reverse("admin:schedapp_job_overview"),
        "not_run_url": reverse("admin:schedapp_job_not_run"),
        "jobs_url": changelist,
    }


class AttentionAdmin(admin.ModelAdmin):
    """The page as the ``Attention`` proxy's only view."""

    def _may_view_jobs(self, request: HttpRequest) -> bool:
        opts = Job._meta
        return any(
            request.user.has_perm(f"{opts.app_label}.{get_permission_codename(action, opts)}")
            for action in ("view", "change")
        )

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self._may_view_jobs(request)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self._may_view_jobs(request)

    def get_urls(self) -> list[Any]:
        name = f"{self.opts.app_label}_{self.opts.model_name}_changelist"
        return [path("", self.admin_site.admin_view(self.changelist_view), name=name)]

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, str] | None = None
    ) -> HttpResponse:
        if not self._may_view_jobs(request):
            raise PermissionDenied
        context = {
            **self.admin_site.each_context(request),
            "title": "Needs attention",
            "original": "Needs attention",
            "add": False,
            "has_view_permission": True,
            "opts": Job._meta,
            "page": attention_page(request.GET, request.user.has_perm("schedapp.requeue_job")),
            "here": request.get_full_path(),
            **(extra_context or {}),
        }
        return TemplateResponse(request, "admin/schedapp/attention.html", context)
