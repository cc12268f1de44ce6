"""Jobs declared in code, kept in sync with the database when a beat starts.

Three ways to declare, merged (a name may be declared only once): Celery's own
``beat_schedule`` (``CELERY_BEAT_SCHEDULE``, ``add_periodic_task``), mapped with Celery's
semantics by ``importer.map_beat_entry`` (an entry that cannot be mapped, such as a custom
schedule class, is reported at beat start and not run), and::

    # settings.py
    SCHEDAPP_JOBS = {
        "nightly-report": {"task": "reports.tasks.nightly", "cron": "0 2 * * *",
                           "timezone": "Europe/Paris", "kwargs": {"full": True}},
    }

    # tasks.py: put @periodic above @shared_task
    @periodic(cron="*/15 * * * *", name="refresh-cache", queue="low")
    @shared_task(name="cache.refresh")
    def refresh() -> None: ...

``sync_declared_jobs()`` creates missing jobs (source "declared"), updates those whose
declaration changed (through ``api.update``: an unchanged job keeps its ``next_run_at``), and
*pauses* declared jobs whose declaration disappeared: their history stays, and declaring them
again resumes them, unless a person paused them (``Declaration.withdrawn`` tells the sync's
pause from a person's). A job created by someone else under a declared name is never touched.
A bad declaration is reported and skipped; the others are still synced. Beats call it at
start.

In a rolling deploy the newest declarations win (DESIGN.md note 27): each sync records its
declaration set (``SCHEDAPP_RELEASE`` and a fingerprint) and, per job name, which set last
decided on it; a sync never writes a name a newer set decided on (``newer``). Jobs are
written a few at a time, each transaction holding its rows about a tenth of a second at most
(note 23), so running jobs' lease renewals and doors never wait behind the sync; beats
syncing at once serialise on each name's ``Declaration`` row, never on a lock held for the
whole sync.

Calendars declared in code (``SCHEDAPP_CALENDARS``) are synced first by
``sync_declared_calendars``: created or replaced, never removed (see its docstring).
"""

from __future__ import annotations

import collections
import hashlib
import json
import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from . import api, audit
from .celeryapp import celery_app
from .conf import get_settings
from .db import beat_transaction, db_now
from .exceptions import JobStateError
from .fields import JOB_FIELDS, changed_fields
from .models import Declaration, DeclarationSet, Job, JobSource, JobState, field_default
from .validation import validate_job

log = logging.getLogger("schedapp.declared")

_registry: list[dict[str, Any]] = []


def periodic(
    *, name: str | None = None, task: str | None = None, **spec: Any
) -> Callable[[Any], Any]:
    """Declare a job for the decorated Celery task (``cron=``, ``interval=`` or ``run_at=``,
    plus any job option). ``name`` defaults to the task name."""

    def decorate(target: Any) -> Any:
        # The task name is read when jobs are synced, not here: reading a shared_task's name
        # now would bind it to whichever Celery app happens to be current at import time.
        if name is not None and any(e["_name"] == name for e in _registry):
            raise ValueError(f"job {name!r} is declared twice with @periodic")
        _registry.append({"_target": target, "_task": task, "_name": name, **spec})
        return target

    return decorate


def _default_task_name(target: Any) -> str:
    return f"{target.__module__}.{target.__name__}"


def _resolve_task(entry: Mapping[str, Any]) -> str:
    if entry.get("_task"):
        return str(entry["_task"])
    target = entry["_target"]
    name = getattr(target, "name", None)  # a Celery task (or shared_task's proxy)
    return name if isinstance(name, str) else _default_task_name(target)


def housekeeping_declarations() -> dict[str, dict[str, Any]]:
    """The housekeeping jobs as declarations (empty with ``SCHEDAPP_HOUSEKEEPING = False``)."""
    s = get_settings()
    if not s.HOUSEKEEPING:
        return {}
    results: dict[str, Any] = {}
    if s.RESULT_RETENTION is not None:
        keep = s.RESULT_RETENTION
        results["older_than_seconds"] = (
            keep.total_seconds() if isinstance(keep, timedelta) else float(keep)
        )
    return {
        "schedapp-prune-runs": {
            "task": "schedapp.prune_runs",
            "cron": s.HOUSEKEEPING_CRON,
            "timezone": "UTC",
            "kwargs": {"older_than_seconds": s.RUN_RETENTION.total_seconds()},
        },
        "schedapp-cleanup-results": {
            "task": "schedapp.cleanup_results",
            "cron": s.HOUSEKEEPING_CRON,
            "timezone": "UTC",
            "kwargs": results,
        },
    }


def declarations() -> dict[str, dict[str, Any]]:
    """Every declared job, by name: ``SCHEDAPP_JOBS`` and ``@periodic`` merged."""
    celery_app().loader.import_default_modules()  # load tasks modules, so @periodic ran
    found: dict[str, dict[str, Any]] = {}
    jobs = get_settings().JOBS or {}
    # Not a mapping: the settings check (schedapp.E030) says so, and a beat refuses to start.
    for name, spec in (jobs.items() if isinstance(jobs, Mapping) else ()):
        found[str(name)] = dict(spec) if isinstance(spec, Mapping) else {"_invalid": spec}
    for name, spec in housekeeping_declarations().items():  # a declaration of yours wins
        found.setdefault(name, spec)
    for name, spec in beat_schedule_declarations().items():
        found[name] = {"_duplicate": True} if name in found else spec
    for entry in _registry:
        spec = {k: v for k, v in entry.items() if not k.startswith("_")}
        spec["task"] = _resolve_task(entry)
        name = entry["_name"] or spec["task"]
        if name in found:
            spec = {"_duplicate": True}
        found[name] = spec
    return found


def beat_schedule_declarations() -> dict[str, dict[str, Any]]:
    """The Celery app's ``beat_schedule`` entries as declarations, with Celery's semantics.

    Reading ``conf`` finalises the configuration, so ``add_periodic_task`` calls made in
    ``on_after_configure`` are in it. A relative interval's phase is kept across restarts
    (``_keep_phase``): beats start at different times, the job keeps its first phase.
    """
    from .importer import map_beat_entry

    found: dict[str, dict[str, Any]] = {}
    for name, entry in (celery_app().conf.beat_schedule or {}).items():
        item = map_beat_entry(str(name), entry)
        if item.problem:
            found[str(name)] = {
                "_unmapped": f"beat_schedule entry not run: {item.problem}",
                "_field": item.problem_field,
            }
            continue
        found[str(name)] = {
            "task": item.task,
            **item.spec,
            "_keep_phase": True,
            "_notes": list(item.notes),  # logged once, by the sync (system checks read these too)
        }
    return found


def declared_values(name: str, spec: Mapping[str, Any]) -> dict[str, Any]:
    """The validated field values of one declaration; defaults fill what it leaves out.

    Raises ValidationError keyed ``"<job name>.<field>"``.
    """
    if spec.get("_duplicate"):
        raise ValidationError(
            {
                f"{name}.name": [
                    "declared more than once (SCHEDAPP_JOBS, @periodic, Celery's beat_schedule)."
                ]
            }
        )
    if "_invalid" in spec:
        raise ValidationError({f"{name}.spec": ["must be a mapping of job options."]})
    if "_unmapped" in spec:
        raise ValidationError({f"{name}.{spec.get('_field', 'schedule')}": [spec["_unmapped"]]})
    spec = {k: v for k, v in spec.items() if not k.startswith("_")}
    values = {f: field_default(f) for f in JOB_FIELDS}
    values.update(run_at=None, cron="", interval=None, interval_anchor=None, name=name)
    values.update(solar_event="", message_options={})
    unknown = sorted(set(spec) - set(JOB_FIELDS))
    if unknown:
        raise ValidationError({f"{name}.{key}": [f"unknown option {key!r}."] for key in unknown})
    values.update(spec)
    if isinstance(values.get("args"), tuple):
        values["args"] = list(values["args"])
    try:
        return validate_job(values)
    except ValidationError as exc:
        raise ValidationError(
            {f"{name}.{field}": messages for field, messages in exc.message_dict.items()}
        ) from exc


@dataclass
class SyncReport:
    created: list[str] = field(default_factory=list)
    updated: dict[str, list[str]] = field(default_factory=dict)  # name -> changed fields
    paused: list[str] = field(default_factory=list)
    resumed: list[str] = field(default_factory=list)  # declared again after a withdrawal
    unchanged: list[str] = field(default_factory=list)
    conflicts: dict[str, str] = field(default_factory=dict)  # name taken by another source
    waiting: list[str] = field(default_factory=list)  # declared again, still paused
    superseded: list[str] = field(default_factory=list)  # a newer release decided on it
    deferred: list[str] = field(default_factory=list)  # its job row stayed busy: next sync
    errors: dict[str, list[str]] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        return bool(self.created or self.updated or self.paused or self.resumed)

    def __str__(self) -> str:
        parts = [
            f"{len(self.created)} created",
            f"{len(self.updated)} updated",
            f"{len(self.paused)} paused",
            f"{len(self.unchanged)} unchanged",
        ]
        if self.resumed:
            parts.append(f"{len(self.resumed)} resumed")
        if self.superseded:
            parts.append(f"{len(self.superseded)} left to a newer release")
        if self.deferred:
            parts.append(f"{len(self.deferred)} deferred (busy)")
        if self.conflicts:  # named: each is a declaration whose edits are ignored
            names = ", ".join(sorted(self.conflicts))
            parts.append(f"{len(self.conflicts)} name conflicts ({names})")
        if self.errors:
            parts.append(f"{len(self.errors)} invalid")
        return "declared jobs: " + ", ".join(parts)


# --- which declarations are the newest ---------------------------------------------------------


def release_key(release: str) -> tuple[tuple[int, int, str], ...]:
    """The order of ``SCHEDAPP_RELEASE`` values: part by part, runs of digits as numbers
    ("41" < "100", "2026.12.2" < "2026.12.10", ISO timestamps in time order)."""
    return tuple(
        (0, int(part), "") if part[0] in "0123456789" else (1, 0, part)
        for part in re.findall(r"[0-9]+|[^0-9]+", release)
    )


def _rank(found: DeclarationSet | None) -> tuple[Any, ...]:
    """Newer sorts higher: a set with a release over one without (a team that starts setting
    it), then the release's order, then the set the database saw first is the older."""
    if found is None:  # no set decided yet
        return (0,)
    return (1, bool(found.release), release_key(found.release), found.first_seen, found.pk)


def newer(one: DeclarationSet | None, other: DeclarationSet | None) -> bool:
    """Whether declaration set ``one`` is newer than ``other`` (None: none, the oldest)."""
    return _rank(one) > _rank(other)


def _plain(value: Any) -> Any:
    if isinstance(value, timedelta):
        return {"seconds": value.total_seconds()}
    if isinstance(value, datetime):
        return value.isoformat()
    return repr(value)


def fingerprint(decls: Mapping[str, Mapping[str, Any]]) -> str:
    """A digest of a declaration set, the same at every start of one release: what a beat
    computes from the instant it starts (a relative ``beat_schedule`` entry's phase) and the
    notes it logs are left out."""
    canonical: dict[str, Any] = {}
    for name, spec in decls.items():
        item = {k: v for k, v in spec.items() if k != "_notes"}
        if spec.get("_keep_phase"):
            item.pop("interval_anchor", None)
            item.pop("not_before", None)
        canonical[str(name)] = item
    try:
        text = json.dumps(canonical, sort_keys=True, default=_plain)
    except TypeError:  # keys json cannot sort (mixed types in a kwargs mapping)
        text = repr(sorted(canonical.items()))
    return hashlib.sha256(text.encode()).hexdigest()


def _our_set(decls: Mapping[str, Mapping[str, Any]], release: Any) -> DeclarationSet:
    """This beat's declaration set, recorded when the database first sees it."""
    release = str(release or "")[:200]
    digest = fingerprint(decls)
    with transaction.atomic():
        DeclarationSet.objects.bulk_create(
            [DeclarationSet(release=release, fingerprint=digest, first_seen=db_now())],
            ignore_conflicts=True,
        )
    return DeclarationSet.objects.get(release=release, fingerprint=digest)


class _Sets:
    """Declaration sets by id; one another beat recorded meanwhile is read when met."""

    def __init__(self) -> None:
        self._sets = {s.pk: s for s in DeclarationSet.objects.all()}

    def get(self, pk: int | None) -> DeclarationSet | None:
        if pk is None:
            return None
        if pk not in self._sets:
            self._sets[pk] = DeclarationSet.objects.get(pk=pk)
        return self._sets[pk]


# --- the sync ----------------------------------------------------------------------------------

# A name whose job row another transaction holds (a door, a renewal, a completion, a person)
# is tried again after the others, up to this many passes, a pause apart; then the next sync.
BUSY_PASSES = 20
BUSY_PAUSE = 0.25
# Names written in one transaction: at most this many, and none started after it has held
# its rows this long (a commit a row cost as much again as the writes).
WRITE_BATCH = 20
WRITE_BATCH_SECONDS = 0.1
STAMP_BATCH = 500


def sync_declared_jobs(
    decls: Mapping[str, Mapping[str, Any]] | None = None, *, release: str | None = None
) -> SyncReport:
    """Bring the database in line with the declarations; idempotent (see the module doc).
    ``decls`` and ``release`` default to the settings (``declarations()``,
    ``SCHEDAPP_RELEASE``).

    Jobs are written a few at a time, each transaction holding its rows for at most about
    ``WRITE_BATCH_SECONDS``: a sync holding every row it touched until the end let running
    jobs' leases lapse (their renewals skip locked rows) and made doors wait. A job whose
    row another transaction holds is skipped, never waited for, and tried again; still busy
    after ``BUSY_PASSES``, it is left for the next sync (``SyncReport.deferred``). A name a
    newer declaration set decided on is left alone (``SyncReport.superseded``).
    """
    named = get_settings().RELEASE if release is None else release
    why = f"declared in code, release {named}" if named else "declared in code"
    with audit.acting(source="declared", reason=why):
        return _sync_declared_jobs(decls, named)


def _sync_declared_jobs(decls: Mapping[str, Mapping[str, Any]] | None, release: str) -> SyncReport:
    """``sync_declared_jobs``'s work, inside its audit actor, for the release it resolved."""
    decls = declarations() if decls is None else decls
    report = SyncReport()
    ours = _our_set(decls, release)
    sets = _Sets()
    values: dict[str, dict[str, Any]] = {}
    for name, spec in decls.items():
        for note in spec.get("_notes", ()):
            log.warning("beat_schedule entry %s: %s", name, note, extra={"action": "declared"})
        try:
            values[name] = declared_values(name, spec)
        except ValidationError as exc:
            _invalid(name, exc, report)
    todo = _in_line(decls, values, ours, sets, report)
    live = (JobState.SCHEDULED, JobState.RUNNING)
    gone = (
        Job.objects.filter(source=JobSource.DECLARED, state__in=live)
        .exclude(name__in=list(decls))
        .values_list("name", flat=True)
    )
    # One order for every beat: batches lock Declaration rows in name order, so two beats
    # syncing at once wait for each other, never deadlock (job rows are never waited for).
    pending = sorted([(n, "declare") for n in todo] + [(n, "withdraw") for n in gone])
    for attempt in range(BUSY_PASSES):
        busy: list[tuple[str, str]] = []
        queue = collections.deque(pending)
        while queue:
            batch = [queue.popleft() for _ in range(min(WRITE_BATCH, len(queue)))]
            with beat_transaction():
                held, later = _write_batch(batch, decls, values, ours, sets, report)
            busy += held
            queue.extendleft(reversed(later))
        pending = sorted(busy)
        if not pending:
            break
        if attempt + 1 < BUSY_PASSES:
            time.sleep(BUSY_PAUSE)
    report.deferred = [name for name, _ in pending]
    if report.deferred:
        log.warning(
            "declared jobs left for the next sync, their rows busy: %s",
            ", ".join(report.deferred),
            extra={"action": "declared_deferred"},
        )
    log.info("%s", report, extra={"action": "declared_sync"})
    return report


def _invalid(name: str, exc: Exception, report: SyncReport) -> None:
    report.errors[name] = _messages(exc)
    log.error(
        "declared job %s is invalid: %s",
        name,
        report.errors[name],
        extra={"action": "declared_invalid", "job_name": name},
    )


def _changes(spec: Mapping[str, Any], values: dict[str, Any], job: Job) -> dict[str, Any]:
    """The fields of ``job`` its declaration changes (a copy of ``values`` is adjusted)."""
    values = dict(values)
    _keep_phase(spec, values, job)
    if values.get("interval_anchor") is None:
        # Not declared: the phase the job took at its first occurrence stays (a new schedule
        # still gets a new one, as changed_fields then says the whole schedule).
        values.pop("interval_anchor", None)
    return changed_fields(job, values)


def _in_line(
    decls: Mapping[str, Mapping[str, Any]],
    values: Mapping[str, dict[str, Any]],
    ours: DeclarationSet,
    sets: _Sets,
    report: SyncReport,
) -> list[str]:
    """The names that need a transaction of their own; the others are in line with this set
    already (a beat of a release starting again: nothing is written) or need only its stamp,
    written in batches that lock declarations, never job rows."""
    todo: list[str] = []
    names = list(values)
    for i in range(0, len(names), STAMP_BATCH):
        batch = names[i : i + STAMP_BATCH]
        jobs = {j.name: j for j in Job.objects.filter(name__in=batch)}
        stamps = {d.name: d for d in Declaration.objects.filter(name__in=batch)}
        stamp: dict[int | None, list[str]] = {}
        for name in batch:
            job, decl = jobs.get(name), stamps.get(name)
            if (
                job is None
                or job.source != JobSource.DECLARED
                or (decl is not None and decl.withdrawn)
                or (decl is not None and newer(sets.get(decl.declaration_set_id), ours))
                or _changes(decls[name], values[name], job)
            ):
                todo.append(name)
            elif decl is not None and decl.declaration_set_id == ours.pk and decl.declared:
                _unchanged(name, job, report)
            else:
                stamp.setdefault(None if decl is None else decl.declaration_set_id, []).append(name)
        for read, group in stamp.items():
            if read is None:
                Declaration.objects.bulk_create(
                    [Declaration(name=n, declaration_set=ours, declared=True) for n in group],
                    ignore_conflicts=True,
                )
            else:
                Declaration.objects.filter(
                    name__in=group, declaration_set_id=read, withdrawn=False
                ).update(declaration_set=ours, declared=True)
            done = set(
                Declaration.objects.filter(
                    name__in=group, declaration_set=ours, declared=True, withdrawn=False
                ).values_list("name", flat=True)
            )
            for name in group:
                if name in done:
                    _unchanged(name, jobs[name], report)
                else:  # another beat wrote it meanwhile: decide under its lock
                    todo.append(name)
    return todo


def _unchanged(name: str, job: Job, report: SyncReport) -> None:
    report.unchanged.append(name)
    if job.state == JobState.PAUSED:
        report.waiting.append(name)


def _write_batch(
    batch: list[tuple[str, str]],
    decls: Mapping[str, Mapping[str, Any]],
    values: Mapping[str, dict[str, Any]],
    ours: DeclarationSet,
    sets: _Sets,
    report: SyncReport,
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Write a few names in the caller's transaction: their Declaration rows locked in name
    order (made first where missing), their job rows locked unless another transaction
    holds them. Returns the names found busy, and those left for another transaction
    because this one has held its rows ``WRITE_BATCH_SECONDS`` already."""
    names = [name for name, _ in batch]
    Declaration.objects.bulk_create([Declaration(name=n) for n in names], ignore_conflicts=True)
    stamps = {
        d.name: d
        for d in Declaration.objects.select_for_update().filter(name__in=names).order_by("name")
    }
    jobs = {
        j.name: j for j in Job.objects.select_for_update(skip_locked=True).filter(name__in=names)
    }
    held = set(Job.objects.filter(name__in=set(names) - set(jobs)).values_list("name", flat=True))
    busy: list[tuple[str, str]] = []
    later: list[tuple[str, str]] = []
    written: list[Declaration] = []
    started = time.monotonic()
    for index, (name, action) in enumerate(batch):
        if index and time.monotonic() - started >= WRITE_BATCH_SECONDS:
            later = batch[index:]
            break
        decl = stamps[name]
        if decl.declaration_set_id != ours.pk and newer(sets.get(decl.declaration_set_id), ours):
            report.superseded.append(name)  # a newer release decided on it
            continue
        if name in held:
            busy.append((name, action))
            continue
        try:
            if action == "declare":
                done = _declare(name, decls[name], values[name], jobs.get(name), decl, report)
            else:
                done = _withdraw(name, jobs.get(name), decl, ours, report)
        except (ValidationError, JobStateError) as exc:
            _invalid(name, exc, report)
            continue
        if done:
            decl.declaration_set = ours
            written.append(decl)
    Declaration.objects.bulk_update(written, ["declaration_set", "declared", "withdrawn"])
    return busy, later


def _declare(
    name: str,
    spec: Mapping[str, Any],
    values: dict[str, Any],
    job: Job | None,
    decl: Declaration,
    report: SyncReport,
) -> bool:
    """Create or update one declared job; True: its declaration is to be stamped."""
    values = dict(values)
    if job is not None and job.source == JobSource.DECLARED:
        _keep_phase(spec, values, job)
    if not _sync_one(name, values, job, report):
        return False  # another source's job: not ours to stamp
    if job is not None and decl.withdrawn and job.state == JobState.PAUSED:
        api.resume(job.pk, reason="declared again")  # paused only because it was not
        report.resumed.append(name)
        report.waiting.remove(name)
    decl.declared, decl.withdrawn = True, False
    return True


def _withdraw(
    name: str, job: Job | None, decl: Declaration, ours: DeclarationSet, report: SyncReport
) -> bool:
    """Pause a declared job this set no longer declares, unless this set did already (a
    person may have resumed it since); True: its declaration is to be stamped."""
    if decl.declaration_set_id == ours.pk and not decl.declared:
        return False
    if job is not None and job.source != JobSource.DECLARED:
        return False  # the name went to a job of another source meanwhile
    if job is not None and job.state in (JobState.SCHEDULED, JobState.RUNNING):
        api.pause(job.pk, reason="no longer declared (SCHEDAPP_JOBS, @periodic)")
        decl.withdrawn = True
        report.paused.append(name)
    decl.declared = False
    return True


def _keep_phase(spec: Mapping[str, Any], values: dict[str, Any], job: Job | None) -> None:
    """An interval declared without an anchor keeps the phase the job has (its first run),
    and a beat_schedule entry's relative phase the one it got at its first sync: a beat
    starting again must not move the job. A declared ``not_before`` stays as declared."""
    given = "interval_anchor" in spec and not spec.get("_keep_phase")
    if job is not None and job.interval is not None and job.interval == values["interval"]:
        if not given:
            values["interval_anchor"] = job.interval_anchor
            if spec.get("_keep_phase"):  # a relative entry's first run, computed at first sync
                values["not_before"] = job.not_before
    elif not given and not spec.get("_keep_phase"):
        values.pop("interval_anchor", None)  # a new interval: the update resets its phase


def _sync_one(name: str, values: dict[str, Any], job: Job | None, report: SyncReport) -> bool:
    """Create or update the job; False when the name belongs to a job of another source."""
    if job is None:
        task = values.pop("task")
        with transaction.atomic():
            api.schedule(task, source=JobSource.DECLARED, **values)
        report.created.append(name)
        return True
    if job.source != JobSource.DECLARED:
        report.conflicts[name] = f"a job named {name!r} was created via {job.source}; not synced."
        log.warning(
            "declared job %r is not synced: %s",
            name,
            conflict_text(name, job.source),
            extra={"action": "declared_conflict", "job_name": name},
        )
        return False
    if values.get("interval_anchor") is None:
        # Not declared: the phase the job took at its first occurrence stays (a new schedule
        # still gets a new one, as changed_fields then says the whole schedule).
        values = {k: v for k, v in values.items() if k != "interval_anchor"}
    changes = changed_fields(job, values)
    if changes:
        with transaction.atomic():
            api.update(job.pk, **changes)
        report.updated[name] = sorted(changes)
    else:
        report.unchanged.append(name)
    if job.state == JobState.PAUSED:
        report.waiting.append(name)
    return True


def conflict_text(name: str, source: str) -> str:
    """Why a declaration is not synced, and what to do: the beat's warning and the system
    check (schedapp.W012) say the same."""
    return (
        f"a job named {name!r} exists with source {source!r} (created by "
        f"{'schedapp_import' if source == JobSource.IMPORTED else source}, not by this "
        "declaration), and sync never touches a job it did not create: edits of the "
        "declaration are ignored while that job holds the name (delete or rename that job, "
        "or remove the declaration)"
    )


def _messages(exc: Exception) -> list[str]:
    if isinstance(exc, ValidationError) and hasattr(exc, "error_dict"):
        return [f"{key}: {' '.join(msgs)}" for key, msgs in exc.message_dict.items()]
    if isinstance(exc, ValidationError):
        return list(exc.messages)
    return [str(exc)]


def clear_registry() -> None:
    """Forget @periodic declarations (for tests)."""
    _registry.clear()


# --- calendars declared in code ----------------------------------------------------------------

DECLARED_CALENDAR_DESCRIPTION = "Declared in code (SCHEDAPP_CALENDARS)."


@dataclass
class CalendarSyncReport:
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    errors: dict[str, list[str]] = field(default_factory=dict)  # name -> "field: message"

    def __str__(self) -> str:
        parts = [
            f"{len(self.created)} created",
            f"{len(self.updated)} updated",
            f"{len(self.unchanged)} unchanged",
        ]
        if self.errors:
            parts.append(f"{len(self.errors)} invalid ({', '.join(sorted(self.errors))})")
        return "declared calendars: " + ", ".join(parts)


def declared_calendars() -> dict[str, Any]:
    """``SCHEDAPP_CALENDARS``: calendar name -> definition (empty when it is not a mapping,
    which the settings check reports)."""
    found = get_settings().CALENDARS
    return dict(found) if isinstance(found, Mapping) else {}


def calendar_order(decls: Mapping[Any, Any]) -> list[Any]:
    """The declared names, each after the declared calendars its definition names, so a
    reference to another declared calendar finds it stored (a cycle is left in any order: the
    save refuses it)."""
    from .calendars import references

    out: list[Any] = []
    seen: set[Any] = set()

    def visit(name: Any) -> None:
        if name in seen:
            return
        seen.add(name)
        for other in sorted(references(decls[name])):
            if other in decls:
                visit(other)
        out.append(name)

    for name in sorted(decls, key=str):
        visit(name)
    return out


def sync_declared_calendars(decls: Mapping[Any, Any] | None = None) -> CalendarSyncReport:
    """Create or replace each declared calendar (``SCHEDAPP_CALENDARS``) whose stored
    definition differs, through ``api.save_calendar`` (its validation: an invalid one is
    reported in ``errors`` and skipped, the others still synced). Idempotent: an unchanged one
    is not written. The declaration wins over an edit made in the admin or the API (at the
    next beat start). A calendar no longer declared is left as it is: jobs may use it, and a
    calendar has nothing to pause; delete it in the admin when nothing names it."""
    from .models import Calendar

    decls = declared_calendars() if decls is None else decls
    report = CalendarSyncReport()
    for name in calendar_order(decls):
        if not isinstance(name, str):
            report.errors[repr(name)] = [f"name: {name!r} is not a string."]
            continue
        try:
            definition = json.loads(json.dumps(decls[name]))
        except (TypeError, ValueError) as exc:
            report.errors[name] = [f"definition: is not JSON ({exc})."]
            continue
        stored = Calendar.objects.filter(name=name).first()
        if stored is not None and stored.definition == definition:
            report.unchanged.append(name)
            continue
        description = stored.description if stored is not None else DECLARED_CALENDAR_DESCRIPTION
        try:
            api.save_calendar(name, definition, description=description)
        except ValidationError as exc:
            report.errors[name] = [
                f"{key}: {' '.join(messages)}" for key, messages in exc.message_dict.items()
            ]
            continue
        (report.updated if stored is not None else report.created).append(name)
    for name, messages in sorted(report.errors.items()):
        log.error(
            "declared calendar %s is invalid and was not synced: %s",
            name,
            "; ".join(messages),
            extra={"action": "declared_calendar_invalid"},
        )
    log.info("%s", report, extra={"action": "declared_calendars_synced"})
    return report
