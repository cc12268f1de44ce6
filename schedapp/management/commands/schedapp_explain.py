"""``manage.py schedapp_explain JOB [--at TIME]``: what happened to a job's occurrences.

With ``--at`` it answers "what happened at 08:00?" (a time without an offset is in the job's
own zone); without, it prints the job's timeline, newest first. ``--fleet`` lists what did not
run in the whole fleet over the last ``--hours``. ``--json`` prints the same as JSON.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import datetime, timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from schedapp import explain
from schedapp.db import db_now
from schedapp.models import Job


def _time(text: str) -> datetime:
    try:
        return datetime.fromisoformat(text.strip().replace(" ", "T", 1))
    except ValueError:
        raise CommandError(
            f"--at: {text!r} is not a time; write 2026-12-03T08:00 (in the job's zone) or "
            "2026-12-03T08:00+01:00"
        ) from None


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


class Command(BaseCommand):
    help = "Explain a job's occurrences: what ran, what did not and why."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("job", nargs="?", help="Job id or name.")
        parser.add_argument("--at", help="An occurrence's time (ISO 8601; the job's zone).")
        parser.add_argument("--limit", type=int, default=50, help="Timeline lines (50).")
        parser.add_argument(
            "--fate",
            action="append",
            default=[],
            help="Only these fates (ran, misfired, outside_window, paused, ...); repeatable.",
        )
        parser.add_argument("--fleet", action="store_true", help="What did not run, fleet-wide.")
        parser.add_argument("--hours", type=float, default=24.0, help="With --fleet (24).")
        parser.add_argument("--json", action="store_true", help="Print JSON.")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["fleet"]:
            return self._fleet(options)
        if not options["job"]:
            raise CommandError("name a job (id or name), or use --fleet")
        try:
            if options["at"]:
                answer = explain.explain(options["job"], _time(options["at"]))
                if options["json"]:
                    self.stdout.write(json.dumps(_plain(asdict(answer)), indent=2))
                else:
                    self.stdout.write(answer.text)
                return None
            entries = explain.timeline(
                options["job"], fates=options["fate"], limit=options["limit"]
            )
        except Job.DoesNotExist as exc:
            raise CommandError(str(exc)) from None
        if options["json"]:
            self.stdout.write(json.dumps([_plain(asdict(e)) for e in entries], indent=2))
            return None
        for e in entries:
            self.stdout.write(_line(e))
        return None

    def _fleet(self, options: dict[str, Any]) -> None:
        view = explain.not_run(db_now() - timedelta(hours=options["hours"]))
        if options["json"]:
            data = {
                "since": view.since,
                "occurrences_by_fate": view.occurrences_by_fate,
                "runs_by_status": view.runs_by_status,
                "records": [
                    {"job": job_id, "name": name, **asdict(entry)}
                    for job_id, name, entry in view.records
                ],
            }
            self.stdout.write(json.dumps(_plain(data), indent=2))
            return
        self.stdout.write(f"since {view.since.isoformat(timespec='seconds')}")
        for fate, n in sorted(view.occurrences_by_fate.items()):
            self.stdout.write(f"  not run, {fate}: {n}")
        for status, n in sorted(view.runs_by_status.items()):
            self.stdout.write(f"  runs {status}: {n}")
        for job_id, name, entry in view.records:
            self.stdout.write(f"{name} (id {job_id}) {_line(entry)}")


def _line(e: explain.Entry) -> str:
    when = e.first.isoformat(timespec="seconds")
    if e.fate == explain.RAN:
        lag = e.lag.total_seconds() * 1000 if e.lag is not None else 0.0
        tries = len(e.attempts)
        return f"{when}  ran  {e.outcome}  attempts={tries}  lag={lag:.0f}ms"
    span = f"..{e.last.isoformat(timespec='seconds')} x{e.count}" if e.count > 1 else ""
    return f"{when}{span}  {e.fate}  {e.detail}"
