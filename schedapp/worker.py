"""Worker hooks: the door, the lease heartbeat and the completion, around plain Celery workers.

Where each runs, in a prefork worker:

* ``task_received`` (main process, as Celery reserves the message, before the prefetch buffer
  or the pool): the run is *held* by this worker from then until Celery is done with the
  request. Nothing is written here: Celery's consumer loop is serial, so a database round
  trip on it would delay every message behind this one.
* ``before_start`` (the process or thread that runs the task, just before the body; the door,
  added to every task class by ``install_door`` at ``worker_init``): the run starts only if
  its claim is still the job's current one and its lease has not expired; admission extends
  the lease. A refused run raises ``Ignore``, so Celery acknowledges the message without
  running the task. The pool processes make these round trips side by side, as they do the
  task bodies.
* ``LeaseHeartbeat`` (a bootstep: a thread of the main process with its own database
  connection): every ``SCHEDAPP_LEASE_HEARTBEAT`` seconds it sends
  ``schedapp.signals.lease_heartbeat``; the receiver renews, in one statement, the leases of
  every run this worker holds, prefetched or executing, once a third of the lease has passed
  (not a run whose door has been at work longer than its lease: ``DoorBoard``).
  It needs neither the broker nor a free pool process: leases live as long as the worker
  process lives and reaches the database. A hung task is bounded by Celery's time limits.
* ``task_success`` / ``task_failure`` / ``task_retry`` (pool process; ``task_failure`` also in
  the main process for lost pool processes and hard time limits): the completion, fenced by
  token and idempotent. In a prefork pool process (and a solo worker) a success waits
  (``PendingSuccesses``) for that process's next door, which carries it in the same
  statement and commit: a process working through a backlog makes one round trip per
  execution, and the result goes back to Celery at once. A success no door takes within
  5 ms is written by a thread of the process, and a process on its way out writes what
  waits; failures are written as they happen.
* ``task_postrun`` (pool process): a task that raised Celery's ``Ignore`` (its occurrence is
  ``skipped``) or ``Reject`` (a failed attempt), which send no other signal.
* ``on_replace`` (pool process, added with the door): a task that replaced itself
  (``Task.replace``) with one task's signature hands its run over to it: the replacement's
  message carries the run's headers and the admission that started it, and its door admits
  it as the same run; the Ignore that ends the replaced task records nothing.
* ``task_unknown`` (main process): a message for a task this worker does not have fails its
  run ("not registered on worker ..."), which then follows the job's retry policy.
* ``task_revoked`` (main process): a run cancelled by ``api.cancel`` or revoked from elsewhere.

Tasks that schedapp did not dispatch (their task id is not ``schedapp:<job>:<token>``) are
left alone by every hook. A worker on a green pool (gevent, eventlet) executes no schedapp
run: its door fails each run it admits, with the reason (``green_pool_problem``).
"""

from __future__ import annotations

import functools
import logging
import mmap
import os
import socket
import struct
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from billiard.process import current_process
from celery import bootsteps, signals, states
from celery.app.trace import build_tracer
from celery.exceptions import Ignore
from celery.worker import state as worker_state

from . import metrics
from .conf import get_settings
from .context import replacement_headers, run_admission, run_headers, run_lease
from .db import (
    CONNECTION_ERRORS,
    bound_connection_waits,
    bounded_wait,
    db_now,
    reset_connection,
    with_retries,
)
from .exceptions import ReplaceNotSupported
from .lease import (
    FAILED,
    SKIPPED,
    SUCCEEDED,
    Completion,
    CompletionResult,
    DoorVerdict,
    admit_replacement,
    admit_run,
    admit_run_after_successes,
    complete_run,
    complete_successes,
    record_cancelled,
    record_expired,
    renew_leases,
)
from .message import HEADER_ADMISSION, HEADER_LEASE, parse_task_id
from .models import Node
from .nodes import record_node
from .policies import MAX_DELAY
from .signals import lease_heartbeat
from .validation import celery_app, refuse_bad_settings

log = logging.getLogger("schedapp.worker")

# The key, among a pending completion's arguments, of how long to retry it (not an argument of
# ``complete_run``).
_RETRY_FOR = "retry_for"

# A request noted at task_received appears in Celery's own bookkeeping right after the signal
# returns; until it is that old, a held run missing from it is not taken for finished, unless
# Celery has acknowledged (or rejected) its message, which it does only once it has it.
_ADMISSION_GRACE = 2.0

# The request attribute that holds the Retry of a ``self.retry(throw=False)`` call.
_QUIET_RETRY = "schedapp_quiet_retry"


@dataclass
class Held:
    """A run whose message this worker reserved and still holds (prefetched or executing)."""

    task_id: str
    lease: float
    admitted_at: float
    renewed_at: float
    request: Any = None  # Celery's Request: its ``acknowledged`` says Celery has taken it

    def done_with(self, live: set[str], now: float) -> bool:
        """Whether Celery is done with this run's message: out of its bookkeeping, and
        either acknowledged (a run refused at the door is, at once) or past the grace."""
        if self.task_id in live:
            return False
        acknowledged = bool(getattr(self.request, "acknowledged", False))
        return acknowledged or now - self.admitted_at > _ADMISSION_GRACE


class WorkerHooks:
    """The worker side of the lease protocol, for one worker process.

    ``task_received`` runs on the consumer's thread and the heartbeat on its own thread; both
    see the runs held here through ``held``, guarded by a lock. The door (``admit``) runs in
    the pool process and keeps no state.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.held: dict[tuple[int, int], Held] = {}
        self.hostname: str | None = None
        self.started_at: datetime | None = None
        self.consumer: Any = None  # Celery's Consumer, from worker_ready: the queues read
        self._node_recorded = 0.0
        self.pending: PendingSuccesses | None = None  # in pool processes and solo workers
        self.doors: DoorBoard | None = None  # from worker_init: the runs at a door, and since
        self._wedged: dict[tuple[int, int], float] = {}  # doors seen past their lease
        self._wedged_told: set[tuple[int, int]] = set()
        self.green_pool: str | None = None  # this worker's pool, if schedapp declines it

    def connect(self) -> None:
        """Connect the receivers (idempotent: dispatch_uid)."""
        for signal, receiver, uid in (
            (signals.task_received, self.on_task_received, "door"),
            (signals.task_success, self.on_task_success, "success"),
            (signals.task_failure, self.on_task_failure, "failure"),
            (signals.task_retry, self.on_task_retry, "retry"),
            (signals.task_postrun, self.on_task_postrun, "postrun"),
            (signals.task_revoked, self.on_task_revoked, "revoked"),
            (signals.task_unknown, self.on_task_unknown, "unknown"),
            (signals.worker_init, self.on_worker_init, "init"),
            (signals.worker_process_init, self.on_process_init, "process_init"),
            (signals.worker_ready, self.on_worker_ready, "ready"),
            (signals.worker_process_shutdown, self.on_process_shutdown, "process_shutdown"),
            (signals.worker_shutdown, self.on_worker_shutdown, "shutdown"),
            (lease_heartbeat, self.on_lease_heartbeat, "lease_heartbeat"),
        ):
            signal.connect(receiver, weak=False, dispatch_uid=f"schedapp.{uid}")

    # --- the door --------------------------------------------------------------------------

    def on_task_received(self, sender: Any = None, request: Any = None, **_: Any) -> None:
        """A message reached this worker (main process): held from now on, so the heartbeat
        renews its lease while it waits in the prefetch buffer and while it runs. No database
        call here: Celery's consumer loop is serial, and a round trip on it would hold up
        every message behind this one."""
        task_id = getattr(request, "id", None)
        claim = parse_task_id(task_id)
        if claim is None:
            return
        lease = float(_request_headers(request).get(HEADER_LEASE) or 60)
        now = time.monotonic()
        with self._lock:
            self.held[claim] = Held(task_id, lease, now, now, request)  # type: ignore[arg-type]

    def admit(self, task: Any, task_id: str) -> None:
        """The door, in the process that runs the task, just before its body (the task's
        ``before_start``): raises ``Ignore`` unless the run may start, so Celery
        acknowledges the message without running the task."""
        claim = parse_task_id(task_id)
        if claim is None:
            return
        job_id, token = claim
        worker = getattr(task.request, "hostname", None) or socket.gethostname()
        # A replacement (``replacing``) comes with the admission of the run it goes on with,
        # and takes the run over under an admission of its own
        carried = run_admission(task.request)
        admission = uuid.uuid4().hex
        # The door keeps trying for as long as the run's lease may be alive: its statement may
        # have committed with the reply lost, and a retry under the same admission finds it
        # admitted. Giving up sooner left the run running with nothing executing it, and its
        # lease's expiry cost it an attempt (design note 24). Each try waits a bounded time
        # for its reply, so a silent connection is given up and a new one tried.
        lease = run_lease(task.request) or get_settings().DEFAULT_LEASE_SECONDS
        at_door = self.doors.enter(claim) if self.doors is not None else None
        try:
            if carried:
                verdict = with_retries(
                    lambda: admit_replacement(job_id, token, worker, carried, admission),
                    what="door",
                    **_door_retries(lease),
                )
            else:
                verdict = self._door(job_id, token, worker, admission, lease)
        except Exception as exc:  # cannot check the claim: do not run it
            verdict = DoorVerdict.ERROR
            log.error(
                "job %s (%s) token %s: could not check the claim (%s); not executing",
                job_id,
                getattr(task, "name", "?"),
                token,
                exc,
                extra={"action": "door_error", "job": job_id, "token": token},
            )
        finally:
            if at_door is not None:
                self.doors.leave(at_door)  # type: ignore[union-attr]
        if verdict is DoorVerdict.ADMITTED:
            if self.green_pool is not None:
                self._decline_on_green_pool(task, claim, worker)
            setattr(task.request, HEADER_ADMISSION, admission)  # for a replacement to carry
            return
        metrics.door_skipped(verdict.value)
        log.warning(
            "job %s (%s) token %s delivered but not executed: %s",
            job_id,
            getattr(task, "name", "?"),
            token,
            verdict.what_next,
            extra={"action": "door_skip", "job": job_id, "token": token, "verdict": verdict},
        )
        raise Refused(f"schedapp: {verdict.explanation}")

    def _decline_on_green_pool(self, task: Any, claim: tuple[int, int], worker: str) -> None:
        """A run the door admitted on a worker whose pool is green fails there and then,
        without executing, with the reason: its job follows the retry policy (and goes dead
        if it only ever reaches such workers) rather than execute where its lease could
        expire under it. Raises ``Refused``."""
        job_id, token = claim
        pool = self.green_pool or ""
        self._record(
            claim,
            FAILED,
            {
                "error": f"worker {worker} {green_pool_problem(pool)}",
                _RETRY_FOR: run_lease(task.request) or 0.0,
            },
        )
        metrics.door_skipped("green_pool")
        log.warning(
            "job %s (%s) token %s delivered but not executed: this worker runs the %s pool (its "
            "run failed with the reason, and follows the job's retry policy)",
            job_id,
            getattr(task, "name", "?"),
            token,
            pool,
            extra={"action": "door_skip", "job": job_id, "token": token, "verdict": "green_pool"},
        )
        raise Refused(f"schedapp: this worker runs the {pool} pool")

    def _door(
        self, job_id: int, token: int, worker: str, admission: str, lease: float | None = None
    ) -> DoorVerdict:
        """One round trip: the successes this process recorded since its last one ride with
        the door. If that fails, they go back to the linger thread and the door is tried
        alone, for as long as the run's ``lease`` may be alive."""
        lease = lease or get_settings().DEFAULT_LEASE_SECONDS
        pending = self.pending.take() if self.pending is not None else []
        if pending:
            successes = [(j, t, kwargs["headers"]) for (j, t), _, kwargs in pending]
            try:
                verdict, results = with_retries(
                    lambda: admit_run_after_successes(successes, job_id, token, worker, admission),
                    what="door",
                    attempts=3,
                    attempt_timeout=statement_wait(lease),
                )
            except BaseException as exc:  # the linger thread writes them, with its retries
                # (a stop landing here, SystemExit: the process's exit writes them; if the
                # door's commit landed after all, writing them again changes nothing)
                self.pending.give_back(pending)  # type: ignore[union-attr]
                if not isinstance(exc, Exception):
                    raise
            else:
                for result in results:
                    self._observe(result, SUCCEEDED)
                return verdict
        return with_retries(
            lambda: admit_run(job_id, token, worker, admission), what="door", **_door_retries(lease)
        )

    def retried_quietly(self, task: Any, retry: Any) -> None:
        """``task`` called ``self.retry(throw=False)``, which sent Celery's retry message and
        returned ``retry`` instead of raising it; the task goes on and may return normally,
        and under Celery beat the retry message then runs the task again later. schedapp
        refuses that message at the door, so it notes the retry on the request, and the
        task's end records it as ``on_task_retry`` records a raised one."""
        request = task.request
        if parse_task_id(request.id) is None or request.is_eager:
            return
        setattr(request, _QUIET_RETRY, retry)

    def replacing(self, task: Any, sig: Any) -> bool:
        """``Task.replace`` is about to send ``sig``, frozen with this run's task id, in place
        of ``task`` (its ``on_replace``): True if that hands a schedapp run over to it.

        The replacement carries the run's headers (its lease, so the worker that receives it
        renews the run's lease while it waits and runs) and the admission that started the
        run, so its door admits it as the same run, whose outcome is then the replacement's.
        The lease is renewed first: the replacement has a whole lease to reach a worker. Only
        a signature of one task can be followed: a chain or a group runs other tasks first,
        under ids of their own, which no door admits and no lease covers, so replacing with
        one fails the run, nothing sent."""
        request = task.request
        claim = parse_task_id(request.id)
        if claim is None or request.is_eager:
            return False
        kind = getattr(sig, "subtask_type", None)
        if kind is not None:  # a group became a chord in Task.replace
            what = {"chord": "group or chord"}.get(kind, kind)
            raise ReplaceNotSupported(
                f"a task of a schedapp job can be replaced by the signature of one task, not "
                f"by a {what}: the run's outcome is the replacement's, and schedapp can only "
                f"follow one task (nothing was sent)"
            )
        sig.set(headers={**(sig.options.get("headers") or {}), **replacement_headers(request)})
        with_retries(
            lambda: renew_leases([claim]),
            what="renewal",
            attempts=3,
            attempt_timeout=statement_wait(run_lease(request)),
        )
        log.info(
            "job %s token %s: task replaced by %s, which goes on with the run",
            *claim,
            sig.name,
            extra={"action": "replaced", "job": claim[0], "token": claim[1]},
        )
        return True

    # --- the lease heartbeat ---------------------------------------------------------------

    def on_lease_heartbeat(self, sender: Any = None, **_: Any) -> None:
        """Renew what is due; a renewal whose reply does not come within a third of the
        shortest lease held is given up (its connection too), so the next heartbeat tries
        on a new connection while the leases may still be alive."""
        with self._lock:
            shortest = min((h.lease for h in self.held.values()), default=None)
        try:
            with bounded_wait(statement_wait(shortest), "lease renewal"):
                self.renew_held_leases()
                self._record_node()
        except CONNECTION_ERRORS as exc:
            reset_connection()
            log.warning("lease renewal failed: %s", exc, extra={"action": "renew_failed"})

    def renew_held_leases(self) -> None:
        """Renew the leases due for it (a third of the lease old) among the runs held here."""
        due = self._due_for_renewal()
        if not due:
            return
        renewal = renew_leases(due)
        now = time.monotonic()
        with self._lock:
            for key in renewal.renewed:
                if key in self.held:
                    self.held[key].renewed_at = now
            for key in renewal.finished | renewal.cancelled | renewal.unstarted | renewal.lost:
                self.held.pop(key, None)
        metrics.heartbeat("worker", renewed=len(renewal.renewed), lost=len(renewal.lost))
        for job_id, token in sorted(renewal.cancelled):
            log.info(
                "job %s was cancelled while this worker held token %s: no longer renewed, and "
                "nothing its task reports will change the job",
                job_id,
                token,
                extra={"action": "lease_cancelled", "job": job_id, "token": token},
            )
        for job_id, token in sorted(renewal.unstarted):
            log.info(
                "job %s token %s was claimed again before it started here; the copy this "
                "worker holds will be refused at the door",
                job_id,
                token,
                extra={"action": "lease_moved_on", "job": job_id, "token": token},
            )
        for job_id, token in sorted(renewal.lost):
            log.error(
                "job %s lost its lease (token %s was reclaimed or reaped while this "
                "worker held it): its outcome will be recorded as stale",
                job_id,
                token,
                extra={"action": "lease_lost", "job": job_id, "token": token},
            )

    def holds_anything(self) -> bool:
        self._due_for_renewal()  # forgets what Celery is done with
        with self._lock:
            return bool(self.held)

    def _due_for_renewal(self) -> list[tuple[int, int]]:
        live = live_task_ids(self.consumer)
        now = time.monotonic()
        wedged = self._wedged_doors(now)
        with self._lock:
            if live is not None:
                for key, held in list(self.held.items()):
                    if held.done_with(live, now):
                        del self.held[key]  # Celery is done with it
            return [
                k
                for k, h in self.held.items()
                if now - h.renewed_at >= h.lease / 3.0 and k not in wedged
            ]

    def _wedged_doors(self, now: float) -> set[tuple[int, int]]:
        """Runs held here whose door has been at work for longer than their lease, seen so
        on two heartbeats running: no longer renewed, so their lease lapses and another
        worker takes them. A door's waits are bounded (``statement_wait``, ``_door_retries``)
        and it gives up after about a lease; this is for a door stuck past that anyway,
        which would otherwise hold its run for as long as the worker lives."""
        if self.doors is None:
            return set()
        with self._lock:
            leases = {key: held.lease for key, held in self.held.items()}
        seen, self._wedged = self._wedged, {}
        for job_id, token, since in self.doors.entries():
            key = (job_id, token)
            if key in leases and now - since > leases[key]:
                self._wedged[key] = since
        wedged = {key for key, since in self._wedged.items() if seen.get(key) == since}
        untold, self._wedged_told = wedged - self._wedged_told, wedged
        for job_id, token in sorted(untold):
            log.error(
                "job %s token %s: its door has been at work for %.0fs, longer than the run's "
                "lease: its lease is no longer renewed, so another worker can take the run",
                job_id,
                token,
                now - self._wedged[(job_id, token)],
                extra={"action": "door_wedged", "job": job_id, "token": token},
            )
        return wedged

    # --- the node row ----------------------------------------------------------------------

    def on_worker_ready(self, sender: Any = None, **_: Any) -> None:
        metrics.start_metrics_server()
        self.hostname = getattr(sender, "hostname", None) or f"{socket.gethostname()}:{os.getpid()}"
        self.started_at = datetime.now(UTC)
        self.consumer = sender
        try:
            self._record_node(force=True)
        except Exception as exc:  # visibility only
            log.warning("could not record worker node: %s", exc)

    def _record_node(self, force: bool = False) -> None:
        if self.hostname is None or self.started_at is None:
            return
        now = time.monotonic()
        if not force and now - self._node_recorded < get_settings().NODE_HEARTBEAT:
            return
        self._node_recorded = now
        with self._lock:
            held = len(self.held)
        record_node(
            self.hostname,
            "worker",
            self.started_at,
            {
                "active": len(worker_state.active_requests),
                "held": held,
                "processed": sum(worker_state.total_count.values()),
                "queues": self.consumed_queues(),
            },
        )

    def consumed_queues(self) -> list[str]:
        """The queues this worker takes messages from now (``-Q``, and any added or cancelled
        since by remote control), so the overview can flag queues nobody consumes."""
        task_consumer = getattr(self.consumer, "task_consumer", None)
        queues = getattr(task_consumer, "queues", None)
        if queues is None:
            app = getattr(self.consumer, "app", None)
            queues = app.amqp.queues.consume_from.values() if app is not None else ()
        return sorted({q.name for q in queues})

    def on_worker_init(self, sender: Any = None, **_: Any) -> None:
        """The worker's main process, its tasks imported, before the pool starts (forked pool
        processes inherit the door) and before the consumer builds its tracers. A worker on
        a green pool says at once that it will execute no schedapp run."""
        install_door(sender.app)
        self.doors = DoorBoard()  # before it forks its pool: the processes share it
        bound_connection_waits()  # before it forks its pool: every process connects so
        metrics.own_files_in_children()  # before it forks its pool and an embedded beat
        metrics.warn_if_pool_unaggregated(getattr(sender, "pool_cls", None))
        self.green_pool = green_pool_name(getattr(sender, "pool_cls", None))
        if self.green_pool is not None:
            log.error(
                "this worker %s Every schedapp run delivered to it fails without executing; "
                "its other tasks run as usual.",
                green_pool_problem(self.green_pool),
                extra={"action": "green_pool", "pool": self.green_pool},
            )

    def on_process_init(self, sender: Any = None, **_: Any) -> None:
        """A pool process starts: its successes wait for its next door to carry them. A pool
        process that imported the tasks afresh (the spawn start method) gets the door here,
        and tracers that know it."""
        self.pending = PendingSuccesses(self._record_many)
        app = celery_app()
        if install_door(app):
            for name, task in app.tasks.items():
                task.__trace__ = build_tracer(name, task, app.loader, sender, app=app)

    def on_process_shutdown(self, pid: int | None = None, **_: Any) -> None:
        self._close_pending()
        metrics.process_exited(pid or os.getpid())

    def on_worker_shutdown(self, sender: Any = None, **_: Any) -> None:
        """The worker's main process, its pool stopped. A solo worker's successes wait in
        this process (Celery's solo pool sends ``worker_process_init``, never
        ``worker_process_shutdown``): the last one is written before the worker exits, which
        a warm shutdown right after its task ended did not wait for."""
        self._close_pending()
        if self.hostname is None:
            return
        try:
            Node.objects.filter(name=self.hostname).delete()
        except Exception:  # shutting down
            pass

    def _close_pending(self) -> None:
        """Write the successes waiting in this process, before it exits."""
        if self.pending is not None:
            self.pending.close()
            self.pending = None

    # --- completion ------------------------------------------------------------------------

    def on_task_success(self, sender: Any = None, result: Any = None, **_: Any) -> None:
        request = getattr(sender, "request", None)
        retry = getattr(request, _QUIET_RETRY, None)
        if retry is not None:  # it called self.retry(throw=False), then returned
            self.on_task_retry(sender, request=request, reason=retry)
            return
        self._complete(
            getattr(request, "id", None),
            SUCCEEDED,
            headers=run_headers(request),
            lease=run_lease(request),
        )

    def on_task_failure(
        self,
        sender: Any = None,
        task_id: str | None = None,
        exception: Any = None,
        einfo: Any = None,
        **_: Any,
    ) -> None:
        request = getattr(sender, "request", None)
        retry = getattr(request, _QUIET_RETRY, None)  # self.retry(throw=False), then raised
        self._complete(
            task_id,
            FAILED,
            error=_describe(exception),
            traceback=str(getattr(einfo, "traceback", "") or ""),
            retry_delay=_retry_delay(getattr(retry, "when", None)) if retry else None,
            lease=run_lease(request),
        )

    def on_task_retry(
        self,
        sender: Any = None,
        request: Any = None,
        reason: Any = None,
        einfo: Any = None,
        **_: Any,
    ) -> None:
        """A task called ``self.retry()``: schedapp owns retries, so this counts as a failed
        attempt retried after the requested countdown (or the job's backoff), within the
        job's ``max_retries``. Celery's own retry message is refused at the door. A task
        that called ``self.retry(throw=False)`` and then returned comes here too (from
        ``on_task_success``): under Celery its retry message runs later all the same."""
        exc = getattr(reason, "exc", None) or reason
        self._complete(
            getattr(request, "id", None),
            FAILED,
            error=f"retry requested: {_describe(exc)}",
            traceback=str(getattr(einfo, "traceback", "") or ""),
            retry_delay=_retry_delay(getattr(reason, "when", None)),
            lease=run_lease(request),
        )

    def on_task_postrun(
        self,
        sender: Any = None,
        task_id: str | None = None,
        retval: Any = None,
        state: str | None = None,
        **_: Any,
    ) -> None:
        """A task that raised Celery's ``Ignore`` or ``Reject`` sends no other signal, and
        its run would stay open until its lease expired and then run again as lost. Ignore
        drops the occurrence as an expired message does (``skipped``, no attempt counted);
        Reject, with or without requeue, is a failed attempt under the job's retry policy
        (a requeued copy is refused at the door). The door's own refusal, and the end of a
        task that replaced itself (its run goes on in the replacement), are left alone."""
        if state == states.IGNORED and not isinstance(retval, Refused | Replaced):
            outcome, error = SKIPPED, f"ignored by the task: {_describe(retval)}"
        elif state == states.REJECTED:
            requeued = " (requeued)" if getattr(retval, "requeue", False) else ""
            reason = _describe(getattr(retval, "reason", retval))
            outcome, error = FAILED, f"rejected by the task{requeued}: {reason}"
        else:
            return
        self._complete(
            task_id, outcome, error=error, lease=run_lease(getattr(sender, "request", None))
        )

    def on_task_unknown(
        self, sender: Any = None, name: str | None = None, id: str | None = None, **_: Any
    ) -> None:
        """Celery rejected a message whose task this worker does not have (a deploy in
        progress, a renamed task). The run fails, so the job retries and, if it never finds
        a worker that has the task, goes dead with the reason, instead of being re-sent every
        lease forever."""
        host = getattr(sender, "hostname", None) or self.hostname or socket.gethostname()
        self._complete(
            id,
            FAILED,
            error=f"task {name} is not registered on worker {host}",
            only_unstarted=True,
        )

    def on_task_revoked(
        self,
        sender: Any = None,
        request: Any = None,
        terminated: bool = False,
        expired: bool = False,
        **_: Any,
    ) -> None:
        """A run revoked (``api.cancel``, ``celery control revoke``), or a message Celery
        discarded because it arrived past its ``expires``: that occurrence is dropped, as
        under Celery beat, rather than failed and retried."""
        task_id = getattr(request, "id", None)
        claim = parse_task_id(task_id)
        if claim is None:
            return
        if expired and not terminated:
            self._expired_early(claim, getattr(request, "expires", None))
            result = with_retries(
                lambda: record_expired(claim[0], claim[1]),
                what="expired",
                attempts=3,
                attempt_timeout=statement_wait(None),
            )
            if result is not None:
                metrics.run_finished("skipped")
            return
        result = with_retries(
            lambda: record_cancelled(claim[0], claim[1], terminated=terminated),
            what="revoked",
            attempts=3,
            attempt_timeout=statement_wait(None),
        )
        self._observe(result, "cancelled")

    def _expired_early(self, claim: tuple[int, int], expires: Any) -> None:
        """Celery discarded a message past its ``expires`` by this host's clock; the beat
        dated it by the database's. If the database says it has not expired, this host's
        clock is ahead: say so (ERROR), or every such occurrence is dropped in silence."""
        if not isinstance(expires, datetime) or expires.tzinfo is None:
            return
        try:
            database_now = db_now()
        except Exception:  # an alarm only: the expiry itself is recorded below
            return
        ahead = datetime.now(UTC) - database_now
        if expires > database_now and ahead.total_seconds() > 1:
            log.error(
                "job %s token %s: Celery discarded its message as expired (expires %s), "
                "which by the database's clock it was not: this host's clock is %.1f s ahead "
                "of the database's. The occurrence is dropped; set the host's clock right (NTP)",
                *claim,
                expires.isoformat(),
                ahead.total_seconds(),
                extra={"action": "clock_ahead", "job": claim[0], "token": claim[1]},
            )

    def _complete(
        self, task_id: str | None, outcome: str, lease: float | None = None, **kwargs: Any
    ) -> None:
        """Record an outcome, retried through a database outage for at least the run's lease
        (``lease``: the one it was dispatched with; schedapp's default if unknown)."""
        claim = parse_task_id(task_id)
        if claim is None:
            return
        kwargs[_RETRY_FOR] = lease or get_settings().DEFAULT_LEASE_SECONDS
        if self.pending is not None and outcome == SUCCEEDED and kwargs.get("headers"):
            self.pending.add((claim, outcome, kwargs), kwargs[_RETRY_FOR])
        else:
            self._record(claim, outcome, kwargs)

    def _record_many(self, items: list[tuple[tuple[int, int], str, dict[str, Any]]]) -> None:
        """Successes that carry their headers in one round trip, the rest one by one."""
        batch = [
            (claim, kwargs["headers"])
            for claim, outcome, kwargs in items
            if outcome == SUCCEEDED and kwargs.get("headers") is not None
        ]
        others = [i for i in items if not (i[1] == SUCCEEDED and i[2].get("headers"))]
        if batch:
            try:
                results = with_retries(
                    lambda: complete_successes([(j, t, h) for (j, t), h in batch]),
                    what="completions",
                    attempts=10,
                    at_least=max(kwargs.get(_RETRY_FOR, 0.0) for _, _, kwargs in items),
                    attempt_timeout=statement_wait(None),
                )
            except Exception as exc:  # never break the worker; the leases will expire
                log.exception(
                    "could not record %d completion(s): %s",
                    len(batch),
                    exc,
                    extra={"action": "completion_failed"},
                )
            else:
                for result in results:
                    self._observe(result, SUCCEEDED)
        for claim, outcome, kwargs in others:
            self._record(claim, outcome, kwargs)

    def _record(self, claim: tuple[int, int], outcome: str, kwargs: dict[str, Any]) -> None:
        job_id, token = claim
        fields = {k: v for k, v in kwargs.items() if k != _RETRY_FOR}
        try:
            # For as long as the lease could be alive: a database back within it must get the
            # outcome before the lease expires. After that the lease has expired and the job
            # runs again (at-least-once), which is the safe failure. A retry of a completion
            # whose commit landed finds it recorded and changes nothing.
            result = with_retries(
                lambda: complete_run(job_id, token, outcome, **fields),
                what="completion",
                attempts=10,
                at_least=kwargs.get(_RETRY_FOR, 0.0),
                attempt_timeout=statement_wait(None),
            )
        except Exception as exc:  # never break the worker; the lease will expire
            log.exception(
                "could not record completion of job %s token %s: %s",
                job_id,
                token,
                exc,
                extra={"action": "completion_failed", "job": job_id},
            )
            return
        self._observe(result, outcome)

    @staticmethod
    def _observe(result: CompletionResult | None, outcome: str) -> None:
        if result is None:
            metrics.run_finished("cancelled")
        elif result.completion is not Completion.ALREADY_RECORDED:
            metrics.run_finished(
                outcome,
                stale=result.completion is Completion.STALE,
                dead=result.dead,
                carried_on=result.carried_on,
            )


class DoorBoard:
    """Which runs are at a door now, and since when (``time.monotonic``, one clock for every
    process of the host), for the main process's heartbeat to read: the doors of prefork
    pool processes in memory shared over fork, a slot per pool process (billiard's process
    index), and those of threads or a solo worker (the main process itself) in a dict.
    Writing costs a door two small copies into memory, and no system call."""

    SLOTS = 1024
    _SLOT = struct.Struct("<qqd")  # job id, token, since

    def __init__(self) -> None:
        self._shared = mmap.mmap(-1, self.SLOTS * self._SLOT.size)  # MAP_SHARED, anonymous
        self._owner = os.getpid()
        self._lock = threading.Lock()
        self._local: dict[int, tuple[int, int, float]] = {}  # thread -> entry, in the owner

    def enter(self, claim: tuple[int, int]) -> int | None:
        """``claim``'s door starts in this process or thread; returns what ``leave`` takes
        (None when the door is not tracked: a pool process without an index, or too many)."""
        entry = (claim[0], claim[1], time.monotonic())
        if os.getpid() == self._owner:
            key = threading.get_ident()
            with self._lock:
                self._local[key] = entry
            return -1 - key  # negative: a thread of the owner (idents are not negative)
        index = getattr(current_process(), "index", None)
        if not isinstance(index, int) or not 0 <= index < self.SLOTS:
            return None
        self._SLOT.pack_into(self._shared, index * self._SLOT.size, *entry)
        return index

    def leave(self, mark: int) -> None:
        """The door of ``mark`` (from ``enter``) is done."""
        if mark >= 0:
            self._SLOT.pack_into(self._shared, mark * self._SLOT.size, 0, 0, 0.0)
            return
        with self._lock:
            self._local.pop(-1 - mark, None)

    def entries(self) -> list[tuple[int, int, float]]:
        """Every door at work now: (job id, token, since)."""
        with self._lock:
            found = list(self._local.values())
        for job_id, token, since in self._SLOT.iter_unpack(self._shared):
            if job_id and since:
                found.append((job_id, token, since))
        return found


def statement_wait(lease: float | None) -> float:
    """How long a worker's statement waits for its reply before its connection is given
    up: ``SCHEDAPP_DB_TIMEOUT``, or a third of the run's ``lease`` if shorter, so that a
    door or a renewal can try again on a new connection while the lease may be alive."""
    limit = get_settings().DB_TIMEOUT
    return min(limit, max(lease / 3.0, 1.0)) if lease else limit


def _door_retries(lease: float) -> dict[str, Any]:
    """The door's retries: for as long as the run's ``lease`` may be alive (it was renewed
    at most now), a second apart at most, each try bounded in time."""
    return {
        "attempts": 3,
        "at_least": lease,
        "max_delay": 1.0,
        "attempt_timeout": statement_wait(lease),
    }


def green_pool_name(pool: Any) -> str | None:
    """The name of ``pool`` (a worker's pool: an alias such as ``"gevent"``, a class, or a
    class's dotted path) if it runs tasks as greenlets of one thread (gevent, eventlet), on
    which schedapp declines to execute runs; None for the others (prefork, threads, solo)."""
    if isinstance(pool, str):
        name = pool.partition(":")[0].rsplit(".", 1)[-1]
        return name if name in ("gevent", "eventlet") else None
    if getattr(pool, "is_green", False):
        return str(getattr(pool, "__module__", "") or "green").rsplit(".", 1)[-1]
    return None


def green_pool_problem(pool: str) -> str:
    """Why schedapp executes no run on a worker whose pool is ``pool`` (a green pool), and
    what to use instead: the one text the worker's log, its runs and ``manage.py check``
    give."""
    return (
        f"runs the {pool} pool, on which schedapp cannot keep its guarantee: a task that does "
        "not yield (computing, or blocked in code the pool did not patch) stops every "
        "greenlet, the lease heartbeat's too, so the leases of the runs this worker holds "
        "expire and those runs execute again while they still run. Run schedapp's jobs on "
        "prefork, threads (-P threads, for I/O-bound tasks) or solo workers, on queues no "
        "green worker consumes."
    )


def live_task_ids(consumer: Any = None) -> set[str] | None:
    """The ids of every request Celery still holds in this process: reserved, executing,
    waiting for an ETA, or waiting in a rate limit's token bucket (which Celery's own
    ``requests`` dict does not list). Read from the request sets, not only from that dict: a
    redelivered copy with the same id (a broker's visibility timeout, a requeue after a
    connection blip) replaces the running request's entry there, and its end removes it.
    None if the sets kept changing under the consumer's thread: then nothing is forgotten."""
    sources = [
        worker_state.active_requests,
        worker_state.reserved_requests,
        getattr(worker_state, "scheduled_requests", ()),  # Celery 5.5+
    ]
    buckets = getattr(consumer, "task_buckets", None) or {}
    for _attempt in range(5):
        try:
            ids = set(worker_state.requests)
            for requests in sources:
                ids.update(request.id for request in list(requests))
            for bucket in list(buckets.values()):
                for request, _tokens in list(getattr(bucket, "contents", None) or ()):
                    ids.add(request.id)
            return ids
        except RuntimeError:  # changed size during iteration
            continue
    return None


class PendingSuccesses:
    """The successes of a prefork pool process (or a solo worker), waiting for its next door
    to carry them.

    A pool process working through a backlog then makes one database round trip and one
    commit per execution (the door of the next run with the completions of the previous
    ones) instead of two. A success that no door takes within ``linger`` seconds is written
    by this object's thread, so an idle process records its completions at once. A process
    on its way out (recycled by ``max_tasks_per_child`` or ``max_memory_per_child``, shrunk
    by the autoscaler, shut down) writes what is left and waits for what its thread is
    writing, through a database outage, for as long as those writes may be retried (their
    runs' lease; ``close``). A pool process killed outright loses the successes still
    waiting (at most ``linger`` old, or those of the run before a door in flight), whose
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

    def give_back(self, items: list[Any]) -> None:
        """Items a door took and could not write: the thread writes them at its next tick."""
        with self._lock:
            self._items[:0] = [(0.0, item) for item in items]
            wake, self._idle = self._idle, False
        if wake:
            self._wake.set()

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
        """Tick every ``linger`` while anything waits; write what waited that long."""
        try:
            while not self._stop.is_set():
                self._wake.wait()
                self._wake.clear()
                while not self._stop.wait(self.linger):
                    with self._lock:
                        cutoff = time.monotonic() - self.linger
                        due = [item for t, item in self._items if t <= cutoff]
                        self._items = [(t, item) for t, item in self._items if t > cutoff]
                        if not due and not self._items:
                            self._idle = True
                            break
                    if due:
                        try:
                            self._write(due)
                        except Exception:  # the writer logs its own failures; keep the thread
                            log.exception(
                                "completion writer failed", extra={"action": "writer_error"}
                            )
        finally:
            reset_connection()  # this thread's own connection


class LeaseHeartbeat(bootsteps.StartStopStep):
    """A thread of the worker's main process that sends ``lease_heartbeat`` every period.

    Celery's own worker heartbeat stops while the broker is unreachable, and a solo pool's
    only thread is busy running the task: neither may decide whether a lease lives.
    """

    label = "schedapp lease heartbeat"

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
            target=self._run,
            args=(parent.hostname, period),
            name="schedapp-lease-heartbeat",
            daemon=True,
        )
        self._thread.start()

    def _run(self, hostname: str, period: float) -> None:
        try:
            while not self._stop.wait(period):
                lease_heartbeat.send(sender=hostname)
                if self._draining.is_set() and not hooks.holds_anything():
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


class Refused(Ignore):
    """The door's refusal: Celery acknowledges the message without running the task, and
    nothing is recorded for it (unlike a task's own ``Ignore``)."""


class Replaced(Ignore):
    """The end of a task that replaced itself (``Task.replace``): its run goes on in the
    replacement, so nothing is recorded for it."""


hooks = WorkerHooks()


def install_door(app: Any) -> int:
    """Give each of ``app``'s tasks the door as the first thing its ``before_start`` does;
    returns how many tasks it changed (0 when all had it).

    Each task instance gets a subclass of its own class, made once per class, that adds the
    door and then calls the class's own ``before_start``: Celery's tracer calls
    ``before_start`` only where a task class defines one, and user task classes (a custom
    ``base``, a ``before_start`` or ``on_replace`` of their own) must keep working unchanged.
    The subclass also hands a run over to the task that replaces its task (``on_replace``),
    and notes a retry the task asked for without raising it (``retry(throw=False)``).
    """
    changed = 0
    for task in list(app.tasks.values()):
        cls = type(task)
        if not cls.__dict__.get("_schedapp_door", False):
            task.__class__ = _with_door(cls)
            changed += 1
    return changed


@functools.cache
def _with_door(cls: type) -> type:
    def before_start(self: Any, task_id: str, args: Any, kwargs: Any) -> None:
        hooks.admit(self, task_id)
        super(door_cls, self).before_start(task_id, args, kwargs)

    def retry(self: Any, *args: Any, **kwargs: Any) -> Any:
        retry = super(door_cls, self).retry(*args, **kwargs)  # raises unless throw=False
        hooks.retried_quietly(self, retry)
        return retry

    def on_replace(self: Any, sig: Any) -> Any:
        if not hooks.replacing(self, sig):
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


def connect(app: Any = None) -> None:
    """Connect the hooks, and add the lease heartbeat to the worker's boot steps."""
    hooks.connect()
    if app is not None:
        app.steps["worker"].add(LeaseHeartbeat)


def _request_headers(request: Any) -> dict[str, Any]:
    headers = getattr(request, "request_dict", None) or {}
    return headers if isinstance(headers, dict) else {}


def _describe(exc: Any) -> str:
    """``Type: message``; an exception Celery could not pickle is named as the task raised it
    (not as Celery's wrapper), and one whose ``__str__`` raises is still described, as
    Python's traceback describes it, so its failure is recorded."""
    if exc is None:
        return ""
    name = getattr(exc, "exc_cls_name", None) or type(exc).__name__
    try:
        text = str(exc)
    except Exception:
        text = f"<unprintable {name} object>"
    return f"{name}: {text}" if isinstance(exc, BaseException) else text


def _retry_delay(when: Any) -> timedelta | None:
    if when is None:
        return None
    if isinstance(when, int | float):  # bounded first: timedelta overflows on 1e15 seconds
        return timedelta(seconds=min(max(0.0, float(when)), MAX_DELAY.total_seconds()))
    if isinstance(when, datetime):
        aware = when if when.tzinfo else when.replace(tzinfo=UTC)
        return max(timedelta(0), aware - datetime.now(UTC))
    return None
