"""The whole life of jobs with real processes: three beats and a worker over PostgreSQL, with
Redis and with RabbitMQ as the broker.

Checked from the task's own side effect (the ``Execution`` rows the task writes), not only from
schedapp's bookkeeping.
"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import pytest

from project.models import Execution
from schedapp import api
from schedapp.db import db_now
from schedapp.models import Job, JobRun, JobState, RunStatus
from schedapp.schedules import fire_times, parse_cron
from schedapp.testing.processes import wait_until

pytestmark = [pytest.mark.e2e]


def test_three_beats_share_a_burst_and_run_every_occurrence_exactly_once(fleet_on_each_broker):
    fleet = fleet_on_each_broker
    # Given three beats and one worker running
    beats = [fleet.beat() for _ in range(3)]
    fleet.worker(concurrency=4)
    now = db_now()
    burst_at = now + timedelta(seconds=6)
    # ... 1,000 one-off jobs due at the same instant
    api.schedule_many(
        {
            "task": "project.tasks.record",
            "kwargs": {"label": f"burst-{i}"},
            "run_at": burst_at,
            "name": f"burst-{i}",
        }
        for i in range(1000)
    )
    # ... and recurring jobs: intervals and a 6-field cron with seconds
    every2 = api.schedule(
        "project.tasks.record", kwargs={"label": "every2"}, interval=2, name="every2"
    )
    every3 = api.schedule(
        "project.tasks.record",
        kwargs={"label": "every3"},
        interval=timedelta(seconds=3),
        name="every3",
    )
    cron5 = api.schedule(
        "project.tasks.record",
        kwargs={"label": "cron5"},
        cron="*/5 * * * * *",
        timezone="Europe/Paris",
        name="cron5",
    )

    # When they run for about 30 seconds
    wait_until(
        lambda: Execution.objects.filter(label__startswith="burst-").count() >= 1000,
        timeout=60,
        message="the burst executed",
    )
    window_end = now + timedelta(seconds=30)
    wait_until(lambda: db_now() >= window_end + timedelta(seconds=2), timeout=40)
    for beat in beats:
        beat.stop()
    wait_until(
        lambda: not JobRun.objects.filter(status__in=["dispatched", "running"]).exists(),
        timeout=20,
        message="in-flight runs finished",
    )

    # Then every one-off job executed exactly once
    burst = Counter(
        Execution.objects.filter(label__startswith="burst-").values_list("label", flat=True)
    )
    assert len(burst) == 1000
    assert set(burst.values()) == {1}
    assert Job.objects.filter(name__startswith="burst-", state=JobState.SUCCEEDED).count() == 1000
    # ... the burst was shared by more than one beat (default batch size)
    claimers = set(
        JobRun.objects.filter(job__name__startswith="burst-").values_list("claimed_by", flat=True)
    )
    assert len(claimers) > 1, claimers
    # ... every recurring occurrence in the window ran exactly once, none skipped
    for job, schedule in (
        (every2, None),
        (every3, None),
        (cron5, parse_cron("*/5 * * * * *", "Europe/Paris")),
    ):
        job.refresh_from_db()
        runs = list(
            Execution.objects.filter(job_id=job.pk)
            .order_by("scheduled_for")
            .values_list("scheduled_for", flat=True)
        )
        assert len(runs) == len(set(runs)), f"{job.name} ran an occurrence twice"
        first = runs[0]
        if schedule is None:
            expected = [first + k * job.interval for k in range(len(runs) + 5)]
        else:
            expected = [first, *fire_times(schedule, first, limit=len(runs) + 5)]
        in_window = [t for t in expected if t <= window_end]
        assert runs[: len(in_window)] == in_window, f"{job.name} missed an occurrence"
        assert len(in_window) >= 5
    # ... and no job is left claimed
    assert not Job.objects.filter(state=JobState.RUNNING).exists()
    assert not Job.objects.exclude(claimed_by="").exists()
    assert not JobRun.objects.filter(status=RunStatus.LOST).exists()
