"""Beats and workers record themselves, so operators can see who is alive and how busy."""

from __future__ import annotations

import os
import socket
from datetime import datetime
from typing import Any

from django.db.models.functions import Now

from .models import Node


def record_node(name: str, kind: str, started_at: datetime, stats: dict[str, Any]) -> None:
    """Insert or refresh this process's row; ``last_seen_at`` uses the database clock.

    Every refresh writes the process as it is (pid, host, start) too: a worker killed and
    started again under the same name (``-n worker1@%h``) is a new process, and its row must
    stop showing the dead one's pid and start. It costs nothing: the same one-row UPDATE."""
    current = {
        "kind": kind,
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "started_at": started_at,
        "stats": stats,
    }
    updated = Node.objects.filter(name=name).update(last_seen_at=Now(), **current)
    if not updated:
        Node.objects.create(name=name, last_seen_at=Now(), **current)
