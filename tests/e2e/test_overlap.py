"""Each overlap policy with real beats and a real worker: jobs whose runs (2.5 s) outlast
their interval (1 s). Every occurrence from a job's first run to its last has exactly one fate:
it ran (once), or the ledger says why not."""

from __future__ import annotations

from datetime import datetime, timedelta
from itertools import pairwise

import pytest

from project.models import Execution
from schedapp import api
from schedapp.models import Job, JobRun, Occurrence, RunStatus
from schedapp.schedules import fire_times
from schedapp.testing.processes import wait_until

pytestmark = [pytest.mark.e2e]

SECOND = timedelta(seconds=1)
RUNS = 4  # finished runs per job before the checks


def finished(job: Job) -> list[Execution]:
    return list(
        Execution.objects.filter(job_id=job.pk, finished_at__isnull=False).order_by("started_at")
    )


def fates(job: Job, until: datetime) -> dict[datetime, list[str]]:
    """Every occurrence of the job from its first run to ``until``, with what became of it."""
    runs = list(JobRun.objects.filter(job=job).order_by("scheduled_for"))
    first = runs[0].scheduled_for
    said: dict[datetime, list[str]] = {
        t: [] for t in fire_times(job.schedule, first - timedelta(microseconds=1), until)
    }
    for run in runs:
        if run.scheduled_for in said and run.status == RunStatus.SUCCEEDED:
            said[run.scheduled_for].append("ran")
    for record in Occurrence.objects.filter(job=job):
        for t in fire_times(
            job.schedule, record.scheduled_for - timedelta(microseconds=1), record.last
        ):
            if t in said:
                said[t].append(record.fate)
    return said


def test_each_overlap_policy_with_runs_that_outlast_their_interval(fleet):
    # Given three jobs every second whose task takes 2.5 s, one per overlap policy (a grace
    # of a minute: lateness alone never makes a misfire here)
    options = {"interval": 1, "misfire_grace": 60, "kwargs": {"sleep": 2.5}}
    jobs = {
        policy: api.schedule(
            "project.tasks.record", name=f"overlap-{policy}", overlap=policy, **options
        )
        for policy in ("skip", "buffer_one", "buffer_all")
    }
    Job.objects.filter(pk=jobs["buffer_all"].pk).update(max_buffer=2)
    # When two beats and a worker with room for all of them run them
    fleet.beat()
    fleet.beat()
    fleet.worker(concurrency=4)
    wait_until(lambda: all(len(finished(j)) >= RUNS for j in jobs.values()), timeout=60)
    for job in jobs.values():
        job.refresh_from_db()
    # Then no job ever ran two runs at once
    for policy, job in jobs.items():
        runs = finished(job)
        for before, after in pairwise(runs):
            assert after.started_at >= before.finished_at, f"{policy}: runs overlapped"
    # skip: the occurrences that came due during a run were skipped and recorded as such;
    # the next run is of the first occurrence after the run ended
    skip = jobs["skip"]
    ran = [e.scheduled_for for e in finished(skip)]
    assert all(b - a >= 3 * SECOND for a, b in pairwise(ran)), ran
    said = fates(skip, ran[RUNS - 1])
    assert all(len(f) == 1 for f in said.values()), said
    assert {f[0] for f in said.values()} == {"ran", "overlapped"}
    # buffer_one: the next occurrence waited for each run, then ran (within its grace)
    one = jobs["buffer_one"]
    ran = [e.scheduled_for for e in finished(one)]
    assert all(b - a == SECOND for a, b in pairwise(ran)), ran
    assert not Occurrence.objects.filter(job=one).exists()
    # buffer_all (at most 2 waiting): the buffered ones ran in order, the oldest beyond the
    # bound were dropped and recorded
    every = jobs["buffer_all"]
    ran = [e.scheduled_for for e in finished(every)]
    assert ran == sorted(ran) and len(set(ran)) == len(ran)
    said = fates(every, ran[RUNS - 1])
    assert all(len(f) == 1 for f in said.values()), said
    assert {f[0] for f in said.values()} == {"ran", "buffer_full"}
    # Every run of each job was for its own occurrence, once
    for policy, job in jobs.items():
        times = [e.scheduled_for for e in Execution.objects.filter(job_id=job.pk)]
        assert len(times) == len(set(times)), f"{policy}: an occurrence ran twice"


def test_a_fixed_delay_job_waits_its_interval_after_each_run(fleet):
    # Given a job every 2 s counted from the end of each run, whose task takes 1.5 s
    job = api.schedule(
        "project.tasks.record",
        name="fixed-delay",
        interval=2,
        fixed_delay=True,
        kwargs={"sleep": 1.5},
    )
    fleet.beat()
    fleet.worker(concurrency=2)
    wait_until(lambda: len(finished(job)) >= 3, timeout=40)
    runs = finished(job)
    # Then each run starts at least the interval after the previous one finished
    for before, after in pairwise(runs):
        assert after.started_at - before.finished_at >= 2 * SECOND - timedelta(milliseconds=50)
        assert after.scheduled_for - before.finished_at >= timedelta(seconds=1.9)
    assert not Occurrence.objects.filter(job=job).exists()


def test_terminate_other_kills_the_run_in_flight_when_the_next_occurrence_comes(fleet):
    # Given a job every 3 s whose task would take 30 s, on a prefork worker
    job = api.schedule(
        "project.tasks.record",
        name="terminate-other",
        interval=3,
        overlap="terminate_other",
        max_retries=3,
        kwargs={"sleep": 30},
    )
    fleet.beat()
    fleet.beat()
    fleet.worker(concurrency=2)
    # When three runs have started
    wait_until(lambda: Execution.objects.filter(job_id=job.pk).count() >= 3, timeout=60)
    # Then each run before the latest was terminated (SIGTERM) when the next came due: never
    # finished, closed cancelled as superseded, not retried (attempt 1 each), and no two ran
    # at once; each next run was for the occurrence that superseded it
    wait_until(
        lambda: JobRun.objects.filter(job=job, status=RunStatus.CANCELLED).count() >= 2, timeout=30
    )
    executions = list(Execution.objects.filter(job_id=job.pk).order_by("started_at"))
    cancelled = list(JobRun.objects.filter(job=job, status=RunStatus.CANCELLED).order_by("token"))
    assert all("superseded" in r.error and r.attempt == 1 for r in cancelled), cancelled
    assert all(e.finished_at is None for e in executions)  # killed, none ran its 30 s
    ends = {r.scheduled_for: r.finished_at for r in JobRun.objects.filter(job=job)}
    for before, after in pairwise(executions):
        assert after.scheduled_for > before.scheduled_for
        assert after.started_at >= ends[before.scheduled_for] - timedelta(milliseconds=50)
    assert not JobRun.objects.filter(job=job, attempt__gt=1).exists()


def test_cancel_other_lets_the_run_end_then_runs_the_latest_occurrence(fleet):
    # Given a job every 2 s whose task takes 5 s: Celery cannot interrupt a running task, so
    # the revoke finds nothing to discard; the run ends, and the latest occurrence runs then
    job = api.schedule(
        "project.tasks.record",
        name="cancel-other",
        interval=2,
        overlap="cancel_other",
        kwargs={"sleep": 5},
    )
    fleet.beat()
    fleet.worker(concurrency=2)
    wait_until(lambda: len(finished(job)) >= 3, timeout=60)
    runs = finished(job)
    ended = {r.scheduled_for: r.finished_at for r in JobRun.objects.filter(job=job)}
    for before, after in pairwise(runs):
        assert after.started_at >= before.finished_at  # never two at once
        # the one run after each is the latest occurrence due when it ended (in the
        # database's clock, which recorded the end)
        assert ended[before.scheduled_for] - 2 * SECOND < after.scheduled_for
        assert after.scheduled_for <= ended[before.scheduled_for]
    said = fates(job, runs[2].scheduled_for)
    assert all(len(f) == 1 for f in said.values()), said
    assert {f[0] for f in said.values()} == {"ran", "overlapped"}
