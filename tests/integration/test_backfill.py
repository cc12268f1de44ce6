"""Backfill (docs/semantics.md, "Backfill"): a job's past occurrences run through a row the
beats advance, throttled in database time, idempotent, cancellable, each run under a lease of
its own that leaves the job's own token, lease and next run alone. Runs on PostgreSQL and, with
project.settings_test_sqlite, on the portable store (the two-beat race is PostgreSQL's)."""

from __future__ import annotations

import time
from datetime import timedelta
from unittest import mock

import pytest
from django.core.exceptions import ValidationError
from django.db import OperationalError, connection

from schedapp import api
from schedapp.db import db_now
from schedapp.lease import admit_run, complete_run
from schedapp.lease import backfill as engine
from schedapp.models import (
    Backfill,
    BackfillFate,
    BackfillRange,
    BackfillState,
    Job,
    JobChange,
    JobRun,
    RunKind,
    RunStatus,
)
from tests.claiming import in_thread

pytestmark = pytest.mark.django_db(transaction=True)

MINUTE = timedelta(minutes=1)
POSTGRES = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="SQLite serialises the transactions"
)


def minutely(**options) -> Job:
    return api.schedule(
        "project.tasks.record",
        interval=MINUTE,
        interval_anchor=db_now().replace(second=0, microsecond=0) - timedelta(days=1),
        name=options.pop("name", "minutely"),
        **{"max_concurrent": 1000, **options},
    )


def a_range(minutes: int):
    """The last ``minutes`` whole minutes before now: exactly ``minutes`` occurrences."""
    end = db_now().replace(second=0, microsecond=0) - MINUTE
    return end - (minutes - 1) * MINUTE, end


def refill(bf: Backfill, tokens: float = 1e9) -> None:
    """As if a long time had passed since its last emission: a full bucket."""
    Backfill.objects.filter(pk=bf.pk).update(
        allowance=tokens, refilled_at=db_now() - timedelta(hours=1)
    )


def advance(limit: int = 10_000) -> list:
    return engine.advance("beat-1", limit)[0]


def run_all(bf: Backfill, rounds: int = 50) -> list:
    """Advance with full buckets until the backfill is done; every run dispatched."""
    runs: list = []
    for _ in range(rounds):
        refill(bf)
        runs.extend(advance())
        bf.refresh_from_db()
        if bf.state != BackfillState.RUNNING:
            break
    return runs


def succeed(runs: list) -> None:
    for run in runs:
        assert admit_run(run.job_id, run.token, "w", f"a{run.token}") == "admitted"
        assert complete_run(run.job_id, run.token, "succeeded").applied


def fates(bf: Backfill) -> list[tuple[str, int]]:
    return list(BackfillRange.objects.filter(backfill=bf).values_list("fate", "count"))


# --- validation ----------------------------------------------------------------------------


def test_bad_input_is_refused_naming_the_field_and_nothing_is_written() -> None:
    job = minutely()
    start, end = a_range(10)
    cases = [
        ({"start": end, "end": start}, "end"),
        ({"start": start, "end": db_now() + MINUTE}, "end"),
        ({"start": start, "end": end, "overlap": "buffer_one"}, "overlap"),
        ({"start": start, "end": end, "max_per_second": 0}, "max_per_second"),
        ({"start": start, "end": end, "max_per_second": -1.0}, "max_per_second"),
        ({"start": start.replace(tzinfo=None), "end": end}, "start"),
        # a range of more occurrences than the cap (every second for two days)
        ({"start": end - timedelta(days=2), "end": end}, None),
    ]
    every_second = api.schedule(
        "project.tasks.record", interval=timedelta(seconds=1), name="every-second"
    )
    for given, field in cases:
        target = every_second if field is None else job
        with pytest.raises(ValidationError) as raised:
            api.backfill(target, **given)
        assert (field or "end") in raised.value.message_dict, given
    once = api.schedule("project.tasks.record", run_at=db_now() + MINUTE, name="once")
    with pytest.raises(ValidationError) as raised:
        api.backfill(once, start, end)
    assert "job" in raised.value.message_dict
    assert not Backfill.objects.exists()
    assert not JobChange.objects.filter(action=JobChange.Action.BACKFILL).exists()


# --- runs ----------------------------------------------------------------------------------


def test_each_occurrence_runs_once_as_a_backfill_run_leaving_the_job_alone() -> None:
    job = minutely()
    before = Job.objects.values("token", "next_run_at", "scheduled_for", "state").get(pk=job.pk)
    start, end = a_range(30)
    bf = api.backfill(job, start, end, max_per_second=100, reason="the outage")
    assert bf.total == 30
    runs = run_all(bf)
    bf.refresh_from_db()
    assert bf.state == BackfillState.DONE and bf.decided == bf.dispatched == 30
    assert sorted(r.scheduled_for for r in runs) == [start + i * MINUTE for i in range(30)]
    rows = JobRun.objects.filter(job=job)
    assert set(rows.values_list("kind", flat=True)) == {RunKind.BACKFILL}
    assert all(t < 0 for t in rows.values_list("token", flat=True))
    assert rows.filter(own_lease=True, lease_expires_at__isnull=False).count() == 30
    succeed(runs)
    assert not rows.filter(lease_expires_at__isnull=False).exists()
    after = Job.objects.values("token", "next_run_at", "scheduled_for", "state").get(pk=job.pk)
    assert after == before  # the job's own schedule, lease and token untouched
    assert fates(bf) == [(BackfillFate.DISPATCHED, 30)]
    change = JobChange.objects.get(job_id=job.pk, action=JobChange.Action.BACKFILL)
    assert change.reason == "the outage"


def test_a_second_backfill_runs_nothing_done_and_rerun_runs_it_again() -> None:
    job = minutely()
    start, end = a_range(12)
    succeed(run_all(api.backfill(job, start, end, max_per_second=50)))
    again = api.backfill(job, start, end, max_per_second=50)
    assert run_all(again) == []
    again.refresh_from_db()
    assert again.already_done == 12 and again.state == BackfillState.DONE
    assert fates(again) == [(BackfillFate.ALREADY_DONE, 12)]
    rerun = api.backfill(job, start, end, max_per_second=50, rerun=True)
    assert len(run_all(rerun)) == 12


def test_an_occurrence_with_a_run_in_flight_is_not_run_twice() -> None:
    job = minutely()
    start, end = a_range(8)
    first = api.backfill(job, start, end, max_per_second=50)
    assert len(run_all(first)) == 8  # dispatched, none finished
    second = api.backfill(job, start, end, max_per_second=50, rerun=True)
    assert run_all(second) == []
    assert fates(second) == [(BackfillFate.IN_FLIGHT, 8)]


def test_the_throttle_never_exceeds_rate_times_elapsed_plus_the_bucket() -> None:
    job = minutely()
    start, end = a_range(600)
    rate = 40.0
    began = api.backfill(job, start, end, max_per_second=rate).refilled_at
    dispatched = 0
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        dispatched += len(advance())
        elapsed = (db_now() - began).total_seconds()
        assert dispatched <= rate * elapsed + engine.bucket(rate)
        time.sleep(0.02)
    assert dispatched >= rate * 1.0  # and it does dispatch at about its rate


def test_cancel_stops_it_and_records_the_rest_cancelled() -> None:
    job = minutely()
    start, end = a_range(20)
    bf = api.backfill(job, start, end, max_per_second=5)
    refill(bf, 5)
    assert len(advance()) == 5
    api.cancel_backfill(bf, reason="enough")
    bf.refresh_from_db()
    assert bf.state == BackfillState.CANCELLED and bf.cancelled_count == 15
    refill(bf)
    assert advance() == []
    assert fates(bf) == [(BackfillFate.DISPATCHED, 5), (BackfillFate.CANCELLED, 15)]
    assert JobRun.objects.filter(job=job).count() == 5  # those go on to their end
    assert JobChange.objects.filter(action=JobChange.Action.BACKFILL_CANCEL).count() == 1


def test_a_beat_dying_mid_batch_loses_nothing() -> None:
    job = minutely()
    start, end = a_range(10)
    bf = api.backfill(job, start, end, max_per_second=100)
    refill(bf)
    with mock.patch.object(engine, "_record", side_effect=RuntimeError("killed")):
        with pytest.raises(RuntimeError):
            advance()
    bf.refresh_from_db()
    assert bf.cursor is None and bf.decided == 0
    assert not JobRun.objects.filter(job=job).exists()  # the runs rolled back with it
    runs = run_all(bf)
    assert sorted(r.scheduled_for for r in runs) == [start + i * MINUTE for i in range(10)]


@POSTGRES
def test_two_beats_never_dispatch_one_occurrence_twice() -> None:
    job = minutely(max_concurrent=1000)
    start, end = a_range(400)
    bf = api.backfill(job, start, end, max_per_second=10_000)

    def beat(name: str):
        def loop() -> list:
            got: list = []
            for _ in range(200):
                runs, _wait = engine.advance(name, 37)
                got.extend(runs)
                if Backfill.objects.get(pk=bf.pk).state != BackfillState.RUNNING:
                    break
                time.sleep(0.005)
            return got

        return loop

    threads = [in_thread(beat(f"beat-{i}")) for i in range(2)]
    for thread, _out in threads:
        thread.join(60)
    outs = [out for _t, out in threads]
    assert all("error" not in out for out in outs), outs
    times = [r.scheduled_for for out in outs for r in out["value"]]
    assert len(times) == len(set(times)) == 400
    assert JobRun.objects.filter(job=job).count() == 400


# --- overlap -------------------------------------------------------------------------------


def test_allow_all_keeps_within_max_concurrent() -> None:
    job = minutely(max_concurrent=4)
    start, end = a_range(10)
    bf = api.backfill(job, start, end, max_per_second=1000)
    refill(bf)
    first = advance()
    assert len(first) == 4
    refill(bf)
    assert advance() == []  # no slot
    succeed(first[:2])
    refill(bf)
    assert len(advance()) == 2


def test_buffer_all_runs_one_at_a_time_in_order() -> None:
    job = minutely()
    start, end = a_range(3)
    bf = api.backfill(job, start, end, overlap="buffer_all", max_per_second=1000)
    order = []
    for _ in range(3):
        refill(bf)
        runs = advance()
        assert len(runs) == 1
        refill(bf)
        assert advance() == []  # the next waits for it
        order.append(runs[0].scheduled_for)
        succeed(runs)
    assert order == [start, start + MINUTE, start + 2 * MINUTE]


def test_skip_records_the_occurrences_that_come_while_a_run_is_in_flight() -> None:
    job = minutely()
    start, end = a_range(6)
    bf = api.backfill(job, start, end, overlap="skip", max_per_second=3)
    refill(bf, 3)
    runs = advance()
    assert [r.scheduled_for for r in runs] == [start]
    succeed(runs)
    refill(bf, 3)
    assert [r.scheduled_for for r in advance()] == [start + 3 * MINUTE]
    bf.refresh_from_db()
    assert fates(bf) == [
        (BackfillFate.DISPATCHED, 1),
        (BackfillFate.OVERLAPPED, 2),
        (BackfillFate.DISPATCHED, 1),
        (BackfillFate.OVERLAPPED, 2),
    ]
    assert bf.overlapped == 4


# --- retries -------------------------------------------------------------------------------


def test_a_failed_backfilled_run_retries_as_a_backfill_and_never_kills_the_job() -> None:
    job = minutely(max_retries=1, retry_backoff=timedelta(seconds=0), jitter=0)
    before = Job.objects.values_list("token", flat=True).get(pk=job.pk)
    start, _end = a_range(1)
    bf = api.backfill(job, start, start + MINUTE / 2, max_per_second=10)
    (run,) = run_all(bf)
    assert admit_run(job.pk, run.token, "w", "a1") == "admitted"
    complete_run(job.pk, run.token, "failed", error="boom")
    retry = JobRun.objects.get(job=job, attempt=2)
    assert retry.kind == RunKind.BACKFILL and retry.token < run.token
    assert retry.scheduled_for == start
    job.refresh_from_db()
    assert job.token == before and job.state != "dead"
    JobRun.objects.filter(pk=retry.pk).update(retry_at=db_now() - MINUTE)
    from schedapp.lease import claim_due_jobs

    claimed = [r for r in claim_due_jobs("beat-1", 10).runs if r.run_id == retry.pk]
    assert claimed and claimed[0].token == retry.token
    assert admit_run(job.pk, retry.token, "w", "a2") == "admitted"
    complete_run(job.pk, retry.token, "failed", error="boom again")
    job.refresh_from_db()
    assert job.state != "dead"  # a backfilled occurrence out of retries does not kill the job
    assert JobRun.objects.get(pk=retry.pk).status == RunStatus.FAILED


# --- the ledger ----------------------------------------------------------------------------


def test_the_timeline_and_explain_tell_each_occurrences_fate() -> None:
    from schedapp import explain

    job = minutely()
    start, end = a_range(10)
    first = api.backfill(job, start, start + 3 * MINUTE, max_per_second=50)
    succeed(run_all(first))
    bf = api.backfill(job, start, end, max_per_second=2)
    refill(bf, 2)
    advance()
    api.cancel_backfill(bf)
    answer = explain.explain(job, start + MINUTE)
    assert answer.entry.kind == "backfill" and "in a backfill" in answer.text
    answer = explain.explain(job, end)
    assert f"Backfill #{bf.pk} did not run it" in answer.text and "cancelled" in answer.text
    said = {
        (e.fate, e.count)
        for e in explain.timeline(job, since=start, until=end)
        if e.kind == "backfill" and e.fate != explain.RAN
    }
    assert said == {(BackfillFate.ALREADY_DONE, 4), (BackfillFate.CANCELLED, 4)}
    ran = [e for e in explain.timeline(job, since=start, until=end) if e.fate == explain.RAN]
    assert len(ran) == 6 and {e.kind for e in ran} == {"backfill"}


@pytest.mark.parametrize("store", ["postgresql", "portable"])
def test_a_backfilled_run_of_a_skip_late_job_is_admitted_though_its_occurrence_is_old(
    store: str,
) -> None:
    # Given a job that skips occurrences found past a 10 s start deadline
    from schedapp.store import portable

    if store == "postgresql" and connection.vendor != "postgresql":
        pytest.skip("the PL/pgSQL door")
    job = minutely(start_deadline=10, skip_late=True)
    start, end = a_range(3)
    bf = api.backfill(job, start, end, max_per_second=100)
    runs = run_all(bf)
    assert len(runs) == 3
    # When its backfilled runs (occurrences minutes old) reach the door
    for run in runs:
        if store == "portable":
            verdict = portable._admit("default", db_now(), run.job_id, run.token, "w", "a")
        else:
            verdict = admit_run(run.job_id, run.token, "w", f"a{run.token}")
        # Then each is admitted: a backfill runs an occurrence as if its time had just
        # passed, so the start deadline (measured from the nominal time) does not apply
        assert str(verdict) == "admitted"


# --- counting a range ----------------------------------------------------------------------


def _counting_paused(job: Job, start, end):
    """api.backfill on a thread of its own, held inside its count of the range until
    ``go`` is set: (thread, out, counting, go)."""
    import threading

    counting, go = threading.Event(), threading.Event()
    real = engine.count_occurrences

    def held(*args, **kwargs):
        counting.set()
        assert go.wait(30), "the test never let the count go on"
        return real(*args, **kwargs)

    patch = mock.patch.object(engine, "count_occurrences", side_effect=held, autospec=True)
    patch.start()
    thread, out = in_thread(lambda: api.backfill(job, start, end, max_per_second=10_000))
    assert counting.wait(30), "api.backfill never counted the range"
    return thread, out, go, patch


@POSTGRES
def test_counting_a_range_does_not_hold_the_jobs_row() -> None:
    """Counting a long range takes seconds (100,000 minutes); a beat must be able to claim the
    job meanwhile, so the count is taken before the row is locked."""
    job = minutely()
    start, end = a_range(30)
    thread, out, go, patch = _counting_paused(job, start, end)
    try:
        with connection.cursor() as cursor:
            cursor.execute("BEGIN")
            try:
                cursor.execute(
                    "SELECT id FROM schedapp_job WHERE id = %s FOR UPDATE NOWAIT", [job.pk]
                )
                locked_by_backfill = False
            except OperationalError:  # lock not available
                locked_by_backfill = True
            cursor.execute("ROLLBACK")
    finally:
        go.set()
        thread.join(60)
        patch.stop()
    assert not locked_by_backfill
    assert "error" not in out, out
    assert out["value"].total == 30


@POSTGRES
def test_a_schedule_changed_while_the_range_was_counted_is_counted_again() -> None:
    job = minutely()
    start, end = a_range(30)
    thread, out, go, patch = _counting_paused(job, start, end)
    try:
        api.update(job, interval=2 * MINUTE, interval_anchor=end - 100 * MINUTE)
    finally:
        go.set()
        thread.join(60)
        patch.stop()
    assert "error" not in out, out
    assert out["value"].total == 15  # every other minute of the 30
