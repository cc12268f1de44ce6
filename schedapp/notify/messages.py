"""What one grouped notification says: the events gathered for a channel as one email or
one webhook body (a bounded list, exact counts per kind), and the webhook's signature.
Pure: no database, no network."""

from __future__ import annotations

import hashlib
import hmac
import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from .channels import KINDS

#: Events listed one by one in a message; the rest are counted ("and N more").
LISTED = 20
#: Events one message carries at most: a larger backlog goes out in the next group interval.
MAX_EVENTS = 1000
SIGNATURE_HEADER = "X-Schedapp-Signature"
TIMESTAMP_HEADER = "X-Schedapp-Timestamp"


@dataclass(frozen=True)
class Event:
    """One outbox row as a message reads it."""

    id: int
    kind: str
    job_id: int | None
    job_name: str
    created_at: datetime
    tags: Sequence[str] = field(default_factory=tuple)
    scheduled_for: datetime | None = None
    detail: str = ""
    incident: str | None = None


@dataclass(frozen=True)
class Digest:
    subject: str
    text: str
    payload: dict


def counts(events: Sequence[Event]) -> dict[str, int]:
    """Events per kind, in KINDS' order, kinds with none left out."""
    found = Counter(e.kind for e in events)
    return {kind: found[kind] for kind in KINDS if found[kind]}


def compose(channel: str, events: Sequence[Event]) -> Digest:
    """One message for ``events`` (oldest first): a subject a person can triage from, the
    first LISTED events, and every event counted by kind."""
    per_kind = counts(events)
    summary = ", ".join(f"{n} {kind}" for kind, n in per_kind.items())
    names = sorted({e.job_name for e in events})
    about = names[0] if len(names) == 1 else f"{names[0]} and {len(names) - 1} more jobs"
    subject = f"[schedapp] {summary}: {about}"
    listed, more = events[:LISTED], max(len(events) - LISTED, 0)
    lines = [f"{len(events)} event(s) on channel {channel}: {summary}.", ""]
    lines += [_line(e) for e in listed]
    if more:
        lines.append(f"... and {more} more (counted above).")
    payload = {
        "channel": channel,
        "total": len(events),
        "counts": per_kind,
        "events": [_json(e) for e in listed],
        "more": more,
        "event_ids": [e.id for e in events],
    }
    return Digest(subject, "\n".join(lines) + "\n", payload)


def _line(e: Event) -> str:
    at = f" (occurrence {e.scheduled_for.isoformat()})" if e.scheduled_for else ""
    tags = f" [{', '.join(e.tags)}]" if e.tags else ""
    detail = f": {e.detail}" if e.detail else ""
    return f"- {e.kind}: {e.job_name}{tags}{at} at {e.created_at.isoformat()}{detail}"


def _json(e: Event) -> dict:
    return {
        "id": e.id,
        "kind": e.kind,
        "job": {"id": e.job_id, "name": e.job_name, "tags": list(e.tags)},
        "scheduled_for": e.scheduled_for.isoformat() if e.scheduled_for else None,
        "at": e.created_at.isoformat(),
        "detail": e.detail,
        "incident": e.incident,
    }


def body(digest: Digest) -> bytes:
    return json.dumps(digest.payload, sort_keys=True, separators=(",", ":")).encode()


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """``sha256=<hex>``: the HMAC of ``"<timestamp>." + body`` with the channel's secret. The
    timestamp is inside the signed content, so a receiver that refuses old timestamps
    refuses a replayed request (it cannot be re-signed with a fresh one)."""
    signed = str(timestamp).encode() + b"." + body
    return "sha256=" + hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()


def verify(
    secret: str, timestamp: str, body: bytes, given: str, now: float, tolerance: float = 300.0
) -> bool:
    """What a receiver checks: the signature matches and the timestamp is recent."""
    try:
        at = int(timestamp)
    except ValueError:
        return False
    if abs(now - at) > tolerance:
        return False
    return hmac.compare_digest(signature(secret, at, body), given)
