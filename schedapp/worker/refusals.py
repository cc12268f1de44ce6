"""The two ends of a task that record nothing: the door's refusal and a replaced task.

Both are Celery ``Ignore`` (Celery acknowledges the message and sends ``task_postrun`` with
state ``IGNORED``); a task's own ``Ignore`` records its run ``skipped``, these do not.
"""

from __future__ import annotations

from celery.exceptions import Ignore


class Refused(Ignore):
    """The door's refusal: Celery acknowledges the message without running the task, and
    nothing is recorded for it (unlike a task's own ``Ignore``)."""


class Replaced(Ignore):
    """The end of a task that replaced itself (``Task.replace``): its run goes on in the
    replacement, so nothing is recorded for it."""
