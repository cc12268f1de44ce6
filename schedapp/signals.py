"""Signals schedapp sends, declared in one place (as Celery declares its own).

``lease_heartbeat`` is sent by a thread of every worker's main process, every
``SCHEDAPP_LEASE_HEARTBEAT`` seconds, whatever the broker or the pool are doing: schedapp's
receiver renews the leases the worker holds. Connect to it for anything else that must beat
as long as the worker process lives and can reach the database.
"""

from __future__ import annotations

from celery.utils.dispatch import Signal

#: sender: the worker's hostname (``worker1@host``). Receivers run on the heartbeat thread,
#: with its own database connection; keep them short (they delay the next renewal).
lease_heartbeat = Signal(name="schedapp.lease_heartbeat")

__all__ = ["lease_heartbeat"]
