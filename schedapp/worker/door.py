"""``Door``: whether a delivered run may start, asked just before the task's body.

It runs in the process or thread that executes the task (the task's ``before_start``, added
by ``install_door``): the run starts only if its claim is still the job's current one and its
lease has not expired; admission extends the lease. A refused run raises ``Refused``, so
Celery acknowledges the message without running the task. The successes this process
recorded since its last door ride with it, in the same statement (``Completions``), except
those of tasks that waited, which the process's thread writes while the next body runs. The door
also hands a run over to a task's replacement (``Task.replace``), notes a retry asked for
without raising (``retry(throw=False)``), and fails every run admitted on a green pool.
"""

from __future__ import annotations

import logging
import socket
import uuid
from typing import Any

from .. import metrics
from ..conf import get_settings
from ..context import replacement_headers, run_admission, run_id_of, run_lease
from ..db import with_retries
from ..exceptions import ReplaceNotSupported
from ..lease import (
    FAILED,
    SUCCEEDED,
    DoorVerdict,
    admit_replacement,
    admit_run,
    admit_run_after_successes,
    renew_leases,
)
from ..message import HEADER_ADMISSION, parse_task_id
from .board import DoorBoard
from .completions import BODY_STARTED, QUIET_RETRY, Completions, Outcome, body_clocks, count_outcome
from .pools import green_pool_problem
from .refusals import Refused
from .waits import door_retries, statement_wait

log = logging.getLogger("schedapp.worker")


class Door:
    """The door of one worker process. It hands the successes waiting in this process to
    the database with the next admission, so it is built with the ``completions`` that hold
    them. ``board`` (from ``worker_init``) shows the main process which runs are at a door;
    ``green_pool`` names this worker's pool if schedapp declines to execute runs on it."""

    def __init__(self, completions: Completions) -> None:
        self.completions = completions
        self.board: DoorBoard | None = None
        self.green_pool: str | None = None

    def admit(self, task: Any, task_id: str) -> None:
        """The door, in the process that runs the task, just before its body (the task's
        ``before_start``): raises ``Refused`` unless the run may start, so Celery
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
        board = self.board
        at_door = board.enter(claim) if board is not None else None
        try:
            if carried:
                verdict = with_retries(
                    lambda: admit_replacement(job_id, token, worker, carried, admission),
                    what="door",
                    **door_retries(lease),
                )
            else:
                verdict = self.check(
                    job_id, token, worker, admission, lease, run_id_of(task.request)
                )
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
                board.leave(at_door)  # type: ignore[union-attr]
        if verdict is DoorVerdict.ADMITTED:
            if self.green_pool is not None:
                self._decline_on_green_pool(task, claim, worker)
            setattr(task.request, HEADER_ADMISSION, admission)  # for a replacement to carry
            setattr(task.request, BODY_STARTED, body_clocks())
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

    def check(
        self,
        job_id: int,
        token: int,
        worker: str,
        admission: str,
        lease: float | None = None,
        run_id: int | None = None,
    ) -> DoorVerdict:
        """The door's database work: one round trip, carrying the successes this process
        recorded since its last one. If that fails, they go back to the thread and the door
        is tried alone, for as long as the run's ``lease`` may be alive.

        The success of a task whose body waited is not carried: the thread writes it once the
        door has answered, while the body it admitted runs. A backlog of such tasks then pays
        for the admission alone between two bodies, at the price of a second commit per
        execution; a backlog of tasks that keep the CPU busy (no time to write in) carries
        them, one commit per execution."""
        lease = lease or get_settings().DEFAULT_LEASE_SECONDS
        pending = self.completions.take_pending()
        carried = [o for o in pending if not o.waited]
        try:
            if carried:
                successes = [(*o.claim, o.fields["headers"]) for o in carried]
                try:
                    verdict, results = with_retries(
                        lambda: admit_run_after_successes(
                            successes, job_id, token, worker, admission, run_id=run_id
                        ),
                        what="door",
                        attempts=3,
                        attempt_timeout=statement_wait(lease),
                    )
                except BaseException as exc:  # the thread writes them, with its retries
                    # (a stop landing here, SystemExit: the process's exit writes them; if
                    # the door's commit landed after all, writing them again changes nothing)
                    self.completions.write_soon(carried)
                    if not isinstance(exc, Exception):
                        raise
                else:
                    for result in results:
                        count_outcome(result, SUCCEEDED)
                    return verdict
            return with_retries(
                lambda: admit_run(job_id, token, worker, admission, run_id),
                what="door",
                **door_retries(lease),
            )
        finally:
            self.completions.write_soon([o for o in pending if o.waited])

    def _decline_on_green_pool(self, task: Any, claim: tuple[int, int], worker: str) -> None:
        """A run the door admitted on a worker whose pool is green fails there and then,
        without executing, with the reason: its job follows the retry policy (and goes dead
        if it only ever reaches such workers) rather than execute where its lease could
        expire under it. Raises ``Refused``."""
        job_id, token = claim
        pool = self.green_pool or ""
        error = f"worker {worker} {green_pool_problem(pool)}"
        retry_for = run_lease(task.request) or 0.0
        self.completions.record(Outcome(claim, FAILED, retry_for, fields={"error": error}))
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

    def retried_quietly(self, task: Any, retry: Any) -> None:
        """``task`` called ``self.retry(throw=False)``, which sent Celery's retry message and
        returned ``retry`` instead of raising it; the task goes on and may return normally,
        and under Celery beat the retry message then runs the task again later. schedapp
        refuses that message at the door, so it notes the retry on the request, and the
        task's end records it as ``on_task_retry`` records a raised one."""
        request = task.request
        if parse_task_id(request.id) is None or request.is_eager:
            return
        setattr(request, QUIET_RETRY, retry)

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
