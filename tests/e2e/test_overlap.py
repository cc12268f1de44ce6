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


def recorded(job: Job, count: int) -> bool:
    """``count`` executions finished, and the success of as many runs recorded: a run's
    success is written after its task returned (with the worker's next door, or within 5 ms),
    so a finished execution's run can still read as running for a moment."""
    return (
        len(finished(job)) >= count
        and JobRun.objects.filter(job=job, status=RunStatus.SUCCEEDED).count() >= count
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
    wait_until(lambda: all(recorded(j, RUNS) for j in jobs.values()), timeout=60)
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
    wait_until(lambda: recorded(job, 3), timeout=60)
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


def most_at_once(executions: list[Execution]) -> int:
    """The most executions of a job running at the same instant (each start counted against
    the executions started before it and not yet finished)."""
    return max(
        sum(
            1
            for other in executions
            if other.started_at <= e.started_at
            and (other.finished_at is None or other.finished_at > e.started_at)
        )
        for e in executions
    )


def test_allow_all_runs_three_at_once_when_its_runs_outlast_its_interval(fleet):
    # Given a job every second whose task takes 3.5 s, allow_all with max_concurrent = 3
    job = api.schedule(
        "project.tasks.record",
        name="allow-all",
        interval=1,
        misfire_grace=60,
        overlap="allow_all",
        max_concurrent=3,
        max_retries=0,
        kwargs={"sleep": 3.5},
    )
    # When two beats and a worker with room for more than three run it
    fleet.beat()
    fleet.beat()
    fleet.worker(concurrency=5)
    wait_until(lambda: len(finished(job)) >= 6, timeout=60)
    ran = sorted(e.scheduled_for for e in finished(job))
    # (each finished execution's run: its success is written after its task returned)
    runs = JobRun.objects.filter(job=job, scheduled_for__in=ran)
    wait_until(lambda: all(r.status == RunStatus.SUCCEEDED for r in runs.all()), timeout=10)
    executions = list(Execution.objects.filter(job_id=job.pk).order_by("started_at"))
    # Then three ran at once, never more; each for its own occurrence, once (three started
    # together may start in any order on the pool)
    assert most_at_once(executions) == 3
    times = [e.scheduled_for for e in executions]
    assert len(times) == len(set(times)), "an occurrence ran twice"
    # every occurrence from the first run on started (none skipped: each waited for a slot
    # within its grace), and each run held its own lease, released when it ended
    expected = fire_times(job.schedule, ran[0] - timedelta(microseconds=1), ran[-1])
    assert [t for t in expected if t not in times] == []
    assert all(r.own_lease and r.status == RunStatus.SUCCEEDED and not r.stale for r in runs)
    assert all(r.lease_expires_at is None for r in runs)
    assert not Occurrence.objects.filter(job=job).exists()


def test_allow_all_survives_a_worker_killed_mid_run_losing_only_its_runs(fleet):
    # Given an allow_all job (max_concurrent = 3, one retry, no backoff) whose runs outlast
    # its interval, on two workers of two processes each
    fleet.beat()
    doomed = fleet.worker(concurrency=2, heartbeat=1)
    survivor = fleet.worker(concurrency=2, heartbeat=1)
    job = api.schedule(
        "project.tasks.record",
        name="allow-all-killed",
        interval=1,
        misfire_grace=60,
        overlap="allow_all",
        max_concurrent=3,
        max_retries=1,
        retry_backoff=0,
        lease_seconds=3,
        kwargs={"sleep": 5},
    )

    def in_flight_on_each() -> dict[str, list[Execution]]:
        running = Execution.objects.filter(job_id=job.pk, finished_at__isnull=True)
        by_worker: dict[str, list[Execution]] = {}
        for execution in running:
            by_worker.setdefault(execution.worker.split("@")[0], []).append(execution)
        return by_worker

    wait_until(
        lambda: {doomed.name, survivor.name} <= set(in_flight_on_each()),
        timeout=40,
        message="a run in flight on each worker",
    )
    # When one worker is SIGKILLed with runs in flight (no cleanup of any kind)
    doomed.kill()
    at_kill = in_flight_on_each()
    killed = {e.scheduled_for for e in at_kill.get(doomed.name, [])}
    untouched = {e.token: e for e in at_kill.get(survivor.name, [])}
    assert killed and untouched

    def succeeded(times: set[datetime]) -> bool:
        done = JobRun.objects.filter(job=job, scheduled_for__in=times, status=RunStatus.SUCCEEDED)
        return {r.scheduled_for for r in done} == times

    # Then each occurrence the killed worker was running is run again (its retry), and
    # succeeds elsewhere
    wait_until(lambda: succeeded(killed), timeout=60, message="the lost runs ran again")
    for when in killed:
        runs = list(JobRun.objects.filter(job=job, scheduled_for=when).order_by("token"))
        lost = [r for r in runs if r.status == RunStatus.LOST]
        assert lost and lost[0].worker.startswith(doomed.name), runs
        done = [r for r in runs if r.status == RunStatus.SUCCEEDED]
        assert len(done) == 1 and done[0].attempt == 2, runs
        assert done[0].worker.startswith(survivor.name)
    # ... the survivor's runs in flight at the kill finished untouched, their first attempt
    wait_until(
        lambda: all(
            JobRun.objects.get(job=job, token=token).status == RunStatus.SUCCEEDED
            for token in untouched
        ),
        timeout=30,
    )
    for token in untouched:
        run = JobRun.objects.get(job=job, token=token)
        assert run.attempt == 1 and not run.stale and run.worker.startswith(survivor.name)
    # ... and nothing executed twice that was not lost: an occurrence with two executions is
    # one the kill interrupted (its first never finished)
    by_occurrence: dict[datetime, list[Execution]] = {}
    for e in Execution.objects.filter(job_id=job.pk).order_by("id"):
        by_occurrence.setdefault(e.scheduled_for, []).append(e)
    for when, executions in by_occurrence.items():
        if len(executions) > 1:
            assert when in killed, (when, executions)
            assert len(executions) == 2 and executions[0].finished_at is None
    assert survivor.alive()
