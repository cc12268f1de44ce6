"""``manage.py schedapp_notify``: deliver notifications (``schedapp.notify.delivery``) from a
process of its own, for teams that set ``SCHEDAPP_NOTIFY_IN_BEAT = False`` (or want another
loop beside the beats': loops share the channels, each message sent by one of them)."""

from __future__ import annotations

import signal
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from schedapp.notify.delivery import DeliveryLoop, deliver_once
from schedapp.notify.outbox import configured_channels
from schedapp.settings_checks import notification_problems


class Command(BaseCommand):
    help = (
        "Send pending notifications, grouped per channel (SCHEDAPP_NOTIFICATIONS), until "
        "stopped; --once: one pass, then exit."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--once", action="store_true", help="One pass, then exit.")

    def handle(self, *args: Any, **options: Any) -> None:
        problems = notification_problems()
        if problems:
            raise CommandError(" ".join(problems))
        if not configured_channels():
            raise CommandError("SCHEDAPP_NOTIFICATIONS configures no channel: nothing to send.")
        if options["once"]:
            deliver_once()
            return
        loop = DeliveryLoop()
        signal.signal(signal.SIGTERM, lambda *_: loop.stop(timeout=0))
        self.stdout.write("delivering notifications; Ctrl-C or SIGTERM stops")
        try:
            loop.run()
        except KeyboardInterrupt:
            pass
