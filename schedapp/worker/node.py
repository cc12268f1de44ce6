"""``NodeRecord``: the worker's row in the node table, for the overview and the admin.

Visibility only: a failure to write it never stops the worker. Written when the worker is
ready, then at most every ``SCHEDAPP_NODE_HEARTBEAT`` seconds with the lease heartbeat, and
deleted at shutdown.
"""

from __future__ import annotations

import os
import socket
import time
from datetime import UTC, datetime
from typing import Any

from celery.worker import state as worker_state

from ..conf import get_settings
from ..models import Node
from ..nodes import record_node


class NodeRecord:
    """This worker's node row: its name, when it started, and what it is doing."""

    def __init__(self) -> None:
        self.hostname: str | None = None
        self.started_at: datetime | None = None
        self.consumer: Any = None  # Celery's Consumer, from worker_ready: the queues read
        self._recorded = 0.0

    def start(self, consumer: Any) -> None:
        """The worker is ready (``worker_ready``'s sender is its consumer)."""
        self.hostname = (
            getattr(consumer, "hostname", None) or f"{socket.gethostname()}:{os.getpid()}"
        )
        self.started_at = datetime.now(UTC)
        self.consumer = consumer

    def record(self, held: int, force: bool = False) -> None:
        """Write the row, with ``held``: the runs this worker holds; at most every
        ``SCHEDAPP_NODE_HEARTBEAT`` seconds unless ``force``."""
        if self.hostname is None or self.started_at is None:
            return
        now = time.monotonic()
        if not force and now - self._recorded < get_settings().NODE_HEARTBEAT:
            return
        self._recorded = now
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

    def forget(self) -> None:
        """The worker is shutting down: its row goes (if it was ever written)."""
        if self.hostname is None:
            return
        try:
            Node.objects.filter(name=self.hostname).delete()
        except Exception:  # shutting down
            pass
