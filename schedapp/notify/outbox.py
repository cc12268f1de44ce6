"""The outbox: an event written as one row per channel that wants it, inside the transaction
that records the event, so that the message exists if and only if the event committed.
Nothing is sent from here (``delivery`` sends, after the commit, from its own loop)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from django.db import DEFAULT_DB_ALIAS, transaction

from ..conf import get_settings
from ..models import Notification
from .channels import KINDS, RECOVERED, Channel, read_channels, route

log = logging.getLogger(__name__)

DETAIL_CHARS = 2000


def dead_incident(job_id: int) -> str:
    """The incident a job's dead-lettering is: one until it is resumed and dies again."""
    return f"dead:{job_id}"


def breach_incident(breach_id: int) -> str:
    """The incident a deadline breach is (``schedapp.deadlines``): its row, opened once."""
    return f"breach:{breach_id}"


def configured_channels() -> dict[str, Channel]:
    """The channels ``SCHEDAPP_NOTIFICATIONS`` configures (those without a problem: the
    settings checks refuse to start a beat or a worker on any)."""
    return read_channels(get_settings().NOTIFICATIONS)[0]


def enqueue(
    kind: str,
    job: Any,
    *,
    scheduled_for: datetime | None = None,
    detail: str = "",
    incident: str | None = None,
    withdraw: bool = True,
    using: str = DEFAULT_DB_ALIAS,
) -> list[str]:
    """Queue the event ``kind`` about ``job`` (a ``Job``, or anything with ``id``, ``name``
    and ``tags``) for every channel that wants it; call it inside the transaction that
    records the event. Returns the channels it was queued for.

    ``incident`` names what the event is about (e.g. ``"late:<job id>:<occurrence>"``): while
    a channel's alert for an incident is unsent, another for it adds nothing (a unique
    index, so racing transactions agree). A ``recovered`` for an incident whose alert is
    still unsent removes that alert and is not queued either (nothing to say); it is queued
    only for a channel whose last message about the incident was an alert it sent.
    ``withdraw=False`` keeps an unsent alert: the recovery is queued behind it (for an
    incident the team must hear of however short, e.g. a run schedapp revoked)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, not {kind!r}")
    tags, named = _words(getattr(job, "tags", None)), _words(getattr(job, "notify", None))
    channels = route(configured_channels(), kind, tags, named)
    incident = incident or ""
    if kind == RECOVERED:
        if not incident:
            raise ValueError("a recovered event names the incident it clears")
        with transaction.atomic(using):  # the caller's, or one of its own if called outside
            channels = _recovery_channels(channels, incident, using, withdraw)
    if not channels:
        return []
    rows = [
        Notification(
            channel=channel,
            kind=kind,
            job_id=getattr(job, "id", None),
            job_name=str(getattr(job, "name", "") or "")[:200],
            tags=tags,
            scheduled_for=scheduled_for,
            detail=str(detail)[:DETAIL_CHARS],
            incident=incident[:200],
        )
        for channel in channels
    ]
    # ON CONFLICT DO NOTHING: the one-alert-per-incident indexes, whoever commits first.
    Notification.objects.using(using).bulk_create(rows, ignore_conflicts=True)
    return channels


def _words(value: Any) -> list[str]:
    """A job's tags or channel names as stored: a value written behind the API's back (not a
    list of strings) counts as none, so it cannot fail the transaction recording the event."""
    if not isinstance(value, list):
        return []
    return [v for v in value if isinstance(v, str)]


def _recovery_channels(
    channels: Sequence[str], incident: str, using: str, withdraw: bool = True
) -> list[str]:
    """The channels a recovery of ``incident`` is told to; an alert for it still unsent is
    withdrawn instead (unless ``withdraw`` is false: the recovery follows it). An alert a
    delivery loop is sending right now (its row locked) is taken as sent, without waiting
    for that loop: the recovery follows it."""
    pending = Notification.objects.using(using).filter(
        channel__in=channels, incident=incident, sent_at=None, failed_at=None
    )
    unsent = []
    if withdraw:
        unsent = list(
            pending.exclude(kind=RECOVERED)
            .select_for_update(skip_locked=True)
            .values_list("id", "channel")
        )
    if unsent:
        Notification.objects.using(using).filter(id__in=[i for i, _ in unsent]).delete()
    withdrawn = {channel for _, channel in unsent}
    told = []
    for channel in channels:
        if channel in withdrawn:
            continue
        last = (
            Notification.objects.using(using)
            .filter(channel=channel, incident=incident)
            .order_by("-id")
            .values("kind", "sent_at")
            .first()
        )
        if last is not None and last["kind"] != RECOVERED:
            told.append(channel)  # sent, or being sent right now (locked, skipped above)
    return told


def pending_count(channels: Iterable[str] | None = None, using: str = DEFAULT_DB_ALIAS) -> int:
    query = Notification.objects.using(using).filter(sent_at=None, failed_at=None)
    if channels is not None:
        query = query.filter(channel__in=list(channels))
    return query.count()
