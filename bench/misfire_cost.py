"""What one misfire decision costs inside the beat's claim transaction.

``plan_misfire`` runs while the claim holds its row locks, so its cost must not grow with how
long a job was away (DESIGN.md, lesson 18). This times it, pure (no database), for:

* (a) twelve ``* * * * *`` jobs found 8 days late (one claim with twelve misfires),
* (b) one ``*/1 * * * * *`` job (every second, 6 fields) 8 days late,
* (c) one ``* * * * *`` job 10 years late,

in Europe/Paris, under each misfire policy (``run_all`` keeps the last 100), and with
``--window DAYS`` under a catch-up window too (the ledger's ranges are computed either way,
where ``plan_misfire`` has them), and prints the
best of ``--repeat`` runs in wall-clock and in CPU time (CPU time is the steadier figure on a
shared machine) with the missed count each plan reports. Each run starts cold: the caches of
the zone's offset changes and of the cron's day bitmasks are emptied first (``--warm`` keeps
them, as a long-running beat would).

    .venv/bin/python bench/misfire_cost.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime, timedelta

from schedapp import schedules
from schedapp.policies import MISFIRE_POLICIES, plan_misfire
from schedapp.schedules import parse_cron

NOW = datetime(2026, 11, 30, 12, 0, 30, tzinfo=UTC)
CASES = [
    ("(a) 12 x '* * * * *', 8 days late", "* * * * *", 12, timedelta(days=8)),
    ("(b) '*/1 * * * * *', 8 days late", "*/1 * * * * *", 1, timedelta(days=8)),
    ("(c) '* * * * *', 10 years late", "* * * * *", 1, timedelta(days=3652)),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--warm", action="store_true", help="keep caches between runs")
    parser.add_argument("--window", type=float, help="a catch-up window of this many days")
    args = parser.parse_args()
    extra = (timedelta(days=args.window),) if args.window else ()
    for label, expr, jobs, late in CASES:
        cron = parse_cron(expr, "Europe/Paris")
        due = (NOW - late).replace(second=0)
        for policy in MISFIRE_POLICIES:
            wall = cpu = float("inf")
            for _ in range(args.repeat):
                if not args.warm:
                    _empty_caches()
                t0, c0 = time.perf_counter(), time.process_time()
                for _ in range(jobs):
                    plan = plan_misfire(cron, due, NOW, policy, 100, timedelta(0), *extra)
                wall = min(wall, time.perf_counter() - t0)
                cpu = min(cpu, time.process_time() - c0)
            print(
                f"{label:38} {policy:9} wall {wall * 1000:9.1f} ms  cpu {cpu * 1000:9.1f} ms"
                f"  missed={plan.missed} records={len(getattr(plan, 'ranges', ()))}"
            )


def _empty_caches() -> None:
    cronmath = getattr(schedules, "cronmath", None)  # absent before exact counting
    if cronmath is not None:
        cronmath._changes_in_year.cache_clear()
        cronmath.cron_sets.cache_clear()


if __name__ == "__main__":
    main()
