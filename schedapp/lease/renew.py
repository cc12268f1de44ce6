"""The heartbeat's write: every lease a worker holds renewed in one statement, and what
became of those it could not renew."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..store import get_store


@dataclass(frozen=True)
class Renewal:
    """What one lease heartbeat found: leases renewed, runs that finished normally since (the
    worker has not noticed yet), runs closed by a cancel (the task may run on; nothing it
    reports changes the job), runs that moved on before they ever started (a message that
    arrived after its lease expired: the door will refuse it), and leases lost while running
    (reclaimed or reaped)."""

    renewed: set[tuple[int, int]] = field(default_factory=set)
    finished: set[tuple[int, int]] = field(default_factory=set)
    cancelled: set[tuple[int, int]] = field(default_factory=set)
    unstarted: set[tuple[int, int]] = field(default_factory=set)
    lost: set[tuple[int, int]] = field(default_factory=set)
    busy: set[tuple[int, int]] = field(default_factory=set)  # still held: renew next time


# A job row held by a door, a completion or the API is held for about a millisecond.
_BUSY_ATTEMPTS = 4
_BUSY_PAUSE = 0.02


def renew_leases(
    held: Sequence[tuple[int, int]], run_ids: Mapping[tuple[int, int], int] | None = None
) -> Renewal:
    """Extend every lease ``(job_id, token)`` a worker holds from now, in one statement;
    ``run_ids`` (from the messages' headers) lets each run be read by its key.

    A lease that can no longer be renewed is *lost* only if its run had started and did not
    simply finish: a run whose completion committed a moment ago (the worker's main process
    has not seen it yet) is reported as finished, one a cancel closed as cancelled, and one
    that never started anywhere (its message waited in this worker while the job moved on) as
    unstarted, not as an alarm. A renewal never waits for a job row another transaction holds
    (waiting, it could deadlock with a door carrying a success): such leases are tried again
    a moment later, and any still busy are left ``busy`` for the next heartbeat. On
    PostgreSQL this is the function ``schedapp_renew_leases_v6`` (sql/functions.sql).
    """
    result = Renewal()
    sets = {
        "renewed": result.renewed,
        "finished": result.finished,
        "cancelled": result.cancelled,
        "unstarted": result.unstarted,
        "lost": result.lost,
        "busy": result.busy,
    }
    pending = list(held)
    for attempt in range(_BUSY_ATTEMPTS):
        if not pending:
            break
        if attempt:
            time.sleep(_BUSY_PAUSE)
        result.busy.clear()
        for job_id, token, outcome in get_store().renew(pending, run_ids):
            sets[outcome].add((job_id, token))
        pending = sorted(result.busy)
    return result
