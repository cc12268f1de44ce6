"""The worker's door through database outages (issue 26), with a real beat and a real worker
whose connections go through the fault-injecting proxy: the door's statement commits and its
reply is lost, then the database is down for a moment, or the connection goes silent.

Giving up must not cost an attempt (design note 24): a run that never executed is never
counted as a failed attempt, and nothing runs twice. A statement that waits for a reply that
never comes is bounded, so a door does not hold its run (renewed by the main process) for as
long as the silence lasts."""

from __future__ import annotations

import pytest

from project.models import Execution
from schedapp import api
from schedapp.db import db_now
from schedapp.models import Job, JobRun, JobState, RunStatus
from schedapp.testing.processes import wait_until

pytestmark = [pytest.mark.e2e]

# The door's function, in the statement of a door alone or of one carrying successes.
DOOR = b"schedapp_admit_run_v6("
ENDED = (JobState.SUCCEEDED, JobState.DEAD, JobState.CANCELLED)


def one_off(label: str, lease: int) -> Job:
    """A one-off with no retry: a failed attempt counted for it makes it dead."""
    return api.schedule(
        "project.tasks.record",
        kwargs={"label": label},
        run_at=db_now(),
        lease_seconds=lease,
        max_retries=0,
        name=label,
    )


def assert_ran_once_and_succeeded(job: Job) -> None:
    job.refresh_from_db()
    runs = list(JobRun.objects.filter(job=job).values_list("status", "error"))
    assert (job.state, job.retry_count) == (JobState.SUCCEEDED, 0), runs
    assert [status for status, _ in runs] == [RunStatus.SUCCEEDED]
    assert Execution.objects.filter(label=job.name).count() == 1


POOLS = ["prefork", "threads", "solo"]  # the door in a pool process, a thread, the worker


@pytest.mark.parametrize("pool", POOLS)
def test_a_door_whose_reply_is_lost_in_a_short_outage_runs_its_run_once_without_an_attempt(
    fleet, pg_proxy, pool
):
    # Given a worker reaching PostgreSQL through a proxy, and a one-off with no retry left
    fleet.beat()
    worker = fleet.worker(
        pool=pool,
        concurrency=1,
        settings={"DATABASE_URL": pg_proxy.database_url(fleet.env["DATABASE_URL"])},
    )
    # When the door's statement commits, its reply is lost, and the database is down for
    # that worker for 3 s (connections refused at once: the door's retries fail fast)
    pg_proxy.cut_after(DOOR, app=worker.name, down=3)
    job = one_off("door-outage", lease=20)
    wait_until(
        lambda: Job.objects.get(pk=job.pk).state in ENDED, timeout=90, message="the job ended"
    )
    assert pg_proxy.stats()["cuts"] == 1
    # Then the door kept trying within the run's lease, found its own admission once the
    # database was back, and the run executed once: no attempt spent, not dead
    assert_ran_once_and_succeeded(job)


@pytest.mark.parametrize("pool", POOLS)
def test_a_door_whose_connection_goes_silent_lets_go_and_its_run_executes_once(
    fleet, pg_proxy, pool
):
    # Given a worker reaching PostgreSQL through a proxy, and a one-off with no retry left
    fleet.beat()
    worker = fleet.worker(
        pool=pool,
        concurrency=1,
        settings={"DATABASE_URL": pg_proxy.database_url(fleet.env["DATABASE_URL"])},
    )
    # When the door's statement commits and its connection then goes silent: no reply, no
    # reset (a network black hole, a NAT that dropped its state); new connections work,
    # and the main process's heartbeat, on its own connection, keeps renewing the lease
    pg_proxy.cut_after(DOOR, app=worker.name, silent=True)
    job = one_off("door-silence", lease=10)
    # Then the door's wait is bounded: it gives the silent connection up, tries again on a
    # new one, finds its own admission, and the run executes once, well within a minute
    # (unbounded, it waited for as long as the silence lasted, the job kept running)
    wait_until(
        lambda: Job.objects.get(pk=job.pk).state in ENDED, timeout=60, message="the job ended"
    )
    assert pg_proxy.stats()["cuts"] == 1
    assert_ran_once_and_succeeded(job)
