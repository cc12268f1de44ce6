"""Worker hooks without a database: which runs a worker keeps renewing (every request Celery
still holds, read from its own bookkeeping, ``celery.worker.state``), and how long an outcome
is retried through a database outage."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from billiard.process import current_process
from celery.worker import state as worker_state
from kombu.utils.limits import TokenBucket

from schedapp.message import HEADER_LEASE, HEADER_RUN, task_id_for
from schedapp.worker import DoorBoard, HeldLeases, Outcome, WorkerHooks, completions, door, leases
from schedapp.worker.completions import FAILED, SUCCEEDED

CLAIM = (7, 3)


class Request:
    """What the hooks and ``celery.worker.state`` read of a request (weak-referenceable, as
    Celery's own)."""

    def __init__(self, task_id: str) -> None:
        self.id = task_id
        self.name = "project.tasks.record"
        self.request_dict = {"headers": {}}
        self.acknowledged = False


@pytest.fixture
def held(monkeypatch: pytest.MonkeyPatch) -> Iterator[HeldLeases]:
    """The runs a worker holds, on their own."""
    monkeypatch.setattr(leases, "ADMISSION_GRACE", 0.0)  # no grace: forget at once
    yield HeldLeases()
    worker_state.requests.clear()
    worker_state.active_requests.clear()
    worker_state.reserved_requests.clear()


def received(held: HeldLeases) -> Request:
    request = Request(task_id_for(*CLAIM))
    held.on_task_received(request=request)
    return request


@pytest.mark.parametrize(
    "header, run_id", [("41", 41), (41, 41), (None, None), ("", None), ("forty-one", None)]
)
def test_a_held_run_keeps_the_id_its_message_carries_or_none_if_unreadable(held, header, run_id):
    """An unreadable id (a foreign or older message) is None, so the renewal finds the run by
    its claim instead of failing the heartbeat."""
    request = Request(task_id_for(*CLAIM))
    if header is not None:
        request.request_dict[HEADER_RUN] = header
    held.on_task_received(request=request)
    assert held.held[CLAIM].run_id == run_id


def test_a_run_executing_is_still_renewed_after_a_redelivered_copy_of_its_message_ended(held):
    # Given a run executing on this worker
    running = received(held)
    worker_state.task_reserved(running)
    worker_state.task_accepted(running)
    # When a redelivered copy of its message (same task id) arrives, is refused at the door
    # and ends, which removes the id from Celery's ``requests`` dict
    copy = received(held)
    worker_state.task_reserved(copy)
    worker_state.task_ready(copy)
    assert running.id not in worker_state.requests
    # Then the run still executing is still held, and its lease renewed
    held.due_for_renewal()
    assert CLAIM in held.held
    # and once it ends too, it is forgotten
    worker_state.task_ready(running)
    held.due_for_renewal()
    assert CLAIM not in held.held


def test_a_refused_copy_is_forgotten_as_celery_acknowledges_it_not_after_the_grace(
    held, monkeypatch
):
    """Within the grace a request missing from Celery's bookkeeping may not be in it yet
    (just received); one whose message Celery acknowledged is done. Before, a copy the door
    refused stayed held for the whole grace: with a lease under 6 s its renewal came due and
    found the run lost, a false "lost its lease" alarm on a worker that never ran it."""
    monkeypatch.setattr(leases, "ADMISSION_GRACE", 60.0)
    # Given a message just received, not yet in Celery's sets: held through the grace
    copy = received(held)
    held.due_for_renewal()
    assert CLAIM in held.held
    # When Celery reserves it, the door refuses it (Ignore: acknowledged) and it ends
    worker_state.task_reserved(copy)
    worker_state.task_accepted(copy)
    copy.acknowledged = True
    worker_state.task_ready(copy)
    # Then it is forgotten at once: no renewal of it comes due
    assert held.due_for_renewal() == []
    assert CLAIM not in held.held


def test_a_run_waiting_in_a_rate_limit_bucket_is_still_renewed(held):
    # Given a message of a rate-limited task, waiting for a token (Celery holds it in the
    # task's bucket, not in ``requests``)
    waiting = received(held)
    bucket = TokenBucket(fill_rate=0.001, capacity=1)
    bucket.add((waiting, 1))
    held.consumer = SimpleNamespace(task_buckets={waiting.name: bucket, "other": None})
    # Then it is held, so its lease does not run out before it reaches the door
    held.due_for_renewal()
    assert CLAIM in held.held
    # and once the bucket lets it go and it ends, it is forgotten
    bucket.contents.clear()
    held.due_for_renewal()
    assert CLAIM not in held.held


# --- completions through a database outage ------------------------------------------------


class Clock:
    """``time.monotonic`` and ``time.sleep`` for the retry loop, without waiting."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_a_completion_is_retried_through_an_outage_shorter_than_the_run_lease(monkeypatch):
    from django.db import OperationalError

    from schedapp import db
    from schedapp.lease import Completion, CompletionResult

    clock = Clock()
    monkeypatch.setattr(db.time, "monotonic", clock.monotonic)
    monkeypatch.setattr(db.time, "sleep", clock.sleep)
    monkeypatch.setattr(db, "reset_connection", lambda: None)
    written: list[float] = []

    def complete_run(job_id, token, outcome, **fields):
        if clock.now < 45:  # the database restarts for 45 s, within the run's 60 s lease
            raise OperationalError("server closed the connection unexpectedly")
        written.append(clock.now)
        return CompletionResult(Completion.APPLIED)

    monkeypatch.setattr(completions, "complete_run", complete_run)
    task = SimpleNamespace(request=SimpleNamespace(schedapp_lease=60))
    # When the task fails as the database goes away
    completions.Completions().on_task_failure(
        sender=task, task_id=task_id_for(*CLAIM), exception=KeyError()
    )
    # Then its outcome is written once the database is back, not dropped after a fixed
    # number of attempts (the run would be reaped and run again)
    assert len(written) == 1 and 45 <= written[0] < 51


@pytest.mark.parametrize(
    ("cause", "said", "resets"),
    [
        ("DeadlockDetected", "database conflict (deadlock detected) during door", 0),
        ("SerializationFailure", "database conflict (serialization failure) during door", 0),
        ("AdminShutdown", "database unavailable during door", 1),
    ],
)
def test_a_lock_conflict_is_retried_as_such_not_reported_as_an_outage(
    monkeypatch, cause, said, resets
):
    from django.db import OperationalError
    from psycopg import errors

    from schedapp import db

    clock, warned, reset = Clock(), [], []
    monkeypatch.setattr(db.time, "sleep", clock.sleep)
    monkeypatch.setattr(db, "reset_connection", lambda: reset.append(1))
    monkeypatch.setattr(db.log, "warning", lambda msg, *a, **k: warned.append(msg % a))
    calls: list[int] = []

    def door() -> str:
        calls.append(1)
        if len(calls) == 1:  # as Django raises it: its OperationalError from psycopg's
            try:
                raise getattr(errors, cause)(cause)
            except errors.Error as exc:
                raise OperationalError(str(exc)) from exc
        return "admitted"

    # When PostgreSQL breaks a deadlock (or a serialization failure) by aborting our statement
    assert db.with_retries(door, what="door") == "admitted"
    # Then it is retried and logged as the conflict it is, on the same connection; a lost
    # connection is still an outage, and reconnected
    assert len(calls) == 2
    assert warned[0].startswith(said), warned
    assert len(reset) == resets


def test_a_stop_landing_in_a_door_that_carries_successes_gives_them_back(monkeypatch):
    # Given a pool process holding the success of its last run, which its next door carries
    written: list[list] = []
    done = completions.Completions()
    monkeypatch.setattr(done, "record_many", written.append)
    done.open_pending(linger=60.0)
    success = Outcome((5, 1), SUCCEEDED, 60.0, fields={"headers": object()})
    done.pending.add(success)

    def stopped_mid_call(*args, **kwargs):
        raise SystemExit(1)  # a terminating revoke or a hard time limit's SIGTERM, mid-statement

    monkeypatch.setattr(door, "admit_run_after_successes", stopped_mid_call)
    # When the process is stopped while that door is on its way
    with pytest.raises(SystemExit):
        door.Door(done).check(*CLAIM, "w1", "a1")
    # Then the success is still there for the process's exit to write (its write, if the
    # door's commit landed after all, is a no-op), not lost with the door
    done.close_pending()
    assert written == [[success]]


@pytest.mark.parametrize("ends", ["returns", "raises"])
def test_a_retry_asked_without_throwing_is_recorded_as_a_retry_when_the_task_ends(
    monkeypatch, ends
):
    """``self.retry(countdown=5, throw=False)`` sends Celery's retry message and returns;
    under Celery that message runs the task again 5 s later, whether the task then returns
    or raises. schedapp refuses that message at the door, so the end of the task is its
    retry: a failed attempt retried after the countdown. Before, a task that returned was
    recorded as a success, and the job went on as if no retry had been asked for."""
    from celery.exceptions import Retry

    recorded: list[tuple] = []
    monkeypatch.setattr(
        completions,
        "complete_run",
        lambda job_id, token, outcome, **fields: recorded.append((outcome, fields)),
    )
    hooks = WorkerHooks()
    request = SimpleNamespace(id=task_id_for(*CLAIM), is_eager=False, schedapp_lease=60)
    task = SimpleNamespace(request=request)
    hooks.door.retried_quietly(task, Retry(exc=RuntimeError("later"), when=5))
    if ends == "returns":
        hooks.completions.on_task_success(sender=task, result="a value")
    else:
        hooks.completions.on_task_failure(sender=task, task_id=request.id, exception=KeyError("k"))
    ((outcome, fields),) = recorded
    assert outcome == FAILED
    assert fields["retry_delay"].total_seconds() == 5
    if ends == "returns":
        assert fields["error"] == "retry requested: RuntimeError: later"


@pytest.mark.parametrize(("ahead", "alarm"), [(3600, True), (0, False)])
def test_a_message_discarded_as_expired_by_a_clock_ahead_of_the_databases_raises_an_alarm(
    monkeypatch, caplog, ahead, alarm
):
    """The beat dates ``expires`` by the database's clock; Celery's worker compares it with
    its host's. A host an hour ahead discards every such message: the run is recorded
    skipped as any expired one, and the worker now says why, at ERROR."""
    from datetime import UTC, datetime, timedelta

    recorded: list[tuple[int, int]] = []
    monkeypatch.setattr(completions, "record_expired", lambda j, t, run_id: recorded.append((j, t)))
    host_now = datetime.now(UTC)
    database_now = host_now - timedelta(seconds=ahead)
    monkeypatch.setattr(completions, "db_now", lambda: database_now)
    request = SimpleNamespace(id=task_id_for(*CLAIM), expires=host_now - timedelta(seconds=10))
    with caplog.at_level("ERROR", logger="schedapp.worker"):
        completions.Completions().on_task_revoked(request=request, expired=True)
    assert recorded == [CLAIM]
    said = [r.getMessage() for r in caplog.records if "clock is" in r.getMessage()]
    assert bool(said) is alarm, said


def executing(held: HeldLeases, lease: float) -> Request:
    """A run with ``lease`` received and executing here, due for renewal."""
    request = Request(task_id_for(*CLAIM))
    request.request_dict[HEADER_LEASE] = lease
    held.on_task_received(request=request)
    worker_state.task_reserved(request)
    worker_state.task_accepted(request)
    held.held[CLAIM].renewed_at -= lease
    return request


def test_a_pool_process_door_at_work_longer_than_the_run_lease_is_no_longer_renewed(held):
    # Given a run with a 0.5 s lease executing here, whose door a prefork pool process entered
    # (the board is made before the pool is forked, as at worker_init)
    executing(held, lease=0.5)
    held.board = DoorBoard()
    pid = os.fork()
    if pid == 0:  # the pool process: enters the door and stays there (it never leaves)
        try:
            current_process().index = 0  # billiard's index of a pool process
            held.board.enter(CLAIM)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    # While its door is younger than the lease, the run is renewed
    assert held.due_for_renewal() == [CLAIM]
    # When the door has been at work longer than the lease (seen on two looks running)
    time.sleep(0.6)
    held.due_for_renewal()
    # Then the run is no longer renewed: its lease lapses, and another worker can take it
    assert held.due_for_renewal() == []
    assert CLAIM in held.held
    # and once its door is done, it is renewed again
    held.board.leave(0)
    assert held.due_for_renewal() == [CLAIM]


def test_a_thread_door_at_work_longer_than_the_run_lease_is_no_longer_renewed(held):
    # Given a threads (or solo) worker, whose doors run in its main process
    executing(held, lease=0.5)
    held.board = DoorBoard()
    mark = held.board.enter(CLAIM)
    assert mark is not None
    assert held.due_for_renewal() == [CLAIM]
    time.sleep(0.6)
    held.due_for_renewal()
    assert held.due_for_renewal() == []
    held.board.leave(mark)
    assert held.board.entries() == []
    assert held.due_for_renewal() == [CLAIM]
