"""``LeaseHeartbeat``: the worker boot step whose thread sends ``lease_heartbeat``.

Celery's own worker heartbeat stops while the broker is unreachable, and a solo pool's only
thread is busy running the task: neither may decide whether a lease lives. This thread of
the main process, with its own database connection, needs neither.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from celery import bootsteps

from ..conf import get_settings
from ..db import reset_connection
from ..settings_checks import refuse_bad_settings
from ..signals import lease_heartbeat

log = logging.getLogger("schedapp.worker")


def _holds_nothing() -> bool:
    return False


class LeaseHeartbeat(bootsteps.StartStopStep):
    """A thread of the worker's main process that sends ``lease_heartbeat`` every period.

    Celery builds the step itself, so what it needs is set on the class by ``connect``:
    ``still_holding`` says whether the worker still holds a run, which a warm shutdown
    renews until it holds none. ``beat`` is the thread's loop.
    """

    label = "schedapp lease heartbeat"
    still_holding: Callable[[], bool] = staticmethod(_holds_nothing)

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self._stop = threading.Event()
        self._draining = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, parent: Any) -> None:
        refuse_bad_settings("worker")
        period = get_settings().LEASE_HEARTBEAT
        log.info(
            "lease heartbeat every %.1fs (renews every lease held here)",
            period,
            extra={"action": "lease_heartbeat_start"},
        )
        self._stop.clear()
        self._draining.clear()
        self._thread = threading.Thread(
            target=self.beat,
            args=(parent.hostname, period),
            name="schedapp-lease-heartbeat",
            daemon=True,
        )
        self._thread.start()

    def beat(self, hostname: str, period: float) -> None:
        """Send ``lease_heartbeat`` every ``period`` until stopped, or until a warm
        shutdown finds nothing held."""
        try:
            while not self._stop.wait(period):
                lease_heartbeat.send(sender=hostname)
                if self._draining.is_set() and not self.still_holding():
                    break
        finally:
            reset_connection()  # this thread's own connection

    def stop(self, parent: Any) -> None:
        """A warm shutdown: the pool still finishes the tasks it has, so their leases are
        renewed until none is held (the thread ends then, or with the process)."""
        self._draining.set()

    def terminate(self, parent: Any) -> None:
        """A cold shutdown kills the tasks: nothing is left to renew."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def shutdown(self, parent: Any) -> None:
        self._draining.set()
