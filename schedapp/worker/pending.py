"""``PendingSuccesses``: a pool process's successes, waiting for its next door to carry them.

One round trip and one commit per execution (the next run's door with the previous run's
success) instead of two, for a process working through a backlog.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any

from ..db import reset_connection

log = logging.getLogger("schedapp.worker")


class PendingSuccesses:
    """The successes of a prefork pool process (or a solo worker), waiting for its next door
    to carry them.

    A pool process working through a backlog then makes one database round trip and one
    commit per execution (the door of the next run with the completions of the previous
    ones) instead of two. A success that no door takes within ``linger`` seconds is written
    by this object's thread, so an idle process records its completions at once; so is one
    the door hands back to it (``write_soon``), which the thread writes at once. A process
    on its way out (recycled by ``max_tasks_per_child`` or ``max_memory_per_child``, shrunk
    by the autoscaler, shut down) writes what is left and waits for what its thread is
    writing, through a database outage, for as long as those writes may be retried (their
    runs' lease; ``close``). A pool process killed outright loses the successes still
    waiting (at most ``linger`` old, those of the run before a door in flight, or one a
    door handed to the thread a moment before, not yet written), whose
    leases then expire like those of any killed worker: the occurrence runs again.
    Failures are not held here: they are written as they happen.
    """

    LINGER = 0.005
    # The least a process on its way out waits for its thread's writes (the time the writer
    # takes for its own ten attempts when the database refuses them).
    EXIT_WAIT = 30.0

    def __init__(self, write: Callable[[list[Any]], None], linger: float = LINGER) -> None:
        self._write = write
        self.linger = linger
        self._lock = threading.Lock()
        self._items: list[tuple[float, Any]] = []
        self._retry_for = self.EXIT_WAIT  # the longest any write of an item may be retried
        self._idle = True  # the thread waits for _wake rather than ticking
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="schedapp-completions", daemon=True)
        self._thread.start()

    def add(self, item: Any, retry_for: float = 0.0) -> None:
        """``item`` waits for a door; ``retry_for``: how long writing it may be retried."""
        with self._lock:
            self._items.append((time.monotonic(), item))
            self._retry_for = max(self._retry_for, retry_for)
            wake, self._idle = self._idle, False
        if wake:
            self._wake.set()

    def take(self) -> list[Any]:
        """Everything waiting, for the door to carry."""
        with self._lock:
            items, self._items = self._items, []
        return [item for _, item in items]

    def write_soon(self, items: list[Any]) -> None:
        """Items the thread writes at once: those a door took and could not write, and
        those a door left for it (``Completions.write_soon``)."""
        if not items:
            return
        with self._lock:
            self._items[:0] = [(-math.inf, item) for item in items]  # due whatever the clock
            self._idle = False
        self._wake.set()  # cuts a tick short, or wakes an idle thread

    def close(self) -> None:
        """Write what waits, once the thread is done with what it is writing. The wait is
        bounded by the longest an item's write may be retried, not by a shorter constant: a
        process that exited while its thread retried through an outage took those successes
        with it, and their runs were reaped and ran again. Past that, a run's lease has
        expired and its occurrence runs again whatever this process does."""
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=self._retry_for)
        if items := self.take():
            self._write(items)

    def _run(self) -> None:
        """Write what waited ``linger`` (or was handed over by ``write_soon``), ticking every
        ``linger`` while anything waits; idle, wait to be woken."""
        try:
            while not self._stop.is_set():
                self._wake.wait()
                self._wake.clear()
                while not self._stop.is_set():
                    with self._lock:
                        cutoff = time.monotonic() - self.linger
                        due = [item for t, item in self._items if t <= cutoff]
                        self._items = [(t, item) for t, item in self._items if t > cutoff]
                        if not due and not self._items:
                            self._idle = True
                            break
                    if not due:
                        self._wake.wait(self.linger)  # a tick; write_soon and close cut it short
                        self._wake.clear()
                        continue
                    try:
                        self._write(due)
                    except Exception:  # the writer logs its own failures; keep the thread
                        log.exception("completion writer failed", extra={"action": "writer_error"})
        finally:
            reset_connection()  # this thread's own connection
