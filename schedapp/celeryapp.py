"""The Celery app schedapp validates against and publishes through, and the task allowlist.

Job validation, the dispatcher, the beat's quarantine, the admin's task list and the system
checks all ask the same two questions: which app, and may a job run this task. The answers
live here, apart from the rules of a job's other fields.
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from functools import lru_cache
from typing import Any

from celery import current_app
from celery.utils.imports import symbol_by_name

from .conf import get_settings


def celery_app() -> Any:
    """The Celery app jobs are validated against and published through."""
    path = get_settings().CELERY_APP
    if path:
        return symbol_by_name(path)
    return current_app._get_current_object()


@lru_cache(maxsize=1)
def _discovered(app_id: int) -> bool:
    celery_app().loader.import_default_modules()  # autodiscover tasks.py of every Django app
    return True


def registered_tasks() -> list[str]:
    """Names of the tasks registered with the Celery app, Celery's own left out.

    Celery imports the projects' ``tasks.py`` modules lazily: read before that, the registry
    holds only Celery's built-ins (a fresh web process offered no task at all), so the
    modules are imported first, once per app."""
    app = celery_app()
    _discovered(id(app))
    return sorted(name for name in list(app.tasks) if not name.startswith("celery."))


def task_not_allowed(name: str) -> str | None:
    """Why the allowlist refuses this task, or None. Checked when a job is written, and again
    whenever it is about to run (the allowlist may have changed since)."""
    settings = get_settings()
    allowed = settings.ALLOWED_TASKS
    if settings.HOUSEKEEPING:  # schedapp's own housekeeping, unless denied explicitly
        allowed = (*allowed, "schedapp.prune_runs", "schedapp.cleanup_results")
    return _allowlist_problem(name, allowed, settings.DENIED_TASKS)


@lru_cache(maxsize=4096)
def _allowlist_problem(name: str, allowed: tuple[str, ...], denied: tuple[str, ...]) -> str | None:
    if any(fnmatchcase(name, p) for p in denied) or not any(fnmatchcase(name, p) for p in allowed):
        return f"task {name!r} is not allowed (SCHEDAPP_ALLOWED_TASKS)."
    return None


def task_problem(name: str) -> str | None:
    """Why a job may not run this task, or None if it may: allowed, and registered with the
    Celery app (where jobs are written; a beat only checks the allowlist)."""
    problem = task_not_allowed(name)
    if problem:
        return problem
    app = celery_app()
    _discovered(id(app))
    if name not in app.tasks:
        return f"task {name!r} is not registered with the Celery app."
    return None
