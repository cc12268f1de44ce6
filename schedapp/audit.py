"""The audit trail: who changed a job, from where, when, why, and what changed.

Every path that changes a job goes through ``schedapp.api`` (the admin's form, actions and
buttons, declared jobs at beat start, the importer) or ``schedule_many``, and each writes its
record here, in the transaction that makes the change: a change that rolls back leaves no
record, and no change is left without one. Who and why come from ``acting``, which the admin,
declared jobs and the importer wrap around their calls; by default the actor is this process
and its host, and the source ``api``.

Why our own table and not a history library: django-pghistory's triggers do not run on SQLite
(the demo), and on PostgreSQL they would fire on every claim, renewal and completion, the
writes of the lease protocol that are no change of the job's definition; django-simple-history
follows ``save()`` signals, which ``schedule_many``'s COPY never sends, and its restore saves
the historical row whole, past the API's validation and the lease protocol. Here a change is
a diff of the job's own fields (``fields.JOB_FIELDS``) and a restore is an ``api.update``.
What is written behind the API's back (raw SQL, ``QuerySet.update``) is not recorded.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db.models import Q
from django.utils.duration import duration_string

from .conf import get_settings
from .fields import JOB_FIELDS
from .models import Job, JobChange

Action = JobChange.Action
API = "api"
BULK = "bulk"


@dataclass(frozen=True)
class Actor:
    """Who is changing jobs now (a user name, or a process and its host), through which path
    (``api``, ``admin``, ``declared``, ``imported``, ``bulk``), and why."""

    who: str
    source: str = API
    reason: str = ""


_acting: ContextVar[Actor | None] = ContextVar("schedapp_audit_actor", default=None)


def this_process() -> str:
    """The actor when no person is named: the program, its pid and the host."""
    program = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python"
    return f"{program} pid {os.getpid()} on {socket.gethostname()}"


def current() -> Actor:
    return _acting.get() or Actor(this_process())


@contextmanager
def acting(
    who: str | None = None, *, source: str | None = None, reason: str | None = None
) -> Iterator[Actor]:
    """Record the changes made inside as ``who``'s, through ``source``, for ``reason``;
    what is not given is the enclosing ``acting``'s (or this process, ``api``, none)."""
    outer = current()
    actor = Actor(
        who or outer.who,
        source or outer.source,
        outer.reason if reason is None else reason,
    )
    token = _acting.set(actor)
    try:
        yield actor
    finally:
        _acting.reset(token)


def enabled() -> bool:
    return bool(get_settings().AUDIT)


def snapshot(job: Job) -> dict[str, Any]:
    """The job's own fields, JSON-encoded as the trail stores them."""
    return {f: _encode(_field_value(job, f)) for f in JOB_FIELDS}


def _field_value(job: Job, field: str) -> Any:
    """A field as the trail keeps it: a calendar by its name (what the API takes back)."""
    if field == "calendar":
        return job.calendar.name if job.calendar_id is not None else None
    return getattr(job, field)


def diff(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, list[Any]]:
    """``{field: [before, after]}`` of the fields that differ."""
    return {f: [before.get(f), v] for f, v in after.items() if before.get(f) != v}


def record(
    job: Job,
    action: str,
    changes: Mapping[str, Any] | None = None,
    *,
    reason: str | None = None,
) -> JobChange | None:
    """Write one record of ``action`` on ``job`` by the current actor (None when the trail is
    off). ``changes``: ``diff``'s output, or another ``{name: [before, after]}``."""
    if not enabled():
        return None
    actor = current()
    return JobChange.objects.create(
        job_id=job.pk,
        job_name=job.name,
        action=action,
        source=actor.source,
        actor=actor.who[:200],
        reason=actor.reason if reason is None else reason,
        changes=dict(changes) if changes is not None else None,
    )


def record_deleted(job: Job) -> JobChange | None:
    """The record of a deletion keeps what was deleted: each field's last value."""
    return record(job, Action.DELETED, {f: [v, None] for f, v in snapshot(job).items()})


def record_created(names: list[str]) -> None:
    """One ``created`` record for each job of ``names``, written by the store in one
    statement where it can (``schedule_many``: its COPY sends no signal and holds no ids)."""
    if not enabled() or not names:
        return
    from .store import get_store

    actor = current()
    source = actor.source if actor.source != API else BULK
    get_store().record_created(names, source=source, actor=actor.who[:200], reason=actor.reason)


def history(job_id: int) -> list[JobChange]:
    """The job's records, newest first. Ordered by id: the job row's lock serialises the
    changes of one job, and each takes its id after that lock (``at`` is its transaction's
    start, which may come before an earlier change's)."""
    return list(JobChange.objects.filter(job_id=job_id).order_by("-id"))


def version_values(change: JobChange, job: Job | None = None) -> dict[str, Any]:
    """The job's own fields just after ``change``: its current fields with every later
    recorded change undone."""
    job = job if job is not None else Job.objects.get(pk=change.job_id)
    values = snapshot(job)
    later = JobChange.objects.filter(job_id=change.job_id, id__gt=change.id).order_by("-id")
    for newer in later.exclude(Q(changes__isnull=True)).values_list("changes", flat=True):
        values = undone(values, newer)
    return decode(values)


def pairs(changes: Mapping[str, Any] | None) -> list[tuple[str, Any, Any]]:
    """(field, before, after) of a record's ``changes``; anything else in them (a row written
    behind the API's back) is passed over."""
    return [
        (name, pair[0], pair[1])
        for name, pair in (changes or {}).items()
        if isinstance(pair, list) and len(pair) == 2
    ]


def undone(values: Mapping[str, Any], changes: Mapping[str, Any] | None) -> dict[str, Any]:
    """The version before a record: ``values`` (the version after it) with its changes to the
    job's own fields undone (a state, also in a record's changes, is not one of them)."""
    before = dict(values)
    for name, old, _new in pairs(changes):
        if name in before:
            before[name] = old
    return before


def decode(values: Mapping[str, Any]) -> dict[str, Any]:
    """Stored JSON back to field values (datetimes, durations), as the model reads them."""
    return {
        name: value if name == "calendar" else Job._meta.get_field(name).to_python(value)
        for name, value in values.items()
    }


class _Encoder(DjangoJSONEncoder):
    """Exact where Django's is not: a datetime to the microsecond (Django's keeps
    milliseconds), a duration as Django writes one ("1 02:03:04.000005"), both of which the
    model fields read back unchanged."""

    def default(self, o: Any) -> Any:
        if isinstance(o, datetime):
            return o.isoformat()
        if isinstance(o, timedelta):
            return duration_string(o)
        return super().default(o)


def _encode(value: Any) -> Any:
    return json.loads(json.dumps(value, cls=_Encoder))
