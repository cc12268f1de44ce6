"""``Completions``: a run's outcome, from the signal Celery sends to the fenced write.

``task_success`` / ``task_failure`` / ``task_retry`` (pool process; ``task_failure`` also in
the main process for lost pool processes and hard time limits), ``task_postrun`` (a task
that raised ``Ignore`` or ``Reject``), ``task_revoked`` and an unknown task (main process)
each become an ``Outcome``, written fenced by token and idempotent, and retried through a
database outage for as long as the run's lease may be alive. A plain success waits in the
pool process (``PendingSuccesses``) for its next door to carry it, unless its task's body
waited (``body_waited``): the process's thread then writes it while the next body runs. The
rest are written as they happen.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from celery import states

try:
    import resource
except ImportError:  # Windows
    resource = None  # type: ignore[assignment]

from .. import metrics
from ..conf import get_settings
from ..context import run_headers, run_id_of, run_lease
from ..db import db_now, with_retries
from ..lease import (
    FAILED,
    SKIPPED,
    SUCCEEDED,
    Completion,
    CompletionResult,
    complete_run,
    complete_successes,
    record_cancelled,
    record_expired,
)
from ..message import parse_task_id
from ..policies import MAX_DELAY
from .pending import PendingSuccesses
from .refusals import Refused, Replaced
from .waits import statement_wait

log = logging.getLogger("schedapp.worker")

# The request attribute that holds the Retry of a ``self.retry(throw=False)`` call (set by
# the door's ``retried_quietly``, read when the task ends).
QUIET_RETRY = "schedapp_quiet_retry"
# The request attribute where the door notes when the task's body started (``body_clocks``).
BODY_STARTED = "schedapp_body_started"
# A body that blocked (a sleep, I/O) and spent at least this long off the CPU marks its
# success to be written by the pool process's thread during the next body, which is likely to
# wait too, rather than carried by the next door, whose time is the worker's (``Door.check``).
WAITED = 0.002
_RUSAGE_THREAD = getattr(resource, "RUSAGE_THREAD", None) if resource is not None else None


@dataclass(frozen=True)
class Outcome:
    """One run's outcome on its way to the database."""

    claim: tuple[int, int]  # (job id, token)
    state: str  # SUCCEEDED, FAILED or SKIPPED
    retry_for: float  # how long its write may be retried: at least the run's lease
    fields: dict[str, Any] = field(default_factory=dict)  # ``complete_run``'s keywords
    waited: bool = False  # a success whose task's body waited (``body_waited``)

    @property
    def carries_headers(self) -> bool:
        """A success with its run's headers: a door, or one batched statement, can write it
        (the common success); every other outcome takes ``complete_run``'s general path."""
        return self.state == SUCCEEDED and bool(self.fields.get("headers"))


class Completions:
    """Records outcomes, for one worker process. ``pending`` holds a pool process's plain
    successes for its next door (``open_pending`` at ``worker_process_init``); without it
    (the main process, a threads worker) every outcome is written at once."""

    def __init__(self) -> None:
        self.pending: PendingSuccesses | None = None

    def open_pending(self, linger: float = PendingSuccesses.LINGER) -> None:
        """Successes of this process wait from now on for a door (or ``linger`` seconds)."""
        self.pending = PendingSuccesses(self.record_many, linger=linger)

    def close_pending(self) -> None:
        """Write the successes waiting in this process, before it exits."""
        if self.pending is not None:
            self.pending.close()
            self.pending = None

    def take_pending(self) -> list[Outcome]:
        """The successes waiting, for a door to carry (none when nothing waits here)."""
        return self.pending.take() if self.pending is not None else []

    def write_soon(self, outcomes: list[Outcome]) -> None:
        """Successes the process's thread writes at once: those a door took and could not
        write, and those of a task that waited, which the door leaves to it."""
        if self.pending is not None:
            self.pending.write_soon(outcomes)

    # --- Celery's signals --------------------------------------------------------------

    def on_task_success(self, sender: Any = None, result: Any = None, **_: Any) -> None:
        request = getattr(sender, "request", None)
        retry = getattr(request, QUIET_RETRY, None)
        if retry is not None:  # it called self.retry(throw=False), then returned
            self.on_task_retry(sender, request=request, reason=retry)
            return
        self.complete(
            getattr(request, "id", None),
            SUCCEEDED,
            headers=run_headers(request),
            lease=run_lease(request),
            waited=body_waited(request),
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
        retry = getattr(request, QUIET_RETRY, None)  # self.retry(throw=False), then raised
        self.complete(
            task_id,
            FAILED,
            error=describe(exception),
            traceback=str(getattr(einfo, "traceback", "") or ""),
            retry_delay=retry_delay(getattr(retry, "when", None)) if retry else None,
            lease=run_lease(request),
            run_id=run_id_of(request),
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
        self.complete(
            getattr(request, "id", None),
            FAILED,
            error=f"retry requested: {describe(exc)}",
            traceback=str(getattr(einfo, "traceback", "") or ""),
            retry_delay=retry_delay(getattr(reason, "when", None)),
            lease=run_lease(request),
            run_id=run_id_of(request),
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
            outcome, error = SKIPPED, f"ignored by the task: {describe(retval)}"
        elif state == states.REJECTED:
            requeued = " (requeued)" if getattr(retval, "requeue", False) else ""
            reason = describe(getattr(retval, "reason", retval))
            outcome, error = FAILED, f"rejected by the task{requeued}: {reason}"
        else:
            return
        request = getattr(sender, "request", None)
        self.complete(
            task_id, outcome, error=error, lease=run_lease(request), run_id=run_id_of(request)
        )

    def unknown_task(self, task_id: str | None, name: str | None, host: str) -> None:
        """Celery rejected a message whose task this worker does not have (a deploy in
        progress, a renamed task). The run fails, so the job retries and, if it never finds
        a worker that has the task, goes dead with the reason, instead of being re-sent every
        lease forever."""
        self.complete(
            task_id,
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
            _expired_early(claim, getattr(request, "expires", None))
            result = with_retries(
                lambda: record_expired(*claim, run_id_of(request)),
                what="expired",
                attempts=3,
                attempt_timeout=statement_wait(None),
            )
            if result is not None:
                metrics.run_finished("skipped")
            return
        result = with_retries(
            lambda: record_cancelled(*claim, terminated=terminated, run_id=run_id_of(request)),
            what="revoked",
            attempts=3,
            attempt_timeout=statement_wait(None),
        )
        count_outcome(result, "cancelled")

    # --- writing -----------------------------------------------------------------------

    def complete(
        self,
        task_id: str | None,
        state: str,
        lease: float | None = None,
        waited: bool = False,
        **fields: Any,
    ) -> None:
        """Record an outcome, retried through a database outage for at least the run's lease
        (``lease``: the one it was dispatched with; schedapp's default if unknown)."""
        claim = parse_task_id(task_id)
        if claim is None:
            return
        outcome = Outcome(
            claim, state, lease or get_settings().DEFAULT_LEASE_SECONDS, fields, waited
        )
        if self.pending is not None and outcome.carries_headers:
            self.pending.add(outcome, outcome.retry_for)
        else:
            self.record(outcome)

    def record_many(self, outcomes: list[Outcome]) -> None:
        """Successes that carry their headers in one round trip, the rest one by one."""
        batch = [o for o in outcomes if o.carries_headers]
        if batch:
            try:
                results = with_retries(
                    lambda: complete_successes([(*o.claim, o.fields["headers"]) for o in batch]),
                    what="completions",
                    attempts=10,
                    at_least=max(o.retry_for for o in outcomes),
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
                    count_outcome(result, SUCCEEDED)
        for outcome in outcomes:
            if not outcome.carries_headers:
                self.record(outcome)

    def record(self, outcome: Outcome) -> None:
        """Write one outcome through ``complete_run``."""
        job_id, token = outcome.claim
        try:
            # For as long as the lease could be alive: a database back within it must get the
            # outcome before the lease expires. After that the lease has expired and the job
            # runs again (at-least-once), which is the safe failure. A retry of a completion
            # whose commit landed finds it recorded and changes nothing.
            result = with_retries(
                lambda: complete_run(job_id, token, outcome.state, **outcome.fields),
                what="completion",
                attempts=10,
                at_least=outcome.retry_for,
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
        count_outcome(result, outcome.state)


def count_outcome(result: CompletionResult | None, state: str) -> None:
    """Count a recorded outcome in the metrics (once: a retried write that found it already
    recorded is not counted again)."""
    if result is None:
        metrics.run_finished("cancelled")
    elif result.completion is not Completion.ALREADY_RECORDED:
        metrics.run_finished(
            state,
            stale=result.completion is Completion.STALE,
            dead=result.dead,
            carried_on=result.carried_on,
        )


def body_clocks() -> tuple[float, float, int]:
    """What ``body_waited`` compares: the wall clock, this thread's CPU clock and its
    voluntary context switches (-1 where the platform does not count them per thread)."""
    return time.monotonic(), time.thread_time(), _blocked()


def _blocked() -> int:
    """This thread's voluntary context switches: each time it blocked (a sleep, I/O, a lock),
    as opposed to being descheduled by a busy machine, which is involuntary."""
    if _RUSAGE_THREAD is None:
        return -1
    return resource.getrusage(_RUSAGE_THREAD).ru_nvcsw


def body_waited(request: Any) -> bool:
    """Whether the task's body, since the door admitted it (``body_clocks``), blocked and
    spent ``WAITED`` seconds or more off the CPU of the thread that ran it. A body that never
    blocked did not wait, however long a busy machine kept it off the CPU."""
    started = getattr(request, BODY_STARTED, None)
    if started is None:
        return False
    wall, cpu, switches = started
    if switches >= 0 and _blocked() == switches:
        return False
    return (time.monotonic() - wall) - (time.thread_time() - cpu) >= WAITED


def _expired_early(claim: tuple[int, int], expires: Any) -> None:
    """Celery discarded a message past its ``expires`` by this host's clock; the beat
    dated it by the database's. If the database says it has not expired, this host's
    clock is ahead: say so (ERROR), or every such occurrence is dropped in silence."""
    if not isinstance(expires, datetime) or expires.tzinfo is None:
        return
    try:
        database_now = db_now()
    except Exception:  # an alarm only: the expiry itself is recorded by the caller
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


def describe(exc: Any) -> str:
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


def retry_delay(when: Any) -> timedelta | None:
    """The delay a task asked for in ``self.retry(countdown=... or eta=...)``, bounded."""
    if when is None:
        return None
    if isinstance(when, int | float):  # bounded first: timedelta overflows on 1e15 seconds
        return timedelta(seconds=min(max(0.0, float(when)), MAX_DELAY.total_seconds()))
    if isinstance(when, datetime):
        aware = when if when.tzinfo else when.replace(tzinfo=UTC)
        return max(timedelta(0), aware - datetime.now(UTC))
    return None
