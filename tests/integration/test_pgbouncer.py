"""The worker's hot calls through a real transaction-pooling PgBouncer (1.18 here, which
forwards no prepared statement between the clients that share a server session), whatever
the project's ``OPTIONS`` ask of psycopg (``tests/e2e/test_pgbouncer.py`` runs the whole
fleet through it)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection, connections

from schedapp import api, lease
from schedapp.db import db_now
from schedapp.dispatch import message_headers
from schedapp.message import RunHeaders
from schedapp.models import Job, JobState
from schedapp.store import DoorVerdict
from schedapp.testing.pgproxy import django_through

pytestmark = [pytest.mark.postgresql, pytest.mark.django_db(transaction=True)]


def in_thread(fn: Any) -> Any:
    """``fn()`` in a thread of its own (its own Django connection, as the worker's lease
    heartbeat has), its result or its exception."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:
            out["error"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    if "error" in out:
        raise out["error"]
    return out["value"]


def test_door_renewal_and_success_work_behind_pgbouncer_with_prepare_threshold_set(pgbouncer):
    # Given a PgBouncer with one server connection, and OPTIONS asking psycopg to prepare
    # every statement (prepare_threshold 0; Django's own statements use client-side binding
    # and are never prepared, so the project itself works behind the pooler)
    pgbouncer.start(pool_size=1)
    job = api.schedule("project.tasks.record", run_at=db_now(), name="prepared")
    (run,) = lease.claim_due_jobs("beat-1", 10).runs
    options = connection.settings_dict["OPTIONS"]
    options["prepare_threshold"] = 0
    try:
        with django_through(pgbouncer):
            assert Job.objects.get(pk=job.pk).state == JobState.RUNNING
            # When a worker's pool process admits the run, its heartbeat thread (a connection
            # of its own, on the same server session) renews the lease, and the pool process
            # records the success
            verdict = lease.admit_run(run.job_id, run.token, "w1@host", "admission-1")
            renewal = in_thread(lambda: lease.renew_leases([(run.job_id, run.token)]))
            headers = RunHeaders.read(message_headers(run, "test"))
            done = lease.complete_run(run.job_id, run.token, lease.SUCCEEDED, headers=headers)
            # Then each of them did its work
            assert verdict == DoorVerdict.ADMITTED
            assert renewal.renewed == {(run.job_id, run.token)}
            assert done.applied
            assert Job.objects.get(pk=job.pk).state == JobState.SUCCEEDED
    finally:
        options.pop("prepare_threshold")
