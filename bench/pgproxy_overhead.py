#!/usr/bin/env python
"""What schedapp.testing.pgproxy costs with no fault armed: N ``SELECT 1`` round trips, direct
and through the proxy (in a thread of this process, and as a separate process).

    python bench/pgproxy_overhead.py --n 10000 --dsn "host=127.0.0.1 port=5432 user=postgres"
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from schedapp.testing.pgproxy import PgProxy, spawn_proxy  # noqa: E402


def timed(dsn: str, n: int, params: bool) -> float:
    """Seconds for ``n`` round trips on one autocommit connection (after a warm-up)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(100):
            conn.execute("SELECT 1")
        started = time.perf_counter()
        if params:
            for i in range(n):
                conn.execute("SELECT %s::int", (i,))
        else:
            for _ in range(n):
                conn.execute("SELECT 1")
        return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dsn", default="host=127.0.0.1 port=5432 user=postgres dbname=postgres")
    args = parser.parse_args()
    info = psycopg.conninfo.conninfo_to_dict(args.dsn)
    upstream = (str(info.get("host") or "127.0.0.1"), int(str(info.get("port") or 5432)))

    def through(host: str, port: int) -> str:
        return psycopg.conninfo.make_conninfo(args.dsn, host=host, port=port)

    with PgProxy(upstream) as proxy, tempfile.TemporaryDirectory() as tmp:
        with spawn_proxy(Path(tmp) / "ctl.sock", upstream) as ctl:
            routes = {
                "direct": args.dsn,
                "proxy (thread)": through(proxy.host, proxy.port),
                "proxy (process)": through(ctl.host, ctl.port),
            }
            for params in (False, True):
                label = "SELECT %s::int (extended)" if params else "SELECT 1 (simple query)"
                print(f"{args.n} x {label}, median of {args.repeat}:")
                for name, dsn in routes.items():
                    runs = [timed(dsn, args.n, params) for _ in range(args.repeat)]
                    best = statistics.median(runs)
                    print(f"  {name:16} {best:6.2f} s  {best / args.n * 1e6:6.0f} us/round trip")


if __name__ == "__main__":
    main()
