"""Every wait of a worker or a beat on the database is bounded in time (issue 26, item 2).

A connection that goes silent after a statement (a network black hole, a NAT or firewall
that dropped its state: no reply and no reset) would hold libpq for as long as the socket
stays open: hours. The fault-injecting proxy (schedapp.testing.pgproxy) forwards the statement, lets
the server run it, drops the reply and keeps the connection open and silent; the worker
hooks and the beat run in this process exactly as they do in theirs."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from django.db import connections
from django.test import override_settings

from schedapp import api, beat
from schedapp.celeryapp import celery_app
from schedapp.db import bound_connection_waits, db_now, watchdog_given_up
from schedapp.message import HEADER_LEASE
from schedapp.models import Job, JobRun, JobState, RunStatus
from schedapp.testing.pgproxy import django_through
from schedapp.worker import WorkerHooks
from tests.claiming import claim_one

pytestmark = pytest.mark.django_db(transaction=True)

DOOR = b"SELECT schedapp_admit_run_v6("
RENEWAL = b"schedapp_renew_leases_v6("
CLAIM = b"due AS MATERIALIZED"


def test_a_door_whose_connection_goes_silent_gives_it_up_and_admits_its_run_on_a_new_one(pg_proxy):
    # Given a run with a 6 s lease, and a door whose statement commits while its
    # connection then goes silent
    _, run = claim_one(name="job", lease_seconds=6)
    hooks = WorkerHooks()
    task = SimpleNamespace(request=SimpleNamespace(hostname="w1@host", headers={HEADER_LEASE: 6}))
    given_up = watchdog_given_up()
    pg_proxy.cut_after(DOOR, silent=True)
    started = time.monotonic()
    with django_through(pg_proxy):
        hooks.door.admit(task, run.task_id)  # raises Ignore if it refused the run
    # Then the door waited a bounded time (a third of the lease) for the reply, gave the
    # connection up, and its retry on a new one found its own admission: the run starts
    assert watchdog_given_up() == given_up + 1
    assert time.monotonic() - started < 6
    r = JobRun.objects.get(pk=run.run_id)
    assert (r.status, r.worker) == (RunStatus.RUNNING, "w1@host")


def test_a_lease_renewal_whose_connection_goes_silent_is_given_up_and_the_next_one_renews(pg_proxy):
    # Given a worker holding a started run with a 3 s lease
    _, run = claim_one(name="job", lease_seconds=3)
    from schedapp import lease

    assert lease.admit_run(run.job_id, run.token, "w1", "a1").value == "admitted"
    hooks = WorkerHooks()
    request = SimpleNamespace(id=run.task_id, request_dict={HEADER_LEASE: 3})
    hooks.leases.on_task_received(request=request)
    hooks.leases.held[(run.job_id, run.token)].renewed_at -= 2  # due for renewal
    pg_proxy.cut_after(RENEWAL, silent=True)
    with django_through(pg_proxy):
        # When its heartbeat's renewal gets no reply: the heartbeat returns (its thread
        # would otherwise wait for ever while the lease expires)
        started = time.monotonic()
        hooks.on_lease_heartbeat()
        assert time.monotonic() - started < 3
        assert pg_proxy.stats()["cuts"] == 1
        before = Job.objects.get(pk=run.job_id).lease_expires_at
        # Then the next heartbeat renews on a new connection, while the lease is alive
        hooks.on_lease_heartbeat()
    assert Job.objects.get(pk=run.job_id).lease_expires_at > before


@pytest.mark.exhaustive  # 12 s (a silent claim, then the back-off); the door and renewal stay
def test_a_beat_tick_whose_claim_goes_silent_backs_off_and_the_next_tick_claims(pg_proxy):
    with override_settings(SCHEDAPP_DB_TIMEOUT=2), django_through(pg_proxy):
        scheduler = beat.LeaseScheduler(celery_app(), lazy=True)
        try:
            scheduler.tick()  # sets up, claims nothing
            job = api.schedule("project.tasks.record", name="due", run_at=db_now())
            # When the claim's statement runs and its connection goes silent
            pg_proxy.cut_after(CLAIM, silent=True)
            started = time.monotonic()
            scheduler.tick()
            # Then the tick gave the connection up after SCHEDAPP_DB_TIMEOUT and backed off
            # instead of waiting for ever (nothing was claimed: the server rolled it back)
            assert time.monotonic() - started < 10
            assert pg_proxy.stats()["cuts"] == 1
            # and the next tick claims and dispatches the job
            deadline = time.monotonic() + 20
            while Job.objects.get(pk=job.pk).state != JobState.RUNNING:
                assert time.monotonic() < deadline, "the job was not claimed again"
                scheduler.tick()
        finally:
            scheduler.close()
    assert JobRun.objects.get(job=job).status == RunStatus.DISPATCHED


def test_beats_and_workers_bound_connecting_and_keep_what_the_project_set():
    settings_dict = connections.settings["default"]
    saved = dict(settings_dict.get("OPTIONS") or {})
    try:
        settings_dict["OPTIONS"] = {"connect_timeout": 5, "keepalives_idle": 60}
        with override_settings(SCHEDAPP_DB_TIMEOUT=12):
            added = bound_connection_waits()
        assert added == {"keepalives": 1, "keepalives_interval": 10, "keepalives_count": 3}
        assert settings_dict["OPTIONS"]["connect_timeout"] == 5  # the project's own
        assert settings_dict["OPTIONS"]["keepalives_idle"] == 60
        settings_dict["OPTIONS"] = {}
        with override_settings(SCHEDAPP_DB_TIMEOUT=12):
            bound_connection_waits()
        assert settings_dict["OPTIONS"]["connect_timeout"] == 12
    finally:
        settings_dict["OPTIONS"] = saved
