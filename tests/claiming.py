"""What the claim tests start from: one job due now and claimed by a beat; a call on a thread
of its own (its own database connection), to race another."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.db import connections

from schedapp import api
from schedapp.db import db_now
from schedapp.lease import ClaimedRun, claim_due_jobs
from schedapp.models import Job


def claim_one(**options: Any) -> tuple[Job, ClaimedRun]:
    """A ``project.tasks.record`` job (a one-off due now, or recurring when ``interval`` or
    ``cron`` is given, made due now) and the run a beat claimed for it."""
    recurring = "interval" in options or "cron" in options
    if not recurring:
        options.setdefault("run_at", db_now())
    options.setdefault("name", "every-minute" if recurring else "job")
    job = api.schedule("project.tasks.record", **options)
    if recurring:
        Job.objects.filter(pk=job.pk).update(next_run_at=db_now() - timedelta(seconds=1))
    (run,) = claim_due_jobs("beat-1", 10).runs
    return job, run


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    """Run ``fn`` on its own thread, hence its own database connection: ``out["value"]`` or
    ``out["error"]``, and ``out["finished"]`` (monotonic), once the thread is joined. A
    daemon thread, so that a call left hanging by a test cannot keep the run from ending."""
    out: dict[str, Any] = {}

    def target() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:
            out["error"] = exc
        finally:
            out["finished"] = time.monotonic()
            connections.close_all()

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, out
