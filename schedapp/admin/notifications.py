"""Notifications as a read-only list: what each channel was told, what is waiting, and what
failed for good (with the last error), so a team can see an alert that did not reach it."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from ..models import Notification
from .filters import LargeTablePaginator
from .runs import ReadOnlyAdmin


class DeliveryFilter(admin.SimpleListFilter):
    title = "delivery"
    parameter_name = "delivery"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("pending", "pending"), ("sent", "sent"), ("failed", "failed")]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value = self.value()
        if value == "pending":
            return queryset.filter(sent_at=None, failed_at=None)
        if value == "sent":
            return queryset.filter(sent_at__isnull=False)
        if value == "failed":
            return queryset.filter(failed_at__isnull=False)
        return queryset


class NotificationAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "created_at",
        "channel",
        "kind",
        "job_name",
        "delivery",
        "attempts",
        "last_error",
    )
    list_filter = (DeliveryFilter, "kind", "channel")
    search_fields = ("job_name",)
    sortable_by = ("id",)
    list_per_page = 100
    paginator = LargeTablePaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    fields = (
        "channel",
        "kind",
        "job_id",
        "job_name",
        "tags",
        "scheduled_for",
        "detail",
        "incident",
        "created_at",
        "attempts",
        "next_attempt_at",
        "sent_at",
        "failed_at",
        "last_error",
    )
    readonly_fields = fields

    @admin.display(description="delivery")
    def delivery(self, obj: Notification) -> str:
        if obj.sent_at is not None:
            return f"sent {obj.sent_at:%Y-%m-%d %H:%M:%S}"
        if obj.failed_at is not None:
            return f"failed {obj.failed_at:%Y-%m-%d %H:%M:%S}"
        return "pending"
