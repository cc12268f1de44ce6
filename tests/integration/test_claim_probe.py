"""The claim's first statement asks, in SQL, whether the reaper and the allow_all retries have
anything to look at (``claim_probe`` in schedapp/sql/queries.sql); the claim then skips the
queries whose answer is no. The SQL and the querysets it stands for must say the same of every
row, or a lease would never be reaped (a probe that says no where the queryset finds rows) or
the saving would be lost (yes where it finds none): held equal here, on PostgreSQL."""

from __future__ import annotations

import itertools
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from schedapp import api, db
from schedapp.lease import claim_due_jobs
from schedapp.lease.claim import due_retries
from schedapp.lease.reap import expired_job_leases, expired_run_leases
from schedapp.models import Job, JobRun, JobState
from schedapp.sql import query
from tests.claiming import claim_one

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="the probe is PostgreSQL's SQL"),
]

HOUR = timedelta(hours=1)
WHEN = {"past": -HOUR, "future": HOUR, "none": None}


def probe() -> tuple[bool, bool, bool]:
    with db.claim_transaction() as found:
        return found.job_leases_expired, found.run_leases_expired, found.retries_due


def querysets() -> tuple[bool, bool, bool]:
    return (expired_job_leases().exists(), expired_run_leases().exists(), due_retries().exists())


def test_the_probe_says_what_the_reaper_and_retry_querysets_find_for_every_kind_of_row():
    job, _ = claim_one()
    now = db.db_now()
    seen = set()
    for state, job_lease, run_lease, retry in itertools.product(
        (JobState.RUNNING, JobState.PAUSED, JobState.SCHEDULED, JobState.DEAD), WHEN, WHEN, WHEN
    ):
        if state == JobState.RUNNING and job_lease == "none":
            continue  # a running job holds its lease (a check constraint)
        at = {k: None if d is None else now + d for k, d in WHEN.items()}
        Job.objects.filter(pk=job.pk).update(state=state, lease_expires_at=at[job_lease])
        JobRun.objects.filter(job=job).update(lease_expires_at=at[run_lease], retry_at=at[retry])
        answer = probe()
        assert answer == querysets(), (state, job_lease, run_lease, retry)
        seen.add(answer)
    # every flag was seen both ways: the comparison above could not pass on a constant
    assert {a[i] for a in seen for i in range(3)} == {True, False}
    assert all(any(a[i] for a in seen) and not all(a[i] for a in seen) for i in range(3))


def test_a_quiet_claim_asks_once_and_sets_its_idle_limit_in_the_same_statement():
    claim_one(name="first")
    with CaptureQueriesContext(connection) as quiet:
        claim_due_jobs("beat-1", 10)
    sql = [q["sql"] for q in quiet.captured_queries if q["sql"] not in ("BEGIN", "COMMIT")]
    assert "idle_in_transaction_session_timeout" in sql[0]  # the probe opens the transaction
    assert "min(retry_at) FROM schedapp_jobrun" in sql[0]
    # nothing expired and no retry waits: none of the reaper's or the retries' queries ran
    assert not any('lease_expires_at" <' in s or 'retry_at" <=' in s for s in sql), sql


def test_an_expired_lease_found_by_the_probe_is_reaped_by_the_same_claim():
    job, run = claim_one(name="lapsed")
    Job.objects.filter(pk=job.pk).update(lease_expires_at=db.db_now() - HOUR)
    result = claim_due_jobs("beat-2", 10)
    assert result.reap.expired == 1
    # reaped and (a one-off that never started) claimed again in the same transaction
    assert [r.job_id for r in result.runs] == [job.pk]
    assert result.runs[0].token > run.token


def test_the_probe_reads_each_index_first_entry_whatever_the_statistics_say():
    """Statistics that see many runs with a lapsed lease or a due retry (read before they were
    renewed or retried; or none yet, on a table never analyzed) had the EXISTS of each planned
    as a scan of every run, expecting a match at once: 2-10 ms a claim at a steady stream. The
    earliest instant is read from the first entry of the partial index, whatever the plan
    expects."""
    past = db.db_now() - HOUR
    api.schedule_many({"task": "project.tasks.record", "run_at": past} for _ in range(2000))
    assert len(claim_due_jobs("beat-1", 2000).runs) == 2000
    JobRun.objects.update(lease_expires_at=past, retry_at=past)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE schedapp_jobrun")
    JobRun.objects.update(lease_expires_at=None, retry_at=None)
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + query("claim_probe"), ["1000ms"])
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "Seq Scan" not in plan, plan
    assert probe() == (False, False, False)
