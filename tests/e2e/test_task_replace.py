"""A task that replaces itself (Celery's ``Task.replace``) on a real beat and worker: the
replacement runs as the same run, under its lease, and its outcome is the run's, as under
Celery beat; a replacement schedapp cannot follow (a chain, a group) fails the run with the
reason instead of being dropped."""

from __future__ import annotations

import time

import pytest

from project.models import Execution
from schedapp import api
from schedapp.db import db_now
from schedapp.models import Job, JobRun, JobState, RunStatus
from schedapp.testing.processes import wait_until

pytestmark = [pytest.mark.e2e]

ENDED = (JobState.SUCCEEDED, JobState.DEAD, JobState.CANCELLED)


def runs_of(job: Job) -> list[JobRun]:
    return list(JobRun.objects.filter(job=job).order_by("id"))


def ended(job: Job) -> str:
    return wait_until(
        lambda: (state := Job.objects.get(pk=job.pk).state) in ENDED and state,
        timeout=40,
        message="the job ended",
    )


def executions(job: Job) -> list[tuple[str, int | None, int | None, bool]]:
    rows = Execution.objects.filter(label__startswith=job.name).order_by("id")
    return [(e.label, e.job_id, e.token, e.finished_at is not None) for e in rows]


def test_a_replaced_task_runs_its_replacement_as_the_same_run_under_its_lease(fleet):
    # Given a one-off with a 3 s lease whose task replaces itself with a task taking 4 s
    fleet.beat()
    worker = fleet.worker(concurrency=2)
    job = api.schedule(
        "project.tasks.replace_self",
        kwargs={"label": "rp", "sleep": 4},
        run_at=db_now(),
        lease_seconds=3,
        max_retries=0,
        name="rp",
    )
    # Then the replacement ran to its end as the same run (its lease renewed all along) and
    # its success is the job's
    assert ended(job) == JobState.SUCCEEDED
    (run,) = runs_of(job)
    assert (run.attempt, run.status, run.error) == (1, RunStatus.SUCCEEDED, "")
    assert executions(job) == [
        ("rp", job.pk, run.token, True),
        ("rp:record", job.pk, run.token, True),
    ]
    assert "delivered but not executed" not in worker.log()


def test_a_replacement_that_fails_fails_the_attempt(fleet):
    fleet.beat()
    fleet.worker(concurrency=2)
    job = api.schedule(
        "project.tasks.replace_self",
        kwargs={"label": "rf", "into": "fail"},
        run_at=db_now(),
        max_retries=1,
        retry_backoff=1,
        name="rf",
    )
    # Then each attempt is the replacement's failure, and follows the retry policy
    assert ended(job) == JobState.DEAD
    assert [(r.attempt, r.status, r.error) for r in runs_of(job)] == [
        (n, RunStatus.FAILED, "RuntimeError: rf:fail failed on purpose") for n in (1, 2)
    ]
    assert [label for label, *_ in executions(job)] == ["rf", "rf:fail"] * 2


@pytest.mark.parametrize("into", ["chain", "group"])
def test_a_replacement_schedapp_cannot_follow_fails_the_run_with_the_reason(fleet, into):
    fleet.beat()
    fleet.worker(concurrency=2)
    job = api.schedule(
        "project.tasks.replace_self",
        kwargs={"label": f"rc-{into}", "into": into},
        run_at=db_now(),
        max_retries=0,
        name=f"rc-{into}",
    )
    # Then the run fails, naming the limitation, and nothing of the replacement was sent
    assert ended(job) == JobState.DEAD
    (run,) = runs_of(job)
    assert run.status == RunStatus.FAILED
    assert run.error.startswith("ReplaceNotSupported: "), run.error
    assert f"a {into}" in run.error
    time.sleep(2)
    assert [label for label, *_ in executions(job)] == [f"rc-{into}"]
