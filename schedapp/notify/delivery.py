"""Delivery: a channel's pending events sent as one grouped message, by one loop at a time.

A loop (a thread of each beat, or ``manage.py schedapp_notify``) takes a channel by locking
its ``NotificationChannel`` row with SKIP LOCKED, so two loops never work on one channel at
once and never send one event twice: the events' rows are locked with the channel's, and
marked sent in the transaction that sent them. The transaction stays open while the message
goes out (at most the channel's timeout; the server ends it if the loop stalls), and nothing
else waits on those locks: an enqueue never updates a row a loop may hold (a recovery skips
a locked one).

The pace, per channel (Alertmanager's): a first event waits ``group_wait`` for others to
join it; after a message, the next waits ``group_interval``. So a channel sends at most one
message per group interval, each listing or counting every event it carries (up to
``messages.MAX_EVENTS``). A failed send is retried after a capped exponential backoff, each
event recording its attempts; an event that reached the channel's ``max_attempts`` is
``failed`` (logged, listed in the admin).
"""

from __future__ import annotations

import logging
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

from django.core.mail import EmailMessage, get_connection
from django.db import close_old_connections, connection, transaction
from django.db.models import F
from django.db.models.functions import Now

from .. import metrics
from ..db import reset_connection
from ..models import Notification, NotificationChannel
from ..policies import compute_backoff
from ..store import get_store
from . import messages
from .channels import Channel
from .outbox import configured_channels

log = logging.getLogger(__name__)

#: The longest a loop waits before looking for new events (nothing wakes it early).
POLL = 2.0
#: The shortest wait between passes (a group interval or backoff of 0 must not spin).
MIN_WAIT = 0.05
ERROR_CHARS = 2000


class DeliveryError(Exception):
    """A message the channel did not take (an HTTP status, a timeout, an SMTP error)."""


Sender = Callable[[Channel, messages.Digest, datetime], None]


def send_webhook(channel: Channel, digest: messages.Digest, now: datetime) -> None:
    """POST the message as JSON, signed (``messages.signature``) with the database's time as
    the timestamp; anything but a 2xx answer within the timeout is a failure (a redirect
    too: the signature was made for this URL)."""
    body = messages.body(digest)
    timestamp = int(now.timestamp())
    request = urllib.request.Request(
        channel.url,
        data=body,
        method="POST",
        headers={
            "Content-Type": "application/json",
            "User-Agent": "schedapp-notify",
            messages.TIMESTAMP_HEADER: str(timestamp),
            messages.SIGNATURE_HEADER: messages.signature(channel.secret, timestamp, body),
        },
    )
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(request, timeout=channel.timeout) as response:
            status = response.status
    except urllib.error.HTTPError as exc:
        raise DeliveryError(f"HTTP {exc.code} from {channel.url}") from exc
    except (urllib.error.URLError, OSError) as exc:
        raise DeliveryError(f"{type(exc).__name__} posting to {channel.url}: {exc}") from exc
    if not 200 <= status < 300:
        raise DeliveryError(f"HTTP {status} from {channel.url}")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # the 3xx is raised as an HTTPError: a failure


def send_email(channel: Channel, digest: messages.Digest, now: datetime) -> None:
    """Through Django's mail framework (``EMAIL_BACKEND``), one email to the channel's list."""
    try:
        mail = get_connection(fail_silently=False, timeout=channel.timeout)
        EmailMessage(
            digest.subject, digest.text, channel.from_email, list(channel.to), connection=mail
        ).send()
    except Exception as exc:
        raise DeliveryError(f"{type(exc).__name__} sending email: {exc}") from exc


SENDERS: dict[str, Sender] = {"email": send_email, "webhook": send_webhook}


def deliver_once(channels: dict[str, Channel] | None = None) -> float:
    """One pass: every channel with pending events whose time has come sends one message.
    Returns the seconds until a channel may next have something to send (at most POLL)."""
    channels = configured_channels() if channels is None else channels
    waiting = set(
        Notification.objects.filter(sent_at=None, failed_at=None)
        .values_list("channel", flat=True)
        .distinct()
    )
    delays = [POLL]
    for name in sorted(waiting & set(channels)):
        delay = deliver_channel(channels[name])
        if delay is not None:
            delays.append(delay)
    return max(min(delays), 0.0)


def deliver_channel(channel: Channel) -> float | None:
    """Send the channel's pending events as one message if their time has come. Returns the
    seconds until it may send next (None: nothing pending, or another loop has it)."""
    NotificationChannel.objects.bulk_create(
        [NotificationChannel(name=channel.name)], ignore_conflicts=True
    )
    with transaction.atomic():
        # The server ends the transaction if this loop stalls holding the channel.
        get_store().limit_idle_transaction(channel.timeout + 10.0)
        state = (
            NotificationChannel.objects.select_for_update(skip_locked=True)
            .annotate(now=Now())
            .filter(name=channel.name)
            .first()
        )
        if state is None:
            return None  # another loop is on it
        now: datetime = state.now  # type: ignore[attr-defined]
        rows = list(
            Notification.objects.select_for_update(skip_locked=True)
            .filter(channel=channel.name, sent_at=None, failed_at=None)
            .order_by("id")[: messages.MAX_EVENTS]
        )
        if not rows:
            return None
        due = min(r.next_attempt_at or r.created_at + channel.group_wait for r in rows)
        gates = [due, state.retry_at]
        if state.last_message_at is not None:
            gates.append(state.last_message_at + channel.group_interval)
        at = max(g for g in gates if g is not None)
        if at > now:
            return (at - now).total_seconds()
        digest = messages.compose(channel.name, [_event(r) for r in rows])
        ids = [r.id for r in rows]
        try:
            SENDERS[channel.type](channel, digest, now)
        except DeliveryError as exc:
            return _failed(channel, state, rows, str(exc), now)
        Notification.objects.filter(id__in=ids).update(
            sent_at=Now(), attempts=F("attempts") + 1, last_error=""
        )
        NotificationChannel.objects.filter(name=channel.name).update(
            last_message_at=now, failures=0, retry_at=None
        )
    metrics.notifications(channel.name, "sent", [r.kind for r in rows])
    log.info(
        "notified channel %s: %s",
        channel.name,
        digest.subject,
        extra={"action": "notified", "channel": channel.name, "events": len(ids)},
    )
    return channel.group_interval.total_seconds()


def _failed(
    channel: Channel,
    state: NotificationChannel,
    rows: list[Notification],
    error: str,
    now: datetime,
) -> float:
    """Record a failed attempt on each event; those at the channel's max_attempts fail for
    good. The channel waits a capped exponential backoff before its next attempt."""
    ids = [r.id for r in rows]
    metrics.notification_send_failed(channel.name)
    failures = state.failures + 1
    delay = compute_backoff(failures - 1, channel.backoff, channel.backoff_max)
    retry_at = now + delay
    error = error[:ERROR_CHARS]
    Notification.objects.filter(id__in=ids).update(
        attempts=F("attempts") + 1, last_error=error, next_attempt_at=retry_at
    )
    given_up = Notification.objects.filter(id__in=ids, attempts__gte=channel.max_attempts).update(
        failed_at=Now()
    )
    if given_up == len(ids):  # nothing left to retry: the next event starts afresh
        failures, retry_at = 0, None
    NotificationChannel.objects.filter(name=channel.name).update(
        failures=failures, retry_at=retry_at
    )
    # (the rows are locked: the events given up are those the update just reached)
    metrics.notifications(
        channel.name, "failed", [r.kind for r in rows if r.attempts + 1 >= channel.max_attempts]
    )
    if given_up:
        log.error(
            "channel %s: %d notification(s) failed after %d attempt(s): %s",
            channel.name,
            given_up,
            channel.max_attempts,
            error,
            extra={"action": "notify_failed", "channel": channel.name},
        )
    else:
        log.warning(
            "channel %s: sending failed (%s); retrying in %.0fs",
            channel.name,
            error,
            delay.total_seconds(),
            extra={"action": "notify_retry", "channel": channel.name},
        )
    return delay.total_seconds() if retry_at else POLL


def _event(row: Notification) -> messages.Event:
    return messages.Event(
        id=row.id,
        kind=row.kind,
        job_id=row.job_id,
        job_name=row.job_name,
        created_at=row.created_at,
        tags=tuple(row.tags or ()),
        scheduled_for=row.scheduled_for,
        detail=row.detail,
        incident=row.incident or None,
    )


class DeliveryLoop:
    """``deliver_once`` again and again on a thread of its own (so its own database
    connection), until stopped: what each beat runs beside its ticks."""

    def __init__(self, channels: Iterable[str] | None = None) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._only = set(channels) if channels is not None else None

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="schedapp-notify", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Ask the loop to end and wait for it a little: a send under way ends within its
        channel's timeout, and the thread is a daemon, so a process stopping is never held."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def run(self) -> None:
        failures = 0
        try:
            while not self._stop.is_set():
                try:
                    close_old_connections()
                    channels = configured_channels()
                    if self._only is not None:
                        channels = {n: c for n, c in channels.items() if n in self._only}
                    delay = deliver_once(channels)
                    failures = 0
                except Exception as exc:  # the database is away, or a bug: log, go on
                    failures += 1
                    reset_connection()
                    delay = min(POLL * 2**failures, 60.0)
                    log.exception(
                        "notification delivery failed: %s; retrying in %.0fs",
                        exc,
                        delay,
                        extra={"action": "notify_loop_failed"},
                    )
                self._stop.wait(max(delay, MIN_WAIT))
        finally:
            connection.close()
