"""Run the burst benchmark, ours and the baselines side by side, and print the table.

    .venv/bin/python -m bench.run --quick        # < 2 minutes: 10,000 jobs, 2 beats;
                                                 # baselines at 1,000 jobs, capped at 30 s
    .venv/bin/python -m bench.run                # the full burst: N = 10,000 and 100,000,
                                                 # 1/2/3 beats (3 runs each), baselines
                                                 # capped at 120 s, end to end with a worker,
                                                 # double firing, worker overhead
    .venv/bin/python -m bench.run --sections ours --sizes 100000 --beats 2   # one part again
    .venv/bin/python -m bench.run --sections overhead                # worker vs plain Celery
    .venv/bin/python -m bench.run --report       # the tables from bench/results/*.json
    .venv/bin/python -m bench.run --sections ours --sizes 100000 --beats 2 --calendar
                    # our burst's jobs daily intervals each under a calendar (issue 31);
                    # --interval: the same intervals without it, to compare with

Punctuality and scale have their own entry points (``bench.punctuality``, ``bench.scale``).
Results go to ``bench/results/*.json``; the README's tables come from them.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from bench import burst, common, doublefire, overhead


def _median_runs(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Repeated runs of one configuration, as the run with the median rate (and the range)."""
    groups: dict[tuple[str, int, int], list[dict[str, Any]]] = {}
    for r in runs:
        groups.setdefault((r["kind"], r["n"], r["beats"]), []).append(r)
    out = []
    for group in groups.values():
        ordered = sorted(group, key=lambda r: r["jobs_per_s"])
        median = dict(ordered[len(ordered) // 2])
        median["repeats"] = len(group)
        median["rate_range"] = (ordered[0]["jobs_per_s"], ordered[-1]["jobs_per_s"])
        median["duplicates_all"] = sum(r["duplicates"] for r in group)
        out.append(median)
    return out


def burst_table(runs: list[dict[str, Any]]) -> common.Table:
    """One row per configuration (median of its repeats); baselines get the ratio of our
    2-beat rate to theirs."""
    rows = _median_runs(runs)
    ours2 = {r["n"]: r["jobs_per_s"] for r in rows
             if r["kind"] == "schedapp" and r["beats"] == 2}
    best_ours = max(ours2.values()) if ours2 else float("nan")
    t = common.Table(["scheduler", "jobs", "beats", "runs", "seconds to last in Redis",
                      "jobs/s (median)", "jobs/s range", "ours (2 beats) / this",
                      "duplicates (all runs)", "commits/job", "statements/job",
                      "beat CPU s", "beat peak RSS MB"])
    for r in rows:
        partial = "" if r["finished"] else f" (partial: {r['published']:,} in the cap)"
        ratio = ""
        if r["kind"] != "schedapp":
            ours = ours2.get(r["n"], best_ours)
            ratio = f"{ours / r['jobs_per_s']:,.0f}x" if r["jobs_per_s"] else "inf"
            if r["n"] not in ours2:
                ratio += " (vs ours at 10,000)"
        low, high = r["rate_range"]
        t.add(r["kind"], r["n"], r["beats"], r["repeats"],
              f"{common.fmt(r['seconds'])}{partial}", r["jobs_per_s"],
              f"{common.fmt(low)}-{common.fmt(high)}" if r["repeats"] > 1 else "",
              ratio, r["duplicates_all"], r["commits_per_job"] or 0.0,
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


def full(sections: list[str], sizes: list[int], beats: list[int], repeat: int,
         cap: float, jobs: str = "once", deadlines: bool = False) -> None:
    """Each section saves its own results file, so a section can be run again alone.
    ``jobs``: our burst's jobs (``once``; ``interval`` or ``calendar``, saved apart).
    ``deadlines``: our jobs carry every deadline field (saved as ``burst-ours-deadlines`` and
    ``overhead-deadlines``, beside the runs without)."""
    burst.setup()
    suffix = "-deadlines" if deadlines else ""
    if "ours" in sections:
        runs: list[dict[str, Any]] = []
        name = "burst-ours" if jobs == "once" else f"burst-ours-{jobs}"
        for n in sizes:
            for _ in range(repeat):
                for b in beats:
                    runs.append(burst.run_ours(n, b, jobs=jobs, deadlines=deadlines))
                    common.save(name + suffix, {"machine": common.machine(), "runs": runs})
    if "baselines" in sections:
        runs = []
        for n in sizes:
            runs.append(burst.run_dcb(n, cap=cap))
            common.save("burst-baselines", {"machine": common.machine(), "runs": runs})
            runs.append(burst.run_redbeat(n, cap=cap))
            common.save("burst-baselines", {"machine": common.machine(), "runs": runs})
    if "e2e" in sections:
        e2e = []
        for backend in ("", "django-db"):
            e2e.append(burst.run_e2e(10_000, beats=2, backend=backend))
            common.save("burst-e2e", {"machine": common.machine(), "runs": e2e})
    if "double" in sections:
        common.save("doublefire", {"machine": common.machine(), "runs": doublefire.main()})
    if "overhead" in sections:
        overhead.run(deadlines=deadlines)  # saves bench/results/overhead{suffix}.json
    report()


def _load(name: str) -> list[dict[str, Any]]:
    path = common.RESULTS / f"{name}.json"
    return json.loads(path.read_text())["runs"] if path.exists() else []


def report() -> None:
    """Print the tables from the saved results."""
    runs = _load("burst-ours-round1") + _load("burst-ours") + _load("burst-baselines")
    runs += _load("burst-ours-interval") + _load("burst-ours-calendar")
    if runs:
        print(burst_table(runs).markdown())
    if e2e := _load("burst-e2e"):
        print()
        print(e2e_table(e2e).markdown())
    if double := _load("doublefire"):
        print()
        print(doublefire.table(double).markdown())
    path = common.RESULTS / "overhead.json"
    if path.exists():
        o = json.loads(path.read_text())
        print(f"\noverhead: plain Celery {o['plain_per_s']:,.0f}/s, schedapp "
              f"{o['schedapp_per_s']:,.0f}/s, ratio {o['ratio_median']:.2f} "
              f"({o['rounds']} rounds of {o['n']:,}), "
              f"{o['commits_per_execution']:.2f} commits/execution")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the < 2 minute version")
    parser.add_argument("--sections", default="ours,baselines,e2e,double,overhead",
                        help="any of ours, baselines, e2e, double, overhead")
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--beats", default="1,2,3")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each of our configs")
    parser.add_argument("--cap", type=float, default=120.0, help="a baseline's time limit")
    parser.add_argument("--report", action="store_true", help="only print the saved tables")
    jobs = parser.add_mutually_exclusive_group()
    jobs.add_argument("--calendar", dest="jobs", action="store_const", const="calendar",
                      help="our burst's jobs are daily intervals, each under a calendar")
    jobs.add_argument("--interval", dest="jobs", action="store_const", const="interval",
                      help="our burst's jobs are the same daily intervals, no calendar")
    parser.add_argument("--deadlines", action="store_true",
                        help="our jobs carry every deadline field (ours and overhead sections)")
    args = parser.parse_args(argv)
    if args.quick:
        quick()
    elif args.report:
        report()
    else:
        full(args.sections.split(","), [int(s) for s in args.sizes.split(",")],
             [int(b) for b in args.beats.split(",")], args.repeat, args.cap,
             args.jobs or "once", args.deadlines)


if __name__ == "__main__":
    main()
