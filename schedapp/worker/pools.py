"""Which Celery pools schedapp executes runs on: not the green ones (gevent, eventlet).

``manage.py check`` and the worker's door both use these, so the reason reads the same
wherever it is given.
"""

from __future__ import annotations

from typing import Any


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
