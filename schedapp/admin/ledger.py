"""The occurrence ledger in the admin: a job's timeline and the fleet's "what did not run".

Both pages read through ``schedapp.explain`` only, whose reads are bounded by a limit and
the ledger's indexes (never the whole history), and render in templates that escape what
they are given: a job's name or a record's detail is text, whatever it holds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from typing import Any
from urllib.parse import urlencode

from django.http import QueryDict
from django.urls import reverse
from django.utils import timezone as django_tz
from django.utils.html import format_html, format_html_join

from .. import explain
from ..db import db_now
from ..display import run_status_label, safe_zone, seconds_text
from ..models import Fate, Job
from .runs import badge

TIMELINE_LIMIT = 100
FLEET_LIMIT = 100
FLEET_HOURS = 24.0
FLEET_MAX_HOURS = 24.0 * 90  # the window's records are counted: keep it a window
FLEET_HOUR_CHOICES = ((1.0, "1 hour"), (6.0, "6 hours"), (24.0, "24 hours"), (168.0, "7 days"))
_TICK = timedelta(microseconds=1)
_CLOCK = re.compile(r"^\d{1,2}:\d{2}(:\d{2}(\.\d+)?)?$")
_ISO_TIME = re.compile(r"(\d{4}-\d\d-\d\d[T ]\d\d:\d\d[\d:.]*(?:[+-]\d\d:\d\d|Z)?)")

FATE_WORDS = {
    explain.RAN: "ran",
    **{f.value: f.value.replace("_", " ") for f in Fate},
    explain.BREACH: "deadline breach",
}
FATE_TITLES = {
    explain.RAN: "Dispatched (its attempts say how it went)",
    **dict(Fate.choices),
    explain.BREACH: "A deadline breach at a time the ledger holds no run or record of",
}


def fate_badge(fate: str) -> str:
    """A fate as the admin's coloured badge, its long meaning in the tooltip."""
    return format_html(
        '<span title="{}">{}</span>',
        FATE_TITLES.get(fate, fate),
        badge(fate, FATE_WORDS.get(fate, fate)),
    )


def detail_html(text: str) -> str:
    """A record's detail, escaped, each ISO time in it kept on one line (a browser breaks a
    line after any hyphen: '2026-12-' then '03T08:00')."""
    parts = _ISO_TIME.split(text)
    return format_html_join(
        "",
        "{}",
        (
            (format_html('<span class="nowrap">{}</span>', p) if i % 2 else p,)
            for i, p in enumerate(parts)
        ),
    )


def parse_time(text: str, zone: str, now: datetime | None = None) -> datetime:
    """A time typed by a person, as an aware instant. A date-time without an offset is in the
    job's zone (``zone``); a bare clock time (``08:00``) is the latest such time that has
    passed there, today or yesterday: "did 08:00 run?" asks about the last 08:00."""
    text = text.strip()
    tz = safe_zone(zone)
    if _CLOCK.match(text):
        clock = time.fromisoformat(text if text.index(":") == 2 else f"0{text}")
        today = (now or db_now()).astimezone(tz)
        at = datetime.combine(today.date(), clock, tz)
        if at > today:
            at = datetime.combine(today.date() - timedelta(days=1), clock, tz)
        return at.astimezone(UTC)
    at = datetime.fromisoformat(text.replace(" ", "T", 1))
    if at.tzinfo is None:
        at = at.replace(tzinfo=tz)
    return at.astimezone(UTC)


def _nominal(t: datetime, zone: str) -> tuple[str, str]:
    """An occurrence in the job's zone: its wall time, and the zone with its UTC offset."""
    local = t.astimezone(safe_zone(zone))
    offset = local.strftime("%z")
    return f"{local:%a %Y-%m-%d %H:%M:%S}", f"{local.tzname()}, UTC{offset[:3]}:{offset[3:]}"


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).isoformat()


def _clock(t: datetime | None, day: date, tz: Any) -> str:
    """A time of an attempt, in the job's zone: the clock alone on the occurrence's day."""
    if t is None:
        return "-"
    local = t.astimezone(tz)
    return f"{local:%H:%M:%S}" if local.date() == day else f"{local:%Y-%m-%d %H:%M:%S}"


def _lag(delta: timedelta | None) -> str:
    if delta is None:
        return "-"
    seconds = delta.total_seconds()
    return ("-" if seconds < 0 else "+") + seconds_text(abs(seconds))


@dataclass(frozen=True)
class AttemptRow:
    url: str
    attempt: int
    token: int
    worker: str
    claimed_by: str
    status: str  # a badge
    stale: bool
    error: str  # its first line


@dataclass(frozen=True)
class Row:
    entry: explain.Entry
    nominal: tuple[str, str]  # wall time; zone and offset
    last: tuple[str, str] | None  # a range's last occurrence
    fate: str  # a badge
    outcome: str  # a badge, or ''
    dispatched: str
    started: str
    finished: str
    lag: str
    started_lag: str
    attempts: tuple[AttemptRow, ...]
    asked: bool
    recorded: str
    detail: str  # escaped markup
    breaches: tuple[str, ...] = ()  # each breach recorded with the occurrence, as text


def _row(entry: explain.Entry, zone: str, asked: explain.Entry | None) -> Row:
    tz = safe_zone(zone)
    day = entry.first.astimezone(tz).date()
    attempts = tuple(
        AttemptRow(
            reverse("admin:schedapp_jobrun_change", args=[a.run_id]),
            a.attempt,
            a.token,
            a.worker,
            a.claimed_by,
            badge(a.shown_status, run_status_label(a.status, a.retry_at, a.stale)),
            a.stale,
            a.error.strip().splitlines()[0][:200] if a.error.strip() else "",
        )
        for a in entry.attempts
    )
    started = [a.started_at for a in entry.attempts if a.started_at is not None]
    first = entry.attempts[0] if entry.attempts else None
    final = entry.attempts[-1] if entry.attempts else None
    return Row(
        entry=entry,
        nominal=_nominal(entry.first, zone),
        last=_nominal(entry.last, zone) if entry.last != entry.first else None,
        fate=fate_badge(entry.fate),
        outcome=badge(entry.outcome, entry.outcome) if entry.outcome else "",
        dispatched=_clock(first.dispatched_at if first else None, day, tz),
        started=_clock(started[0] if started else None, day, tz),
        finished=_clock(final.finished_at if final else None, day, tz),
        lag=_lag(entry.lag),
        started_lag=_lag(entry.started_lag),
        attempts=attempts,
        asked=asked is not None and (entry.first, entry.fate) == (asked.first, asked.fate),
        recorded=_clock(entry.recorded_at, day, tz) if entry.recorded_at else "",
        detail=detail_html(entry.detail) if entry.detail else "-",
        breaches=tuple(n.text for n in entry.breaches if entry.fate != explain.BREACH),
    )


@dataclass
class TimelinePage:
    """What the timeline page shows, from its query string (``fate``, ``until``, ``at``)."""

    job: Job
    rows: list[Row] = field(default_factory=list)
    fate: str = ""
    until: datetime | None = None
    asked: str = ""  # the question as typed
    answer: explain.Answer | None = None
    answer_shown: bool = False
    show_answer_url: str = ""
    errors: list[str] = field(default_factory=list)
    filters: list[dict[str, Any]] = field(default_factory=list)
    older_url: str = ""
    newest_url: str = ""


def _query(**params: str) -> str:
    kept = {k: v for k, v in params.items() if v}
    return f"?{urlencode(kept)}" if kept else "?"


def timeline_page(job: Job, query: QueryDict) -> TimelinePage:
    """The job's timeline, newest first (or older than ``until``), filtered by one fate,
    with the answer to "what happened at ``at``?" and its row marked when it is shown."""
    page = TimelinePage(job, fate=query.get("fate", ""), asked=query.get("at", "").strip())
    if page.fate and page.fate not in FATE_WORDS:
        page.errors.append(f"Unknown fate {page.fate!r}: showing all.")
        page.fate = ""
    if query.get("until"):
        try:
            page.until = parse_time(query["until"], job.timezone)
        except (ValueError, OverflowError):  # not a time, or beyond what datetime holds
            page.errors.append(f"{query['until']!r} is not a time: showing the newest.")
    if page.asked:
        try:
            at = parse_time(page.asked, job.timezone)
        except (ValueError, OverflowError):  # not a time, or beyond what datetime holds
            page.errors.append(
                f"{page.asked!r} is not a time: write 2026-12-03 08:00, or 08:00 for the "
                f"latest 08:00 (in the job's zone, {job.timezone})."
            )
        else:
            page.answer = explain.explain(job, at)
    entries = explain.timeline(
        job, until=page.until, fates=[page.fate] if page.fate else (), limit=TIMELINE_LIMIT
    )
    asked = page.answer.entry if page.answer is not None else None
    page.rows = [_row(e, job.timezone, asked) for e in entries]
    page.answer_shown = any(r.asked for r in page.rows)
    if asked is not None and not page.answer_shown:
        page.show_answer_url = _query(at=page.asked, until=_iso(asked.last))
    page.filters = [
        {
            "label": "All" if not fate else FATE_WORDS[fate],
            "selected": fate == page.fate,
            "url": _query(fate=fate, at=page.asked),
        }
        for fate in ("", *FATE_WORDS)
    ]
    if len(entries) == TIMELINE_LIMIT:
        page.older_url = _query(
            fate=page.fate, until=_iso(entries[-1].first - _TICK), at=page.asked
        )
    if page.until is not None:
        page.newest_url = _query(fate=page.fate, at=page.asked)
    return page


def timeline_url(job_id: int, at: datetime | None = None, last: datetime | None = None) -> str:
    """The job's timeline page; at an occurrence (asked about, and shown) when given one."""
    url = reverse("admin:schedapp_job_timeline", args=[job_id])
    if at is None:
        return url
    return url + _query(at=_iso(at), until=_iso(last or at))


@dataclass(frozen=True)
class FleetRow:
    job_url: str
    name: str
    fate: str  # a badge
    first: str
    last: str
    count: int
    detail: str
    decided_by: str
    recorded: str


def _server_time(t: datetime | None) -> str:
    if t is None:
        return "-"
    local = django_tz.localtime(t)
    text = f"{local:%Y-%m-%d %H:%M:%S} {local.tzname()}"
    if local.tzname() in ("UTC", "GMT") and not local.utcoffset():
        return text
    offset = local.strftime("%z")
    return f"{text} (UTC{offset[:3]}:{offset[3:]})"


def _job_time(t: datetime, zone: str) -> str:
    """An occurrence on the fleet page: in its job's zone, as on the job's timeline."""
    wall, where = _nominal(t, zone)
    return f"{wall} ({where})"


def fleet_page(query: QueryDict) -> dict[str, Any]:
    """The fleet's occurrences that did not run in the last ``hours`` (24 by default), by
    fate; the runs that ended otherwise than succeeded, by status; the latest records."""
    errors = []
    hours = FLEET_HOURS
    if query.get("hours"):
        try:
            hours = float(query["hours"])
            if not 0 < hours <= FLEET_MAX_HOURS:
                raise ValueError
        except ValueError:
            errors.append(f"hours: give a number from 0 to {FLEET_MAX_HOURS:g}; showing 24.")
            hours = FLEET_HOURS
    view = explain.not_run(db_now() - timedelta(hours=hours), limit=FLEET_LIMIT)
    runs = reverse("admin:schedapp_jobrun_changelist")
    by_fate = [
        {"badge": fate_badge(fate), "count": view.occurrences_by_fate.get(fate, 0)}
        for fate in Fate.values
    ]
    by_status = [
        {
            "badge": badge(status, status),
            "count": view.runs_by_status.get(status, 0),
            "url": f"{runs}?status__exact={status}",
        }
        for status in explain.NOT_SUCCEEDED
    ]
    records = [
        FleetRow(
            timeline_url(job_id, e.first, e.last),
            name,
            fate_badge(e.fate),
            _job_time(e.first, view.zones.get(job_id, "UTC")),
            _job_time(e.last, view.zones.get(job_id, "UTC")) if e.last != e.first else "",
            e.count,
            detail_html(e.detail) if e.detail else "-",
            e.decided_by,
            _server_time(e.recorded_at),
        )
        for job_id, name, e in view.records
    ]
    return {
        "since": _server_time(view.since),
        "hours": hours,
        "hour_choices": [
            {"label": label, "url": _query(hours=f"{h:g}"), "selected": h == hours}
            for h, label in FLEET_HOUR_CHOICES
        ],
        "by_fate": by_fate,
        "not_run_total": sum(view.occurrences_by_fate.values()),
        "by_status": by_status,
        "runs_total": sum(view.runs_by_status.values()),
        "records": records,
        "limit": FLEET_LIMIT,
        "errors": errors,
    }
