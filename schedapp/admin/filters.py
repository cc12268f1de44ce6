"""Changelist plumbing that keeps the admin fast with millions of jobs and runs.

* ``LargeTablePaginator`` never counts a whole big table: without filters it reads the
  planner's row estimate (``pg_class.reltuples``, kept fresh by autovacuum; on a partitioned
  table the sum of its partitions', as autovacuum never analyses the parent); with filters it
  counts at most ``COUNT_CAP`` rows, and the page says "10,000+". On a partitioned table (run
  history) a filter counts only among the newest ``RECENT_IDS`` ids, so that a rare status
  reads the newest partitions, never all history; the page then says what it counted
  ("37 recent", since which run), and lists those runs only. A filter an index serves (the
  runs of one job, a task id) is counted over all history, at most ``COUNT_CAP`` index entries.
* Deep pages read their ids first (``ORDER BY ... OFFSET`` over the primary key index alone),
  then only those rows, with their joins: page 5,000 does not join 500,000 rows to skip them.
* The task and queue filters never run ``SELECT DISTINCT`` over the job table (there is no
  index for it): they list the tasks registered with Celery that the allowlist permits, the
  queues Celery is configured with, and the values used by the newest ``RECENT_SAMPLE`` jobs
  (read backwards on the primary key), so legacy values show up too.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.core.paginator import Paginator
from django.db import connection
from django.db.models import Lookup, Model, Q, QuerySet
from django.db.models.sql.where import AND, OR, WhereNode
from django.http import HttpRequest
from django.utils import timezone as django_tz

from .. import api, partitions
from ..db import is_postgresql
from ..models import Job

COUNT_CAP = 10_000
# A filtered count on a partitioned table reads the newest this many ids at most: a filter
# matching 5 % of runs or more still reaches COUNT_CAP within them ("10,000+", as everywhere),
# and a rarer one (failed, lost) reads 200,000 rows at most (about 70 MB of heap, what the
# default shared_buffers holds), never all history. A million read from disk cost 4x as much.
RECENT_IDS = COUNT_CAP * 20
# Below this many estimated rows an exact count is cheap, and better.
ESTIMATE_ABOVE = 50_000
RECENT_SAMPLE = 5_000
# From this offset on, a page is fetched as ids first, then rows ("deferred join").
DEFERRED_JOIN_FROM = 1_000


def estimated_rows(table: str) -> int | None:
    """The planner's estimate of a table's rows; None if unknown (never analysed).

    A partitioned table's own estimate is kept by nobody (autovacuum analyses its partitions,
    never the parent): its rows are the sum of its partitions' estimates, those never analysed
    left out (None if none was)."""
    if not is_postgresql():
        return None
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT CASE WHEN c.relkind = 'p' THEN (SELECT sum(p.reltuples) FROM pg_inherits i "
            "  JOIN pg_class p ON p.oid = i.inhrelid "
            "  WHERE i.inhparent = c.oid AND NOT i.inhdetachpending AND p.reltuples >= 0) "
            "WHEN c.reltuples >= 0 THEN c.reltuples END::bigint "
            "FROM pg_class c WHERE c.oid = %s::regclass",
            [table],
        )
        row = cursor.fetchone()
    if row is None or row[0] is None:
        return None
    return int(row[0])


def recent_window(model: type[Model], below: int | None = None) -> int | None:
    """The id above which a filtered count of ``model`` reads: on the run table, when it is
    partitioned (no other table is, and none costs a catalog query) and holds more than
    ``RECENT_IDS`` ids (up to ``below``, when the page looks further back), the newest
    ``RECENT_IDS`` of them (a bound the planner prunes older partitions by); None
    (everything) otherwise. Ids rise with time (one sequence), and a bound in ids bounds what
    is read however large a partition is."""
    if model._meta.db_table != partitions.PARENT or not partitions.is_partitioned():
        return None
    table = connection.ops.quote_name(model._meta.db_table)
    pk = connection.ops.quote_name(model._meta.pk.column)
    with connection.cursor() as cursor:
        # min and max walk the primary key's ends.
        cursor.execute(
            f"SELECT (SELECT min({pk}) FROM {table}), (SELECT max({pk}) FROM {table} "
            f"  WHERE %s::bigint IS NULL OR {pk} <= %s)",
            [below, below],
        )
        row = cursor.fetchone()
    if row is None or row[0] is None or row[1] - row[0] < RECENT_IDS:
        return None
    return int(row[1]) - RECENT_IDS


def upper_bound(queryset: QuerySet) -> int | None:
    """The highest id ``queryset`` admits by a condition on its primary key (``id__lte``, the
    "older" link of a count among the newest ids), None if it has none."""
    pk = queryset.model._meta.pk
    bounds = []
    for node in queryset.query.where.children if queryset.query.where.connector == AND else []:
        target = getattr(getattr(node, "lhs", None), "target", None)
        if isinstance(node, Lookup) and target == pk and isinstance(node.rhs, int):
            if node.lookup_name == "lte":
                bounds.append(node.rhs)
            elif node.lookup_name == "lt":
                bounds.append(node.rhs - 1)
    return min(bounds, default=None)


def index_served(queryset: QuerySet) -> bool:
    """Whether every condition of ``queryset`` is an equality (or IN) on the first column of
    one of its model's indexes, such as the runs of one job or a task id: counting up to the
    cap then reads at most ``COUNT_CAP`` index entries (and a probe per partition), however
    old the matches are."""
    meta = queryset.model._meta
    leading = {index.fields[0].lstrip("-") for index in meta.indexes if index.condition is None}
    leading.update(c.fields[0] for c in meta.constraints if getattr(c, "fields", None))
    leading.add(meta.pk.name)

    def served(node: Any) -> bool:
        if isinstance(node, WhereNode):
            return (
                not node.negated
                and node.connector in (AND, OR)
                and bool(node.children)
                and all(served(child) for child in node.children)
            )
        target = getattr(getattr(node, "lhs", None), "target", None)
        return (
            isinstance(node, Lookup)
            and node.lookup_name in ("exact", "in")
            and target is not None
            and target.name in leading
        )

    return served(queryset.query.where)


class LargeTablePaginator(Paginator):
    """A paginator whose count costs one cheap query whatever the table size."""

    # A field whose value at the oldest counted row says, in time, where a count among the
    # newest ids began (None: the id alone).
    since_field: str | None = None

    @cached_property
    def count(self) -> int:  # type: ignore[override]
        queryset = self.object_list
        self.count_is_exact = True
        self.count_is_estimate = False
        self.counted_after: int | None = None  # a count among the ids above this one only
        self.counted_since: Any = None
        if not isinstance(queryset, QuerySet):
            return len(queryset)
        if queryset.query.is_empty():
            return 0
        after = None
        if not queryset.query.where:
            estimate = estimated_rows(queryset.model._meta.db_table)
            if estimate is not None and estimate >= ESTIMATE_ABOVE:
                self.count_is_exact = False
                self.count_is_estimate = True
                return estimate
        elif not index_served(queryset):
            after = recent_window(queryset.model, upper_bound(queryset))
            if after is not None:
                # The pages list what was counted: the newest matches, newest first.
                queryset = self.object_list = queryset.filter(pk__gt=after)
        capped = queryset.order_by().values("pk")[: COUNT_CAP + 1].count()
        if capped > COUNT_CAP:
            self.count_is_exact = False
        elif after is not None:
            self.count_is_exact = False
            self.counted_after = after
            if self.since_field:
                self.counted_since = (
                    queryset.model._default_manager.filter(pk__gt=after)
                    .order_by("pk")
                    .values_list(self.since_field, flat=True)
                    .first()
                )
        return capped

    def page(self, number: Any) -> Any:
        queryset = self.object_list
        number = self.validate_number(number)
        bottom = (number - 1) * self.per_page
        if not isinstance(queryset, QuerySet) or bottom < DEFERRED_JOIN_FROM:
            return super().page(number)
        ids = list(queryset.values_list("pk", flat=True)[bottom : bottom + self.per_page])
        return self._get_page(queryset.filter(pk__in=ids), number, self)  # type: ignore[attr-defined]

    def count_text(self) -> str:
        count = self.count
        if self.count_is_estimate:
            return f"about {count:,}"
        if self.counted_after is not None:
            return f"{count:,} recent"
        if not self.count_is_exact:
            return f"{COUNT_CAP:,}+"
        return f"{count:,}"

    def count_note(self) -> str:
        """What a count among the newest ids left out, in words ("" when it left out nothing)."""
        _ = self.count  # sets counted_after
        if self.counted_after is None:
            return ""
        since = ""
        if self.counted_since is not None:
            local = django_tz.localtime(self.counted_since)
            since = f", since {local:%Y-%m-%d %H:%M %Z}"
        return (
            f"(counted among the newest {RECENT_IDS:,} ids: above {self.counted_after:,}"
            f"{since}; older ones are not counted or listed)"
        )


class CountedChangeList(ChangeList):
    """A changelist that lists what its paginator counted. Django lists the whole filtered
    queryset when it fits on one page (or "show all"): after a count among the newest ids
    only, that would read, and list, every match of the history."""

    # The query string of the same filters one window further back (None: nothing older).
    older_query: str | None = None

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        paginator = self.paginator
        if getattr(paginator, "counted_after", None) is None:
            return
        self.older_query = self.get_query_string(
            {f"{self.model._meta.pk.name}__lte": paginator.counted_after}
        )
        if (self.show_all and self.can_show_all) or not self.multi_page:
            # The newest ``count`` matches: none, and no query, when the count found none.
            self.result_list = paginator.object_list[: self.result_count]


def _recent_values(request: HttpRequest) -> list[tuple[str, str]]:
    """(task, queue) pairs of the newest jobs: one bounded query, shared by both filters."""
    cached = getattr(request, "_schedapp_recent", None)
    if cached is None:
        table = Job._meta.db_table
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT DISTINCT task, queue FROM (SELECT task, queue FROM {table} "
                "ORDER BY id DESC LIMIT %s) recent",
                [RECENT_SAMPLE],
            )
            cached = [(task, queue) for task, queue in cursor.fetchall()]
        request._schedapp_recent = cached  # type: ignore[attr-defined]
    return cached


def allowed_registered_tasks() -> list[str]:
    """Task names a job may use: registered with the Celery app and permitted."""
    from ..celeryapp import registered_tasks, task_problem

    return [name for name in registered_tasks() if task_problem(name) is None]


def configured_queues() -> list[str]:
    from ..celeryapp import celery_app

    conf = celery_app().conf
    names = {conf.task_default_queue or "celery"}
    for queue in conf.task_queues or ():
        names.add(getattr(queue, "name", str(queue)))
    return sorted(n for n in names if n)


class TagFilter(admin.SimpleListFilter):
    """Jobs carrying a tag; the choices are the tags of the newest jobs (one bounded query)
    and the one chosen."""

    title = "tag"
    parameter_name = "tag"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        recent = Job.objects.order_by("-id").values_list("tags", flat=True)[:RECENT_SAMPLE]
        names = {t for tags in recent if isinstance(tags, list) for t in tags if isinstance(t, str)}
        value = self.value()
        if value:
            names.add(value)
        return [(n, n) for n in sorted(names)]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value = self.value()
        return queryset & api.tagged(value) if value else queryset


class TaskFilter(admin.SimpleListFilter):
    title = "task"
    parameter_name = "task"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        names = set(allowed_registered_tasks())
        names.update(task for task, _queue in _recent_values(request))
        value = self.value()
        if value:
            names.add(value)
        return [(n, n) for n in sorted(names)]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        return queryset.filter(task=self.value()) if self.value() else queryset


DEFAULT_QUEUE = "__default__"


class QueueFilter(admin.SimpleListFilter):
    title = "queue"
    parameter_name = "queue"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        names = set(configured_queues())
        names.update(queue for _task, queue in _recent_values(request) if queue)
        value = self.value()
        if value and value != DEFAULT_QUEUE:
            names.add(value)
        return [(DEFAULT_QUEUE, "(task routing)"), *((n, n) for n in sorted(names))]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value = self.value()
        if not value:
            return queryset
        return queryset.filter(queue="" if value == DEFAULT_QUEUE else value)


class ScheduleKindFilter(admin.SimpleListFilter):
    title = "schedule kind"
    parameter_name = "kind"
    KINDS = {
        "cron": ~Q(cron=""),
        "interval": Q(interval__isnull=False),
        "once": Q(run_at__isnull=False),
        "solar": ~Q(solar_event=""),
    }

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("cron", "Cron"), ("interval", "Interval"), ("once", "One-off"), ("solar", "Solar")]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        condition = self.KINDS.get(self.value() or "")
        return queryset.filter(condition) if condition is not None else queryset


class RunJobFilter(admin.SimpleListFilter):
    """The runs of one job (``?job=<id>``), linked from the job's page.

    It lists only the selected job (one query by primary key), never every job. A value that
    is no job id (a typo, "²", past bigint) matches no run, and the filter says so."""

    title = "job"
    parameter_name = "job"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        value = self.value()
        if not value:
            return []
        job_id = _job_id(value)
        if job_id is None:
            return [(value, f"no job {value!r}")]
        name = Job.objects.filter(pk=job_id).values_list("name", flat=True).first()
        return [(value, name or f"job {value} (deleted)")]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value = self.value()
        if not value:
            return queryset
        job_id = _job_id(value)
        if job_id is None:
            return queryset.none()
        return queryset.filter(job_id=job_id)


def _job_id(value: str) -> int | None:
    """The job id ``value`` spells in ASCII digits, within bigint; None if it spells none
    (``str.isdigit`` also accepts "²", which ``int`` refuses)."""
    if not (value.isascii() and value.isdigit()):
        return None
    job_id = int(value)
    return job_id if job_id < 2**63 else None
