"""Defects of the first worker protocol, put back on purpose to show the chaos oracle catches
them (``CHAOS_DEFECT=<name>`` in a worker's environment; ``bench/worker_app.py`` installs it).

* ``unrenewed-reserved``: the first protocol's door and renewals: runs are admitted when the
  main process receives the message (not just before the body), and leases are renewed only
  for requests the pool is executing, not for those waiting in the prefetch buffer (issue 9,
  case 2): with Celery's default prefetch a buffered run loses its lease, is dispatched
  again, and its buffered copy, admitted long before, still runs.
* ``broker-heartbeat``: leases are renewed only when Celery's own worker heartbeat is sent,
  which stops while the broker is unreachable (issue 9, case 1).

* ``drop-overlapped``: the occurrence ledger loses its ``overlapped`` records (a trigger the
  harness puts on the chaos run's private database drops them as they are written): a skip
  job's occurrences that came due during a run then have no fate, and never executed.

Test and bench code only: nothing in ``schedapp`` knows about it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# Defects put in the database (by the harness, once migrated), not in the worker.
DATABASE_DEFECTS = {
    "drop-overlapped": """
        CREATE FUNCTION chaos_drop_overlapped() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RETURN NULL; END $$;
        CREATE TRIGGER chaos_drop_overlapped BEFORE INSERT ON schedapp_occurrence
        FOR EACH ROW WHEN (NEW.fate = 'overlapped') EXECUTE FUNCTION chaos_drop_overlapped();
    """,
}
DEFECTS = ("unrenewed-reserved", "broker-heartbeat", *DATABASE_DEFECTS)


def install_in_database(name: str) -> None:
    """Put a database defect in the (private) database of a chaos run; others do nothing."""
    if name in DATABASE_DEFECTS:
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute(DATABASE_DEFECTS[name])


def install(name: str) -> None:
    """Replace parts of the worker's protocol once the worker starts."""
    if name not in DEFECTS:
        raise ValueError(f"unknown defect {name!r}; known: {', '.join(DEFECTS)}")
    if name in DATABASE_DEFECTS:
        return
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
    """Admission on receipt (a receiver of ``task_received``), no door before the body, and
    renewal of the executing requests only: the worker's door and held leases replaced on
    ``schedapp.worker.hooks``."""
    import uuid

    from celery import signals
    from celery.worker import state as worker_state

    from schedapp.lease import admit_run
    from schedapp.message import parse_task_id
    from schedapp.store.base import DoorVerdict
    from schedapp.worker import Door, HeldLeases, hooks

    def admit_on_receipt(sender: Any = None, request: Any = None, **_: Any) -> None:
        claim = parse_task_id(getattr(request, "id", None))
        if claim is None:
            return
        verdict = admit_run(claim[0], claim[1], request.hostname, uuid.uuid4().hex)
        if verdict is not DoorVerdict.ADMITTED:
            worker_state.revoked.add(request.id)  # the first protocol's refusal

    class NoDoor(Door):
        def admit(self, task: Any, task_id: str) -> None:
            pass

    class ActiveOnly(HeldLeases):
        def due_for_renewal(self) -> list[tuple[int, int]]:
            due = super().due_for_renewal()
            active = {r.id for r in worker_state.active_requests}
            with self.lock:
                return [k for k in due if k in self.held and self.held[k].task_id in active]

    signals.task_received.connect(admit_on_receipt, weak=False, dispatch_uid="chaos.receipt")
    hooks.door = NoDoor(hooks.completions)
    hooks.leases = ActiveOnly()


def _broker_heartbeat() -> None:
    """The worker's heartbeat step replaced (Celery reads its steps after ``worker_init``) by
    one whose thread never beats; Celery's own heartbeat sends ``lease_heartbeat`` instead."""
    from celery import current_app, signals

    from schedapp.signals import lease_heartbeat
    from schedapp.worker import LeaseHeartbeat

    class Silent(LeaseHeartbeat):
        def beat(self, hostname: str, period: float) -> None:
            self._stop.wait()

    steps = current_app.steps["worker"]
    steps.discard(LeaseHeartbeat)
    steps.add(Silent)

    def relay(sender: Any = None, **_: Any) -> None:
        lease_heartbeat.send(sender=getattr(sender, "hostname", None))

    signals.heartbeat_sent.connect(relay, weak=False, dispatch_uid="chaos.relay")
