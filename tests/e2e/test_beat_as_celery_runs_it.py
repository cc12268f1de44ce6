"""How a Celery team starts, stops and embeds beat keeps working under ``-S
schedapp.beat:LeaseScheduler``: real ``celery beat`` and ``celery worker -B`` processes, over
Redis and the test database. Each test names its run time on a 2-core machine (stopping its
processes adds a few seconds)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections import Counter
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
from schedapp.testing.processes import wait_until
from tests.integration.test_beat import LAST_OF_THE_CLAIM

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
    """About 5 s each. ``celery beat``'s SIGTERM and SIGINT (Ctrl-C) handler closes the
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


def between_ticks(name: str) -> bool:
    """Whether every connection of process ``name`` is idle: no statement under way, no
    transaction open."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FILTER (WHERE state <> 'idle'), count(*) FROM pg_stat_activity "
            "WHERE application_name = %s",
            [name],
        )
        busy, connected = cursor.fetchone()
    return connected > 0 and busy == 0


def test_a_beat_stopped_while_its_claims_commit_is_on_its_way_gives_back_what_it_claimed(
    pg_proxy, fleet_through
):
    """About 10 s. The server commits a claim whose beat is told to stop (SIGTERM, a deploy)
    before the COMMIT's reply is back: the beat gives the claim back as it exits, and the
    next beat runs the job at once. Before, the run stayed dispatched and unsent until its
    lease lapsed, a minute later, and for ever once no beat was left to reap it (CI's chaos
    run of 2026-12-07 stopped its beats so: jobs stuck running on expired leases)."""
    from schedapp.models import RunStatus

    fleet = fleet_through(pg_proxy)
    beat = fleet.beat()

    def held_between_ticks() -> bool:
        beat.signal_main(signal.SIGSTOP)
        if between_ticks(beat.name):
            return True
        beat.signal_main(signal.SIGCONT)
        return False

    # Given a beat held between two ticks while a job comes due, and a proxy that holds what
    # the beat sends after its claim's last statement (next_due): the claim's COMMIT
    wait_until(held_between_ticks, timeout=15, message="the beat between ticks")
    job = api.schedule(TASK, run_at=db_now(), name="due", kwargs={"label": "due"})
    pg_proxy.stall_after(LAST_OF_THE_CLAIM, 3.0, app=beat.name)
    beat.signal_main(signal.SIGCONT)
    wait_until(lambda: pg_proxy.stats()["stalls"] == 1, timeout=15, message="the claim's stall")
    time.sleep(0.3)  # its COMMIT sent, and held
    # When it is told to stop meanwhile (psycopg cancels the COMMIT, a no-op on a statement
    # the server has not got, and waits for its reply: it comes as the stall ends)
    beat.signal_main(signal.SIGTERM)
    assert beat.popen.wait(timeout=20) == 0, beat.log()[-3000:]
    # Then the claim did commit (its run row is there), and the beat gave it back
    (run,) = JobRun.objects.filter(job=job)
    assert (run.status, run.error) == (RunStatus.LOST, "not published: beat stopped")
    assert Job.objects.get(pk=job.pk).state == JobState.SCHEDULED
    # ... so the next beat runs it at once (well within its 60 s lease), once
    fleet.beat()
    fleet.worker(concurrency=1)
    wait_until(lambda: Execution.objects.filter(job_id=job.pk).exists(), timeout=30)
    assert Execution.objects.filter(job_id=job.pk).count() == 1


def test_an_embedded_beat_runs_when_its_worker_read_the_database_before_forking_it(fleet):
    """About 5 s. ``celery worker -B`` forks its beat from the worker's main process, which
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
    """About 5 s. With ``SCHEDAPP_METRICS_PORT``, the endpoint of ``celery worker -B`` is
    the worker's main process's (an answer says the worker lives, as docs/operations.md
    says), and with ``PROMETHEUS_MULTIPROC_DIR`` it shows the embedded beat's claims and
    dispatches beside the pool's runs. Before, the beat, forked first, took the port: the
    worker logged "Address already in use", and without the directory (a threads or solo
    pool needs none) the worker's own metrics were served by nobody."""
    from schedapp.testing.servers import free_port
    from tests.e2e.test_metrics import scrape

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


def test_workers_with_embedded_beats_share_the_jobs_and_stop_with_their_beats(fleet, tmp_path):
    """About 15 s. ``celery worker -B``, with the scheduler named by ``--scheduler`` on one
    worker (a worker's ``-S`` is its ``--statedb``) and by ``beat_scheduler``
    (``CELERY_BEAT_SCHEDULER``) on the other, whose ``-s`` (Celery's schedule file) names a
    directory that does not exist, which schedapp never uses: each embedded beat
    claims and publishes, the workers run what either sent, each occurrence once; Celery
    sends each beat ``beat_init`` and ``beat_embedded_init`` with its Service as the sender,
    in a process of its worker's; and a worker stopped as a supervisor stops it takes its
    beat down with it, leaving the other pair to carry on."""
    notes = tmp_path / "beat-signals.jsonl"
    settings = {"PROJECT_BEAT_SIGNALS": str(notes), "SCHEDAPP_BATCH_SIZE": 3}
    # Given two workers, each with a beat embedded
    first = fleet.worker(
        settings=settings, extra_args=["-B", "--scheduler", "schedapp.beat:LeaseScheduler"]
    )
    schedule_file = tmp_path / "absent" / "celerybeat-schedule"
    second = fleet.worker(settings=settings, extra_args=["-B", "-s", str(schedule_file)])
    wait_until(lambda: Node.objects.filter(kind="beat").count() == 2, timeout=20)
    # When a burst of one-off jobs falls due, beside a job every second
    every = api.schedule(TASK, interval=1, name="every-second", kwargs={"label": "every"})
    api.schedule_many(
        {"task": TASK, "run_at": db_now(), "name": f"burst-{i}", "kwargs": {"label": "burst"}}
        for i in range(60)
    )
    wait_until(
        lambda: Execution.objects.filter(label="burst", finished_at__isnull=False).count() >= 60,
        timeout=60,
        message="the burst ran",
    )
    # Then each occurrence ran once, on these workers, and both beats claimed part of it
    ran = Counter(Execution.objects.values_list("job_id", "scheduled_for"))
    assert ran and max(ran.values()) == 1, ran.most_common(3)
    host = socket.gethostname()
    assert set(Execution.objects.values_list("worker", flat=True)) <= {
        f"{first.name}@{host}",
        f"{second.name}@{host}",
    }
    burst = JobRun.objects.filter(job__name__startswith="burst-")
    assert len(set(burst.values_list("claimed_by", flat=True))) == 2
    # ... and each beat got Celery's signals, from its Service, in a child of its worker
    signals = [json.loads(line) for line in notes.read_text().splitlines()]
    beats = {}
    for worker in (first, second):
        got = [n for n in signals if n["ppid"] == worker.pid]
        assert [(n["signal"], n["sender"]) for n in got] == [
            ("beat_init", "Service"),
            ("beat_embedded_init", "Service"),
        ], signals
        beats[worker.name] = got[0]["pid"]
    # When the first worker is stopped as a supervisor stops it (SIGTERM to its main process)
    first.signal_main(signal.SIGTERM)
    assert first.popen.wait(timeout=30) == 0
    # Then its beat stopped with it, and the other beat runs the every-second job on
    wait_until(lambda: not psutil.pid_exists(beats[first.name]), timeout=10, message="beat gone")
    wait_until(lambda: Node.objects.count() == 2, timeout=10, message="its rows gone")
    assert {n.kind for n in Node.objects.all()} == {"beat", "worker"}
    before = Execution.objects.filter(job_id=every.pk).count()
    wait_until(
        lambda: Execution.objects.filter(job_id=every.pk).count() >= before + 2,
        timeout=30,
        message="the every-second job ran twice more",
    )
    assert second.alive() and psutil.pid_exists(beats[second.name])
    assert not schedule_file.parent.exists()


def test_a_detached_beat_takes_celerys_options_and_stops_by_its_pidfile(fleet, tmp_path):
    """About 5 s. ``celery beat --detach --pidfile --logfile -s --max-interval``, as an init
    script starts it, with a ``beat_init`` receiver that raises: Celery logs the receiver's
    error and the beat goes on; ``beat_init`` comes once, from the Service, in the beat's
    process; the schedule file (``-s``, in a directory that does not exist) is never used; a
    job resumed behind the beat's back is found within the max interval, however long the
    beat's own sleep (``SCHEDAPP_MAX_SLEEP``, 30 s here: before, a beat with nothing
    scheduled slept that long whatever its max interval); SIGTERM to the pid in the pidfile
    stops it, and the pidfile goes with it."""
    from schedapp.testing.processes import CELERY, SCHEDULER
    from tests import APP, ROOT

    notes, pidfile = tmp_path / "signals.jsonl", tmp_path / "beat.pid"
    logfile, schedule = tmp_path / "beat.log", tmp_path / "absent" / "celerybeat-schedule"
    later = api.pause(api.schedule(TASK, run_at=db_now(), name="later", kwargs={"label": "x"}))
    env = fleet._env(
        {"PROJECT_BEAT_SIGNALS": notes, "PROJECT_BEAT_INIT_RAISES": 1, "SCHEDAPP_MAX_SLEEP": 30},
        "detached",
    )
    argv = [CELERY, "-A", APP, "beat", "-S", SCHEDULER, "--detach", "-l", "INFO"]
    argv += ["--pidfile", str(pidfile), "-f", str(logfile), "-s", str(schedule)]
    subprocess.run([*argv, "--max-interval", "1"], cwd=ROOT, env=env, check=True, timeout=60)
    pid = int(wait_until(lambda: pidfile.exists() and pidfile.read_text().strip(), timeout=30))
    try:
        wait_until(lambda: Node.objects.filter(kind="beat").exists(), timeout=30)
        time.sleep(1.5)  # its first ticks are done: nothing is scheduled
        # When the job is resumed by SQL, which wakes no beat
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE schedapp_job SET state = 'scheduled', next_run_at = now(), "
                "scheduled_for = now() WHERE id = %s",
                [later.pk],
            )
        # Then the beat finds it within its max interval (1 s), not after its own 30 s
        wait_until(
            lambda: JobRun.objects.filter(job=later).exists(),
            timeout=5,
            message="the job claimed within the max interval",
        )
        sent = "Scheduler: Sending due task later (project.tasks.record)"
        # (the line follows the publish, which follows the claim)
        log = wait_until(lambda: sent in (text := logfile.read_text()) and text, timeout=10)
        assert "the project's beat_init receiver failed" in log  # Celery logged it, went on
        signals = [json.loads(line) for line in notes.read_text().splitlines()]
        assert signals == [
            {"signal": "beat_init", "sender": "Service", "pid": pid, "ppid": signals[0]["ppid"]}
        ]
        assert not schedule.parent.exists()
    finally:
        os.kill(pid, signal.SIGTERM)
    wait_until(lambda: not psutil.pid_exists(pid), timeout=15, message="the beat exited")
    assert not pidfile.exists()
    assert not Node.objects.filter(kind="beat").exists()
