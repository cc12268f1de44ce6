"""Celery tasks schedapp runs on itself: housekeeping, declared by default as the jobs
``schedapp-prune-runs`` and ``schedapp-cleanup-results`` (``SCHEDAPP_HOUSEKEEPING``)."""

from __future__ import annotations

from datetime import timedelta

from celery import shared_task

from .prune import prune_runs as prune

DEFAULT_OLDER_THAN = 30 * 86400


@shared_task(name="schedapp.prune_runs")
def prune_runs(
    older_than_seconds: float = DEFAULT_OLDER_THAN,
    batch_size: int = 5_000,
    max_batches: int | None = None,
    pause: float = 0.0,
) -> dict[str, object]:
    """Delete runs finished more than ``older_than_seconds`` ago, in short batches."""
    result = prune(
        timedelta(seconds=older_than_seconds),
        batch_size=batch_size,
        max_batches=max_batches,
        pause=pause,
    )
    return {
        "deleted": result.deleted,
        "batches": result.batches,
        "cutoff": result.cutoff,
        "dropped_partitions": list(result.dropped_partitions),
    }


HOUSEKEEPING_TASKS = ("schedapp.prune_runs", "schedapp.cleanup_results")


@shared_task(name="schedapp.cleanup_results")
def cleanup_results(older_than_seconds: float | None = None, batch_size: int = 5_000) -> int:
    """Delete django-celery-results' task results older than ``older_than_seconds`` (None:
    Celery's ``result_expires``), in short batches; what ``celery.backend_cleanup`` does,
    without Celery's internal task (the default allowlist denies ``celery.*``)."""
    from django.apps import apps
    from django.db import transaction

    from .celeryapp import celery_app
    from .db import db_now

    if not apps.is_installed("django_celery_results"):
        return 0
    from django_celery_results.models import TaskResult

    if older_than_seconds is None:
        expires = celery_app().conf.result_expires
        if not expires:
            return 0
        age = expires if isinstance(expires, timedelta) else timedelta(seconds=expires)
    else:
        age = timedelta(seconds=older_than_seconds)
    cutoff = db_now() - age
    deleted = 0
    while True:
        with transaction.atomic():
            ids = list(
                TaskResult.objects.filter(date_done__lt=cutoff).values_list("id", flat=True)[
                    :batch_size
                ]
            )
            if not ids:
                return deleted
            deleted += TaskResult.objects.filter(id__in=ids).delete()[0]
