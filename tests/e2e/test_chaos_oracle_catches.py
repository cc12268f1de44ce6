"""The strict chaos check catches a defect put back on purpose.

A worker with Celery's default prefetch holds long one-offs in its buffer for longer than
their lease. With the first protocol's defect (bench/defects.py: runs admitted on receipt,
leases renewed only for requests being executed) a buffered run loses its lease, is
dispatched again, and both copies run: no fault explains that duplicate, so the run fails.
With the protocol as it is, the same run passes. Each run has its own PostgreSQL cluster,
Redis and proxy (bench/chaos.py), so the two run side by side."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.e2e]


def start(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "bench.chaos", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def run_with_and_without(
    defect: str, *args: str, problem: str = "unexplained duplicate"
) -> list[str]:
    """The same chaos run with ``defect`` switched on and without it, side by side: with it
    the run fails, and only on ``problem`` (those PROBLEM lines are returned); without it,
    the same jobs and processes show no duplicate, nothing lost and a complete ledger."""
    with_defect = start(*args, "--defect", defect)
    without = start(*args)
    bad_out, _ = with_defect.communicate(timeout=300)
    good_out, _ = without.communicate(timeout=300)
    assert with_defect.returncode == 1, bad_out
    problems = [line for line in bad_out.splitlines() if line.startswith("PROBLEM:")]
    assert problems, bad_out
    assert all(problem in line for line in problems), problems
    assert without.returncode == 0, good_out
    # duplicates, attributed, unexplained, lost, ledger problems, fates complete, passed
    assert "| 0 | 0 | 0 | 0 | 0 | yes | yes |" in good_out
    return problems


def test_the_oracle_fails_a_run_with_the_prefetch_defect_and_passes_it_without():
    run_with_and_without(
        "unrenewed-reserved", "--profile", "prefetch", "--duration", "15", "--seed", "1"
    )


@pytest.mark.slow
def test_the_oracle_fails_a_run_with_the_broker_outage_defect_and_passes_it_without():
    # Two 20 s jobs (8 s leases) running while Redis is down for 12-16 s: with leases renewed
    # only on Celery's heartbeat (which needs the broker) both run twice, and a broker outage
    # never explains a duplicate.
    problems = run_with_and_without(
        "broker-heartbeat", "--profile", "broker", "--duration", "30", "--seed", "1"
    )
    assert all("broker_outage" in line for line in problems), problems


def test_the_oracle_fails_a_run_whose_ledger_drops_its_overlapped_records():
    # A skip job whose runs outlast its interval: with the ledger's overlapped records
    # dropped (bench/defects.py), the occurrences it skipped have no fate and never ran.
    problems = run_with_and_without(
        "drop-overlapped",
        "--profile",
        "ledger",
        "--duration",
        "30",
        "--seed",
        "1",
        problem="occurrence",
    )
    assert any("no fate recorded" in line for line in problems), problems
    assert any("never executed" in line for line in problems), problems
