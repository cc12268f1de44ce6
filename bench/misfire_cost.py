"""What one misfire decision costs inside the beat's claim transaction.

``plan_misfire`` runs while the claim holds its row locks, so its cost must not grow with how
long a job was away (DESIGN.md, lesson 18). This times it, pure (no database), for:

* (a) twelve ``* * * * *`` jobs found 8 days late (one claim with twelve misfires),
* (b) one ``*/1 * * * * *`` job (every second, 6 fields) 8 days late,
* (c) one ``* * * * *`` job 10 years late,

under each misfire policy (``run_all`` keeps the last 100), best of ``--repeat`` runs, and
prints the missed count each plan reports.

    .venv/bin/python bench/misfire_cost.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime, timedelta

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
    args = parser.parse_args()
    for label, expr, jobs, late in CASES:
        cron = parse_cron(expr, "Europe/Paris")
        due = (NOW - late).replace(second=0)
        for policy in MISFIRE_POLICIES:
            best = float("inf")
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                for _ in range(jobs):
                    plan = plan_misfire(cron, due, NOW, policy, 100)
                best = min(best, time.perf_counter() - t0)
            print(f"{label:40} {policy:9} {best * 1000:10.1f} ms   missed={plan.missed}")


if __name__ == "__main__":
    main()
