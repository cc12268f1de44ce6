"""``manage.py schedapp_import``: switch from Celery beat or django-celery-beat in one step."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from schedapp import importer
from schedapp.policies import WHEN_RETRIES_EXHAUSTED


class Command(BaseCommand):
    help = (
        "Import CELERY_BEAT_SCHEDULE (default) and/or django-celery-beat's periodic tasks "
        "as schedapp jobs; existing names are skipped (or updated with --update), and "
        "entries that cannot be mapped are reported."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--from-settings",
            action="store_true",
            help="Import CELERY_BEAT_SCHEDULE (the default source).",
        )
        parser.add_argument(
            "--from-django-celery-beat",
            action="store_true",
            help="Import django-celery-beat's PeriodicTask rows.",
        )
        parser.add_argument(
            "--update",
            action="store_true",
            help="Update jobs imported before whose source entry changed.",
        )
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="Validate and report; write nothing. Shows each job it would create (task, "
            "schedule in words, zone, next fire times, message options) and, with --update, "
            "each change.",
        )
        parser.add_argument(
            "--beat-state",
            metavar="PATH",
            help="Celery beat's state file (celerybeat-schedule): intervals keep their phase "
            "(next run one interval after the last one beat sent) instead of restarting now.",
        )
        parser.add_argument(
            "--retries",
            type=int,
            metavar="N",
            help="Retries of a failed occurrence (default 0: Celery beat retries nothing, it "
            "sends the next occurrence).",
        )
        parser.add_argument(
            "--on-exhausted",
            choices=WHEN_RETRIES_EXHAUSTED,
            help="When an occurrence's retries are spent: next_occurrence (the default, Celery "
            "beat's: the failure is recorded and the next occurrence runs) or dead (the job is "
            "set aside for a person, schedapp's default for its own jobs).",
        )
        parser.add_argument(
            "--strict",
            action="store_true",
            help="Exit non-zero if any entry is not mapped, invalid, or has a setting that "
            "cannot be carried over (the rest is still imported unless --dry-run).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        candidates: list[importer.Candidate] = []
        if options["from_settings"] or not options["from_django_celery_beat"]:
            last_runs = None
            if options["beat_state"]:
                try:
                    last_runs = importer.read_beat_state(options["beat_state"])
                except Exception as exc:  # missing, not a shelve, another Celery's entries
                    raise CommandError(f"cannot read {options['beat_state']}: {exc}") from exc
            candidates += importer.from_beat_schedule(
                importer.beat_schedule_from_settings(), last_runs=last_runs
            )
        if options["from_django_celery_beat"]:
            try:
                candidates += importer.from_django_celery_beat()
            except RuntimeError as exc:
                raise CommandError(str(exc)) from exc
        if not candidates:
            self.stdout.write("nothing to import")
            return
        if options["retries"] is not None and options["retries"] < 0:
            raise CommandError("--retries must be 0 or more")
        candidates = importer.with_failure_policy(
            candidates, retries=options["retries"], when_exhausted=options["on_exhausted"]
        )
        report = importer.import_candidates(
            candidates, update=options["update"], dry_run=options["dry_run"]
        )
        for line in report.lines():
            stream = self.stderr if line.startswith(("NOT MAPPED", "INVALID")) else self.stdout
            stream.write(line)
        if options["strict"] and not report.complete:
            raise CommandError(
                f"--strict: {len(report.unmapped)} not mapped, {len(report.invalid)} invalid, "
                f"{len(report.ignored)} with settings ignored"
            )
