"""``HeldLeases``: the runs this worker holds, and the renewal of their leases.

A run is held from the moment Celery reserves its message (``task_received``, main process)
until Celery is done with it: prefetched, waiting in a rate limit's bucket or executing. The
lease heartbeat (``heartbeat.LeaseHeartbeat``) renews, in one statement, every held lease a
third of the way through it, except a run whose door has been at work longer than its lease
(``DoorBoard``): that one lapses, so another worker can take the run.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from celery.worker import state as worker_state

from .. import metrics
from ..context import as_run_id
from ..lease import renew_leases
from ..message import HEADER_LEASE, HEADER_RUN, parse_task_id
from .board import DoorBoard

log = logging.getLogger("schedapp.worker")

# A request noted at task_received appears in Celery's own bookkeeping right after the signal
# returns; until it is that old, a held run missing from it is not taken for finished, unless
# Celery has acknowledged (or rejected) its message, which it does only once it has it.
ADMISSION_GRACE = 2.0


@dataclass
class Held:
    """A run whose message this worker reserved and still holds (prefetched or executing)."""

    task_id: str
    lease: float
    admitted_at: float
    renewed_at: float
    request: Any = None  # Celery's Request: its ``acknowledged`` says Celery has taken it
    run_id: int | None = None  # the message's schedapp_run header: the run read by its key

    def done_with(self, live: set[str], now: float) -> bool:
        """Whether Celery is done with this run's message: out of its bookkeeping, and
        either acknowledged (a run refused at the door is, at once) or past the grace."""
        if self.task_id in live:
            return False
        acknowledged = bool(getattr(self.request, "acknowledged", False))
        return acknowledged or now - self.admitted_at > ADMISSION_GRACE


class HeldLeases:
    """The runs held by this worker's main process, and their renewal.

    ``on_task_received`` runs on the consumer's thread and the renewal on the heartbeat's;
    both see ``held`` under ``lock``. ``consumer`` (Celery's, from ``worker_ready``) tells
    which requests wait in rate limit buckets; ``board`` (from ``worker_init``) which runs
    are at a door now.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.held: dict[tuple[int, int], Held] = {}
        self.consumer: Any = None
        self.board: DoorBoard | None = None
        self._wedged: dict[tuple[int, int], float] = {}  # doors seen past their lease
        self._wedged_told: set[tuple[int, int]] = set()

    def on_task_received(self, sender: Any = None, request: Any = None, **_: Any) -> None:
        """A message reached this worker (main process): held from now on, so the heartbeat
        renews its lease while it waits in the prefetch buffer and while it runs. No database
        call here: Celery's consumer loop is serial, and a round trip on it would hold up
        every message behind this one."""
        task_id = getattr(request, "id", None)
        claim = parse_task_id(task_id)
        if claim is None:
            return
        headers = _request_headers(request)
        lease = float(headers.get(HEADER_LEASE) or 60)
        run_id = as_run_id(headers.get(HEADER_RUN))
        now = time.monotonic()
        with self.lock:
            self.held[claim] = Held(task_id, lease, now, now, request, run_id)  # type: ignore[arg-type]

    def shortest_lease(self) -> float | None:
        """The shortest lease among the runs held (None if none): it bounds a renewal's wait."""
        with self.lock:
            return min((h.lease for h in self.held.values()), default=None)

    def count(self) -> int:
        """How many runs are held now."""
        with self.lock:
            return len(self.held)

    def renew_held_leases(self) -> None:
        """Renew the leases due for it (a third of the lease old) among the runs held here."""
        due = self.due_for_renewal()
        if not due:
            return
        with self.lock:
            run_ids = {k: h.run_id for k in due if (h := self.held.get(k)) and h.run_id is not None}
        renewal = renew_leases(due, run_ids)
        now = time.monotonic()
        with self.lock:
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
        """Whether any run is still held (a warm shutdown renews until none is)."""
        self.due_for_renewal()  # forgets what Celery is done with
        with self.lock:
            return bool(self.held)

    def due_for_renewal(self) -> list[tuple[int, int]]:
        """The held runs whose lease is a third old, except wedged doors; forgets the runs
        Celery is done with."""
        live = live_task_ids(self.consumer)
        now = time.monotonic()
        wedged = self._wedged_doors(now)
        with self.lock:
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
        worker takes them. A door's waits are bounded (``statement_wait``, ``door_retries``)
        and it gives up after about a lease; this is for a door stuck past that anyway,
        which would otherwise hold its run for as long as the worker lives."""
        if self.board is None:
            return set()
        with self.lock:
            leases = {key: held.lease for key, held in self.held.items()}
        seen, self._wedged = self._wedged, {}
        for job_id, token, since in self.board.entries():
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


def _request_headers(request: Any) -> dict[str, Any]:
    headers = getattr(request, "request_dict", None) or {}
    return headers if isinstance(headers, dict) else {}
