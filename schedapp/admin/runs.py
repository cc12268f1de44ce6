"""Run history and fleet nodes in the admin: read-only for everybody.

Runs are written by beats and workers only; history is removed by ``schedapp_prune`` (in
batches), never from the admin, so nobody can add, change or delete a run here.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import DurationField, ExpressionWrapper, F, Q, QuerySet
from django.db.models.functions import Now
from django.http import HttpRequest
from django.urls import NoReverseMatch, reverse
from django.utils import timezone as django_tz
from django.utils.html import format_html, format_html_join

from ..display import (
    duration_text,
    local_time,
    run_status,
    run_status_label,
    safe_zone,
    seconds_text,
)
from ..models import Job, JobRun, Node
from ..overview import NODE_FRESH_SECONDS
from .filters import CountedChangeList, LargeTablePaginator, RunJobFilter

COLOURS = {
    # job states
    "scheduled": "#417690",
    "running": "#b36b00",
    "paused": "#777777",
    "succeeded": "#2e7d32",
    "dead": "#ba2121",
    "cancelled": "#444444",
    # run statuses
    "dispatched": "#417690",
    "failed": "#ba2121",
    "lost": "#8e24aa",
    "skipped": "#777777",
    "waiting": "#5a6a7a",  # a retry of an allow_all occurrence, not sent yet
    # occurrences' fates (the ledger)
    "ran": "#417690",
    "misfired": "#c05600",
    "outside_window": "#8d6e00",
    "overlapped": "#6d6d6d",
    "buffer_full": "#8d6e00",
    "excluded": "#5a6a7a",  # by the job's calendar
    "merged": "#5a6a7a",
    "quarantined": "#ba2121",
}
RECENT_RUNS_ON_JOB_PAGE = 5
# The runs search lists the runs of at most this many jobs whose name matches (the newest).
SEARCH_JOBS = 1_000


def badge(value: str, label: str) -> str:
    colour = COLOURS.get(value, "#555555")
    return format_html(
        '<span class="schedapp-badge schedapp-{}" style="background:{};color:#fff;'
        'padding:1px 6px;border-radius:8px;font-size:0.85em;white-space:nowrap">{}</span>',
        value,
        colour,
        label,
    )


def runs_summary(job: Job) -> str:
    """A link to the job's runs (the runs changelist, paginated) and its latest few runs."""
    url = f"{reverse('admin:schedapp_jobrun_changelist')}?job={job.pk}"
    latest = list(
        JobRun.objects.filter(job_id=job.pk)
        .order_by("-id")
        .only(
            "id",
            "status",
            "retry_at",
            "scheduled_for",
            "started_at",
            "finished_at",
            "attempt",
            "worker",
        )[:RECENT_RUNS_ON_JOB_PAGE]
    )
    rows = format_html_join(
        "",
        '<tr><td><a href="{}">#{}</a></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>',
        (
            (
                reverse("admin:schedapp_jobrun_change", args=[r.pk]),
                r.pk,
                badge(run_status(r.status, r.retry_at), run_status_label(r.status, r.retry_at)),
                local_time(r.scheduled_for, job.timezone, seconds=True),
                r.attempt,
                duration_text(r.duration),
            )
            for r in latest
        ),
    )
    table = (
        format_html(
            "<table><thead><tr><th>run</th><th>status</th><th>scheduled for</th><th>attempt</th>"
            "<th>duration</th></tr></thead><tbody>{}</tbody></table>",
            rows,
        )
        if latest
        else "none yet"
    )
    return format_html(
        '<p><a href="{}" id="schedapp-runs-link">All runs of this job</a> · <a href="{}" '
        'id="schedapp-timeline-link">Its timeline: every occurrence, what ran and what did not'
        "</a></p>{}",
        url,
        reverse("admin:schedapp_job_timeline", args=[job.pk]),
        table,
    )


class RunPaginator(LargeTablePaginator):
    """Says when a count among the newest runs began, in the time they were dispatched."""

    since_field = "dispatched_at"


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class JobRunAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "status_badge",
        "job_link",
        "scheduled_started",
        "duration_col",
        "processes",
        "attempt",
        "error_head",
    )
    list_display_links = ("id",)
    list_filter = ("status", "stale", RunJobFilter)
    list_select_related = ("job",)
    search_fields = ("=task_id",)
    search_help_text = "Part of a job's name, or an exact Celery task id (e.g. schedapp:42:7)"
    sortable_by = ("id",)
    list_per_page = 100
    paginator = RunPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    fields = (
        "job_link",
        "status_badge",
        "stale",
        "attempt",
        "token",
        "task_result",
        "scheduled",
        "due",
        "dispatched",
        "started",
        "finished",
        "duration_col",
        "lag",
        "claimed_by",
        "worker",
        "last_heartbeat",
        "heartbeats",
        "error_text",
        "traceback_text",
    )
    readonly_fields = fields

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[CountedChangeList]:
        return CountedChangeList

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        queryset = (
            super()
            .get_queryset(request)
            .select_related("job")
            .defer("job__args", "job__kwargs", "job__last_error")
        )
        match = getattr(request, "resolver_match", None)
        if match is not None and match.url_name == "schedapp_jobrun_changelist":
            queryset = queryset.defer("traceback")
        return queryset

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet, search_term: str
    ) -> tuple[QuerySet, bool]:
        """An exact task id (its index), or the runs of the jobs whose name contains the term:
        people look for "the billing job's runs", not a task id. The jobs are looked up first
        (at most ``SEARCH_JOBS`` of them), then their runs through the (job, -id) index."""
        term = search_term.strip()
        if not term:
            return queryset, False
        jobs = list(
            Job.objects.filter(name__icontains=term)
            .order_by("-id")
            .values_list("id", flat=True)[:SEARCH_JOBS]
        )
        return queryset.filter(Q(task_id=term) | Q(job_id__in=jobs)), False

    @admin.display(description="status")
    def status_badge(self, run: JobRun) -> str:
        shown = run_status(run.status, run.retry_at)
        return badge(shown, run_status_label(run.status, run.retry_at, run.stale))

    @admin.display(description="job")
    def job_link(self, run: JobRun) -> str:
        return format_html(
            '<a href="{}">{}</a>',
            reverse("admin:schedapp_job_change", args=[run.job_id]),
            run.job.name,
        )

    @admin.display(description="scheduled for")
    def scheduled(self, run: JobRun) -> str:
        return local_time(run.scheduled_for, run.job.timezone, seconds=True)

    # Every time of a run is shown in its job's zone, to the second, like the job's page.
    def _at(self, run: JobRun, value: Any) -> str:
        return local_time(value, run.job.timezone, seconds=True)

    @admin.display(description="scheduled for / started")
    def scheduled_started(self, run: JobRun) -> str:
        """The occurrence, and (smaller) when a worker started it, in the job's zone."""
        started = "not started"
        if run.started_at is not None:
            local = run.started_at.astimezone(safe_zone(run.job.timezone))
            started = f"started {local:%H:%M:%S}"
            if local.date() != run.scheduled_for.astimezone(local.tzinfo).date():
                started = f"started {local:%Y-%m-%d %H:%M:%S}"
        return format_html("{}<br><small>{}</small>", self.scheduled(run), started)

    @admin.display(description="started")
    def started(self, run: JobRun) -> str:
        return self._at(run, run.started_at)

    @admin.display(description="due at")
    def due(self, run: JobRun) -> str:
        return self._at(run, run.due_at)

    @admin.display(description="dispatched at")
    def dispatched(self, run: JobRun) -> str:
        return self._at(run, run.dispatched_at)

    @admin.display(description="finished at")
    def finished(self, run: JobRun) -> str:
        return self._at(run, run.finished_at)

    @admin.display(description="last heartbeat")
    def last_heartbeat(self, run: JobRun) -> str:
        return self._at(run, run.heartbeat_at)

    @admin.display(description="worker / beat")
    def processes(self, run: JobRun) -> str:
        """Who ran it, and (smaller) which beat claimed it: one column, so that attempt and
        error stay on a 1,400 px screen with the navigation and filters open."""
        return format_html("{}<br><small>{}</small>", run.worker or "-", run.claimed_by or "-")

    @admin.display(description="duration")
    def duration_col(self, run: JobRun) -> str:
        return duration_text(run.duration)

    @admin.display(description="dispatch lag")
    def lag(self, run: JobRun) -> str:
        if run.dispatched_at is None:
            return "-"
        return seconds_text((run.dispatched_at - run.due_at).total_seconds())

    @admin.display(description="error")
    def error_head(self, run: JobRun) -> str:
        first = run.error.splitlines()[0][:160] if run.error else ""
        return first or "-"

    @admin.display(description="error")
    def error_text(self, run: JobRun) -> str:
        return format_html(
            '<pre style="white-space: pre-wrap; margin: 0">{}</pre>', run.error or "-"
        )

    @admin.display(description="traceback")
    def traceback_text(self, run: JobRun) -> str:
        return format_html(
            '<pre style="white-space: pre-wrap; margin: 0">{}</pre>', run.traceback or "-"
        )

    @admin.display(description="Celery task id")
    def task_result(self, run: JobRun) -> str:
        """The task id, linked to django-celery-results' record of it when that is installed."""
        try:
            url = reverse("admin:django_celery_results_taskresult_changelist")
        except NoReverseMatch:
            return run.task_id
        return format_html('<a href="{}?task_id={}">{}</a> (result)', url, run.task_id, run.task_id)


def stats_text(stats: dict[str, Any] | None) -> str:
    """A node's counters as words ('active 2 · processed 1,234 · queues celery, reports'),
    not raw JSON: short enough to wrap inside its column."""
    parts = []
    for key, value in sorted((stats or {}).items()):
        if isinstance(value, bool) or not isinstance(value, int | float | list | tuple):
            shown = str(value)
        elif isinstance(value, list | tuple):
            shown = ", ".join(str(v) for v in value) or "none"
        else:
            shown = f"{value:,}"
        parts.append(f"{key.replace('_', ' ')} {shown}")
    return " · ".join(parts) or "-"


class NodeAdmin(ReadOnlyAdmin):
    """Beats and workers as they recorded themselves; a crashed process's row stays until it
    ages out of the overview (or someone with delete permission removes it). Each row says
    whether the process still refreshes its row (alive) or stopped doing so (missing), by
    the database's clock, as the overview counts live nodes."""

    # The host is in a node's name (worker1@host, host:pid:id): the list shows the pid only.
    list_display = ("name", "kind", "status", "pid", "started", "seen", "stats_words")
    list_filter = ("kind",)
    readonly_fields = (
        "name",
        "kind",
        "status",
        "hostname",
        "pid",
        "started",
        "seen",
        "stats_words",
    )
    fields = readonly_fields

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        # The age by the database's clock (one clock: the beats' and workers' own).
        return (
            super()
            .get_queryset(request)
            .annotate(
                seen_ago=ExpressionWrapper(Now() - F("last_seen_at"), output_field=DurationField())
            )
        )

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return admin.ModelAdmin.has_delete_permission(self, request, obj)

    @staticmethod
    def _age(node: Node) -> float:
        ago = getattr(node, "seen_ago", None)
        return max(0.0, ago.total_seconds()) if ago is not None else float("inf")

    @admin.display(description="status")
    def status(self, node: Node) -> str:
        if self._age(node) <= NODE_FRESH_SECONDS:
            return badge("succeeded", "alive")
        return badge("failed", "missing")

    @admin.display(description="host / pid")
    def host_pid(self, node: Node) -> str:
        return format_html("{} / {}", node.hostname or "-", node.pid or "-")

    @admin.display(description="started", ordering="started_at")
    def started(self, node: Node) -> str:
        return _server_time(node.started_at)

    @admin.display(description="last seen", ordering="last_seen_at")
    def seen(self, node: Node) -> str:
        return format_html(
            "{} ago<br><small>{}</small>",
            seconds_text(self._age(node)),
            _server_time(node.last_seen_at),
        )

    @admin.display(description="stats")
    def stats_words(self, node: Node) -> str:
        return stats_text(node.stats)


def _server_time(value: Any) -> str:
    """An instant in the server's zone (``TIME_ZONE``), with the zone's abbreviation."""
    if value is None:
        return "-"
    return django_tz.localtime(value).strftime("%Y-%m-%d %H:%M:%S %Z")
