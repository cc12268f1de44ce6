"""Celery's own ``beat.Scheduler`` on a simulated clock: when would ``celery beat`` send an entry?

No broker, no process, no real sleep. The scheduler is Celery's ``celery.beat.Scheduler`` with
two things replaced:

* the clock: ``app.now`` (which every schedule's ``now()`` and the scheduler's ``_when`` read,
  since beat entries carry no ``nowfun``) returns the simulated instant, in the app's zone as
  Celery's own ``app.now`` does;
* the publishing: ``send_task`` records the simulated instant instead of writing to a broker
  (``apply_entry``/``apply_async``, with ``reserve``, args evaluation and headers, run as in
  Celery; an unregistered task name goes through ``send_task`` there too).

The driver is ``beat.Service.start``'s loop: call ``tick()``, sleep for what it returns. Beat is
simulated as an ideal process on which ticking takes no time, so it sends an entry at the first
instant its schedule says it is due, which is the instant Celery computes. Two stretches of
the loop are taken in one step because nothing but time passes during them:

* while the top of the heap is not due, ``tick()`` only returns ``min(remaining,
  max_interval)`` and beat sleeps again: the clock goes straight to the heap time;
* beat's heap wakes it 10 ms early (``Scheduler.adjust``); the entry is then not due and
  ``tick()`` returns 0 until it is. With ``early_wake=False`` (the default) ``adjust`` leaves
  the delay alone and beat wakes at the due instant itself; with ``early_wake=True`` the busy
  loop runs, taken as one step to the instant the entry's own ``is_due`` names. Both send at
  the same instants (a test checks it); the default is twice as fast.

A real beat adds its own latency (a few ms per send) to each instant; an interval entry's next
run counts from that late send, so real intervals drift by it. Here the latency is zero.

The default scheduler of ``celery beat`` is ``PersistentScheduler``; with a fresh schedule file
it behaves as this ``Scheduler`` (the file only carries ``last_run_at`` over restarts). The
``celery.backend_cleanup`` entry that beat adds when results expire is left out
(``result_expires=None``): it is not one of the project's entries.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import Any

import celery
import pytest
from celery import Celery
from celery.beat import Scheduler

# Tests whose oracle is Celery's own scheduler compare with Celery 5.5 and later. Celery 5.4
# computes DST days and solar events otherwise (its `15 */4 * * *` in Europe/Paris sends at
# 05:15+02:00 on 2026-03-29, where the wall clock says 04:15; a 6-hour interval across the
# autumn change comes out 7 hours long), so on 5.4 (nox's lowest sessions) they would test
# Celery, not schedapp, and are skipped.
celery_oracle = pytest.mark.skipif(
    celery.VERSION < (5, 5), reason="the oracle is Celery >= 5.5's scheduler (see celery_sim)"
)

BEAT_ENTRY_KEYS = ("task", "schedule", "args", "kwargs", "options", "relative")
_MAX_TICKS_PER_SEND = 1000


class SimClock:
    """The simulated instant (aware, UTC)."""

    def __init__(self) -> None:
        self.now = datetime(2000, 1, 1, tzinfo=UTC)


class RecordingScheduler(Scheduler):
    """Celery's in-memory ``Scheduler`` that records when it sends instead of publishing."""

    producer = None  # apply_entry passes self.producer along; never connect to a broker

    def __init__(self, app: Celery, clock: SimClock, early_wake: bool = False) -> None:
        self.clock = clock
        self.early_wake = early_wake
        self.sent: list[tuple[str, datetime]] = []
        super().__init__(app, lazy=True)

    def adjust(self, n: float, drift: float = -0.010) -> float:
        return super().adjust(n, drift) if self.early_wake else n

    def send_task(self, name: str, *args: Any, **kwargs: Any) -> None:
        self.sent.append((name, self.clock.now))


@cache
def sim_app(zone: str) -> tuple[Celery, SimClock]:
    """One Celery app per zone, its ``now`` bound to a simulated clock."""
    app = Celery(f"celery-sim-{zone}", set_as_current=False)
    app.conf.timezone = zone
    app.conf.enable_utc = True
    app.conf.result_expires = None  # no celery.backend_cleanup entry
    clock = SimClock()
    zone_info = app.timezone
    app.now = lambda: clock.now.astimezone(zone_info)  # type: ignore[method-assign]
    return app, clock


def beat_entry(entry: Mapping[str, Any]) -> dict[str, Any]:
    """The keys of a collected entry that a ``beat_schedule`` item has, schedule copied.

    Copied because beat binds a schedule object to its app and caches the app's zone on it.
    """
    item = {k: entry[k] for k in BEAT_ENTRY_KEYS if k in entry}
    item["schedule"] = copy.deepcopy(item["schedule"])
    return item


def celery_send_times(
    entry: Mapping[str, Any], zone: str, start: datetime, count: int, *, early_wake: bool = False
) -> list[datetime]:
    """The first ``count`` instants (UTC) at which beat started at ``start`` sends ``entry``."""
    app, clock = sim_app(zone)
    clock.now = start.astimezone(UTC)
    scheduler = RecordingScheduler(app, clock, early_wake)
    scheduler.merge_inplace({"entry": beat_entry(entry)})  # what setup_schedule does
    sent = scheduler.sent
    idle = 0
    while len(sent) < count:
        before = len(sent)
        interval = scheduler.tick()
        if len(sent) > before:
            idle = 0
            continue  # tick() returned 0 after sending: beat ticks again at once
        idle += 1
        if idle > _MAX_TICKS_PER_SEND:
            raise RuntimeError(f"beat never sent {entry!r} after {clock.now}")
        top = scheduler._heap[0] if scheduler._heap else None
        if interval and interval > 0:
            wake = clock.now + timedelta(seconds=interval)
            if top is not None:  # capped sleeps only wake beat to sleep again
                wake = max(wake, datetime.fromtimestamp(top.time, UTC))
            clock.now = wake
        elif top is not None:  # busy loop until the top entry is due
            _, remaining = top.entry.is_due()
            clock.now += timedelta(seconds=max(remaining, 0)) or timedelta(microseconds=1)
    return [when for _, when in sent[:count]]
