"""``WorkerHooks``: the worker's four objects, built once and wired to Celery's signals.

``door`` (``Door``), ``leases`` (``HeldLeases``), ``completions`` (``Completions``) and
``node`` (``NodeRecord``) each own their state; this module builds them, passes each the
collaborators it needs, and connects the signals. A receiver finds its object when the
signal comes, so an object replaced on ``hooks`` is the one called: that is the seam the
bench uses (``bench/ceilings.py``, ``bench/timing.py``, ``bench/defects.py``). Replace an
object before the worker starts (a ``worker_init`` receiver connected before schedapp's):
``worker_init`` gives the door and the leases the ``DoorBoard`` they share, and the door
holds the ``completions`` it was built with, so replace ``completions`` first, then build
the door with it.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
from collections.abc import Callable
from typing import Any

from celery import signals
from celery.app.trace import build_tracer
from celery.exceptions import Ignore

from .. import metrics
from ..celeryapp import celery_app
from ..db import CONNECTION_ERRORS, bound_connection_waits, bounded_wait, reset_connection
from ..signals import lease_heartbeat
from .board import DoorBoard
from .completions import Completions
from .door import Door
from .heartbeat import LeaseHeartbeat
from .leases import HeldLeases
from .node import NodeRecord
from .pools import green_pool_name, green_pool_problem
from .refusals import Replaced
from .waits import statement_wait

log = logging.getLogger("schedapp.worker")


class WorkerHooks:
    """The worker side of the lease protocol, for one worker process: its objects, and the
    receivers of the signals that concern more than one of them (the worker's start and
    end, the heartbeat, an unknown task)."""

    def __init__(self) -> None:
        self.completions = Completions()
        self.door = Door(self.completions)
        self.leases = HeldLeases()
        self.node = NodeRecord()

    def connect(self) -> None:
        """Connect the receivers (idempotent: dispatch_uid)."""
        for signal, receiver, uid in (
            (signals.task_received, self._to("leases", "on_task_received"), "door"),
            (signals.task_success, self._to("completions", "on_task_success"), "success"),
            (signals.task_failure, self._to("completions", "on_task_failure"), "failure"),
            (signals.task_retry, self._to("completions", "on_task_retry"), "retry"),
            (signals.task_postrun, self._to("completions", "on_task_postrun"), "postrun"),
            (signals.task_revoked, self._to("completions", "on_task_revoked"), "revoked"),
            (signals.task_unknown, self.on_task_unknown, "unknown"),
            (signals.worker_init, self.on_worker_init, "init"),
            (signals.worker_process_init, self.on_process_init, "process_init"),
            (signals.worker_ready, self.on_worker_ready, "ready"),
            (signals.worker_process_shutdown, self.on_process_shutdown, "process_shutdown"),
            (signals.worker_shutdown, self.on_worker_shutdown, "shutdown"),
            (lease_heartbeat, self.on_lease_heartbeat, "lease_heartbeat"),
        ):
            signal.connect(receiver, weak=False, dispatch_uid=f"schedapp.{uid}")

    def _to(self, part: str, method: str) -> Callable[..., Any]:
        """A receiver that calls ``method`` of the object ``part`` is when the signal comes."""

        def receiver(**kwargs: Any) -> Any:
            return getattr(getattr(self, part), method)(**kwargs)

        receiver.__qualname__ = f"WorkerHooks.{part}.{method}"
        return receiver

    # --- the worker's start and end -----------------------------------------------------

    def on_worker_init(self, sender: Any = None, **_: Any) -> None:
        """The worker's main process, its tasks imported, before the pool starts (forked pool
        processes inherit the door) and before the consumer builds its tracers. A worker on
        a green pool says at once that it will execute no schedapp run."""
        install_door(sender.app, self)
        board = DoorBoard()  # before it forks its pool: the processes share it
        self.door.board = board
        self.leases.board = board
        bound_connection_waits()  # before it forks its pool: every process connects so
        metrics.own_files_in_children()  # before it forks its pool and an embedded beat
        metrics.warn_if_pool_unaggregated(getattr(sender, "pool_cls", None))
        self.door.green_pool = green_pool_name(getattr(sender, "pool_cls", None))
        if self.door.green_pool is not None:
            log.error(
                "this worker %s Every schedapp run delivered to it fails without executing; "
                "its other tasks run as usual.",
                green_pool_problem(self.door.green_pool),
                extra={"action": "green_pool", "pool": self.door.green_pool},
            )

    def on_process_init(self, sender: Any = None, **_: Any) -> None:
        """A pool process starts: its successes wait for its next door to carry them. A pool
        process that imported the tasks afresh (the spawn start method) gets the door here,
        and tracers that know it."""
        self.completions.open_pending()
        app = celery_app()
        if install_door(app, self):
            for name, task in app.tasks.items():
                task.__trace__ = build_tracer(name, task, app.loader, sender, app=app)

    def on_worker_ready(self, sender: Any = None, **_: Any) -> None:
        metrics.start_metrics_server()
        self.node.start(sender)
        self.leases.consumer = sender
        try:
            self.node.record(self.leases.count(), force=True)
        except Exception as exc:  # visibility only
            log.warning("could not record worker node: %s", exc)

    def on_process_shutdown(self, pid: int | None = None, **_: Any) -> None:
        self.completions.close_pending()
        metrics.process_exited(pid or os.getpid())

    def on_worker_shutdown(self, sender: Any = None, **_: Any) -> None:
        """The worker's main process, its pool stopped. A solo worker's successes wait in
        this process (Celery's solo pool sends ``worker_process_init``, never
        ``worker_process_shutdown``): the last one is written before the worker exits, which
        a warm shutdown right after its task ended did not wait for."""
        self.completions.close_pending()
        self.node.forget()

    # --- the heartbeat, an unknown task ---------------------------------------------------

    def on_lease_heartbeat(self, sender: Any = None, **_: Any) -> None:
        """Renew what is due, and record the node; a renewal whose reply does not come
        within a third of the shortest lease held is given up (its connection too), so the
        next heartbeat tries on a new connection while the leases may still be alive."""
        try:
            with bounded_wait(statement_wait(self.leases.shortest_lease()), "lease renewal"):
                self.leases.renew_held_leases()
                self.node.record(self.leases.count())
        except CONNECTION_ERRORS as exc:
            reset_connection()
            log.warning("lease renewal failed: %s", exc, extra={"action": "renew_failed"})

    def still_holding(self) -> bool:
        """Whether this worker still holds a run (``LeaseHeartbeat`` asks, shutting down)."""
        return self.leases.holds_anything()

    def on_task_unknown(
        self, sender: Any = None, name: str | None = None, id: str | None = None, **_: Any
    ) -> None:
        """A message for a task this worker does not have fails its run (main process)."""
        host = getattr(sender, "hostname", None) or self.node.hostname or socket.gethostname()
        self.completions.unknown_task(id, name, host)


hooks = WorkerHooks()


def connect(app: Any = None) -> None:
    """Connect the hooks, and add the lease heartbeat to the worker's boot steps."""
    hooks.connect()
    LeaseHeartbeat.still_holding = staticmethod(hooks.still_holding)  # type: ignore[method-assign]
    if app is not None:
        app.steps["worker"].add(LeaseHeartbeat)


def install_door(app: Any, worker_hooks: WorkerHooks | None = None) -> int:
    """Give each of ``app``'s tasks the door of ``worker_hooks`` (``hooks`` by default) as the
    first thing its ``before_start`` does; returns how many tasks it changed (0 when all had
    it).

    Each task instance gets a subclass of its own class, made once per class, that adds the
    door and then calls the class's own ``before_start``: Celery's tracer calls
    ``before_start`` only where a task class defines one, and user task classes (a custom
    ``base``, a ``before_start`` or ``on_replace`` of their own) must keep working unchanged.
    The subclass also hands a run over to the task that replaces its task (``on_replace``),
    and notes a retry the task asked for without raising it (``retry(throw=False)``).
    """
    owner = worker_hooks if worker_hooks is not None else hooks
    changed = 0
    for task in list(app.tasks.values()):
        cls = type(task)
        if not cls.__dict__.get("_schedapp_door", False):
            task.__class__ = _with_door(cls, owner)
            changed += 1
    return changed


@functools.cache
def _with_door(cls: type, hooks: WorkerHooks) -> type:
    """``cls`` with the door of ``hooks``, found when the task starts (``hooks.door``)."""

    def before_start(self: Any, task_id: str, args: Any, kwargs: Any) -> None:
        hooks.door.admit(self, task_id)
        super(door_cls, self).before_start(task_id, args, kwargs)

    def retry(self: Any, *args: Any, **kwargs: Any) -> Any:
        retry = super(door_cls, self).retry(*args, **kwargs)  # raises unless throw=False
        hooks.door.retried_quietly(self, retry)
        return retry

    def on_replace(self: Any, sig: Any) -> Any:
        if not hooks.door.replacing(self, sig):
            return super(door_cls, self).on_replace(sig)
        try:
            return super(door_cls, self).on_replace(sig)
        except Ignore as exc:  # "Replaced by new task": the replacement has the run
            raise Replaced(*exc.args) from None

    door_cls = type(
        cls.__name__,
        (cls,),
        {
            "__module__": cls.__module__,
            "__qualname__": cls.__qualname__,
            "__doc__": cls.__doc__,
            "_schedapp_door": True,
            "before_start": before_start,
            "on_replace": on_replace,
            "retry": retry,
        },
    )
    return door_cls
