"""``manage.py schedapp_calendar import NAME FILE.ics``: save an iCalendar file as a calendar."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from schedapp import api


class Command(BaseCommand):
    help = (
        "Calendars. 'import NAME FILE.ics': create the calendar NAME, or replace its definition, "
        "with one rule that excludes the events of the iCalendar file (read from disk)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True)
        load = actions.add_parser("import", help="Save an .ics file as the calendar NAME.")
        load.add_argument("name", help="The calendar's name.")
        load.add_argument("file", help="Path of the .ics file (RFC 5545).")
        load.add_argument(
            "--timezone",
            default=None,
            help="The wall clock its timed events are placed on (default: the file's "
            "X-WR-TIMEZONE, else UTC); use the time zone of the jobs it applies to.",
        )
        load.add_argument("--description", default="", help="The calendar's description.")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            calendar = api.import_calendar(
                options["name"],
                options["file"],
                timezone=options["timezone"],
                description=options["description"],
            )
        except ValidationError as exc:
            lines = [f"{field}: {' '.join(msgs)}" for field, msgs in exc.message_dict.items()]
            raise CommandError("calendar not saved: " + "; ".join(lines)) from exc
        self.stdout.write(f"saved calendar {calendar.name!r} from {options['file']}")
