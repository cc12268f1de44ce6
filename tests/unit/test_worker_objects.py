"""The worker's objects one at a time, and the seam that replaces them: what was reachable
only through the whole ``WorkerHooks`` before it was split (issue 27, item 5)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery, signals

from schedapp.message import task_id_for
from schedapp.worker import (
    Completions,
    LeaseHeartbeat,
    NodeRecord,
    Outcome,
    WorkerHooks,
    completions,
    hooks,
    install_door,
    node,
)
from schedapp.worker.completions import FAILED, SUCCEEDED

CLAIM = (7, 3)


class Recorder:
    """Stands in for one of the worker's objects: notes every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple, dict]] = []

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: self.calls.append((name, args, kwargs))


def test_an_object_replaced_on_the_hooks_after_they_were_connected_gets_the_signals(monkeypatch):
    # Given the process's hooks, connected when the app was ready (apps.py), and then their
    # completions replaced: the bench's seam
    replacement = Recorder()
    monkeypatch.setattr(hooks, "completions", replacement)

    # When Celery sends a task's success
    class Task:  # a signal's sender must be hashable
        request = SimpleNamespace(id=task_id_for(*CLAIM))

    signals.task_success.send(sender=Task(), result=None)
    # Then the object in place now receives it, not the one there at connect time
    assert [name for name, _, _ in replacement.calls] == ["on_task_success"]


def test_a_task_given_the_door_asks_the_door_in_place_when_it_starts():
    app = Celery("doors", set_as_current=False)

    @app.task
    def work() -> None:
        pass

    own = WorkerHooks()
    assert install_door(app, own) >= 1
    replacement = Recorder()
    own.door = replacement  # replaced after the task classes were made
    work.before_start(task_id_for(*CLAIM), (), {})
    assert [(name, args[1]) for name, args, _ in replacement.calls] == [
        ("admit", task_id_for(*CLAIM))
    ]


def test_the_heartbeat_of_a_warm_shutdown_ends_once_nothing_is_held(monkeypatch):
    answers = iter([True, True, False])
    monkeypatch.setattr(LeaseHeartbeat, "still_holding", staticmethod(lambda: next(answers)))
    step = LeaseHeartbeat(SimpleNamespace())
    step.stop(None)  # a warm shutdown: drain
    thread = threading.Thread(target=step.beat, args=("w1@host", 0.01), daemon=True)
    thread.start()
    thread.join(timeout=5)
    assert not thread.is_alive()  # three beats: held, held, nothing held
    assert next(answers, "used up") == "used up"


def test_a_success_with_headers_waits_for_a_door_and_any_other_outcome_is_written_at_once(
    monkeypatch,
):
    written: list[tuple] = []
    monkeypatch.setattr(
        completions,
        "complete_run",
        lambda job_id, token, state, **fields: written.append((job_id, token, state)),
    )
    done = Completions()
    done.open_pending(linger=60.0)
    try:
        done.complete(task_id_for(*CLAIM), SUCCEEDED, headers={"h": 1}, lease=30.0)
        done.complete(task_id_for(8, 1), SUCCEEDED, headers=None)  # no headers: general path
        done.complete(task_id_for(9, 1), FAILED, error="boom")
        done.complete("not-a-schedapp-task", FAILED, error="ignored")
        assert written == [(8, 1, SUCCEEDED), (9, 1, FAILED)]
        (waiting,) = done.take_pending()
        assert waiting == Outcome(CLAIM, SUCCEEDED, 30.0, fields={"headers": {"h": 1}})
        assert waiting.carries_headers
    finally:
        done.close_pending()


def test_the_thread_writes_at_once_what_a_door_hands_it_whatever_its_linger():
    from schedapp.worker.pending import PendingSuccesses

    written: list[list] = []
    wrote = threading.Event()

    def write(items: list) -> None:
        written.append(items)
        wrote.set()

    pending = PendingSuccesses(write, linger=3600.0)  # never on its own within this test
    try:
        pending.add("carried by a door", 60.0)
        pending.write_soon(["left to the thread"])
        assert wrote.wait(10.0), "the thread did not write what it was handed"
        assert written == [["left to the thread"]]
        assert pending.take() == ["carried by a door"]  # the rest still waits for a door
    finally:
        pending.close()


@pytest.mark.parametrize(
    ("wall", "cpu", "blocked", "waited"),
    [
        (0.005, 0.0001, 1, True),  # a 5 ms sleep
        (0.005, 0.0045, 1, False),  # 5 ms of computing, half a millisecond of waiting
        (0.0015, 0.0, 1, False),  # a wait shorter than WAITED
        (0.5, 0.49, 3, True),  # a long computation that also waited 10 ms
        (0.005, 0.0001, 0, False),  # never blocked: descheduled by a busy machine
        (0.005, 0.0001, None, True),  # a platform that does not count its switches
    ],
)
def test_a_body_waited_when_it_blocked_and_its_time_off_the_cpu_reached_the_threshold(
    monkeypatch, wall, cpu, blocked, waited
):
    clocks = {"monotonic": 100.0, "thread_time": 7.0, "switches": 40}
    monkeypatch.setattr(
        completions,
        "time",
        SimpleNamespace(
            monotonic=lambda: clocks["monotonic"], thread_time=lambda: clocks["thread_time"]
        ),
    )
    monkeypatch.setattr(
        completions, "_blocked", lambda: clocks["switches"] if blocked is not None else -1
    )
    request = SimpleNamespace(**{completions.BODY_STARTED: completions.body_clocks()})
    clocks["monotonic"] += wall
    clocks["thread_time"] += cpu
    clocks["switches"] += blocked or 0
    assert completions.body_waited(request) is waited
    assert completions.body_waited(SimpleNamespace()) is False  # no door admitted it


def test_a_sleep_is_a_voluntary_switch_on_this_machine():
    """The real clocks ``body_waited`` reads: a task that sleeps blocked (where counted)."""
    start = completions.body_clocks()
    time.sleep(0.01)
    slept = completions.body_clocks()
    assert slept[2] > start[2] or slept[2] == -1


def test_a_success_says_whether_its_body_waited(monkeypatch):
    monkeypatch.setattr(completions, "body_waited", lambda request: request.slept)
    monkeypatch.setattr(completions, "run_headers", lambda request: {"h": 1})
    monkeypatch.setattr(completions, "run_lease", lambda request: 30.0)
    done = Completions()
    done.open_pending(linger=60.0)
    try:
        for job_id, slept in ((7, True), (8, False)):
            request = SimpleNamespace(id=task_id_for(job_id, 1), slept=slept)
            done.on_task_success(sender=SimpleNamespace(request=request))
        waiting = done.take_pending()
    finally:
        done.close_pending()
    assert [(o.claim, o.waited) for o in waiting] == [((7, 1), True), ((8, 1), False)]


def test_the_node_row_is_written_at_most_every_node_heartbeat_unless_forced(monkeypatch):
    rows: list[dict] = []
    monkeypatch.setattr(node, "record_node", lambda name, kind, started, stats: rows.append(stats))
    record = NodeRecord()
    record.record(held=1)  # not started yet: nothing to say
    record.start(SimpleNamespace(hostname="w1@host", task_consumer=SimpleNamespace(queues=[])))
    record.record(held=2, force=True)
    record.record(held=3)  # within SCHEDAPP_NODE_HEARTBEAT of the last
    record.record(held=4, force=True)
    assert [row["held"] for row in rows] == [2, 4]


@pytest.mark.parametrize("state", [FAILED, "skipped"])
def test_only_a_success_with_headers_can_ride_with_a_door(state):
    assert not Outcome(CLAIM, state, 1.0, fields={"headers": {"h": 1}}).carries_headers
    assert not Outcome(CLAIM, SUCCEEDED, 1.0, fields={"headers": {}}).carries_headers
