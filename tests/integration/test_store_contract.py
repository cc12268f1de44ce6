"""The storage seam's contract, one set of tests run against every store in one process:
``PostgreSQLStore`` on the default database and ``PortableStore`` on SQLite (the ``portable``
alias of project.settings_test), each bound to its alias.

What a store promises (``schedapp.store.base.Store``): the claim (a batch, by ids, the late
rows without a run, the restamp), the next due instant, the door's every verdict, the
renewal's every outcome, the one-call successes (or "take the general path"), run rows, the
bulk insert of new jobs, notifications (or none: the beat polls), and the overview's reads.
Both stores read the time once per transaction (PostgreSQL's ``now()``; the portable store's
clock is held still here, as a transaction's ``now()`` is), so a lease can be put exactly at
the boundary: a lease that expires at now has expired, as APScheduler's contract tests put it.

What only PostgreSQL can show (a second transaction skipping locked rows, a renewal reporting
a busy row, LISTEN/NOTIFY) runs on it alone; SQLite's IMMEDIATE transactions make the other
writer wait instead, and the portable store's "no listener" is its side of that contract.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connections, transaction

from schedapp.fields import with_defaults
from schedapp.models import Calendar, Job, JobChange, JobRun, JobState, RunStatus
from schedapp.policies import dispatch_wait
from schedapp.store import (
    DoorVerdict,
    NameTaken,
    PortableStore,
    PostgreSQLStore,
    Store,
    insert_runs,
)
from schedapp.validation import JobValidator, job_defaults

pytestmark = pytest.mark.django_db(databases=["default", "portable"])

TASK = "project.tasks.record"
BEAT = "beat-contract"
LEASE = 60  # seconds
STORES = {"postgresql": (PostgreSQLStore, "default"), "portable": (PortableStore, "portable")}


@pytest.fixture(params=list(STORES))
def store(request: pytest.FixtureRequest) -> Store:
    """Each store on its own database; the portable store's clock held still for the test,
    as PostgreSQL's ``now()`` is for the test's transaction."""
    cls, alias = STORES[request.param]
    bound = cls(using=alias)
    if request.param == "portable":
        held = datetime.now(UTC).replace(microsecond=0)
        bound.now = lambda: held  # type: ignore[method-assign]
    return bound


def make_job(store: Store, name: str, **fields: Any) -> Job:
    """A job written straight to the store's database (an interval job, due a second ago)."""
    now = store.now()
    values: dict[str, Any] = {
        "task": TASK,
        "interval": timedelta(minutes=1),
        "interval_anchor": now,
        "timezone": "UTC",
        "lease_seconds": LEASE,
        "next_run_at": now - timedelta(seconds=1),
        "scheduled_for": now - timedelta(seconds=1),
        "misfire_grace": timedelta(minutes=5),
        **fields,
    }
    return Job.objects.using(store.using).create(name=name, **values)


def claimed(store: Store, name: str, **fields: Any) -> dict:
    """A job claimed by the store: its claim row (token, run_id)."""
    job = make_job(store, name, **fields)
    rows, _ = store.claim(BEAT, 10, ids=[job.pk])
    assert len(rows) == 1
    return rows[0]


def admitted(store: Store, name: str, **fields: Any) -> dict:
    row = claimed(store, name, **fields)
    assert store.admit(row["id"], row["token"], "w1", "adm-1") is DoorVerdict.ADMITTED
    return row


def job_of(store: Store, job_id: int) -> Job:
    return Job.objects.using(store.using).get(pk=job_id)


def run_of(store: Store, job_id: int, token: int) -> JobRun:
    return JobRun.objects.using(store.using).get(job_id=job_id, token=token)


def set_job(store: Store, job_id: int, **fields: Any) -> None:
    Job.objects.using(store.using).filter(pk=job_id).update(**fields)


def set_run(store: Store, job_id: int, token: int, **fields: Any) -> None:
    JobRun.objects.using(store.using).filter(job_id=job_id, token=token).update(**fields)


# --- the clock --------------------------------------------------------------------------------


def test_now_is_aware_and_utc(store):
    assert store.now().utcoffset() == timedelta(0)


# --- the claim --------------------------------------------------------------------------------


def test_a_batch_claim_takes_the_due_jobs_by_priority_then_due_time(store):
    # Given two due jobs of one priority, a due job of a higher one, one not yet due, one paused
    now = store.now()
    older = make_job(store, "older", next_run_at=now - timedelta(seconds=30))
    newer = make_job(store, "newer", next_run_at=now - timedelta(seconds=5))
    urgent = make_job(store, "urgent", priority=5)
    later = make_job(store, "later", next_run_at=now + timedelta(seconds=1))
    paused = make_job(store, "paused", state=JobState.PAUSED)

    # When a beat claims at most three
    rows, _ = store.claim(BEAT, 3)

    # Then it takes the three due ones, highest priority first, then by due time
    assert [r["id"] for r in rows] == [urgent.pk, older.pk, newer.pk]
    for row in rows:
        job = job_of(store, row["id"])
        # each under a new token, running, leased for its dispatch wait from the claim's now
        assert (job.state, job.token, job.claimed_by) == (JobState.RUNNING, 1, BEAT)
        assert row["token"] == 1 and not row["late"]
        assert job.lease_expires_at == now + dispatch_wait(LEASE, 0)
        # with one dispatched run, whose id the row carries
        run = run_of(store, row["id"], 1)
        assert (run.pk, run.status, run.claimed_by) == (row["run_id"], RunStatus.DISPATCHED, BEAT)
        assert run.attempt == 1 and run.due_at == job.next_run_at
    # and the job not due yet and the paused one are left alone
    assert job_of(store, later.pk).state == JobState.SCHEDULED
    assert job_of(store, paused.pk).state == JobState.PAUSED


def test_a_job_due_exactly_now_is_claimed(store):
    # Given a job due at exactly the claim's now
    job = make_job(store, "exact", next_run_at=store.now())
    # When claimed, then it is taken (due means next_run_at <= now)
    rows, _ = store.claim(BEAT, 10)
    assert [r["id"] for r in rows] == [job.pk]


def test_a_claim_by_ids_takes_only_those_still_due(store):
    # Given three due jobs and one not due
    a, b, c = (make_job(store, n) for n in "abc")
    future = make_job(store, "future", next_run_at=store.now() + timedelta(hours=1))

    # When a beat claims a and the future one by id
    rows, _ = store.claim(BEAT, 1, ids=[a.pk, future.pk])

    # Then only a is claimed; b and c wait for the next claim
    assert [r["id"] for r in rows] == [a.pk]
    assert {j.state for j in Job.objects.using(store.using).filter(pk__in=[b.pk, c.pk])} == {
        JobState.SCHEDULED
    }
    assert job_of(store, future.pk).token == 0


def test_a_claimed_job_is_not_claimed_again(store):
    # Given a job already claimed
    row = claimed(store, "once")
    # When a beat claims again, then nothing is due
    assert store.claim(BEAT, 10)[0] == []
    assert store.due_ids(10) == []
    assert job_of(store, row["id"]).token == 1


def test_a_late_row_is_returned_without_a_run(store):
    # Given a recurring job found later than its misfire grace, and one on time
    now = store.now()
    late = make_job(store, "late", next_run_at=now - timedelta(hours=1))
    on_time = make_job(store, "on-time")

    # When claimed
    rows = {r["id"]: r for r in store.claim(BEAT, 10)[0]}

    # Then the late one is marked late, with no run (its misfire policy decides above the
    # seam), and the one on time has its run
    assert rows[late.pk]["late"] and not rows[late.pk].get("run_id")
    assert rows[late.pk]["lateness"] == pytest.approx(3600, abs=1)
    assert not JobRun.objects.using(store.using).filter(job_id=late.pk).exists()
    assert not rows[on_time.pk]["late"] and rows[on_time.pk]["run_id"]


# Whether a claimed row is late, as the SQL says it and as the portable store says it in
# Python: (skip_late, start_deadline, seconds since the occurrence, jitter seconds), against
# policies.misfire_after / past_start_deadline (the grace here: 5 minutes).
LATE_CASES = [
    (False, None, 30, 0),
    (False, 10, 30, 0),  # late by its deadline, but the job does not skip: runs
    (True, 10, 30, 0),
    (True, 10, 9, 0),
    (True, 10, 12, 5),  # jitter: due 7 s ago, the occurrence 12 s ago: past the deadline
    (True, None, 30, 0),  # (refused by the API; written behind its back: not late)
    (True, 600, 400, 0),  # beyond the grace, within the deadline: the misfire policy's
    (False, None, 400, 0),
]


@pytest.mark.parametrize(("skip", "deadline", "ago", "jitter"), LATE_CASES)
def test_a_row_is_late_beyond_its_grace_or_its_start_deadline_when_it_skips(
    store, skip, deadline, ago, jitter
):
    from schedapp.policies import misfire_after, past_start_deadline

    now = store.now()
    occurrence = now - timedelta(seconds=ago)
    job = make_job(
        store,
        "j",
        scheduled_for=occurrence,
        next_run_at=occurrence + timedelta(seconds=jitter),
        skip_late=skip,
        start_deadline=None if deadline is None else timedelta(seconds=deadline),
    )
    (row,) = store.claim(BEAT, 10, ids=[job.pk])[0]
    expected = now - (occurrence + timedelta(seconds=jitter)) > misfire_after(
        "run_once", timedelta(minutes=5)
    ) or past_start_deadline(skip, job.start_deadline, occurrence, now)
    assert row["late"] is expected
    assert bool(row.get("run_id")) is not expected


def test_due_ids_are_the_claims_order_and_claim_nothing(store):
    now = store.now()
    first = make_job(store, "first", next_run_at=now - timedelta(minutes=2))
    second = make_job(store, "second")
    assert store.due_ids(10) == [first.pk, second.pk]
    assert store.due_ids(1) == [first.pk]
    assert job_of(store, first.pk).state == JobState.SCHEDULED


def test_restamp_takes_the_lease_from_the_clock_and_only_of_running_jobs(store):
    # Given a claimed job whose lease is about to run out, and a job back to scheduled
    row = claimed(store, "slow-claim")
    set_job(store, row["id"], lease_expires_at=store.now() - timedelta(seconds=50))
    waiting = make_job(store, "waiting")

    # When the claim restamps both before it commits
    store.restamp_leases([row["id"], waiting.pk])

    # Then the claimed job's lease runs its whole dispatch wait from the clock again
    assert job_of(store, row["id"]).lease_expires_at >= store.now() + dispatch_wait(LEASE, 0)
    assert job_of(store, waiting.pk).lease_expires_at is None


# --- next due ---------------------------------------------------------------------------------


def test_next_due_is_the_earliest_due_job_and_the_earliest_lease_expiry(store):
    now = store.now()
    make_job(store, "soon", next_run_at=now + timedelta(seconds=30))
    make_job(store, "later", next_run_at=now + timedelta(minutes=30))
    make_job(store, "paused", state=JobState.PAUSED, next_run_at=now)
    row = claimed(store, "running")
    expiry = job_of(store, row["id"]).lease_expires_at

    assert store.next_due() == (now, now + timedelta(seconds=30), expiry)


def test_next_due_counts_a_run_to_supersede_before_its_lease_ends(store):
    """Under cancel_other / terminate_other a beat must wake when a run is to be cancelled
    (``supersede_at``), earlier than its lease's end; a job not running has none to cancel."""
    now = store.now()
    row = claimed(store, "running")
    set_job(store, row["id"], supersede_at=now + timedelta(seconds=5))
    idle = make_job(store, "idle", next_run_at=now + timedelta(minutes=30))
    set_job(store, idle.pk, supersede_at=now + timedelta(seconds=1))  # not running: ignored
    assert store.next_due() == (now, now + timedelta(minutes=30), now + timedelta(seconds=5))


def test_next_due_with_nothing_scheduled(store):
    assert store.next_due() == (store.now(), None, None)


# --- the door ---------------------------------------------------------------------------------


def test_the_door_admits_a_dispatched_run_and_gives_it_an_ordinary_lease(store):
    # Given a run dispatched a second time (its wait doubled)
    row = claimed(store, "door", unstarted_dispatches=1)
    now = store.now()

    # When the door admits it
    verdict = store.admit(row["id"], row["token"], "w1", "adm-1")

    # Then it runs, under the worker's admission, with an ordinary lease from now
    assert verdict is DoorVerdict.ADMITTED
    run = run_of(store, row["id"], row["token"])
    assert (run.status, run.worker, run.admission, run.started_at) == (
        RunStatus.RUNNING,
        "w1",
        "adm-1",
        now,
    )
    job = job_of(store, row["id"])
    assert (job.lease_expires_at, job.unstarted_dispatches) == (now + timedelta(seconds=LEASE), 0)


def test_the_same_door_call_again_is_admitted_again(store):
    # Given a run admitted, whose door's reply was lost
    row = admitted(store, "retried-door")
    # When the same admission knocks again, then it is admitted again, and nothing changes
    assert store.admit(row["id"], row["token"], "w1", "adm-1") is DoorVerdict.ADMITTED
    assert run_of(store, row["id"], row["token"]).status == RunStatus.RUNNING


def _stale(store: Store, row: dict) -> None:
    set_job(store, row["id"], token=row["token"] + 1)


def _lease_ends_now(store: Store, row: dict) -> None:
    set_job(store, row["id"], lease_expires_at=store.now())


def _paused(store: Store, row: dict) -> None:
    set_job(store, row["id"], state=JobState.PAUSED)


def _dead(store: Store, row: dict) -> None:
    set_job(store, row["id"], state=JobState.DEAD, lease_expires_at=None)


def _started_elsewhere(store: Store, row: dict) -> None:
    set_run(store, row["id"], row["token"], status=RunStatus.RUNNING, admission="adm-other")


def _finished(store: Store, row: dict) -> None:
    set_run(store, row["id"], row["token"], status=RunStatus.SUCCEEDED)


# What a refused run's error says, as the admin shows it: the same text on every store.
SKIPPED_ERRORS = {
    DoorVerdict.STALE_TOKEN: "delivered but not executed: its claim is no longer the job's "
    "current one",
    DoorVerdict.LEASE_EXPIRED: "delivered but not executed: its lease expired before it arrived",
    DoorVerdict.JOB_PAUSED: "delivered but not executed: the job is paused",
    DoorVerdict.JOB_STATE: "delivered but not executed: the job is no longer running",
}

# (how the run stands when its message arrives, the verdict, its run's status afterwards)
REFUSALS = [
    (_stale, DoorVerdict.STALE_TOKEN, RunStatus.SKIPPED),
    (_lease_ends_now, DoorVerdict.LEASE_EXPIRED, RunStatus.SKIPPED),
    (_paused, DoorVerdict.JOB_PAUSED, RunStatus.SKIPPED),
    (_dead, DoorVerdict.JOB_STATE, RunStatus.SKIPPED),
    (_started_elsewhere, DoorVerdict.DUPLICATE, RunStatus.RUNNING),
    (_finished, DoorVerdict.DUPLICATE, RunStatus.SUCCEEDED),
]


@pytest.mark.parametrize(
    ("given", "verdict", "status"), REFUSALS, ids=[g.__name__.strip("_") for g, *_ in REFUSALS]
)
def test_the_door_refuses(store, given, verdict, status):
    # Given a dispatched run, then the situation
    row = claimed(store, f"refused-{given.__name__}")
    given(store, row)

    # When its message reaches the door
    got = store.admit(row["id"], row["token"], "w1", "adm-1")

    # Then the verdict, and a run still dispatched is recorded as delivered, not executed
    assert got is verdict
    run = run_of(store, row["id"], row["token"])
    assert run.status == status
    if status == RunStatus.SKIPPED:
        assert run.error == SKIPPED_ERRORS[verdict]
        assert (run.finished_at, run.worker) == (store.now(), "w1")
        assert run.started_at is None


def test_a_paused_jobs_refused_run_lets_go_of_its_lease(store):
    row = claimed(store, "paused-door")
    _paused(store, row)
    assert store.admit(row["id"], row["token"], "w1", "adm-1") is DoorVerdict.JOB_PAUSED
    job = job_of(store, row["id"])
    assert (job.claimed_by, job.lease_expires_at) == ("", None)


def test_a_lease_a_moment_before_its_end_is_admitted(store):
    # Given a lease that expires a millisecond after now: still valid at the boundary's edge
    row = claimed(store, "just-in-time")
    set_job(store, row["id"], lease_expires_at=store.now() + timedelta(milliseconds=1))
    assert store.admit(row["id"], row["token"], "w1", "adm-1") is DoorVerdict.ADMITTED


def test_the_door_knows_no_such_run(store):
    row = claimed(store, "unknown")
    assert store.admit(row["id"], row["token"] + 7, "w1", "adm-1") is DoorVerdict.UNKNOWN
    assert store.admit(10**9, 1, "w1", "adm-1") is DoorVerdict.UNKNOWN


def test_the_door_finds_the_run_by_the_id_its_message_carries(store):
    # Given two claimed runs
    row, other = claimed(store, "keyed"), claimed(store, "keyed-other")
    run_id = run_of(store, row["id"], row["token"]).pk
    other_id = run_of(store, other["id"], other["token"]).pk
    # Then a door naming another claim's run finds no such run, and writes nothing
    assert store.admit(row["id"], row["token"], "w1", "adm-1", other_id) is DoorVerdict.UNKNOWN
    assert run_of(store, row["id"], row["token"]).status == RunStatus.DISPATCHED
    assert run_of(store, other["id"], other["token"]).status == RunStatus.DISPATCHED
    # and one naming its own run admits it, as one naming none does
    assert store.admit(row["id"], row["token"], "w1", "adm-1", run_id) is DoorVerdict.ADMITTED
    assert store.admit(other["id"], other["token"], "w1", "adm-2") is DoorVerdict.ADMITTED


# --- renewal ----------------------------------------------------------------------------------


def test_a_held_lease_is_renewed_and_its_run_heartbeats(store):
    # Given a running run whose lease expires at exactly now (not reaped yet)
    row = admitted(store, "renewed")
    set_job(store, row["id"], lease_expires_at=store.now())

    # When its worker renews
    out = store.renew([(row["id"], row["token"])])

    # Then it is renewed for a whole lease from now, and its run counts the heartbeat
    assert out == [(row["id"], row["token"], "renewed")]
    assert job_of(store, row["id"]).lease_expires_at == store.now() + timedelta(seconds=LEASE)
    run = run_of(store, row["id"], row["token"])
    assert (run.heartbeats, run.heartbeat_at) == (1, store.now())


def _renew_finished(store: Store, row: dict) -> None:
    set_job(store, row["id"], state=JobState.SCHEDULED, lease_expires_at=None)
    set_run(store, row["id"], row["token"], status=RunStatus.SUCCEEDED)


def _renew_cancelled(store: Store, row: dict) -> None:
    set_job(store, row["id"], state=JobState.CANCELLED, lease_expires_at=None)
    set_run(store, row["id"], row["token"], status=RunStatus.CANCELLED)


def _renew_unstarted(store: Store, row: dict) -> None:
    set_job(store, row["id"], token=row["token"] + 1)  # reaped and claimed again, unstarted


def _renew_lost(store: Store, row: dict) -> None:
    set_job(store, row["id"], token=row["token"] + 1)
    set_run(store, row["id"], row["token"], status=RunStatus.LOST)


def _renew_finished_stale(store: Store, row: dict) -> None:
    set_job(store, row["id"], token=row["token"] + 1)
    set_run(store, row["id"], row["token"], status=RunStatus.SUCCEEDED, stale=True)


RENEWALS = [
    (_renew_finished, True, "finished"),
    (_renew_cancelled, True, "cancelled"),
    (_renew_unstarted, False, "unstarted"),
    (_renew_lost, True, "lost"),
    (_renew_finished_stale, True, "lost"),
]


@pytest.mark.parametrize(
    ("given", "admit", "outcome"), RENEWALS, ids=[g.__name__[7:] for g, *_ in RENEWALS]
)
def test_a_lease_no_longer_held_is_not_renewed(store, given, admit, outcome):
    # Given a run (admitted or not), then what became of it
    row = admitted(store, f"r-{given.__name__}") if admit else claimed(store, f"r-{outcome}")
    given(store, row)
    lease_before = job_of(store, row["id"]).lease_expires_at

    # When its worker renews, then the outcome says why, and nothing was written
    assert store.renew([(row["id"], row["token"])]) == [(row["id"], row["token"], outcome)]
    assert job_of(store, row["id"]).lease_expires_at == lease_before
    assert run_of(store, row["id"], row["token"]).heartbeats == 0


def test_a_lease_of_no_such_job_is_lost(store):
    assert store.renew([(10**9, 1)]) == [(10**9, 1, "lost")]


def test_one_renewal_answers_for_every_held_lease_in_order(store):
    a = admitted(store, "many-a")
    b = admitted(store, "many-b")
    _renew_lost(store, b)
    held = [(b["id"], b["token"]), (a["id"], a["token"])]
    assert store.renew(held) == [(*held[0], "lost"), (*held[1], "renewed")]


# --- successes in one call --------------------------------------------------------------------


def _one_off_success(store: Store, row: dict) -> list[Any]:
    """schedapp_succeed_run's arguments for a one-off job (no next occurrence), the run's id
    last, as a worker sends it from the message's headers."""
    run_id = run_of(store, row["id"], row["token"]).pk
    return [row["id"], row["token"], row["scheduled_for"], None, True, "", "", None, None, run_id]


def test_succeed_run_in_one_call_or_the_general_path(store):
    # Given an admitted one-off run
    now = store.now()
    row = admitted(store, "fast", interval=None, interval_anchor=None, run_at=now)

    # When the worker records its success in one call
    applied = store.succeed_run(_one_off_success(store, row))

    run = run_of(store, row["id"], row["token"])
    if isinstance(store, PortableStore):
        # Then the portable store declines (the general path records it) and wrote nothing
        assert applied is False
        assert run.status == RunStatus.RUNNING
        return
    # Then PostgreSQL applied it: the run succeeded, the one-off job is done, lease let go
    assert applied is True
    assert run.status == RunStatus.SUCCEEDED
    job = job_of(store, row["id"])
    assert (job.state, job.lease_expires_at) == (JobState.SUCCEEDED, None)
    # and the same call again (its reply lost) finds nothing to do
    assert store.succeed_run(_one_off_success(store, row)) is False


def test_succeed_runs_and_succeed_and_admit(store):
    # Given two admitted one-off runs, and a third run waiting at the door
    now = store.now()
    once = {"interval": None, "interval_anchor": None, "run_at": now}
    a, b = admitted(store, "batch-a", **once), admitted(store, "batch-b", **once)
    waiting = claimed(store, "batch-next")
    columns = [
        list(c) for c in zip(_one_off_success(store, a), _one_off_success(store, b), strict=True)
    ]

    # When the two successes are recorded in one call, then the door is asked with none
    batch = store.succeed_runs(columns)
    rows, verdict = store.succeed_and_admit([], waiting["id"], waiting["token"], "w1", "adm-9")

    # Then the door's verdict comes back on both stores
    assert (rows, verdict) == ([], DoorVerdict.ADMITTED)
    statuses = {run_of(store, r["id"], r["token"]).status for r in (a, b)}
    if isinstance(store, PortableStore):
        # and the portable store took neither success (the general path will)
        assert batch == []
        assert statuses == {RunStatus.RUNNING}
    else:
        assert sorted(batch) == [(1, True), (2, True)]
        assert statuses == {RunStatus.SUCCEEDED}


def test_succeed_and_admit_carries_a_success_to_the_door(store):
    now = store.now()
    done = admitted(store, "carried", interval=None, interval_anchor=None, run_at=now)
    waiting = claimed(store, "next-at-door")
    columns = [[value] for value in _one_off_success(store, done)]

    rows, verdict = store.succeed_and_admit(columns, waiting["id"], waiting["token"], "w1", "a2")

    assert verdict is DoorVerdict.ADMITTED
    assert run_of(store, waiting["id"], waiting["token"]).status == RunStatus.RUNNING
    status = run_of(store, done["id"], done["token"]).status
    if isinstance(store, PortableStore):
        assert (rows, status) == ([], RunStatus.RUNNING)
    else:
        assert (rows, status) == ([(1, True)], RunStatus.SUCCEEDED)


# --- run rows ---------------------------------------------------------------------------------


def test_insert_runs_writes_a_dispatched_run_per_row(store):
    # Given a late claimed row its misfire policy decided to run (the claim wrote no run)
    now = store.now()
    job = make_job(store, "late-run", next_run_at=now - timedelta(hours=2))
    (row,) = store.claim(BEAT, 10)[0]
    assert row["late"]

    # When the runs are inserted
    insert_runs(BEAT, [row], now, store.using)

    # Then it has its run, and the row its id
    run = run_of(store, job.pk, row["token"])
    assert run.pk == row["run_id"]
    assert (run.status, run.attempt, run.dispatched_at) == (RunStatus.DISPATCHED, 1, now)
    assert run.task_id and run.claimed_by == BEAT


def test_the_claim_records_each_runs_kind(store):
    # Given a job due on its schedule, one a person ran now, and one retrying (any attempt
    # after the first is a retry, a manual occurrence's too)
    now = store.now()
    make_job(store, "scheduled")
    make_job(store, "manual", manual_at=now - timedelta(seconds=1))
    make_job(store, "retrying", retry_count=2, manual_at=now - timedelta(seconds=1))
    # and one whose run now was an occurrence ago
    make_job(store, "moved-on", manual_at=now - timedelta(minutes=1))

    # When the store claims them
    rows, _ = store.claim(BEAT, 10)

    # Then each run says why it exists
    kinds = dict(JobRun.objects.using(store.using).values_list("job__name", "kind"))
    assert kinds == {
        "scheduled": "scheduled",
        "manual": "manual",
        "retrying": "retry",
        "moved-on": "scheduled",
    }
    assert len(rows) == 4


# --- the bulk insert of new jobs --------------------------------------------------------------


def _encoded(store: Store, now: datetime, names: list[str]) -> list[Any]:
    encoder = store.job_rows(now, "binary")
    rows = []
    for name in names:
        values = with_defaults(job_defaults(), {"task": TASK, "name": name, "interval": 60})
        checked = JobValidator().check(values)
        assert not checked.errors, checked.errors
        rows.append(encoder.encode(checked, "api", now, now + timedelta(minutes=1)))
    return [encoder, rows]


def test_insert_jobs_writes_them_and_says_where(store):
    # Given three new jobs encoded for the store
    now = store.now()
    encoder, rows = _encoded(store, now, ["bulk-1", "bulk-2", "bulk-3"])

    # When inserted
    inserted = store.insert_jobs(encoder, iter(rows))

    # Then they are there, scheduled, and the last id is the last of them
    jobs = Job.objects.using(store.using).order_by("id")
    assert [j.name for j in jobs] == ["bulk-1", "bulk-2", "bulk-3"]
    assert {j.state for j in jobs} == {JobState.SCHEDULED}
    assert inserted.last_id == jobs.last().pk
    assert jobs.first().next_run_at == now + timedelta(minutes=1)
    # and the store finds them by name
    found = store.jobs_named(["bulk-2", "nobody"])
    assert list(found) == ["bulk-2"]
    assert found["bulk-2"][0] == jobs.get(name="bulk-2").pk


def test_insert_jobs_with_a_taken_name_writes_none_of_them(store):
    # Given an existing job, and a batch of which one takes its name
    now = store.now()
    make_job(store, "taken")
    encoder, rows = _encoded(store, now, ["free-1", "taken", "free-2"])

    # When inserted, then the store says a name is taken, and none of the batch was written
    with pytest.raises(NameTaken):
        store.insert_jobs(encoder, iter(rows))
    assert list(Job.objects.using(store.using).values_list("name", flat=True)) == ["taken"]
    # and the transaction goes on: a batch without the clash is written
    encoder, rows = _encoded(store, now, ["free-1", "free-2"])
    store.insert_jobs(encoder, iter(rows))
    assert Job.objects.using(store.using).count() == 3


def test_record_created_writes_one_audit_record_per_named_job(store):
    # Given two jobs written in bulk, and a name no job holds
    now = store.now()
    encoder, rows = _encoded(store, now, ["audited-1", "audited-2"])
    store.insert_jobs(encoder, iter(rows))

    # When their creation is recorded
    names = ["audited-1", "audited-2", "nobody"]
    store.record_created(names, source="bulk", actor="me", reason="r")

    # Then each job has one "created" record with who, the path and why
    records = JobChange.objects.using(store.using).order_by("job_name")
    jobs = dict(Job.objects.using(store.using).values_list("name", "id"))
    assert [(c.job_id, c.job_name, c.action, c.source, c.actor, c.reason) for c in records] == [
        (jobs[name], name, "created", "bulk", "me", "r") for name in ("audited-1", "audited-2")
    ]
    assert all(c.changes is None and c.at is not None for c in records)


def test_tagged_finds_exactly_the_jobs_carrying_a_label(store):
    make_job(store, "eu", tags=["billing", "team-eu"])
    make_job(store, "ops", tags=["billing-ops"])
    make_job(store, "none")
    jobs = Job.objects.using(store.using)
    assert list(jobs.filter(store.tagged("billing")).values_list("name", flat=True)) == ["eu"]
    assert list(jobs.filter(store.tagged("billing-ops")).values_list("name", flat=True)) == ["ops"]
    assert not jobs.filter(store.tagged("team")).exists()


# --- notifications ----------------------------------------------------------------------------


def test_the_portable_store_has_no_listener_and_notify_is_harmless():
    # The portable store's side of the contract: beats poll, and a notify changes nothing
    store = PortableStore(using="portable")
    store.notify(datetime.now(UTC), None)
    store.notify(None, 1.0)
    assert store.listen() is None


@pytest.mark.django_db(databases=["default"], transaction=True)
def test_a_committed_notify_wakes_a_postgresql_listener():
    # Given a beat's listener on PostgreSQL
    store = PostgreSQLStore(using="default")
    listener = store.listen()
    assert listener is not None
    try:
        # When a job due now is notified in a transaction that commits
        with transaction.atomic(using="default"):
            store.notify(store.now(), None)
        # Then the listener wakes for a wake-up time after it
        assert listener.wait(5.0, wake_at_db=datetime.now(UTC).timestamp() + 60) is True
        # and sleeps out its timeout when nothing more comes
        assert listener.wait(0.2, wake_at_db=None) is False
    finally:
        listener.close()


# --- what only PostgreSQL can show: another transaction's locks are skipped, not waited for -


@pytest.mark.django_db(databases=["default"], transaction=True)
def test_postgresql_skips_what_another_transaction_holds():
    # Given two due jobs, one of them locked by another transaction (a beat mid-claim)
    store = PostgreSQLStore(using="default")
    held_job = make_job(store, "held")
    free_job = make_job(store, "free")
    locked, release, done = threading.Event(), threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic(using="default"):
                Job.objects.select_for_update().get(pk=held_job.pk)
                locked.set()
                release.wait(10)
        finally:
            connections.close_all()
            done.set()

    threading.Thread(target=hold, daemon=True).start()
    assert locked.wait(10)
    try:
        with transaction.atomic(using="default"):
            # When a beat claims, then it takes the free job without waiting
            rows, _ = store.claim(BEAT, 10)
            assert [r["id"] for r in rows] == [free_job.pk]
            assert store.due_ids(10) == []
    finally:
        release.set()
        assert done.wait(10)


@pytest.mark.django_db(databases=["default"], transaction=True)
def test_postgresql_reports_a_held_row_busy_on_renewal():
    # Given a running job whose row another transaction holds (a door, a completion)
    store = PostgreSQLStore(using="default")
    with transaction.atomic(using="default"):
        row = admitted(store, "busy")
    locked, release, done = threading.Event(), threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic(using="default"):
                Job.objects.select_for_update().get(pk=row["id"])
                locked.set()
                release.wait(10)
        finally:
            connections.close_all()
            done.set()

    threading.Thread(target=hold, daemon=True).start()
    assert locked.wait(10)
    try:
        # When the worker renews, then it does not wait: the lease is busy, to be renewed later
        with transaction.atomic(using="default"):
            assert store.renew([(row["id"], row["token"])]) == [(row["id"], row["token"], "busy")]
    finally:
        release.set()
        assert done.wait(10)


# --- the overview's reads ---------------------------------------------------------------------


def test_backlog_counts_due_jobs_up_to_the_cap(store):
    now = store.now()
    for i in range(3):
        make_job(store, f"due-{i}", next_run_at=now - timedelta(minutes=i + 1))
    make_job(store, "not-due", next_run_at=now + timedelta(hours=1))
    claimed(store, "running")

    assert store.backlog(10) == (3, now - timedelta(minutes=3))
    assert store.backlog(2)[0] == 2


def test_dispatch_lag_and_recent_statuses_say_the_same_on_every_store(store):
    # Given runs in two minutes of the window (lags 1, 2, 4, 10 s in one, 0.5 s in the other),
    # one dispatched before the window, and the oldest one outside the newest-runs sample
    now = store.now()
    job = make_job(store, "lag")
    early = now.replace(second=0, microsecond=0) - timedelta(minutes=3)
    late = now.replace(second=0, microsecond=0) - timedelta(minutes=1)
    runs = [
        (early, 0.0, RunStatus.SUCCEEDED),  # the oldest: outside the sample of 6
        (now - timedelta(hours=2), 0.0, RunStatus.SUCCEEDED),  # before the window
        (early + timedelta(seconds=1), 1.0, RunStatus.SUCCEEDED),
        (early + timedelta(seconds=2), 2.0, RunStatus.FAILED),
        (early + timedelta(seconds=3), 4.0, RunStatus.SUCCEEDED),
        (early + timedelta(seconds=4), 10.0, RunStatus.SUCCEEDED),
        (late + timedelta(seconds=5), 0.5, RunStatus.RUNNING),
    ]
    for token, (dispatched, lag, status) in enumerate(runs, start=1):
        JobRun.objects.using(store.using).create(
            job=job,
            token=token,
            scheduled_for=dispatched,
            due_at=dispatched - timedelta(seconds=lag),
            dispatched_at=dispatched,
            task_id=f"lag-{token}",
            status=status,
        )

    lag = store.dispatch_lag(5, 6)
    statuses = store.recent_statuses(5, 6)

    # Then the whole window first (p50 and p95 as percentile_cont interpolates them), then
    # each minute, oldest first
    expected = [(None, 5, 2.0, 8.8, 10.0), (early, 4, 3.0, 9.1, 10.0), (late, 1, 0.5, 0.5, 0.5)]
    assert [(m, int(n)) for m, n, *_ in lag] == [(m, n) for m, n, *_ in expected]
    for row, want in zip(lag, expected, strict=True):
        assert [float(v) for v in row[2:]] == pytest.approx(want[2:])
    assert statuses == {RunStatus.FAILED: 1, RunStatus.RUNNING: 1, RunStatus.SUCCEEDED: 3}


def test_dispatch_lag_of_an_empty_window_is_one_empty_row(store):
    assert store.dispatch_lag(5, 100) == [(None, 0, None, None, None)]
    assert store.recent_statuses(5, 100) == {}


def test_the_claim_reads_a_jobs_calendar_with_it(store):
    """The misfire planning of a claim follows a job's calendar: both stores' claim rows carry
    what ``job_calendars.for_rows`` and ``for_row`` read."""
    calendar = Calendar.objects.using(store.using).create(
        name="contract-sundays", definition={"weekdays": ["sun"]}
    )
    row = claimed(
        store, "under-a-calendar", calendar=calendar, calendar_mode="only", calendar_roll="defer"
    )
    plain = claimed(store, "without")
    assert (row["calendar_id"], row["calendar_mode"], row["calendar_roll"]) == (
        calendar.pk,
        "only",
        "defer",
    )
    assert (plain["calendar_id"], plain["calendar_mode"], plain["calendar_roll"]) == (
        None,
        "exclude",
        "skip",
    )


# --- a backfilled run: a lease of its own, a negative token ---------------------------------


def test_a_backfilled_run_beside_the_jobs_own_run_is_admitted_and_renewed_on_its_row(store):
    # Given a job whose own run is in flight (token 1), and a backfilled run of an earlier
    # occurrence beside it, as lease.backfill writes it (a negative token, its own lease)
    row = admitted(store, "backfilled")
    now = store.now()
    JobRun.objects.using(store.using).create(
        job_id=row["id"],
        token=-1,
        kind="backfill",
        scheduled_for=now - timedelta(hours=1),
        due_at=now,
        dispatched_at=now,
        task_id=f"schedapp:{row['id']}:-1",
        own_lease=True,
        lease_expires_at=now + timedelta(seconds=LEASE),
    )
    before = job_of(store, row["id"])

    # When the door admits it and its worker renews both leases
    assert store.admit(row["id"], -1, "w2", "adm-b") is DoorVerdict.ADMITTED
    out = store.renew([(row["id"], row["token"]), (row["id"], -1)])

    # Then each is decided on its own: the backfilled run on its row, the job's run on the
    # job, whose token and state the backfilled run left alone
    # (outcomes by pair: PostgreSQL lists a run's own leases first; renew_leases reads pairs)
    assert sorted(out) == [(row["id"], -1, "renewed"), (row["id"], row["token"], "renewed")]
    run = run_of(store, row["id"], -1)
    assert (run.status, run.worker, run.admission) == (RunStatus.RUNNING, "w2", "adm-b")
    job = job_of(store, row["id"])
    assert (job.token, job.state) == (before.token, before.state) == (row["token"], "running")
    assert run_of(store, row["id"], row["token"]).status == RunStatus.RUNNING
