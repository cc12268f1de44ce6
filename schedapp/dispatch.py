"""Publish claimed runs to Celery, after the claim committed, never before.

Each message is a plain Celery protocol-2 task message that any stock worker consumes; we
build it directly from the claimed row (its args are already JSON text from the database)
instead of going through ``send_task``, whose per-message work (config look-ups, argsrepr,
retry wrappers) costs more than the database and the broker together. The message carries,
in its headers, what the worker needs to fence the run: job, run, token, occurrence, attempt
and idempotency key; its task id is deterministic per claim.
"""

from __future__ import annotations

import base64
import json
import logging
import socket
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from celery import Celery
from kombu import Exchange, Producer, Queue

from .claims import ClaimedRun
from .message import (
    HEADER_ATTEMPT,
    HEADER_JOB,
    HEADER_KEY,
    HEADER_LEASE,
    HEADER_RUN,
    HEADER_SCHEDULE,
    HEADER_SCHEDULED_FOR,
    HEADER_TOKEN,
)
from .validation import task_not_allowed

log = logging.getLogger("schedapp.dispatch")

_EMBED = '{"callbacks": null, "errbacks": null, "chain": null, "chord": null}'


@dataclass
class PublishResult:
    published: list[ClaimedRun] = field(default_factory=list)
    failed: list[ClaimedRun] = field(default_factory=list)  # the broker failed: release them
    error: BaseException | None = None
    # Runs that must not be published, with the reason (task no longer allowed, no route):
    # their jobs are quarantined, not released, or they would come back every tick.
    refused: list[tuple[ClaimedRun, str]] = field(default_factory=list)


@dataclass(frozen=True)
class Route:
    exchange: str
    routing_key: str
    queue: Queue | None


def message_body(run: ClaimedRun) -> bytes:
    """``[args, kwargs, embed]`` as JSON, spliced from the database's own JSON text."""
    return f"[{run.args_json}, {run.kwargs_json}, {_EMBED}]".encode()


def message_headers(run: ClaimedRun, origin: str) -> dict[str, Any]:
    task_id = run.task_id
    return {
        "lang": "py",
        "task": run.task,
        "id": task_id,
        "shadow": None,
        "eta": None,
        "expires": None,
        "group": None,
        "group_index": None,
        "retries": 0,
        "timelimit": [None, None],
        "root_id": task_id,
        "parent_id": None,
        "argsrepr": run.args_json if len(run.args_json) <= 1024 else run.args_json[:1021] + "...",
        "kwargsrepr": (
            run.kwargs_json if len(run.kwargs_json) <= 1024 else run.kwargs_json[:1021] + "..."
        ),
        "origin": origin,
        "ignore_result": False,
        "replaced_task_nesting": 0,
        "stamped_headers": None,
        "stamps": {},
        HEADER_JOB: run.job_id,
        HEADER_RUN: run.run_id,
        HEADER_TOKEN: run.token,
        HEADER_SCHEDULED_FOR: run.scheduled_for.isoformat(),
        HEADER_ATTEMPT: run.attempt,
        HEADER_KEY: run.idempotency_key,
        HEADER_LEASE: run.lease_seconds,
        HEADER_SCHEDULE: run.schedule.encode() if run.schedule else None,
    }


class Dispatcher:
    """Publishes batches of claimed runs through one producer; caches routes and declares."""

    def __init__(self, app: Celery, origin: str | None = None) -> None:
        self.app = app
        self.origin = origin or f"schedapp-beat@{socket.gethostname()}"
        self._routes: dict[tuple[str, str], Route] = {}
        self._declared: set[str] = set()
        self._queues: dict[Route, tuple[str, ...]] = {}

    def route(self, task: str, queue: str) -> Route:
        key = (task, queue)
        route = self._routes.get(key)
        if route is None:
            route = self._routes[key] = self._resolve_route(task, queue)
        return route

    def _resolve_route(self, task: str, queue: str) -> Route:
        options: dict[str, Any] = {"queue": queue} if queue else {}
        routed = self.app.amqp.router.route(options, task)
        q = routed.get("queue")
        if isinstance(q, Queue):
            exchange = q.exchange.name if isinstance(q.exchange, Exchange) else (q.exchange or "")
            return Route(exchange, routed.get("routing_key") or q.routing_key or q.name, q)
        name = q or self.app.conf.task_default_queue
        return Route(name, name, self.app.amqp.queues[name])

    def publish(self, runs: Sequence[ClaimedRun]) -> PublishResult:
        """Publish every run; on a broker error, report the rest as failed (to be released).
        A run whose task is no longer allowed, or which cannot be routed, is refused."""
        result = PublishResult()
        runs = self._admissible(runs, result)
        if not runs:
            return result
        try:
            with self.app.producer_or_acquire() as producer:
                channel = _redis_channel(producer)
                if channel is not None:
                    self._publish_redis(producer, channel, runs)
                    result.published.extend(runs)
                else:
                    self._publish_kombu(producer, runs, result)
        except Exception as exc:  # broker down, connection reset, ...: the lease recovers
            self._declared.clear()  # a restarted broker may have lost its bindings
            self._queues.clear()
            result.error = exc
            done = {r.run_id for r in result.published}
            result.failed = [r for r in runs if r.run_id not in done]
            log.error(
                "publishing %d run(s) failed: %s",
                len(result.failed),
                exc,
                extra={"action": "publish_failed", "count": len(result.failed)},
            )
        return result

    def _admissible(self, runs: Sequence[ClaimedRun], result: PublishResult) -> list[ClaimedRun]:
        """The allowlist may have changed since a job was written; a route may not resolve
        (a custom router raising, a queue name the broker refuses). Checked per run, so one
        job cannot hold back the batch."""
        ok = []
        for run in runs:
            problem = task_not_allowed(run.task)
            if problem is None:
                try:
                    self.route(run.task, run.queue)
                except Exception as exc:
                    problem = f"cannot route task {run.task!r} (queue {run.queue!r}): {exc}"
            if problem is None:
                ok.append(run)
            else:
                result.refused.append((run, problem))
        return ok

    def probe(self) -> bool:
        """Whether the broker answers: one connection attempt, no publish, no claim."""
        try:
            with self.app.connection_for_write() as conn:
                conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0)
                conn.default_channel  # noqa: B018 - opening a channel proves the broker answers
            return True
        except Exception as exc:
            log.warning(
                "broker still unavailable: %s", exc, extra={"action": "broker_probe_failed"}
            )
            return False

    def _publish_redis(self, producer: Producer, channel: Any, runs: Sequence[ClaimedRun]) -> None:
        """The fast path for Redis: the exact message kombu's Redis transport would store,
        built with one ``json.dumps`` per run and pushed in one pipeline round trip. All or
        nothing as far as we know: on an error every run is released (and so fenced)."""
        pipe = channel.client.pipeline(transaction=False)
        for run in runs:
            route = self.route(run.task, run.queue)
            queues = self._queues.get(route) or self._bound_queues(channel, route)
            payload = redis_message(run, route, self.origin)
            for queue in queues:
                pipe.lpush(queue, payload)
        pipe.execute()

    def _bound_queues(self, channel: Any, route: Route) -> tuple[str, ...]:
        """The queue lists a route delivers to, as kombu's exchange lookup finds them.

        An empty lookup means the bindings are gone (a Redis restart without persistence, a
        flushed database): declare the queue again rather than push into nowhere, as kombu's
        own publish silently would.
        """
        queues = tuple(channel._lookup(route.exchange, route.routing_key))
        if not queues and route.queue is not None:
            route.queue.bind(channel).declare()  # kombu may skip this: it remembers the old
            channel._queue_bind(route.exchange, route.routing_key, "", route.queue.name)
            queues = tuple(channel._lookup(route.exchange, route.routing_key))
        if not queues:
            raise LookupError(
                f"no queue is bound to exchange {route.exchange!r} with routing "
                f"key {route.routing_key!r}"
            )
        self._queues[route] = queues
        return queues

    def _publish_kombu(
        self, producer: Producer, runs: Sequence[ClaimedRun], result: PublishResult
    ) -> None:
        """Any other broker: kombu's publish, in a transport batch where kombu offers one."""
        batch = getattr(producer, "batch", None)
        if batch is not None:
            with batch(max_size=len(runs) + 1):
                for run in runs:
                    self._publish_one(producer, run)
            result.published.extend(runs)  # the batch flushed on exit without error
        else:
            for run in runs:
                self._publish_one(producer, run)
                result.published.append(run)

    def _publish_one(self, producer: Producer, run: ClaimedRun) -> None:
        route = self.route(run.task, run.queue)
        declare = None
        if route.queue is not None and route.queue.name not in self._declared:
            declare = [route.queue]
        producer.publish(
            message_body(run),
            exchange=route.exchange,
            routing_key=route.routing_key,
            headers=message_headers(run, self.origin),
            content_type="application/json",
            content_encoding="utf-8",
            correlation_id=run.task_id,
            reply_to="",
            declare=declare,
            retry=False,
        )
        if declare:
            self._declared.add(route.queue.name)  # type: ignore[union-attr]


def redis_message(run: ClaimedRun, route: Route, origin: str) -> str:
    """The JSON kombu's Redis transport stores for a published message (its
    ``prepare_message`` plus ``_inplace_augment_message``): a stock worker cannot tell."""
    return json.dumps(
        {
            "body": base64.b64encode(message_body(run)).decode(),
            "content-encoding": "utf-8",
            "content-type": "application/json",
            "headers": message_headers(run, origin),
            "properties": {
                "correlation_id": run.task_id,
                "reply_to": "",
                "delivery_mode": 2,
                "delivery_info": {"exchange": route.exchange, "routing_key": route.routing_key},
                "priority": 0,
                "body_encoding": "base64",
                "delivery_tag": str(uuid.uuid4()),
            },
        }
    )


def _redis_channel(producer: Producer) -> Any:
    """The producer's kombu Redis channel, or None for any other transport."""
    try:
        from kombu.transport.redis import Channel as RedisChannel
    except ImportError:  # redis-py is not installed
        return None
    channel = producer.channel
    return channel if isinstance(channel, RedisChannel) else None
