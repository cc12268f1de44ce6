"""How long the worker's statements wait for a reply, and how long the door retries.

A worker's writes (door, renewal, completion) are bounded in time so that a silent connection
is given up and a new one tried while the run's lease may still be alive (design note 24).
"""

from __future__ import annotations

from typing import Any

from ..conf import get_settings


def statement_wait(lease: float | None) -> float:
    """How long a worker's statement waits for its reply before its connection is given
    up: ``SCHEDAPP_DB_TIMEOUT``, or a third of the run's ``lease`` if shorter, so that a
    door or a renewal can try again on a new connection while the lease may be alive."""
    limit = get_settings().DB_TIMEOUT
    return min(limit, max(lease / 3.0, 1.0)) if lease else limit


def door_retries(lease: float) -> dict[str, Any]:
    """The door's retries (``with_retries`` arguments): for as long as the run's ``lease``
    may be alive (it was renewed at most now), a second apart at most, each try bounded in
    time."""
    return {
        "attempts": 3,
        "at_least": lease,
        "max_delay": 1.0,
        "attempt_timeout": statement_wait(lease),
    }
