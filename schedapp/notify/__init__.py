"""Notifications a team receives: events (a breach, a dead job, a recovery) queued in a
transactional outbox (``outbox.enqueue``, in the event's transaction) and delivered, grouped
per channel, by a loop on its own thread in each beat or by ``manage.py schedapp_notify``
(``delivery``). ``channels`` reads ``SCHEDAPP_NOTIFICATIONS`` and routes; ``messages`` says
what one grouped message holds and signs webhooks; both are pure, so importing them (this
package) loads no model: ``enqueue`` is loaded when first asked for."""

from __future__ import annotations

from typing import Any

from .channels import KINDS

__all__ = ["KINDS", "enqueue"]


def __getattr__(name: str) -> Any:
    if name == "enqueue":
        from .outbox import enqueue

        return enqueue
    raise AttributeError(name)
