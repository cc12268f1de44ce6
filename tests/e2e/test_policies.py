"""Per-job policies with real beats and workers: misfires, jitter, cancel, effectively-once."""

from __future__ import annotations

import time
from collections import Counter
from datetime import timedelta

import pytest

from project.models import Execution
from schedapp import api, explain
from schedapp.db import db_now
from schedapp.models import Job, JobRun, JobState, Occurrence, RunStatus
from schedapp.schedules import fire_times, parse_cron
from schedapp.testing.processes import wait_until

pytestmark = [pytest.mark.e2e]

EVERY_2S = "*/2 * * * * *"


def executed(job: Job) -> list:
    return list(
        Execution.objects.filter(job_id=job.pk)
        .order_by("scheduled_for")
        .values_list("scheduled_for", flat=True)
    )


def test_each_misfire_policy_after_all_beats_were_down(fleet):
    # Given three jobs every 2 s, one per misfire policy, with a grace of 1 s
    options = {"cron": EVERY_2S, "timezone": "UTC", "misfire_grace": 1}
    skip = api.schedule(
        "project.tasks.record",
        kwargs={"label": "skip"},
        name="skip",
        misfire_policy="skip",
        **options,
    )
    once = api.schedule(
        "project.tasks.record",
        kwargs={"label": "once"},
        name="once",
        misfire_policy="run_once",
        **options,
    )
    every = api.schedule(
        "project.tasks.record",
        kwargs={"label": "all"},
        name="all",
        misfire_policy="run_all",
        misfire_max_catchup=3,
        **options,
    )
    jobs = (skip, once, every)
    beats = [fleet.beat(), fleet.beat()]
    fleet.worker(concurrency=3)
    wait_until(lambda: all(len(executed(j)) >= 2 for j in jobs), timeout=20)
    # When every beat stops for about nine seconds (four or five occurrences)
    for beat in beats:
        beat.stop()
    wait_until(lambda: not Job.objects.filter(state=JobState.RUNNING).exists(), timeout=10)
    stopped_at = db_now()
    # What each job had decided before the stop (on a loaded machine a claim more than the
    # grace late already counts a miss): the outage's misses are counted from there
    before = {
        j.pk: Job.objects.values_list("missed_runs", "next_run_at").get(pk=j.pk) for j in jobs
    }
    time.sleep(9)
    fleet.beat()
    restarted_at = db_now()
    wait_until(lambda: db_now() > restarted_at + timedelta(seconds=5), timeout=10)

    schedule = parse_cron(EVERY_2S, "UTC")
    for job in jobs:
        job.refresh_from_db()
        times = executed(job)
        assert len(times) == len(set(times)), f"{job.name}: an occurrence ran twice"
        last_before = max(t for t in times if t <= stopped_at)
        after_outage = list(
            JobRun.objects.filter(job=job, scheduled_for__gt=last_before).order_by("scheduled_for")
        )
        assert after_outage, f"{job.name} did not run after the outage"
        # The first claim after the restart decided the misfire, at its claim time; skip
        # dispatched nothing then, so its first run is of the first occurrence after that
        first = after_outage[0]
        decided_at = (
            first.scheduled_for - timedelta(microseconds=1)
            if (job.misfire_policy == "skip")
            else first.dispatched_at
        )
        missed_before, next_at = before[job.pk]
        missed = list(fire_times(schedule, next_at - timedelta(microseconds=1), until=decided_at))
        assert len(missed) >= 4
        missed_in_outage = job.missed_runs - missed_before
        caught_up = [r.scheduled_for for r in after_outage if r.scheduled_for <= decided_at]
        if job.misfire_policy == "skip":
            # Then skip ran none of them, and counted them all
            assert caught_up == []
            assert first.scheduled_for > restarted_at - timedelta(seconds=0.5)
            assert missed_in_outage == len(missed)
        elif job.misfire_policy == "run_once":
            # run_once ran exactly one, the latest; the older ones are counted as missed
            assert caught_up == [missed[-1]]
            assert missed_in_outage == len(missed) - 1
        else:
            # run_all ran the last three (its bound), oldest first, each once
            assert caught_up == missed[-3:]
            assert missed_in_outage == len(missed) - 3
        # ... and every job went back to its regular occurrences, each run once
        later = [
            r.scheduled_for
            for r in after_outage
            if r.scheduled_for > decided_at and r.status == RunStatus.SUCCEEDED
        ]
        assert later and later == list(
            fire_times(schedule, later[0] - timedelta(seconds=2), limit=len(later))
        )
        assert set(later) <= set(times)
        # And the ledger gives every occurrence across the outage one fate: ran, or a
        # record of why not, whose counts are exactly the misses; none of those executed
        assert explain.unaccounted(job, times[0], later[-1]) == [], job.name
        records = list(Occurrence.objects.filter(job=job))
        assert sum(r.count for r in records) == job.missed_runs, job.name
        assert not [t for t in times for r in records if r.scheduled_for <= t <= r.last]
        assert {r.fate for r in records} <= {"misfired"}


def test_jitter_spreads_two_thousand_same_second_jobs_over_ten_seconds(fleet):
    fleet.beat()
    fleet.beat()
    fleet.worker(concurrency=4)
    due = db_now() + timedelta(seconds=3)
    api.schedule_many(
        {"task": "project.tasks.noop", "run_at": due, "jitter": 10, "name": f"jit-{i}"}
        for i in range(2000)
    )
    wait_until(
        lambda: Job.objects.filter(state=JobState.SUCCEEDED).count() == 2000,
        timeout=90,
        interval=1,
        message="every jittered job ran",
    )
    runs = list(JobRun.objects.values_list("scheduled_for", "due_at", "dispatched_at"))
    assert len(runs) == 2000  # none lost, none twice
    # The spread is recorded on each run (due_at - scheduled_for) ...
    spreads = [(due_at - sched).total_seconds() for sched, due_at, _ in runs]
    assert min(spreads) >= 0 and max(spreads) <= 10
    # ... and the dispatches really were spread: about 200 per second over ten seconds
    buckets = Counter(int((dispatched - due).total_seconds()) for _, _, dispatched in runs)
    assert set(buckets) <= set(range(-1, 12)), buckets
    for second in range(10):
        assert 100 <= buckets[second] <= 320, buckets


def test_cancel_while_running_stops_the_task_and_no_further_run_happens(fleet):
    fleet.beat()
    fleet.worker(concurrency=2)
    job = api.schedule(
        "project.tasks.record",
        kwargs={"label": "cancel", "sleep": 30},
        interval=2,
        name="to-cancel",
    )
    # Its first occurrence (2 s away) runs; no run_now here: if the beat claimed that occurrence
    # first (a loaded machine), run_now on a running job would raise JobStateError.
    wait_until(lambda: Execution.objects.filter(job_id=job.pk).exists(), timeout=20)
    api.cancel(job, terminate=True)
    wait_until(
        lambda: JobRun.objects.get(job=job).status == RunStatus.CANCELLED,
        timeout=15,
        message="the running task was terminated",
    )
    time.sleep(5)  # two more intervals: nothing may run
    assert JobRun.objects.filter(job=job).count() == 1
    execution = Execution.objects.get(job_id=job.pk)
    assert execution.finished_at is None  # killed before its 30 s were up
    assert Job.objects.get(pk=job.pk).state == JobState.CANCELLED


def test_once_turns_a_duplicate_delivery_of_an_occurrence_into_one_effect(fleet):
    fleet.beat()
    fleet.worker(concurrency=2)
    job = api.schedule(
        "project.tasks.record_once", kwargs={"label": "once"}, interval=3600, name="effect-once"
    )
    api.run_now(job)
    wait_until(lambda: JobRun.objects.filter(job=job, status="succeeded").count() == 1, timeout=20)
    job.refresh_from_db()
    first_run = JobRun.objects.get(job=job)
    # When the same occurrence is delivered again (as after a lost lease)
    Job.objects.filter(pk=job.pk).update(
        state=JobState.SCHEDULED, next_run_at=db_now(), scheduled_for=first_run.scheduled_for
    )
    api.update(job, priority=1)  # any API write wakes the beats
    wait_until(
        lambda: JobRun.objects.filter(job=job, status="succeeded").count() == 2,
        timeout=20,
        message="the duplicate delivery ran",
    )
    # Then the task body's effect happened once
    second_run = JobRun.objects.filter(job=job).order_by("id").last()
    assert second_run.scheduled_for == first_run.scheduled_for
    assert second_run.token != first_run.token
    assert Execution.objects.filter(job_id=job.pk).count() == 1


def test_a_recurring_job_without_retries_that_always_fails_goes_on_occurrence_after_occurrence(
    fleet,
):
    # Given "charge cards every second" as an import from Celery beat makes it: no retry, and
    # a failed occurrence followed by the next one (issue 29 item 1); its task always raises
    fleet.beat()
    fleet.worker(concurrency=2)
    job = api.schedule(
        "project.tasks.fail",
        kwargs={"label": "charge"},
        cron="* * * * * *",
        timezone="UTC",
        max_retries=0,
        when_retries_exhausted="next_occurrence",
        name="charge-cards",
    )
    # When it has failed several occurrences (one run each, never a retry)
    wait_until(
        lambda: Job.objects.get(pk=job.pk).failed_occurrences >= 4,
        timeout=60,
        message="four occurrences failed",
    )
    # Then it was never dead, each run was a first attempt for its own occurrence, and it is
    # still scheduled (or running its next occurrence)
    job.refresh_from_db()
    assert job.state in (JobState.SCHEDULED, JobState.RUNNING), job.state
    assert job.retry_count == 0
    assert "RuntimeError: charge failed on purpose" in job.last_error
    failed = list(
        JobRun.objects.filter(job=job, status=RunStatus.FAILED).values_list(
            "attempt", "scheduled_for"
        )
    )
    assert len(failed) >= 4
    assert {attempt for attempt, _ in failed} == {1}  # no retry
    occurrences = [when for _, when in failed]
    assert len(set(occurrences)) == len(occurrences)  # one run per occurrence
    assert not JobRun.objects.filter(job=job, attempt__gt=1).exists()
    assert not Job.objects.filter(pk=job.pk, state=JobState.DEAD).exists()


def test_an_imported_job_whose_task_autoretries_runs_the_tasks_retries_then_goes_on(fleet):
    # Given an imported job (no retry of its own, carry on) whose task is
    # @task(autoretry_for=(RuntimeError,), retry_backoff=1): under Celery beat each
    # occurrence runs 4 times (the task's 3 retries), then the next occurrence comes
    fleet.beat()
    fleet.worker(concurrency=2)
    job = api.schedule(
        "project.tasks.autoretry",
        kwargs={"label": "auto"},
        interval=3600,
        max_retries=0,
        when_retries_exhausted="next_occurrence",
        name="auto-imported",
    )
    first = job.scheduled_for
    Job.objects.filter(pk=job.pk).update(next_run_at=db_now())
    wait_until(
        lambda: Job.objects.get(pk=job.pk).failed_occurrences == 1,
        timeout=60,
        message="the occurrence given up after the task's retries",
    )
    job.refresh_from_db()
    # Then the task's retries ran (self.request.retries 0..3), and the job waits for its next
    # occurrence instead of going dead
    labels = list(
        Execution.objects.filter(job_id=job.pk).order_by("id").values_list("label", flat=True)
    )
    assert labels == ["auto:0", "auto:1", "auto:2", "auto:3"]
    runs = list(JobRun.objects.filter(job=job).order_by("id"))
    assert [r.attempt for r in runs] == [1, 2, 3, 4]
    assert {r.scheduled_for for r in runs} == {first}
    assert (job.state, job.retry_count) == (JobState.SCHEDULED, 0)
    assert job.scheduled_for == first + timedelta(hours=1)
    assert job.last_error == "RuntimeError: auto fails on purpose"
