"""The measuring process: pops every message off the broker's queue list(s) and timestamps it.

It runs apart from the beats, so "in Redis" is observed from outside, the way a worker would
see it: ``BRPOP`` blocks until a message arrives (no busy polling), then ``RPOP <n>`` drains
whatever else is there in batches. Each batch is stamped with ``time.time()`` when it returns;
messages are parsed only after the run, so the watcher stays cheap while the beats work.

Each message is identified by a *key* to count duplicates: a schedapp message by its job id
(task id ``schedapp:<job>:<token>``, so a job published twice under two claims still counts
twice), any other message by its first positional argument (the baselines' tasks carry a
unique argument each). For schedapp messages the due time (``schedapp_scheduled_for`` header)
is recorded too, to compute each message's fire lag.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import redis


def key_of(message: dict[str, Any]) -> tuple[str, float | None]:
    """(duplicate key, due epoch or None) of one stored kombu message."""
    headers = message.get("headers") or {}
    task_id = str(headers.get("id") or "")
    if task_id.startswith("schedapp:"):
        job = task_id.split(":")[1]
        due = headers.get("schedapp_scheduled_for")
        return f"job:{job}", datetime.fromisoformat(due).timestamp() if due else None
    body = json.loads(base64.b64decode(message["body"]))
    args = body[0] if isinstance(body, list) and body else []
    return f"arg:{args[0] if args else task_id}", None


def watch(url: str, queues: list[str], out: Path, expect: int, deadline: float,
          linger: float) -> None:
    client = redis.Redis.from_url(url)
    batches: list[tuple[float, list[bytes]]] = []
    count = 0
    done_at: float | None = None
    print("ready", flush=True)
    while True:
        now = time.time()
        if now >= deadline or (done_at is not None and now >= done_at + linger):
            break
        wait = min(deadline - now, 0.5 if done_at is None else done_at + linger - now)
        popped = client.brpop(queues, timeout=max(0.01, wait))
        if popped is None:
            continue
        batches.append((time.time(), [popped[1]]))
        count += 1
        for queue in queues:
            while more := client.rpop(queue, 1000):
                batches.append((time.time(), more))
                count += len(more)
        if done_at is None and count >= expect:
            done_at = time.time()  # keep listening a little: late duplicates count too
    _write(out, batches, expect, deadline)


def _write(out: Path, batches: list[tuple[float, list[bytes]]], expect: int,
           deadline: float) -> None:
    arrivals: list[float] = []
    dues: list[float | None] = []
    order: list[str] = []
    keys: dict[str, int] = {}
    for stamp, messages in batches:
        for raw in messages:
            key, due = key_of(json.loads(raw))
            keys[key] = keys.get(key, 0) + 1
            arrivals.append(stamp)
            dues.append(due)
            order.append(key)
    total = len(arrivals)
    result = {
        "expected": expect,
        "received": total,
        "unique": len(keys),
        "duplicates": total - len(keys),
        "first": min(arrivals) if arrivals else None,
        "last": max(arrivals) if arrivals else None,
        "deadline": deadline,
        "arrivals": arrivals,
        "dues": dues,
        "keys": order,
    }
    out.write_text(json.dumps(result))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis", required=True)
    parser.add_argument("--queue", action="append", default=[])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--expect", type=int, required=True)
    parser.add_argument("--deadline", type=float, required=True, help="epoch seconds")
    parser.add_argument("--linger", type=float, default=2.0)
    args = parser.parse_args(argv)
    watch(args.redis, args.queue or ["celery"], args.out, args.expect, args.deadline,
          args.linger)


if __name__ == "__main__":
    sys.exit(main())
