"""The worker side of the lease protocol, around plain Celery workers: four objects, each with
one job, wired to Celery's signals in ``wiring.py``.

Where each runs, in a prefork worker:

* ``HeldLeases`` (``leases.py``; ``task_received``, main process, as Celery reserves the
  message, before the prefetch buffer or the pool): the run is *held* by this worker from
  then until Celery is done with the request. Nothing is written here: Celery's consumer loop
  is serial, so a database round trip on it would delay every message behind this one.
* ``Door`` (``door.py``; ``before_start``, in the process or thread that runs the task,
  added to every task class by ``install_door`` at ``worker_init``): the run starts only if
  its claim is still the job's current one and its lease has not expired; admission extends
  the lease. A refused run raises ``Refused`` (an ``Ignore``), so Celery acknowledges the
  message without running the task. The pool processes make these round trips side by side,
  as they do the task bodies. The door also hands a run over to a task's replacement
  (``Task.replace`` with one task's signature: the replacement's message carries the run's
  headers and admission, and its door admits it as the same run) and notes a
  ``retry(throw=False)``.
* ``LeaseHeartbeat`` (``heartbeat.py``; a bootstep: a thread of the main process with its own
  database connection): every ``SCHEDAPP_LEASE_HEARTBEAT`` seconds it sends
  ``schedapp.signals.lease_heartbeat``; the receiver renews, in one statement, the leases of
  every run this worker holds, prefetched or executing, once a third of the lease has passed
  (not a run whose door has been at work longer than its lease: ``DoorBoard``, ``board.py``).
  It needs neither the broker nor a free pool process: leases live as long as the worker
  process lives and reaches the database. A hung task is bounded by Celery's time limits.
* ``Completions`` (``completions.py``; ``task_success`` / ``task_failure`` / ``task_retry``
  in the pool process, ``task_failure`` also in the main process for lost pool processes and
  hard time limits; ``task_postrun`` for a task's own ``Ignore`` or ``Reject``;
  ``task_unknown`` and ``task_revoked`` in the main process): the completion, fenced by token
  and idempotent. In a prefork pool process (and a solo worker) a success waits
  (``PendingSuccesses``, ``pending.py``) for that process's next door, which carries it in
  the same statement and commit: a process working through a backlog makes one round trip
  per execution. A success no door takes within 5 ms is written by a thread of the process,
  and a process on its way out writes what waits; failures are written as they happen.
* ``NodeRecord`` (``node.py``): the worker's row in the node table, with the heartbeat.

Tasks that schedapp did not dispatch (their task id is not ``schedapp:<job>:<token>``) are
left alone by every hook. A worker on a green pool (gevent, eventlet) executes no schedapp
run: its door fails each run it admits, with the reason (``green_pool_problem``).

``hooks`` is the process's ``WorkerHooks``; ``connect`` (called by the app's ``ready``)
connects it. To change one part (the bench does), replace ``hooks.door``,
``hooks.completions``, ``hooks.leases`` or ``hooks.node`` before the worker starts (see
``wiring.py``).
"""

from __future__ import annotations

from .board import DoorBoard
from .completions import Completions, Outcome
from .door import Door
from .heartbeat import LeaseHeartbeat
from .leases import Held, HeldLeases, live_task_ids
from .node import NodeRecord
from .pending import PendingSuccesses
from .pools import green_pool_name, green_pool_problem
from .refusals import Refused, Replaced
from .waits import statement_wait
from .wiring import WorkerHooks, connect, hooks, install_door

__all__ = [
    "Completions",
    "Door",
    "DoorBoard",
    "Held",
    "HeldLeases",
    "LeaseHeartbeat",
    "NodeRecord",
    "Outcome",
    "PendingSuccesses",
    "Refused",
    "Replaced",
    "WorkerHooks",
    "connect",
    "green_pool_name",
    "green_pool_problem",
    "hooks",
    "install_door",
    "live_task_ids",
    "statement_wait",
]
