"""Real ``celery beat`` and ``celery worker`` processes (``-m e2e``)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any


def renewed_past_its_lease(run: Any, lease_seconds: float) -> bool:
    """The outcome that says a run's lease was renewed: it ran longer than its lease, and was
    renewed at least once. How many renewals that took depends on the machine's load, so it is
    not counted against the wall clock (a refactor was reverted on 99 heartbeats < 100)."""
    ran = run.finished_at - run.started_at
    return ran > timedelta(seconds=lease_seconds) and run.heartbeats > 0
