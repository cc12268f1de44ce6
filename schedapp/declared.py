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
again shows them (still paused: a person resumes them, because sync cannot tell its own pause
from an operator's). A job created by someone else under a declared name is never touched.
A bad declaration is reported and skipped; the others are still synced. Beats call it at
start; several beats starting together are serialised by an advisory lock.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from . import api
from .conf import get_settings
from .db import beat_transaction
from .exceptions import JobStateError
from .models import Job, JobSource, JobState, field_default
from .store import get_store
from .validation import JOB_FIELDS, celery_app, changed_fields, validate_job

log = logging.getLogger("schedapp.declared")

# pg_advisory_xact_lock key: "schedapp" declared-jobs sync.
_LOCK_KEY = 0x5C4ED_D3C1
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
    unchanged: list[str] = field(default_factory=list)
    conflicts: dict[str, str] = field(default_factory=dict)  # name taken by another source
    waiting: list[str] = field(default_factory=list)  # declared again, still paused
    errors: dict[str, list[str]] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        return bool(self.created or self.updated or self.paused)

    def __str__(self) -> str:
        parts = [
            f"{len(self.created)} created",
            f"{len(self.updated)} updated",
            f"{len(self.paused)} paused",
            f"{len(self.unchanged)} unchanged",
        ]
        if self.conflicts:  # named: each is a declaration whose edits are ignored
            names = ", ".join(sorted(self.conflicts))
            parts.append(f"{len(self.conflicts)} name conflicts ({names})")
        if self.errors:
            parts.append(f"{len(self.errors)} invalid")
        return "declared jobs: " + ", ".join(parts)


def sync_declared_jobs(decls: Mapping[str, Mapping[str, Any]] | None = None) -> SyncReport:
    """Bring the database in line with the declarations; idempotent (see the module doc)."""
    decls = declarations() if decls is None else decls
    report = SyncReport()
    with beat_transaction():
        get_store().lock(_LOCK_KEY)  # one beat at a time
        existing = {job.name: job for job in Job.objects.filter(name__in=list(decls))}
        for name, spec in decls.items():
            for note in spec.get("_notes", ()):
                log.warning("beat_schedule entry %s: %s", name, note, extra={"action": "declared"})
            try:
                values = declared_values(name, spec)
                job = existing.get(name)
                _keep_phase(spec, values, job)
                _sync_one(name, values, job, report)
            except (ValidationError, JobStateError) as exc:
                report.errors[name] = _messages(exc)
                log.error(
                    "declared job %s is invalid: %s",
                    name,
                    report.errors[name],
                    extra={"action": "declared_invalid", "job_name": name},
                )
        gone = (
            Job.objects.filter(source=JobSource.DECLARED)
            .exclude(name__in=list(decls))
            .filter(state__in=(JobState.SCHEDULED, JobState.RUNNING))
        )
        for job in gone:
            api.pause(job.pk)
            report.paused.append(job.name)
    log.info("%s", report, extra={"action": "declared_sync"})
    return report


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


def _sync_one(name: str, values: dict[str, Any], job: Job | None, report: SyncReport) -> None:
    if job is None:
        task = values.pop("task")
        with transaction.atomic():
            api.schedule(task, source=JobSource.DECLARED, **values)
        report.created.append(name)
        return
    if job.source != JobSource.DECLARED:
        report.conflicts[name] = f"a job named {name!r} was created via {job.source}; not synced."
        log.warning(
            "declared job %r is not synced: %s",
            name,
            conflict_text(name, job.source),
            extra={"action": "declared_conflict", "job_name": name},
        )
        return
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
