"""What needs a person now: the open deadline breaches by kind, and the notifications that
did not reach their channel (the admin's "needs attention" page).

Every read is bounded, so the page costs the same with ten breaches or a million cleared
ones: a kind's open breaches are a page of the open-breach partial index (kind, opened_at,
id), newest first, older ones by a keyset (never OFFSET); each kind is counted up to
``COUNT_CAP`` on that index (shown as "10,000+" beyond), never over the history; failed
deliveries are the newest of their partial index, within ``FAILED_DAYS``; failing channels
are the channel table's rows (one per configured channel).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db.models import Exists, OuterRef, Q, QuerySet

from .db import db_now
from .models import Breach, BreachKind, Job, Notification, NotificationChannel
from .store import get_store

PAGE_SIZE = 50  # open breaches shown per kind
COUNT_CAP = 10_000
FAILED_LIMIT = 20
FAILED_DAYS = 7
KINDS: tuple[str, ...] = tuple(BreachKind.values)


@dataclass(frozen=True)
class OpenBreach:
    """An open breach as the page shows it, with what it needs of its job."""

    id: int
    job_id: int
    job_name: str
    job_state: str
    zone: str
    tags: tuple[str, ...]
    kind: str
    scheduled_for: datetime
    opened_at: datetime
    detail: str


@dataclass
class KindPage:
    kind: str
    count: int  # up to COUNT_CAP
    capped: bool
    rows: list[OpenBreach] = field(default_factory=list)
    # (opened_at, id) of the last row shown when older ones exist: the next page's keyset.
    older: tuple[datetime, int] | None = None


@dataclass
class Attention:
    now: datetime
    kinds: list[KindPage]
    failed: list[Notification]
    failing_channels: list[NotificationChannel]


def _open(tag: str = "") -> QuerySet[Breach]:
    breaches = Breach.objects.filter(cleared_at__isnull=True)
    if tag:
        tagged = Job.objects.filter(pk=OuterRef("job_id")).filter(get_store().tagged(tag))
        breaches = breaches.filter(Exists(tagged))
    return breaches


def _tags(value: object) -> tuple[str, ...]:
    """A job's tags as stored; a value written behind the API's back shows as none."""
    if isinstance(value, list):
        return tuple(t for t in value if isinstance(t, str))
    return ()


def count_open(kind: str, tag: str = "", cap: int | None = None) -> int:
    """A kind's open breaches, counted up to ``cap`` + 1 (so "more than cap" is seen)."""
    cap = COUNT_CAP if cap is None else cap
    return _open(tag).filter(kind=kind)[: cap + 1].count()


def open_breaches(
    kind: str, tag: str = "", older_than: tuple[datetime, int] | None = None, limit: int = PAGE_SIZE
) -> list[OpenBreach]:
    """A kind's open breaches, newest first, older than a keyset when given one."""
    breaches = _open(tag).filter(kind=kind)
    if older_than is not None:
        at, breach_id = older_than
        breaches = breaches.filter(Q(opened_at__lt=at) | Q(opened_at=at, id__lt=breach_id))
    rows = breaches.order_by("-opened_at", "-id").values_list(
        "id",
        "job_id",
        "job__name",
        "job__state",
        "job__timezone",
        "job__tags",
        "kind",
        "scheduled_for",
        "opened_at",
        "detail",
    )[:limit]
    return [
        OpenBreach(b, j, name, state, zone, _tags(tags), k, at, opened, detail)
        for b, j, name, state, zone, tags, k, at, opened, detail in rows
    ]


def failed_notifications(since: datetime, limit: int = FAILED_LIMIT) -> list[Notification]:
    """Notifications that failed for good since ``since``, newest first."""
    return list(
        Notification.objects.filter(failed_at__gte=since).order_by("-failed_at", "-id")[:limit]
    )


def failing_channels() -> list[NotificationChannel]:
    """Channels whose latest deliveries failed (still retrying, or given up)."""
    return list(NotificationChannel.objects.filter(failures__gt=0).order_by("name")[:100])


def collect(
    kinds: tuple[str, ...] = KINDS,
    tag: str = "",
    older_than: tuple[datetime, int] | None = None,
    limit: int | None = None,
) -> Attention:
    """The page: every kind counted, the ``kinds`` asked for listed a page each (older than
    the keyset, for a single kind), the failed deliveries and the failing channels."""
    now = db_now()
    limit = PAGE_SIZE if limit is None else limit
    pages = []
    for kind in KINDS:
        count = count_open(kind, tag)
        page = KindPage(kind, min(count, COUNT_CAP), count > COUNT_CAP)
        if kind in kinds and count:
            rows = open_breaches(kind, tag, older_than, limit + 1)
            page.rows = rows[:limit]
            if len(rows) > limit:
                page.older = (rows[limit - 1].opened_at, rows[limit - 1].id)
        pages.append(page)
    failed = failed_notifications(now - timedelta(days=FAILED_DAYS))
    return Attention(now, pages, failed, failing_channels())
