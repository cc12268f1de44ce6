"""How a Celery team starts, stops and embeds beat keeps working under ``-S
schedapp.beat:LeaseScheduler``: real ``celery beat`` and ``celery worker -B`` processes, over
Redis and the test database. Each test names its run time on this 2-core machine."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

import psutil
import psycopg
import pytest
from django.db import connection

from project.models import Execution
from schedapp import api
from schedapp.db import db_now
from schedapp.models import Job, JobRun, JobState, Node
from tests.fleet import wait_until

pytestmark = [pytest.mark.e2e]
TASK = "project.tasks.record"


@contextmanager
def table_locked(table: str) -> Iterator[psycopg.Connection]:
    """Another session holds ``table`` (as a long migration or a VACUUM FULL would): every
    statement of a beat that touches it waits, mid-tick. Released when the block ends."""
    params = connection.get_connection_params()
    with psycopg.connect(**params) as locker:
        locker.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
        yield locker
        locker.rollback()


def waiting_on_a_lock(name: str) -> bool:
    """Whether a connection of process ``name`` (its application_name) waits on a lock."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
            "AND wait_event_type = 'Lock'",
            [name],
        )
        return cursor.fetchone()[0] > 0


@pytest.mark.parametrize(
    ("sig", "table"),
    [
        (signal.SIGTERM, "schedapp_jobrun"),  # in its first claim
        (signal.SIGINT, "schedapp_jobrun"),
        (signal.SIGTERM, "schedapp_job"),  # in its setup (declared jobs synced)
    ],
    ids=["SIGTERM-claiming", "SIGINT-claiming", "SIGTERM-starting"],
)
def test_a_beat_stopped_in_the_middle_of_a_statement_exits_at_once_and_strands_nothing(
    fleet, sig, table
):
    """About 6 s each. ``celery beat``'s SIGTERM and SIGINT (Ctrl-C) handler closes the
    scheduler from inside whatever the beat was doing, then raises SystemExit. Before, a beat
    stopped while one of its statements ran hung for ever: closing used the connection of the
    statement it had interrupted (psycopg's connection lock), so only SIGKILL ended it; one
    stopped in its setup hung the same way in a second scheduler Celery built to close."""
    # Given a job due now, and a beat whose first claim (or its setup) waits on a table
    # another session has locked
    job = api.schedule(TASK, run_at=db_now(), name="due", kwargs={"label": "due"})
    with table_locked(table):
        beat = fleet.beat(wait=False)
        wait_until(lambda: waiting_on_a_lock(beat.name), timeout=30, message="beat waits")
        # When it is told to stop while its statement waits, and the table is freed after
        beat.signal_main(sig)
        wait_until(lambda: not waiting_on_a_lock(beat.name), timeout=5, raise_on_timeout=False)
    # Then it exits at once, as Celery's beat does: code 0, "stopped" logged once
    try:
        code = beat.popen.wait(timeout=15)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the beat hung after {sig.name}:\n{beat.log()[-3000:]}")
    assert code == 0, beat.log()[-3000:]
    assert beat.log().count(" stopped") == 1, beat.log()[-3000:]
    assert not Node.objects.filter(kind="beat").exists()
    # ... and nothing is left claimed: the job is still due, with no run, and the next beat
    # runs it at once (well within its 60 s lease)
    assert Job.objects.get(pk=job.pk).state == JobState.SCHEDULED
    assert not JobRun.objects.filter(job=job).exists()
    fleet.beat()
    fleet.worker(concurrency=1)
    wait_until(lambda: Execution.objects.filter(job_id=job.pk).exists(), timeout=30)
    assert Execution.objects.filter(job_id=job.pk).count() == 1


def test_an_embedded_beat_runs_when_its_worker_read_the_database_before_forking_it(fleet):
    """About 10 s. ``celery worker -B`` forks its beat from the worker's main process, which
    holds a database connection if the project used the ORM as the worker started (a cache
    warmed in ``worker_init``): Celery closes every inherited file descriptor in the beat's
    process, so that connection's socket is gone there. Before, the beat's first statement
    went to it, failed ("connection socket closed"), and the beat process died at start:
    the worker ran on with no beat, and nothing was dispatched; and once the beat's setup
    was the first tick's, that tick failed on it ("database unavailable: connection socket
    closed", an ERROR at every start) before the next opened a connection of its own."""
    job = api.schedule(TASK, interval=1, name="every-second", kwargs={"label": "embedded"})
    worker = fleet.worker(
        concurrency=1, settings={"PROJECT_DB_AT_WORKER_INIT": 1}, extra_args=["-B"]
    )
    wait_until(
        lambda: Execution.objects.filter(job_id=job.pk).count() >= 3,
        timeout=30,
        message="the embedded beat dispatched, and its worker ran them",
    )
    assert "Process Beat" not in worker.log()  # Celery's report of a beat process that died
    assert "ERROR" not in worker.log()
    # the worker's own connection, inherited by the beat, still works in the worker
    assert Node.objects.filter(kind="worker").count() == 1
    assert Node.objects.filter(kind="beat").count() == 1


def test_a_worker_with_an_embedded_beat_serves_the_metrics_of_both(fleet, tmp_path):
    """About 12 s. With ``SCHEDAPP_METRICS_PORT``, the endpoint of ``celery worker -B`` is
    the worker's main process's (an answer says the worker lives, as docs/operations.md
    says), and with ``PROMETHEUS_MULTIPROC_DIR`` it shows the embedded beat's claims and
    dispatches beside the pool's runs. Before, the beat, forked first, took the port: the
    worker logged "Address already in use", and without the directory (a threads or solo
    pool needs none) the worker's own metrics were served by nobody."""
    from tests.e2e.test_metrics import scrape
    from tests.servers import free_port

    port = free_port()
    multiproc = tmp_path / "prom"
    multiproc.mkdir()
    worker = fleet.worker(
        settings={"SCHEDAPP_METRICS_PORT": port, "PROMETHEUS_MULTIPROC_DIR": str(multiproc)},
        extra_args=["-B"],
    )
    job = api.schedule(TASK, interval=1, name="every-second", kwargs={"label": "metrics"})
    wait_until(lambda: Execution.objects.filter(job_id=job.pk).count() >= 3, timeout=30)
    assert "Address already in use" not in worker.log()
    listening = {
        c.laddr.port
        for c in psutil.Process(worker.pid).net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN
    }
    assert port in listening
    metrics = wait_until(
        lambda: (
            (m := scrape(port)).get('schedapp_runs_finished_total{status="succeeded"}', 0) >= 3
            and m
        ),
        timeout=10,
    )
    assert metrics["schedapp_dispatches_total"] >= 3  # the embedded beat's
