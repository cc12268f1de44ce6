"""The bench's Celery app: the demo project's (``project.celery.app``) with the bench's worker
hooks installed by environment variable, so that ``project/`` never imports ``bench/``.

Workers (and the chaos run's beats) start with ``celery -A bench.worker_app``:

* ``CHAOS_DEFECT=<name>``: a defect of the first worker protocol put back on purpose, the chaos
  check's proof that it catches defects (``bench/defects.py``);
* ``BENCH_CEILING=<name>``: a part of the worker protocol taken out to show what it costs
  (``bench/ceilings.py``, ``bench.overhead --ceilings``);
* ``BENCH_TIMING=<dir>``: each pool slot's cycle, timed (``bench/timing.py``).

Never set outside the chaos runs, the benchmarks and their tests.
"""

from __future__ import annotations

import os

from project.celery import app

__all__ = ["app"]

if os.environ.get("CHAOS_DEFECT"):
    from bench.defects import install

    install(os.environ["CHAOS_DEFECT"])

if os.environ.get("BENCH_CEILING"):
    from bench.ceilings import install as install_ceiling

    install_ceiling(os.environ["BENCH_CEILING"])

if os.environ.get("BENCH_TIMING"):
    from bench.timing import install as install_timing

    install_timing(os.environ["BENCH_TIMING"])
