"""Run the burst benchmark, ours and the baselines side by side, and print the table.

    .venv/bin/python -m bench.run --quick        # < 2 minutes: 10,000 jobs, 2 beats;
                                                 # baselines at 1,000 jobs, capped at 30 s
    .venv/bin/python -m bench.run                # the full burst: N = 10,000 and 100,000,
                                                 # 1/2/3 beats, baselines capped at 120 s,
                                                 # end to end with a worker, double firing

Punctuality and scale have their own entry points (``bench.punctuality``, ``bench.scale``).
Results go to ``bench/results/*.json``; the README's tables come from them.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from bench import burst, common, doublefire


def burst_table(runs: list[dict[str, Any]]) -> common.Table:
    """One row per run; baselines get the ratio of our 2-beat rate to theirs."""
    ours2 = {r["n"]: r["jobs_per_s"] for r in runs
             if r["kind"] == "schedapp" and r["beats"] == 2}
    best_ours = max(ours2.values()) if ours2 else float("nan")
    t = common.Table(["scheduler", "jobs", "beats", "seconds to last in Redis", "jobs/s",
                      "ours (2 beats) / this", "duplicates", "commits/job",
                      "statements/job", "beat CPU s", "beat peak RSS MB"])
    for r in runs:
        partial = "" if r["finished"] else f" (partial: {r['published']:,} in the cap)"
        ratio = ""
        if r["kind"] != "schedapp":
            ours = ours2.get(r["n"], best_ours)
            ratio = f"{ours / r['jobs_per_s']:,.0f}x" if r["jobs_per_s"] else "inf"
            if r["n"] not in ours2:
                ratio += " (vs ours at 10,000)"
        t.add(r["kind"], r["n"], r["beats"], f"{common.fmt(r['seconds'])}{partial}",
              r["jobs_per_s"], ratio, r["duplicates"], r["commits_per_job"] or 0.0,
              r["statements_per_job"] or 0.0, " / ".join(f"{c:.2f}" for c in r["cpu_s"]),
              " / ".join(f"{m:.0f}" for m in r["peak_rss_mb"]))
    return t


def e2e_table(runs: list[dict[str, Any]]) -> common.Table:
    t = common.Table(["jobs", "beats", "result backend", "seconds to last execution",
                      "executions/s", "commits/execution (all)", "beat commits/job",
                      "worker commits/execution", "task results stored"])
    for r in runs:
        t.add(r["n"], r["beats"], r["backend"], r["seconds"], r["jobs_per_s"],
              r["commits_per_execution"], r["beat_commits_per_job"],
              r["worker_commits_per_execution"], r["task_results_stored"])
    return t


def quick() -> dict[str, Any]:
    started = time.monotonic()
    burst.setup()
    runs = [burst.run_ours(10_000, 2, cap=60),
            burst.run_dcb(1_000, cap=30),
            burst.run_redbeat(1_000, cap=30)]
    common.drop_db(burst.DB)
    result = {"machine": common.machine(), "runs": runs,
              "wall_s": time.monotonic() - started}
    common.save("burst-quick", result)
    print()
    print(burst_table(runs).markdown())
    print(f"\nquick mode took {result['wall_s']:.0f}s")
    return result


def full(sizes: list[int], beats: list[int], cap: float, baselines: bool, e2e: bool,
         double: bool) -> dict[str, Any]:
    started = time.monotonic()
    burst.setup()
    result: dict[str, Any] = {"machine": common.machine(), "runs": [], "e2e": [],
                              "double_fire": []}

    def keep() -> None:
        common.save("burst", result)

    for n in sizes:
        for b in beats:
            result["runs"].append(burst.run_ours(n, b))
            keep()
        if baselines:
            result["runs"].append(burst.run_dcb(n, cap=cap))
            keep()
            result["runs"].append(burst.run_redbeat(n, cap=cap))
            keep()
    if e2e:
        for backend in ("", "django-db"):
            result["e2e"].append(burst.run_e2e(10_000, beats=2, backend=backend))
            keep()
    if double:
        result["double_fire"] = doublefire.main()
        keep()
    result["wall_s"] = time.monotonic() - started
    keep()
    print()
    print(burst_table(result["runs"]).markdown())
    if result["e2e"]:
        print()
        print(e2e_table(result["e2e"]).markdown())
    if result["double_fire"]:
        print()
        print(doublefire.table(result["double_fire"]).markdown())
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the < 2 minute version")
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--beats", default="1,2,3")
    parser.add_argument("--cap", type=float, default=120.0, help="a baseline's time limit")
    parser.add_argument("--no-baselines", action="store_true")
    parser.add_argument("--no-e2e", action="store_true")
    parser.add_argument("--no-double-fire", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        quick()
        return
    full([int(s) for s in args.sizes.split(",")], [int(b) for b in args.beats.split(",")],
         args.cap, not args.no_baselines, not args.no_e2e, not args.no_double_fire)


if __name__ == "__main__":
    main()
