"""What publishing like apply_async costs the beat: CPU per message of ``Dispatcher.publish``
(10,000 runs in batches of 500 to Redis, in-process, median of 5), for this checkout's
dispatcher and, given ``--base``, a ``dispatch.py`` of another commit (e.g. extracted with
``git show 17fb2aa:schedapp/dispatch.py > /tmp/dispatch_base.py``).

    CELERY_BROKER_URL=redis://127.0.0.1:6379/11 .venv/bin/python -m bench.publish_cost \\
        --base /tmp/dispatch_base.py

It flushes the Redis database it is given: use one of your own.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from datetime import UTC, datetime
from types import ModuleType
from typing import Any

N = 10_000
BATCH = 500


def _runs() -> list[Any]:
    from schedapp.lease import ClaimedRun

    t = datetime(2030, 1, 1, tzinfo=UTC)
    return [
        ClaimedRun(i, i, 1, f"j{i}", "project.tasks.noop", f"[{i}]", "{}", "", t, t, 1, 30)
        for i in range(N)
    ]


def _load(path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location("schedapp._dispatch_base", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def measure(module: ModuleType, label: str, repeat: int = 5) -> float:
    import redis

    from project.celery import app

    runs = _runs()
    samples = []
    for _ in range(repeat):
        redis.Redis.from_url(os.environ["CELERY_BROKER_URL"]).flushdb()
        dispatcher = module.Dispatcher(app, origin="bench")
        dispatcher.publish(runs[:10])  # routes resolved, bindings declared
        start = time.process_time()
        for i in range(0, N, BATCH):
            assert dispatcher.publish(runs[i : i + BATCH]).error is None
        samples.append(time.process_time() - start)
    cpu = sorted(samples)[len(samples) // 2]
    print(f"{label:55s} {cpu:.3f} CPU s  {N / cpu:>9,.0f} messages per CPU second")
    return cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", help="a dispatch.py to compare with")
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings_test")
    import django

    django.setup()
    from celery.signals import before_task_publish

    from schedapp import dispatch

    base = measure(_load(args.base), "base dispatcher") if args.base else None
    ours = measure(dispatch, "this dispatcher, no publish receivers")

    def receiver(headers: dict[str, Any] | None = None, **_: Any) -> None:
        assert headers is not None
        headers["trace_id"] = "x"

    before_task_publish.connect(receiver, weak=False)
    try:
        traced = measure(dispatch, "this dispatcher, a before_task_publish receiver")
    finally:
        before_task_publish.disconnect(receiver)
    if base:
        print(f"CPU ratio to base: {ours / base:.2f}; with a receiver: {traced / base:.2f}")


if __name__ == "__main__":
    main()
