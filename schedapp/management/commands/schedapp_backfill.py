"""``manage.py schedapp_backfill JOB --start TIME --end TIME``: run a job's past occurrences.

The same as ``api.backfill`` and the admin's "Backfill…" (docs/semantics.md, "Backfill"): the
beats run each occurrence in the range as if its time had just passed, throttled, shared by
all of them, recorded in the ledger and the audit trail. A time without an offset is in the
job's own zone. ``--list`` shows the backfills (a job's, or all) with their progress;
``--cancel ID`` stops one.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from schedapp import api, explain
from schedapp.exceptions import JobStateError
from schedapp.lease import backfill as backfills
from schedapp.models import Backfill, Job


def _time(option: str, text: str, zone: str) -> datetime:
    try:
        at = datetime.fromisoformat(text.strip().replace(" ", "T", 1))
    except ValueError:
        raise CommandError(
            f"--{option}: {text!r} is not a time; write 2026-12-03T08:00 (in the job's zone) "
            "or 2026-12-03T08:00+01:00"
        ) from None
    return explain.aware(at, zone)


def _row(record: Backfill) -> dict[str, Any]:
    return {
        "id": record.pk,
        "job": record.job_id,
        "state": record.state,
        "start": record.start.isoformat(),
        "end": record.end.isoformat(),
        "overlap": record.overlap,
        "max_per_second": record.max_per_second,
        "total": record.total,
        "decided": record.decided,
        "dispatched": record.dispatched,
        "already_done": record.already_done,
        "in_flight": record.in_flight,
        "overlapped": record.overlapped,
        "cancelled": record.cancelled_count,
    }


def _errors(exc: ValidationError) -> str:
    if hasattr(exc, "message_dict"):
        return "; ".join(
            f"--{field.replace('_', '-')}: {' '.join(messages)}"
            for field, messages in exc.message_dict.items()
        )
    return " ".join(exc.messages)


class Command(BaseCommand):
    help = "Backfill a job's past occurrences, list backfills, or cancel one."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("job", nargs="?", help="Job id or name.")
        parser.add_argument("--start", help="The range's start (ISO 8601; the job's zone).")
        parser.add_argument("--end", help="The range's end, included (ISO 8601; the job's zone).")
        parser.add_argument(
            "--overlap",
            default=backfills.DEFAULT_OVERLAP,
            choices=backfills.BACKFILL_OVERLAP,
            help=f"How its runs overlap each other ({backfills.DEFAULT_OVERLAP}).",
        )
        parser.add_argument(
            "--max-per-second", type=float, default=10.0, help="Runs a second at most (10)."
        )
        parser.add_argument(
            "--rerun", action="store_true", help="Run again occurrences that succeeded."
        )
        parser.add_argument("--reason", help="Why (kept in the job's audit trail).")
        parser.add_argument("--list", action="store_true", help="List backfills (a job's).")
        parser.add_argument("--cancel", type=int, metavar="ID", help="Cancel backfill ID.")
        parser.add_argument("--json", action="store_true", help="Print JSON.")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["cancel"] is not None:
            try:
                record = api.cancel_backfill(options["cancel"], reason=options["reason"])
            except Backfill.DoesNotExist:
                raise CommandError(f"no backfill with id {options['cancel']}") from None
            return self._show([record], options)
        job = self._job(options["job"]) if options["job"] else None
        if options["list"]:
            records = Backfill.objects.order_by("-id")
            if job is not None:
                records = records.filter(job=job)
            return self._show(list(records[:100]), options)
        if job is None:
            raise CommandError("name a job (id or name), or use --list or --cancel ID")
        if not options["start"] or not options["end"]:
            raise CommandError("give the range: --start TIME --end TIME")
        zone = job.timezone or "UTC"
        try:
            record = api.backfill(
                job,
                _time("start", options["start"], zone),
                _time("end", options["end"], zone),
                overlap=options["overlap"],
                max_per_second=options["max_per_second"],
                rerun=options["rerun"],
                reason=options["reason"],
            )
        except ValidationError as exc:
            raise CommandError(_errors(exc)) from None
        except JobStateError as exc:
            raise CommandError(str(exc)) from None
        return self._show([record], options)

    def _job(self, ref: str) -> Job:
        try:
            return explain.job_named(ref)
        except Job.DoesNotExist as exc:
            raise CommandError(str(exc)) from None

    def _show(self, records: list[Backfill], options: dict[str, Any]) -> None:
        if options["json"]:
            self.stdout.write(json.dumps([_row(r) for r in records], indent=2))
            return
        if not records:
            self.stdout.write("no backfill")
        for r in records:
            self.stdout.write(
                f"backfill {r.pk} of job {r.job_id}: {r.state}, {r.decided}/{r.total} decided "
                f"({r.dispatched} run, {r.already_done} already done, {r.in_flight} in flight, "
                f"{r.overlapped} overlapped, {r.cancelled_count} cancelled), "
                f"{r.start.isoformat()} to {r.end.isoformat()}, {r.overlap}, "
                f"at most {r.max_per_second:g}/s"
            )
