"""``manage.py schedapp_prune --older-than 30d``: delete old run history in batches."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from schedapp.prune import DEFAULT_BATCH, parse_age, prune_runs


class Command(BaseCommand):
    help = (
        "Delete runs that finished longer ago than --older-than (30d, 12h, 90m, 3600s), "
        "in short batches; runs still dispatched or running are kept."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--older-than", required=True, help="Age: 30d, 12h, 90m, 3600s, 2w.")
        parser.add_argument(
            "--batch-size",
            type=int,
            default=DEFAULT_BATCH,
            help=f"Runs per DELETE transaction (default {DEFAULT_BATCH}).",
        )
        parser.add_argument(
            "--max-batches",
            type=int,
            default=None,
            help="Stop after this many batches (default: until done).",
        )
        parser.add_argument(
            "--pause", type=float, default=0.0, help="Seconds to sleep between batches (default 0)."
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="Count what would be deleted; delete nothing."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            age = parse_age(options["older_than"])
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        if options["batch_size"] < 1:
            raise CommandError("--batch-size must be at least 1.")
        result = prune_runs(
            age,
            batch_size=options["batch_size"],
            max_batches=options["max_batches"],
            pause=options["pause"],
            dry_run=options["dry_run"],
        )
        verb = "would delete" if options["dry_run"] else "deleted"
        self.stdout.write(
            f"{verb} {result.deleted} run(s) finished before {result.cutoff} "
            f"({result.batches} batch(es), {result.seconds:.2f}s)"
        )
