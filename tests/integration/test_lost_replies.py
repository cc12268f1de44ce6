"""Retried writes after a lost reply: the COMMIT lands, the reply never reaches the worker,
the worker's hook tries again, and the second attempt changes nothing (lesson 16).

A fault-injecting proxy (schedapp.testing.pgproxy) sits between Django and PostgreSQL: it
forwards the write, lets the server commit, swallows the server's answer and cuts the
connection. The worker hooks then retry exactly as they do in a worker (``db.with_retries``)."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace

import pytest

from schedapp import api, lease
from schedapp.db import db_now
from schedapp.lease import claim_due_jobs
from schedapp.message import RunHeaders
from schedapp.models import Job, JobRun, JobState, RunStatus
from schedapp.testing.pgproxy import django_through
from schedapp.worker import Outcome, WorkerHooks
from tests.claiming import claim_one

pytestmark = pytest.mark.django_db(transaction=True)

# Fragments that occur only in the statement under test (Django inlines parameters into the
# text, so a fragment must not be something a value could contain): the worker's functions.
DOOR = b"SELECT schedapp_admit_run_v6("
FAST_SUCCESS = b"SELECT schedapp_succeed_run_v5("


def claimed(**options) -> lease.ClaimedRun:
    return claim_one(name="job", **options)[1]


def headers_of(run: lease.ClaimedRun) -> RunHeaders:
    from schedapp.dispatch import message_headers

    return RunHeaders.read(message_headers(run, "test"))  # type: ignore[return-value]


def test_a_door_whose_reply_was_lost_admits_its_run_on_retry(pg_proxy):
    run = claimed(lease_seconds=30)
    hooks = WorkerHooks()
    task = SimpleNamespace(request=SimpleNamespace(hostname="w1@host"))
    pg_proxy.cut_after(DOOR)
    with django_through(pg_proxy):
        hooks.door.admit(task, run.task_id)  # raises Ignore if it refused the run
    assert pg_proxy.stats()["cuts"] == 1  # the first attempt committed, its reply was lost
    # The retry recognised its own admission: the run starts
    r = JobRun.objects.get(pk=run.run_id)
    assert (r.status, r.worker) == (RunStatus.RUNNING, "w1@host")


def test_a_success_whose_reply_was_lost_moves_the_job_on_once(pg_proxy):
    run = claimed(interval=60)
    lease.admit_run(run.job_id, run.token, "w1", "a1")
    hooks = WorkerHooks()
    pg_proxy.cut_after(FAST_SUCCESS)
    with django_through(pg_proxy):
        hooks.completions.complete(run.task_id, lease.SUCCEEDED, headers=headers_of(run))
    assert pg_proxy.stats()["cuts"] == 1
    job = Job.objects.get(pk=run.job_id)
    # the next occurrence follows the one that ran: none was skipped by the retry
    assert job.scheduled_for == run.scheduled_for + timedelta(seconds=60)
    assert JobRun.objects.get(pk=run.run_id).status == RunStatus.SUCCEEDED


def test_a_success_committed_in_a_transaction_whose_reply_was_lost_is_applied_once(pg_proxy):
    run = claimed(interval=60)
    lease.admit_run(run.job_id, run.token, "w1", "a1")
    hooks = WorkerHooks()
    pg_proxy.cut_after()  # the COMMIT of the general completion path
    with django_through(pg_proxy):
        hooks.completions.complete(run.task_id, lease.SUCCEEDED)  # no headers: the general path
    assert pg_proxy.stats()["cuts"] == 1
    job = Job.objects.get(pk=run.job_id)
    assert job.scheduled_for == run.scheduled_for + timedelta(seconds=60)


def test_a_failure_whose_reply_was_lost_spends_one_retry(pg_proxy):
    run = claimed(max_retries=1, retry_backoff=0)
    lease.admit_run(run.job_id, run.token, "w1", "a1")
    hooks = WorkerHooks()
    pg_proxy.cut_after()
    with django_through(pg_proxy):
        hooks.completions.complete(run.task_id, lease.FAILED, error="RuntimeError: boom")
    assert pg_proxy.stats()["cuts"] == 1
    job = Job.objects.get(pk=run.job_id)
    # one failed attempt: retried, not dead
    assert (job.state, job.retry_count) == (JobState.SCHEDULED, 1)


def test_a_batch_of_successes_whose_reply_was_lost_moves_each_job_on_once(pg_proxy):
    runs = []
    for i in range(3):
        job = api.schedule("project.tasks.record", name=f"b{i}", interval=60)
        Job.objects.filter(pk=job.pk).update(next_run_at=db_now() - timedelta(seconds=1))
    runs = claim_due_jobs("beat-1", 10).runs
    for run in runs:
        lease.admit_run(run.job_id, run.token, "w1", f"a{run.token}")
    hooks = WorkerHooks()
    pg_proxy.cut_after(b"FROM schedapp_succeed_runs_v4(")
    items = [
        Outcome((r.job_id, r.token), lease.SUCCEEDED, 60.0, fields={"headers": headers_of(r)})
        for r in runs
    ]
    with django_through(pg_proxy):
        hooks.completions.record_many(items)  # what a pool process's completion writer does
    assert pg_proxy.stats()["cuts"] == 1
    for run in runs:
        job = Job.objects.get(pk=run.job_id)
        assert job.scheduled_for == run.scheduled_for + timedelta(seconds=60)
        assert JobRun.objects.get(pk=run.run_id).status == RunStatus.SUCCEEDED


@pytest.mark.parametrize("successes", [1, 2])
def test_a_door_carrying_successes_whose_reply_was_lost_applies_each_once(pg_proxy, successes):
    # Given recurring runs that succeeded in a pool process, waiting for its next door
    done = []
    for i in range(successes):
        run = claim_one(name=f"every-minute-{i}", interval=60)[1]
        lease.admit_run(run.job_id, run.token, "w1", f"a{i}")
        done.append(run)
    nxt = claimed(lease_seconds=30)
    hooks = WorkerHooks()
    hooks.completions.open_pending(linger=3600)  # only the door writes
    for run in done:
        hooks.completions.complete(run.task_id, lease.SUCCEEDED, headers=headers_of(run))
    task = SimpleNamespace(request=SimpleNamespace(hostname="w1@host"))
    # When the door's statement, carrying them, commits and its reply is lost
    pg_proxy.cut_after(b"schedapp_admit_run_v6(")
    with django_through(pg_proxy):
        hooks.door.admit(task, nxt.task_id)  # raises Ignore if it refused the run
    assert pg_proxy.stats()["cuts"] == 1
    # Then the retry found both done: each job moved on by one occurrence, the run started
    for run in done:
        job = Job.objects.get(pk=run.job_id)
        assert job.scheduled_for == run.scheduled_for + timedelta(seconds=60)
        assert JobRun.objects.get(pk=run.run_id).status == RunStatus.SUCCEEDED
    r = JobRun.objects.get(pk=nxt.run_id)
    assert (r.status, r.worker) == (RunStatus.RUNNING, "w1@host")
    hooks.completions.close_pending()
