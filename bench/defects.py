"""Defects of the first worker protocol, put back on purpose to show the chaos oracle catches
them (``CHAOS_DEFECT=<name>`` in a worker's environment; ``project/celery.py`` installs it).

* ``unrenewed-reserved``: leases are renewed only for requests the pool is executing, not for
  those waiting in the prefetch buffer (issue 9, case 2): with Celery's default prefetch a
  buffered run loses its lease, is dispatched again, and its buffered copy still runs.
* ``broker-heartbeat``: leases are renewed only when Celery's own worker heartbeat is sent,
  which stops while the broker is unreachable (issue 9, case 1).

Test and bench code only: nothing in ``schedapp`` knows about it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

DEFECTS = ("unrenewed-reserved", "broker-heartbeat")


def install(name: str) -> None:
    """Patch the worker hooks once the worker starts."""
    if name not in DEFECTS:
        raise ValueError(f"unknown defect {name!r}; known: {', '.join(DEFECTS)}")
    at_worker_start(
        _unrenewed_reserved if name == "unrenewed-reserved" else _broker_heartbeat, "chaos.defect"
    )


def at_worker_start(patch: Callable[[], None], uid: str) -> None:
    """Run ``patch`` when the worker starts, with Django set up, before the pool forks."""
    from celery import signals

    def run(**_: Any) -> None:
        import django

        django.setup()
        patch()

    signals.worker_init.connect(run, weak=False, dispatch_uid=uid)


def _unrenewed_reserved() -> None:
    from celery.worker import state as worker_state

    from schedapp.worker import WorkerHooks

    original = WorkerHooks._due_for_renewal

    def active_only(self: WorkerHooks) -> list[tuple[int, int]]:
        due = original(self)
        active = {r.id for r in worker_state.active_requests}
        with self._lock:
            return [k for k in due if k in self.held and self.held[k].task_id in active]

    WorkerHooks._due_for_renewal = active_only  # type: ignore[method-assign]


def _broker_heartbeat() -> None:
    from celery import signals

    from schedapp.signals import lease_heartbeat
    from schedapp.worker import LeaseHeartbeat

    def silent(self: LeaseHeartbeat, hostname: str, period: float) -> None:
        self._stop.wait()

    LeaseHeartbeat._run = silent  # type: ignore[method-assign]

    def relay(sender: Any = None, **_: Any) -> None:
        lease_heartbeat.send(sender=getattr(sender, "hostname", None))

    signals.heartbeat_sent.connect(relay, weak=False, dispatch_uid="chaos.relay")
