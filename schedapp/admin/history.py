"""A job's history page: every recorded change (``schedapp.audit``), newest first, with who,
from where, when, why and a field diff; for a change of schedule, the next fire times before
and after it; and a button that restores the version a change left (``api.restore``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .. import audit
from ..db import db_now
from ..display import local_time
from ..fields import SCHEDULE_DETAIL_FIELDS, SCHEDULE_FIELDS
from ..models import Job, JobChange
from ..schedules import fire_times
from ..validation import stored_schedule

# Records shown on the page (a job changed more often than this shows its latest).
SHOWN = 200
FIRE_TIMES = 5
_SCHEDULE = (*SCHEDULE_FIELDS, *SCHEDULE_DETAIL_FIELDS, "timezone", "interval_anchor")


@dataclass
class Entry:
    record: JobChange
    at: str
    fields: list[tuple[str, str, str]] = field(default_factory=list)  # name, before, after
    fires_before: list[str] = field(default_factory=list)
    fires_after: list[str] = field(default_factory=list)
    restorable: bool = False


@dataclass
class HistoryPage:
    entries: list[Entry]
    more: bool


def history_page(job: Job) -> HistoryPage:
    """Each record with the version it left, read back from the job as it is now by undoing
    the newer records' diffs one by one (one query for the records)."""
    records = list(JobChange.objects.filter(job_id=job.pk).order_by("-id")[: SHOWN + 1])
    more = len(records) > SHOWN
    records = records[:SHOWN]
    now = db_now()
    after = audit.snapshot(job)  # the version the newest record left
    entries = []
    for index, record in enumerate(records):
        before = audit.undone(after, record.changes)
        changed = audit.pairs(record.changes)
        entry = Entry(record, local_time(record.at, job.timezone, seconds=True))
        entry.fields = [(name, _shown(old), _shown(new)) for name, old, new in changed]
        # The newest version is the job as it is: nothing to restore to.
        entry.restorable = index > 0 and record.action != JobChange.Action.DELETED
        if any(name in _SCHEDULE for name, _old, _new in changed):
            entry.fires_before = _fires(before, now)
            entry.fires_after = _fires(after, now)
        entries.append(entry)
        after = before
    return HistoryPage(entries, more)


def _fires(values: dict[str, Any], now: datetime) -> list[str]:
    """The next fire times of a version's schedule, in its zone; its problem if it has none."""
    try:
        decoded = audit.decode(values)
        schedule = stored_schedule(decoded)
        zone = decoded.get("timezone") or "UTC"
        times = [local_time(t, zone) for t in fire_times(schedule, now, limit=FIRE_TIMES)]
    except Exception as exc:  # an old version may not be a valid schedule any more
        return [f"(cannot be computed: {exc})"]
    return times or ["(no occurrence left)"]


def _shown(value: Any) -> str:
    """A stored value as the form shows it: JSON for lists and objects."""
    if value is None:
        return "—"
    if value == "":
        return '""'
    if isinstance(value, dict | list | bool):
        return json.dumps(value)
    return str(value)
