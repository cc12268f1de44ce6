"""``manage.py schedapp_status``: states, backlog, oldest due job, live beats, dispatch lag.

``--json`` prints the same as one JSON object, and ``--check`` exits 1 when something needs a
person (no beat alive, or the oldest due job waited longer than ``--max-wait``), for cron or
a container health check.
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from schedapp import overview
from schedapp.display import seconds_text


class Command(BaseCommand):
    help = "Show the scheduler's state: jobs by state, backlog, beats and workers, lag."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="Print JSON.")
        parser.add_argument(
            "--minutes",
            type=int,
            default=overview.LAG_WINDOW_MINUTES,
            help="Window for dispatch lag (default %(default)s).",
        )
        parser.add_argument(
            "--check",
            action="store_true",
            help="Exit 1 if no beat is alive or the backlog waits too long.",
        )
        parser.add_argument(
            "--max-wait",
            type=float,
            default=60.0,
            help="With --check: longest acceptable wait of a due job, seconds.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        data = overview.collect(options["minutes"])
        problems = self._problems(data, options["max_wait"])
        if options["json"]:
            self.stdout.write(json.dumps({**data.as_dict(), "problems": problems}, indent=2))
        else:
            self._print(data, problems)
        if options["check"] and problems:
            raise SystemExit(1)

    def _problems(self, data: overview.Overview, max_wait: float) -> list[str]:
        problems = []
        if not data.beats:
            problems.append("no beat seen in the last minute")
        waited = data.oldest_due_seconds
        if waited is not None and waited > max_wait:
            problems.append(f"the oldest due job has waited {seconds_text(waited)}")
        return problems

    def _print(self, data: overview.Overview, problems: list[str]) -> None:
        out = self.stdout.write
        out(f"schedapp status at {data.now:%Y-%m-%d %H:%M:%S} UTC (database clock)")
        out("")
        out("Jobs by state")
        for state, count in data.counts.items():
            out(f"  {state:<10} {count:>12,}")
        out(f"  {'total':<10} {data.total:>12,}")
        out("")
        capped = "+" if data.backlog_capped else ""
        out(f"Due backlog        {data.backlog:,}{capped}")
        out(f"Oldest due job     {self._waited(data)}")
        out(f"Expired leases     {data.expired_leases:,}")
        out(f"Dead letters       {data.dead:,}")
        out("")
        if data.lag is None:
            out("Dispatch lag       no run dispatched in the window")
        else:
            lag = data.lag
            out(
                f"Dispatch lag       {lag.label}: {lag.runs:,} runs, p50 {seconds_text(lag.p50)}, "
                f"p95 {seconds_text(lag.p95)}, max {seconds_text(lag.max)}"
            )
            for row in data.lag_by_minute:
                out(
                    f"  {row.label}  {row.runs:>8,} runs  p50 {seconds_text(row.p50):>8}  "
                    f"p95 {seconds_text(row.p95):>8}  max {seconds_text(row.max):>8}"
                )
        out("")
        for title, nodes in (("Beats", data.beats), ("Workers", data.workers)):
            out(f"{title} alive: {len(nodes)}")
            for node in nodes:
                stats = ", ".join(f"{k}={v}" for k, v in sorted(node.stats.items()))
                out(
                    f"  {node.name}  (pid {node.pid or '-'} on {node.hostname or '-'}, seen "
                    f"{seconds_text(node.age_seconds)} ago) {stats}"
                )
        if data.unconsumed_queues:
            out("")
            out("Queues no live worker consumes from:")
            for queue in data.unconsumed_queues:
                out(f"  {queue.name}  {queue.jobs:,} jobs ({', '.join(queue.tasks)})")
        if problems:
            out("")
            for problem in problems:
                self.stderr.write(f"PROBLEM: {problem}")

    @staticmethod
    def _waited(data: overview.Overview) -> str:
        if data.oldest_due is None:
            return "none scheduled"
        waited = data.oldest_due_seconds
        if waited is None:
            return f"nothing due yet (next at {data.oldest_due:%Y-%m-%d %H:%M:%S} UTC)"
        return f"due since {data.oldest_due:%Y-%m-%d %H:%M:%S} UTC ({seconds_text(waited)} ago)"
