"""Each worker pool and pool setting a Celery team uses, with real workers: a run executes
again only when its lease was really lost, and every run ends recorded (succeeded, failed ...),
never left ``running`` to be reaped as lost and run again."""

from __future__ import annotations

import signal
import time
from collections import Counter
from datetime import timedelta

import pytest
from django.db import connection

from project.models import Execution
from schedapp import api
from schedapp.db import db_now
from schedapp.models import Job, JobRun, JobState, RunStatus
from schedapp.testing.processes import Proc, wait_until
from tests.e2e import renewed_past_its_lease

pytestmark = [pytest.mark.e2e]

LEASE = 3  # seconds; the long tasks take twice that: only renewals keep them from running again
# The others' lease: long enough to wait in the queue behind the long ones without being sent
# again (which is a backlog's ordinary behaviour, but slows the test down).
QUEUED_LEASE = 20


def schedule_a_mix(shorts: int) -> None:
    """One-offs due now, as a Celery team's jobs are: two tasks longer than their lease (one
    sleeping, one computing without pause), one that fails, one that asks Celery to retry it,
    and ``shorts`` quick ones."""
    now = db_now()
    long = {"run_at": now, "lease_seconds": LEASE}
    for name, busy in (("waits", False), ("computes", True)):
        api.schedule(
            "project.tasks.record",
            kwargs={"label": name, "sleep": 2 * LEASE, "busy": busy},
            name=name,
            **long,
        )
    failing = {"run_at": now, "lease_seconds": QUEUED_LEASE, "max_retries": 1, "retry_backoff": 0}
    api.schedule("project.tasks.fail", kwargs={"label": "fails"}, name="fails", **failing)
    api.schedule(
        "project.tasks.retry_self",
        kwargs={"label": "retries", "countdown": 0},
        name="retries",
        **failing,
    )
    api.schedule_many(
        {
            "task": "project.tasks.record",
            "kwargs": {"label": f"short-{i}"},
            "run_at": now + timedelta(seconds=i * 0.1),
            "lease_seconds": QUEUED_LEASE,
            "name": f"short-{i}",
        }
        for i in range(shorts)
    )


def all_ended(count: int) -> bool:
    return Job.objects.filter(state__in=[JobState.SUCCEEDED, JobState.DEAD]).count() == count


def assert_each_ran_once_and_ended_recorded(shorts: int) -> None:
    """Every execution the mix should have had, no other, and each run that started closed
    by its worker."""
    time.sleep(1)  # time for a second execution to show, if one were under way
    executed = Counter(Execution.objects.values_list("label", flat=True))
    expected = {"waits": 1, "computes": 1, "fails": 2, "retries": 2}
    assert executed == {**expected, **{f"short-{i}": 1 for i in range(shorts)}}
    started = JobRun.objects.filter(started_at__isnull=False).order_by("id")
    runs: dict[str, list[tuple[str, bool]]] = {}
    for run in started.select_related("job"):
        runs.setdefault(run.job.name, []).append((run.status, run.stale))
    succeeded, failed = (RunStatus.SUCCEEDED, False), (RunStatus.FAILED, False)
    assert runs == {
        **{f"short-{i}": [succeeded] for i in range(shorts)},
        "waits": [succeeded],
        "computes": [succeeded],
        "fails": [failed, failed],
        "retries": [failed, failed],
    }
    # the long ones were renewed while they ran past their lease, the computing one too
    long = {r.job.name: r for r in started.filter(job__name__in=["waits", "computes"])}
    assert all(renewed_past_its_lease(r, LEASE) for r in long.values()), [
        (name, r.started_at, r.finished_at, r.heartbeats) for name, r in long.items()
    ]
    dead = Job.objects.filter(name__in=["fails", "retries"], state=JobState.DEAD)
    assert dead.count() == 2


def connections_of(proc: Proc) -> int:
    """Database connections the process (and its pool) holds open now."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND application_name = %s",
            [proc.name],
        )
        return cursor.fetchone()[0]


def assert_no_connection_trouble(worker: Proc) -> None:
    log = worker.log()
    for symptom in ("already closed", "InterfaceError", "could not record", "could not check"):
        assert symptom not in log, symptom


# --- threads ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "reuse", ["1000", "null"], ids=["connections-reused", "connections-closed-around-each-task"]
)
def test_the_threads_pool_admits_renews_and_records_every_run_on_one_connection_a_thread(
    fleet, reuse
):
    # Given a worker with four threads, its database connections reused across tasks
    # (CELERY_DB_REUSE_MAX) or, Celery's default, closed around each task
    fleet.beat()
    worker = fleet.worker(pool="threads", concurrency=4, settings={"PROJECT_DB_REUSE_MAX": reuse})
    # When it runs long, computing, failing, retried and quick tasks side by side
    shorts = 24
    schedule_a_mix(shorts)
    open_connections = []

    def ended() -> bool:
        open_connections.append(connections_of(worker))
        return all_ended(4 + shorts)

    wait_until(ended, timeout=60, interval=0.3, message="every job ended")
    # Then each ran once (twice for the failing ones, which allow one retry), each run
    # recorded as it ended, the long ones renewed while they ran ...
    assert_each_ran_once_and_ended_recorded(shorts)
    # ... on one connection per thread (and one each for the lease heartbeat and the main
    # thread), none left behind by a task or found closed under a task
    assert max(open_connections) <= 4 + 2, open_connections
    assert connections_of(worker) <= 4 + 2
    assert_no_connection_trouble(worker)


# --- prefork pool processes recycled -----------------------------------------------------------


@pytest.mark.parametrize(
    "recycle",
    [["--max-tasks-per-child", "1"], ["--max-memory-per-child", "1"]],
    ids=["max-tasks-per-child", "max-memory-per-child"],
)
def test_pool_processes_recycled_after_each_task_record_every_run(fleet, recycle):
    # Given a prefork worker whose pool processes exit after each task (one task per child,
    # or a memory limit of 1 KiB that every process exceeds): none has a next door to carry
    # its success
    fleet.beat()
    worker = fleet.worker(concurrency=2, extra_args=recycle)
    # When it runs long, computing, failing, retried and quick tasks
    shorts = 4
    schedule_a_mix(shorts)
    wait_until(lambda: all_ended(4 + shorts), timeout=60, interval=0.3, message="jobs ended")
    # Then each success was recorded by the process that ran it, on its way out
    assert_each_ran_once_and_ended_recorded(shorts)
    assert_no_connection_trouble(worker)
    pids = set(Execution.objects.values_list("pid", flat=True))
    assert len(pids) == Execution.objects.count()  # a fresh process for every execution


def test_a_pool_process_recycled_during_a_database_outage_records_its_success_within_the_lease(
    fleet, pg_proxy
):
    # Given a prefork worker whose pool process exits after each task, reaching PostgreSQL
    # through a proxy, and a task with a 50 s lease, running
    fleet.beat()
    worker = fleet.worker(
        concurrency=1,
        extra_args=["--max-tasks-per-child", "1"],
        settings={"DATABASE_URL": pg_proxy.database_url(fleet.env["DATABASE_URL"])},
    )
    job = api.schedule(
        "project.tasks.nap",
        kwargs={"seconds": 2},
        run_at=db_now(),
        lease_seconds=50,
        max_retries=1,
        retry_backoff=0,
        name="nap",
    )
    wait_until(
        lambda: JobRun.objects.filter(job=job, started_at__isnull=False).exists(),
        timeout=30,
        message="the task started",
    )
    # When the worker's network to the database is cut from just before the task ends, for
    # 35 s, its connections found dead afterwards (a failover), while its pool process, done,
    # is on its way out
    outage = 35
    pg_proxy.blackhole(outage, reset=True, app=worker.name)
    time.sleep(outage)
    # Then the process waited for its success to be written rather than exit with it: the run
    # succeeded once the database was back, well within its lease, and ran once
    wait_until(
        lambda: Job.objects.get(pk=job.pk).state == JobState.SUCCEEDED,
        timeout=10,
        message="the success recorded after the outage",
    )
    (run,) = JobRun.objects.filter(job=job)
    assert (run.status, run.stale) == (RunStatus.SUCCEEDED, False)


def test_pool_processes_the_autoscaler_stops_record_their_successes_first(fleet, pg_proxy):
    # Given a prefork worker that autoscales between two processes and none, shrinking a
    # second after its last message, and reaches PostgreSQL through a proxy
    fleet.beat()
    worker = fleet.worker(
        concurrency=2,
        extra_args=["--autoscale=2,0"],
        settings={
            "AUTOSCALE_KEEPALIVE": 1,
            "DATABASE_URL": pg_proxy.database_url(fleet.env["DATABASE_URL"]),
        },
    )
    # ... running two tasks
    now = db_now()
    for i in range(2):
        api.schedule(
            "project.tasks.nap",
            kwargs={"seconds": 2},
            run_at=now,
            lease_seconds=20,
            max_retries=1,
            retry_backoff=0,
            name=f"nap-{i}",
        )
    wait_until(
        lambda: JobRun.objects.filter(started_at__isnull=False).count() == 2,
        timeout=30,
        message="the tasks started",
    )
    # When the worker's network to the database is cut for 6 s as they end, and the
    # autoscaler stops both processes (SIGTERM) while their successes wait to be written
    pg_proxy.blackhole(6, reset=True, app=worker.name)
    wait_until(lambda: "Scaling down 2 processes" in worker.log(), timeout=6, message="shrink")
    # Then each process wrote its success before it exited: both ran once and succeeded
    wait_until(lambda: all_ended(2), timeout=15, message="the successes recorded")
    assert [r.status for r in JobRun.objects.order_by("id")] == [RunStatus.SUCCEEDED] * 2


# --- solo ------------------------------------------------------------------------------------


def test_a_solo_worker_stopped_as_its_task_ends_records_the_success_before_it_exits(
    fleet, pg_proxy
):
    # Given a solo worker, whose successes wait for its next door as a pool process's do,
    # reaching PostgreSQL through a proxy, running a task
    fleet.beat()
    worker = fleet.worker(
        pool="solo",
        concurrency=1,
        settings={"DATABASE_URL": pg_proxy.database_url(fleet.env["DATABASE_URL"])},
    )
    job = api.schedule(
        "project.tasks.nap", kwargs={"seconds": 2}, run_at=db_now(), lease_seconds=30, name="nap"
    )
    wait_until(
        lambda: JobRun.objects.filter(job=job, started_at__isnull=False).exists(),
        timeout=30,
        message="the task started",
    )
    # When it is stopped (SIGTERM: a warm shutdown, which lets the task finish), and its
    # network to the database is cut for 4 s as the task ends
    worker.signal_main(signal.SIGTERM)
    pg_proxy.blackhole(4, reset=True, app=worker.name)
    worker.popen.wait(timeout=30)
    # Then it wrote the success before it exited: the run is not left running, to be reaped
    # and run again
    (run,) = JobRun.objects.filter(job=job)
    assert (run.status, run.stale) == (RunStatus.SUCCEEDED, False)


# --- green pools ------------------------------------------------------------------------------


@pytest.mark.parametrize("pool", ["gevent", "eventlet"])
def test_a_green_pool_worker_fails_schedapp_runs_without_executing_them(fleet, pool):
    # Given a worker on a green pool, where a task that does not yield stops every greenlet,
    # the lease heartbeat's too (measured: a task computing for 7 s with a 3 s lease stopped
    # every renewal, and the runs of that worker, its other tasks', executed twice)
    from project.tasks import add

    fleet.beat()
    worker = fleet.worker(pool=pool, concurrency=4)
    # Then it says at start that it will execute no schedapp run, why, and what to use
    assert f"this worker runs the {pool} pool" in worker.log()
    assert "-P threads" in worker.log()
    # When a job's run reaches it
    job = api.schedule(
        "project.tasks.record",
        kwargs={"label": pool},
        run_at=db_now(),
        lease_seconds=LEASE,
        max_retries=0,
        name=pool,
    )
    wait_until(
        lambda: Job.objects.get(pk=job.pk).state == JobState.DEAD,
        timeout=30,
        message="the job failed",
    )
    # Then the run failed without executing, the reason on the run and the job
    assert not Execution.objects.exists()
    (run,) = JobRun.objects.filter(job=job)
    assert run.status == RunStatus.FAILED
    assert f"runs the {pool} pool" in run.error
    assert Job.objects.get(pk=job.pk).last_error == run.error
    # ... and the worker runs the project's other tasks as before
    sent = add.apply_async((2, 3))
    wait_until(
        lambda: f"project.tasks.add[{sent.id}] succeeded" in worker.log(),
        timeout=20,
        message="a plain task ran",
    )
