"""Celery tasks schedapp runs on itself.

Prune run history every night with a job of its own::

    api.schedule("schedapp.prune_runs", cron="0 3 * * *", name="schedapp-prune",
                 kwargs={"older_than_seconds": 30 * 86400})
"""

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
    return {"deleted": result.deleted, "batches": result.batches, "cutoff": result.cutoff}
