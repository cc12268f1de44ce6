"""The errors schedapp raises; each names the field or the job and says what is wrong."""

from __future__ import annotations


class SchedappError(Exception):
    """Base class for schedapp's own errors."""


class ScheduleError(SchedappError, ValueError):
    """A schedule value is invalid; ``field`` names the input it came from.

    Raised by the pure schedule code, which must not depend on Django; the validation layer
    turns it into a ``django.core.exceptions.ValidationError`` keyed by ``field``.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class JobStateError(SchedappError):
    """An operation does not apply to the job in its current state (e.g. requeue a live job)."""


class LeaseLost(SchedappError):
    """A fenced write found a newer fencing token: another claim owns the job now."""


class ReplaceNotSupported(SchedappError):
    """A task of a schedapp job replaced itself (``Task.replace``) with a signature schedapp
    cannot follow as the run (a chain, a group): the run fails with this, nothing sent."""
