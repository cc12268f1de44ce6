"""``DoorBoard``: which runs are at a door now, for the main process's heartbeat to read.

The door runs in a pool process (or a pool thread); the heartbeat runs in the main process
and stops renewing a run whose door has been at work longer than its lease. This board is
how the one sees the other, with no system call on the door's path.
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
import time

from billiard.process import current_process


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
