"""Punctuality: a steady stream of jobs, each due at its own instant; how late is each fire?

``rate * seconds`` one-off jobs are bulk-loaded up front, job ``i`` due at ``t0 + i / rate``
(database clock), while the beats sleep. The watcher pops and timestamps every message as it
lands in Redis; a message's fire lag is its arrival time minus its due time (the
``schedapp_scheduled_for`` header). Both clocks are this host's (PostgreSQL runs here; the
offset between ``clock_timestamp()`` and ``time.time()`` is measured and applied, and is
~0.1 ms). Reported: p50 / p99 / max lag, and how many fired more than 100 ms late.

    .venv/bin/python -m bench.punctuality [--rates 1000,10] [--seconds 60] [--beats 1,2]
"""

from __future__ import annotations

import argparse
import time
from datetime import timedelta
from typing import Any

from bench import burst, common


def run(rate: int, seconds: float, beats: int) -> dict[str, Any]:
    burst.reset()
    n = int(rate * seconds)
    tag = f"punctuality-{rate}-{beats}b"
    logs = common.run_dir(tag)
    env = common.bench_env(burst.DB, burst.REDIS_DB, common.OURS_SETTINGS)
    procs = [common.start_beat(f"beat{i + 1}", common.OURS_SCHEDULER, env, logs)
             for i in range(beats)]
    try:
        for p in procs:
            p.wait_for("schedapp.beat: beat ", timeout=60)
        offset = common.db_clock_offset(burst.DB)
        with common.connect(burst.DB) as conn:
            t0 = common.db_now(conn) + timedelta(seconds=5.0 + n / 25_000)
            common.insert_jobs(conn, 1, n, t0, step=1.0 / rate)
            conn.execute("ANALYZE schedapp_job")
        start = t0.timestamp()
        out = logs / "watcher.json"
        watcher = common.start_watcher(burst.REDIS_DB, out, expect=n,
                                       deadline=start + seconds + 30, linger=1.0)
        common.sleep_until(start - 1.0)
        for p in procs:
            p.mark_cpu()
        commits = common.xact_commits(burst.DB)
        seen = common.watcher_result(watcher, out, timeout=seconds + 60)
        common.settle_stats()
        commits = common.xact_commits(burst.DB) - commits
        cpu = [p.cpu_seconds() - p.cpu_mark for p in procs]
        memory = [p.memory()["peak_rss_mb"] for p in procs]
    finally:
        common.stop_all(procs)
    lags = [(a + offset - d) * 1000 for a, d in zip(seen["arrivals"], seen["dues"], strict=True)
            if d is not None]
    result = {
        "rate": rate, "seconds": seconds, "beats": beats, "jobs": n,
        "published": seen["unique"], "duplicates": seen["duplicates"],
        "lag_ms": {"p50": common.percentile(lags, 50), "p90": common.percentile(lags, 90),
                   "p99": common.percentile(lags, 99), "max": max(lags) if lags else None,
                   "min": min(lags) if lags else None},
        "late_over_100ms": sum(1 for x in lags if x > 100),
        "commits_per_job": commits / max(seen["unique"], 1),
        "beat_cpu_s": cpu, "beat_cpu_share": [c / seconds for c in cpu],
        "peak_rss_mb": memory, "clock_offset_s": offset,
    }
    lag = result["lag_ms"]
    print(f"  {rate}/s x {seconds:.0f}s, {beats} beat(s): published {seen['unique']:,}/{n:,}, "
          f"lag p50 {lag['p50']:.1f} ms, p99 {lag['p99']:.1f} ms, max {lag['max']:.1f} ms, "
          f">100 ms: {result['late_over_100ms']}, duplicates {seen['duplicates']}, commits/job "
          f"{result['commits_per_job']:.3f}, "
          f"beat CPU {[round(c, 1) for c in cpu]} s", flush=True)
    return result


def table(results: list[dict[str, Any]]) -> common.Table:
    t = common.Table(["rate (jobs/s)", "beats", "jobs", "published", "duplicates",
                      "lag p50 ms", "lag p99 ms", "lag max ms", "fired >100 ms late",
                      "beat CPU (share of one core)", "commits/job"])
    for r in results:
        lag = r["lag_ms"]
        t.add(r["rate"], r["beats"], r["jobs"], r["published"], r["duplicates"], lag["p50"],
              lag["p99"], lag["max"], r["late_over_100ms"],
              " / ".join(f"{c:.0%}" for c in r["beat_cpu_share"]),
              r.get("commits_per_job", float("nan")))
    return t


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="1000,10")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--beats", default="1,2")
    parser.add_argument("--no-recreate", action="store_true")
    parser.add_argument("--tag", default="", help="results file suffix (punctuality<tag>)")
    args = parser.parse_args(argv)
    burst.setup(recreate=not args.no_recreate)
    results = []
    for beats in (int(b) for b in args.beats.split(",")):
        for rate in (int(r) for r in args.rates.split(",")):
            results.append(run(rate, args.seconds, beats))
            common.save(f"punctuality{args.tag}",
                        {"machine": common.machine(), "runs": results})
            time.sleep(1.0)
    print(table(results).markdown())
    return results


if __name__ == "__main__":
    main()
