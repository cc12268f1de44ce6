"""Backfill with real beats and workers (issue 28, "Must show"): 10,000 occurrences across two
beats, each executed once, the throttle respected in database time, a second backfill of the
same range runs nothing, both beats took part."""

from __future__ import annotations

import os
from bisect import bisect_right
from datetime import timedelta

import pytest

from project.models import Execution
from schedapp import api
from schedapp.db import db_now
from schedapp.lease.backfill import bucket
from schedapp.models import Backfill, BackfillState, JobRun, RunKind
from schedapp.testing.processes import wait_until

pytestmark = [pytest.mark.e2e]

# BACKFILL_E2E_OCCURRENCES: a smaller run on a machine too loaded for 10,000 in minutes
OCCURRENCES = int(os.environ.get("BACKFILL_E2E_OCCURRENCES", "10000"))
RATE = 400.0


def test_ten_thousand_occurrences_across_two_beats_each_once_and_throttled(fleet):
    # Given a minutely job, and the 10,000 minutes before the last one
    end = db_now().replace(second=0, microsecond=0) - timedelta(minutes=1)
    start = end - (OCCURRENCES - 1) * timedelta(minutes=1)
    job = api.schedule(
        "project.tasks.record",
        name="backfilled",
        interval=60,
        interval_anchor=start,
        max_concurrent=1000,
    )
    fleet.beat()
    fleet.beat()
    fleet.worker(pool="threads", concurrency=8)
    fleet.worker(pool="threads", concurrency=8)
    # When it is backfilled at 400 a second
    bf = api.backfill(job, start, end, max_per_second=RATE)
    assert bf.total == OCCURRENCES

    def executed() -> int:
        return (
            Execution.objects.filter(job_id=job.pk, scheduled_for__range=(start, end))
            .order_by()
            .values("scheduled_for")
            .distinct()
            .count()
        )

    # (at 400/s about 25 s of dispatch; generous for a loaded machine's workers)
    wait_until(lambda: executed() == OCCURRENCES, timeout=120 + OCCURRENCES / 20)
    bf.refresh_from_db()
    assert bf.state == BackfillState.DONE and bf.dispatched == OCCURRENCES
    # Then each occurrence executed exactly once
    executions = Execution.objects.filter(job_id=job.pk, scheduled_for__range=(start, end))
    assert executions.count() == OCCURRENCES
    runs = JobRun.objects.filter(job=job, kind=RunKind.BACKFILL)
    assert runs.count() == OCCURRENCES
    # and no second of database time saw more than the rate plus the bucket dispatched
    times = sorted(t.timestamp() for t in runs.values_list("dispatched_at", flat=True))
    most = max(bisect_right(times, t + 1.0) - i for i, t in enumerate(times))
    assert most <= RATE + bucket(RATE), most
    # and both beats took part
    assert len(set(runs.values_list("claimed_by", flat=True))) == 2
    # And a second backfill of the same range runs nothing
    again = api.backfill(job, start, end, max_per_second=RATE)
    wait_until(lambda: Backfill.objects.get(pk=again.pk).state == BackfillState.DONE, timeout=60)
    again.refresh_from_db()
    assert again.dispatched == 0 and again.already_done == OCCURRENCES
    assert JobRun.objects.filter(job=job, kind=RunKind.BACKFILL).count() == OCCURRENCES
    assert executions.count() == OCCURRENCES
