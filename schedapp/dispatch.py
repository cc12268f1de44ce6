"""Publish claimed runs to Celery, after the claim committed, never before.

Each message is a plain Celery protocol-2 task message that any stock worker consumes; we
build it directly from the claimed row (its args are already JSON text from the database)
instead of going through ``send_task``, whose per-message work (config look-ups, argsrepr,
retry wrappers) costs more than the database and the broker together. The message carries,
in its headers, what the worker needs to fence the run: job, run, token, occurrence, attempt
and idempotency key; its task id is deterministic per claim.

What a message says is what ``apply_async`` would send for the same task (DESIGN 20): the
task's own options (queue, routing_key, exchange, priority, expires, time limits,
ignore_result, compression), ``task_routes`` and ``task_default_*``, then the job's queue and
message options over them, resolved once per (task, queue, options) and cached; with the header
Celery's own beat adds (``celery_beat_task``, from Celery 5.7). ``before_task_publish`` and
``after_task_publish`` fire for every message when they have receivers (Celery's own check),
and headers a receiver adds are sent. The Redis fast path writes what kombu's Redis transport
would store, through a few of kombu's private helpers: a kombu whose helpers or message
layout changed is detected at the first publish, and kombu's public ``Producer.publish``
takes over.
"""

from __future__ import annotations

import base64
import json
import logging
import socket
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from celery import VERSION as CELERY_VERSION
from celery import Celery, Task, signals
from celery.utils.saferepr import saferepr
from kombu import Exchange, Producer, Queue
from kombu.common import maybe_declare
from kombu.compression import compress

from .celeryapp import task_not_allowed
from .conf import get_settings
from .lease import ClaimedRun
from .message import (
    HEADER_ATTEMPT,
    HEADER_JOB,
    HEADER_KEY,
    HEADER_LEASE,
    HEADER_OWN_LEASE,
    HEADER_RUN,
    HEADER_SCHEDULE,
    HEADER_SCHEDULED_FOR,
    HEADER_TOKEN,
)

log = logging.getLogger("schedapp.dispatch")

_EMBED = '{"callbacks": null, "errbacks": null, "chain": null, "chord": null}'
# The header Celery's beat adds to what it sends, over the entry's own headers
# (Scheduler.apply_async), from Celery 5.7; earlier beats add none, so neither do we there.
BEAT_HEADERS: tuple[tuple[str, Any], ...] = (
    (("celery_beat_task", True),) if CELERY_VERSION >= (5, 7) else ()
)


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
    """How every message of one (task, queue, message options) is published."""

    exchange: str
    routing_key: str
    queue: Queue | None
    priority: int | None = None  # the message's (AMQP, Redis priority lists)
    expires: float | None = None  # seconds after publishing: the ``expires`` header, TTL
    time_limit: float | None = None
    soft_time_limit: float | None = None
    delivery_mode: int = 2
    headers: tuple[tuple[str, Any], ...] = ()  # the job's own (message options)
    # The task's own (apply_async's default); None for a task this app does not know, as
    # send_task sends it. A False header would make the worker store the result regardless.
    ignore_result: bool | None = False
    # kombu's name of the body's compression (``gzip``, ``bzip2``...): the task's own
    # ``compression`` option, else ``task_compression``; None sends the body as it is.
    compression: str | None = None
    repr_levels: int = 3  # task_repr_maxlevels (Celery 5.7; 3 before): argsrepr's depth
    # The task's own ``shadow_name(args, kwargs, options)`` with the job's options, as
    # apply_async calls it; None for a task that defines none (the header is None).
    shadow: Callable[[Any, Any], str | None] | None = None
    # The routed options ``send_task_message`` hands kombu's publish as message properties
    # (apply_async's, None values included): a priority None sends no AMQP priority
    # property, where a priority no option names is kombu's 0.
    properties: tuple[tuple[str, Any], ...] = ()


def publish_properties(run: ClaimedRun, route: Route) -> dict[str, Any]:
    """The properties ``send_task_message`` publishes the message with (kombu's publish
    arguments ``priority`` and ``expiration`` among them), as ``apply_async`` builds them."""
    properties = {"correlation_id": run.task_id, "reply_to": "", **dict(route.properties)}
    if route.priority is not None:
        properties["priority"] = route.priority
    if route.expires is not None:
        properties["expiration"] = route.expires
    return properties


def message_body(run: ClaimedRun) -> bytes:
    """``[args, kwargs, embed]`` as JSON, spliced from the database's own JSON text."""
    return f"[{run.args_json}, {run.kwargs_json}, {_EMBED}]".encode()


REPR_MAXSIZE = 1024  # Celery's AMQP.argsrepr_maxsize and kwargsrepr_maxsize


def json_saferepr(text: str, empty: Any, levels: int = 3) -> str:
    """``argsrepr``/``kwargsrepr`` as ``as_task_v2`` writes them, ``saferepr(args or (),
    1024, maxlevels)``, from the arguments' JSON text.

    Celery's ``saferepr`` costs more than the rest of a message; for the common text it
    equals the builtin ``repr``, which costs a tenth of it: no quote nor backslash in the
    text (so no string needs escaping or another quote), printable, at most ``levels``
    containers (so none is cut), and a result shorter than the limit. Any other text gets
    ``saferepr`` itself."""
    if text == "[]" or text == "{}":  # most jobs': no arguments to parse
        return repr(empty)
    value = json.loads(text) or empty
    fast = repr(value)
    if (
        len(fast) < REPR_MAXSIZE
        and "'" not in text
        and "\\" not in text
        and text.isprintable()
        and (not levels or text.count("[") + text.count("{") <= levels)
    ):
        return fast
    return saferepr(value, REPR_MAXSIZE, maxlevels=levels)


_UNNAMED: Any = object()


def message_headers(
    run: ClaimedRun,
    origin: str,
    route: Route | None = None,
    now: datetime | None = None,
    shadow: str | None = _UNNAMED,
) -> dict[str, Any]:
    """The protocol-2 headers ``apply_async`` would send, plus schedapp's. ``now`` (aware,
    the app's zone) dates an ``expires`` given in seconds, as Celery does; ``shadow`` is the
    task's ``shadow_name`` for this run when the caller already asked it (once per message,
    as ``apply_async`` asks)."""
    task_id = run.task_id
    levels = route.repr_levels if route is not None else 3
    if shadow is _UNNAMED:
        shadow = None
        if route is not None and route.shadow is not None:
            shadow = route.shadow(run.args, run.kwargs)
    expires = None
    if route is not None and route.expires is not None:
        expires = ((now or datetime.now(UTC)) + timedelta(seconds=route.expires)).isoformat()
    headers = {
        "lang": "py",
        "task": run.task,
        "id": task_id,
        "shadow": shadow,
        "eta": None,
        "expires": expires,
        "group": None,
        "group_index": None,
        # The occurrence's retries so far, as Celery counts them in a retry's message: a task's
        # self.request.retries, autoretry's retry_backoff and Task.retry's max_retries read it.
        "retries": run.attempt - 1,
        "timelimit": [route.time_limit, route.soft_time_limit] if route else [None, None],
        "root_id": task_id,
        "parent_id": None,
        "argsrepr": json_saferepr(run.args_json, (), levels),
        "kwargsrepr": json_saferepr(run.kwargs_json, {}, levels),
        "origin": origin,
        "ignore_result": route.ignore_result if route is not None else False,
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
        HEADER_OWN_LEASE: True if run.own_lease else None,
    }
    if route is not None and route.headers:
        headers.update(route.headers)  # apply_async(headers=...) merges them the same way
    headers.update(BEAT_HEADERS)
    return headers


def payload_problem(run: ClaimedRun, limit: int) -> str | None:
    """Why a claimed run's arguments cannot make a message (None: they can), as the API would
    have refused them. Rows written behind the API's back may hold any JSON: args that are
    not an array, kwargs that are not an object, or nesting too deep for Python's parser
    (``json.loads`` raises RecursionError: taken for a broker error, it gave the whole batch
    back, every tick). Cheap for the common text: the first character, and a parse only
    when there are more brackets than the API's depth allows (a deep value the API would
    refuse but a worker can read is still sent: the limit may have been lowered since).
    ``limit`` is ``SCHEDAPP_MAX_PAYLOAD_DEPTH``, read once a batch by the caller."""
    for name, text, opener, shape in (
        ("args", run.args_json, "[", "array"),
        ("kwargs", run.kwargs_json, "{", "object"),
    ):
        if not text.startswith(opener):
            return f"{name} must be a JSON {shape}, got {text[:40]!r}."
        if text.count("[") + text.count("{") <= limit:
            continue
        try:
            json.loads(text)
        except RecursionError:
            return f"{name} is nested too deep for Python to read it."
        except ValueError as exc:
            return f"{name} cannot be read as JSON: {exc}."
    return None


class Dispatcher:
    """Publishes batches of claimed runs through one producer; caches routes and declares."""

    def __init__(self, app: Celery, origin: str | None = None) -> None:
        self.app = app
        self.origin = origin or f"schedapp-beat@{socket.gethostname()}"
        self._routes: dict[tuple[str, str, str], Route] = {}
        self._fast_ok: bool | None = None  # kombu's Redis internals as this module knows them
        self._declared: set[str] = set()
        self._event_dispatcher: Any = None  # the app's, once task_send_sent_event is on
        self._shadow_names: dict[str, str | None] = {}  # this batch's, by task id

    def route(self, task: str, queue: str, options: str = "{}") -> Route:
        """How a message of ``task`` with the job's ``queue`` and message ``options`` (JSON
        text) is published; resolved once per combination."""
        key = (task, queue, options)
        route = self._routes.get(key)
        if route is None:
            if not self._routes:  # a beat imports no task modules: their options are read
                self.app.loader.import_default_modules()
            route = self._routes[key] = resolve_route(self.app, task, queue, options)
        return route

    def publish(
        self, runs: Sequence[ClaimedRun], result: PublishResult | None = None
    ) -> PublishResult:
        """Publish every run; on a broker error, report the rest as failed (to be released).
        A run whose task is no longer allowed, or which cannot be routed, is refused.

        ``result`` (filled and returned) records each run as it reaches the broker, so a
        caller interrupted part-way (SIGTERM, Ctrl-C: a BaseException goes through) knows
        which runs were sent, and gives back only the others."""
        result = result if result is not None else PublishResult()
        runs = self._admissible(runs, result)
        if not runs:
            return result
        try:
            with self.app.producer_or_acquire() as producer:
                channel = _redis_channel(producer)
                if channel is not None and self._fast_ok is None:
                    self._fast_ok = redis_internals_match(channel, self.origin)
                if channel is not None and self._fast_ok:
                    self._publish_redis(producer, channel, runs, result.published)
                else:
                    self._publish_kombu(producer, runs, result)
        except Exception as exc:  # broker down, connection reset, ...: the lease recovers
            self._declared.clear()  # a restarted broker may have lost its bindings
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
        verdicts: dict[str, str | None] = {}  # the allowlist's, once per task name a batch
        depth = get_settings().MAX_PAYLOAD_DEPTH
        self._shadow_names = {}
        for run in runs:
            if run.task not in verdicts:
                verdicts[run.task] = task_not_allowed(run.task)
            problem = verdicts[run.task]
            if problem is None:
                problem = payload_problem(run, depth)
            if problem is None:
                try:
                    route = self.route(run.task, run.queue, run.message_options)
                except Exception as exc:
                    problem = f"cannot route task {run.task!r} (queue {run.queue!r}): {exc}"
                else:  # apply_async would raise, every time: the job cannot be sent
                    problem = self._ask_shadow_name(run, route)
            if problem is None:
                ok.append(run)
            else:
                result.refused.append((run, problem))
        return ok

    def _ask_shadow_name(self, run: ClaimedRun, route: Route) -> str | None:
        """Ask the task's ``shadow_name`` for this run's name, once, as ``apply_async`` asks it
        once per message; the name is kept for the message. Returns why it cannot name the
        run (it raised), or None."""
        if route.shadow is None:
            return None
        try:
            self._shadow_names[run.task_id] = route.shadow(run.args, run.kwargs)
        except Exception as exc:
            return f"the shadow_name of task {run.task!r} raised for this job: {exc!r}"
        return None

    def _shadow_name(self, run: ClaimedRun) -> str | None:
        """The name ``_admissible`` got from the task's ``shadow_name`` for ``run`` (or
        ``_UNNAMED``: the task defines none, or the run did not go through it)."""
        return self._shadow_names.get(run.task_id, _UNNAMED)

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

    def message_expiry(self, job: Any) -> float | None:
        """Seconds a message of ``job`` (a ``Job``) lives once published, its ``expires``;
        None: for ever. The reaper drops an occurrence whose message is past it unstarted."""
        options = json.dumps(job.message_options) if job.message_options else "{}"
        return self.route(job.task, job.queue, options).expires

    def _publish_redis(
        self,
        producer: Producer,
        channel: Any,
        runs: Sequence[ClaimedRun],
        published: list[ClaimedRun] | None = None,
    ) -> None:
        """The fast path for Redis: the exact message kombu's Redis transport would store,
        built with one ``json.dumps`` per run and pushed in one pipeline round trip. All or
        nothing as far as we know: on an error before the push every run is released (and so
        fenced); once it is pushed, every run is in ``published``.

        A route's queues are looked up once per batch, not kept: kombu's own publish reads
        the exchange's bindings at every publish, so a queue bound later (a new worker's)
        gets the next message, and a deleted one no more."""
        pipe = channel.client.pipeline(transaction=False)
        bound: dict[tuple[str, str], tuple[str, ...]] = {}  # this batch's lookups
        signalled = _has_receivers()
        events = self._events()
        sent: list[tuple[ClaimedRun, Route, dict[str, Any]]] = []
        sent_events: list[dict[str, Any]] = []
        for run in runs:
            now = self._now(run)
            route = self.route(run.task, run.queue, run.message_options)
            queues = bound.get((route.exchange, route.routing_key))
            if queues is None:
                queues = bound[(route.exchange, route.routing_key)] = self._bound_queues(
                    channel, route
                )
            headers = message_headers(run, self.origin, route, now, self._shadow_name(run))
            properties = publish_properties(run, route)
            if events is not None:
                sent_events.append(task_sent_fields(headers, route))
            if signalled:
                _before_publish(run, route, headers, properties, self._retry_policy())
                sent.append((run, route, headers))
            payload = redis_message(run, route, self.origin, headers, properties)
            if properties.get("priority"):  # a receiver's, if it set one
                step = channel._get_message_priority(
                    {"properties": {"priority": properties["priority"]}}, reverse=False
                )
                queues = tuple(channel._q_for_pri(q, step) for q in queues)
            for queue in queues:
                pipe.lpush(queue, payload)
        pipe.execute()
        if published is not None:  # on the broker, whatever their signals and events do
            published.extend(runs)
        for run, route, headers in sent:  # not for the events alone: each signal parses
            _after_publish(run, route, headers)  # its message's body
        if events is not None:
            _send_task_sent(events, producer, sent_events)

    def _now(self, run: ClaimedRun) -> datetime:
        """What dates a message's ``expires`` given in seconds: the database's clock (the
        claim's now() and the time since), in the app's zone as ``app.now()`` gives it. The
        beat host's clock, as ``apply_async`` would read it, may be off: an hour behind, every
        message of a job with ``expires`` was already past it when published, and dropped."""
        database_now = run.database_now()
        if database_now is None:
            return self.app.now()
        return database_now.astimezone(self.app.timezone)

    def _retry_policy(self) -> dict[str, Any]:
        """The ``retry_policy`` ``before_task_publish`` gets: ``task_publish_retry_policy``,
        as ``send_task_message`` passes it (a dispatch itself is not retried: the lease
        recovers it)."""
        return dict(self.app.conf.task_publish_retry_policy)

    def _events(self) -> Any:
        """The event dispatcher ``task-sent`` events go through, as ``send_task_message``
        sends them when ``task_send_sent_event`` is on (Flower shows them); else None."""
        if not self.app.conf.task_send_sent_event:
            return None
        if self._event_dispatcher is None:  # Celery's own (amqp._event_dispatcher), which
            # buffers what it cannot publish for ever: we log and drop it instead
            self._event_dispatcher = self.app.events.Dispatcher(
                enabled=False, buffer_while_offline=False
            )
        return self._event_dispatcher

    def _bound_queues(self, channel: Any, route: Route) -> tuple[str, ...]:
        """The queue lists a route delivers to, as kombu's exchange lookup finds them.

        An empty lookup means the bindings are gone (a Redis restart without persistence, a
        flushed database): declare the queue again rather than push into nowhere, as kombu's
        own publish silently would, and bind it to the route's key as kombu's ``queue_bind``
        stores a binding (the exchange type's pattern: a topic exchange's matches that key
        alone).

        The lookup matches by the exchange's type as this connection knows it (direct when it
        declared no such exchange): the route's queue is declared first, as kombu's publish
        declares it (``maybe_declare``: once per connection), which records its exchange's
        type, so a topic exchange is matched as one. An exchange a route names alone is
        declared by neither.
        """
        if route.queue is not None:
            maybe_declare(route.queue, channel)
        queues = tuple(channel._lookup(route.exchange, route.routing_key))
        if not queues and route.queue is not None:
            route.queue.bind(channel).declare()  # kombu may skip this: it remembers the old
            # queue_bind's own storing, without its skip of a binding this connection made
            binding = channel.typeof(route.exchange).prepare_bind(
                route.queue.name, route.exchange, route.routing_key, None
            )
            channel._queue_bind(route.exchange, *binding)
            queues = tuple(channel._lookup(route.exchange, route.routing_key))
        if not queues:
            raise LookupError(
                f"no queue is bound to exchange {route.exchange!r} with routing "
                f"key {route.routing_key!r}"
            )
        return queues

    def _publish_kombu(
        self, producer: Producer, runs: Sequence[ClaimedRun], result: PublishResult
    ) -> None:
        """Any other broker: kombu's publish, in a transport batch where the transport
        batches (kombu 5.7's Redis): nothing is sent unless the whole batch is. Elsewhere
        (RabbitMQ) each message is on the broker as its publish returns, and is recorded as
        published then, so an error or an interruption part-way gives back only the rest."""
        batch = getattr(producer, "batch", None)
        if batch is not None and getattr(producer, "supports_batch_publish", False):
            with batch(max_size=len(runs) + 1):
                for run in runs:
                    self._publish_one(producer, run)
            result.published.extend(runs)  # the batch flushed on exit without error
        else:
            for run in runs:
                self._publish_one(producer, run, result.published)

    def _publish_one(
        self, producer: Producer, run: ClaimedRun, published: list[ClaimedRun] | None = None
    ) -> None:
        """kombu's public path, as Celery's ``send_task_message`` calls it; the run is added
        to ``published`` as soon as kombu has sent its message."""
        route = self.route(run.task, run.queue, run.message_options)
        declare = None
        if route.queue is not None and route.queue.name not in self._declared:
            declare = [route.queue]
        headers = message_headers(run, self.origin, route, self._now(run), self._shadow_name(run))
        properties = publish_properties(run, route)
        events = self._events()
        event = task_sent_fields(headers, route) if events is not None else None
        signalled = _has_receivers()
        if signalled:
            _before_publish(run, route, headers, properties, self._retry_policy())
        producer.publish(
            message_body(run),
            exchange=route.exchange,
            routing_key=route.routing_key,
            headers=headers,
            content_type="application/json",
            content_encoding="utf-8",
            delivery_mode=route.delivery_mode,
            declare=declare,
            compression=route.compression,
            retry=False,
            **properties,
        )
        if published is not None:
            published.append(run)
        if signalled:
            _after_publish(run, route, headers)
        if event is not None:
            _send_task_sent(events, producer, [event])
        if declare:
            self._declared.add(route.queue.name)  # type: ignore[union-attr]


def redis_message(
    run: ClaimedRun,
    route: Route,
    origin: str,
    headers: dict[str, Any] | None = None,
    properties: dict[str, Any] | None = None,
) -> str:
    """The JSON kombu's Redis transport stores for a published message (its
    ``prepare_message`` plus ``_inplace_augment_message``): a stock worker cannot tell.
    A compressed body names its compression in ``headers``, as kombu's ``Producer`` adds it;
    ``properties`` are ``publish_properties``, as ``before_task_publish`` left them."""
    if headers is None:
        headers = message_headers(run, origin, route)
    body = message_body(run)
    if route.compression:
        body, headers["compression"] = compress(body, route.compression)
    properties = dict(properties) if properties is not None else publish_properties(run, route)
    priority = properties.pop("priority", None)
    expiration = properties.pop("expiration", None)
    for argument in PUBLISH_ARGUMENTS:  # kombu's publish takes them; not stored
        properties.pop(argument, None)
    properties["delivery_mode"] = route.delivery_mode
    if expiration is not None:
        properties["expiration"] = str(int(expiration * 1000))
    properties.update(
        delivery_info={"exchange": route.exchange, "routing_key": route.routing_key},
        priority=priority or 0,
        body_encoding="base64",
        delivery_tag=str(uuid.uuid4()),
    )
    return json.dumps(
        {
            "body": base64.b64encode(body).decode(),
            "content-encoding": "utf-8",
            "content-type": "application/json",
            "headers": headers,
            "properties": properties,
        }
    )


# Options ``send_task_message`` takes itself; the other routed options are the message's
# properties. And kombu publish's own arguments, which a transport does not store as such.
SENDER_OPTIONS = frozenset(
    "queue exchange routing_key exchange_type event_dispatcher retry retry_policy serializer "
    "delivery_mode compression declare headers timeout confirm_timeout".split()
)
PUBLISH_ARGUMENTS = ("mandatory", "immediate")

# kombu's Redis helpers the fast path calls (private, or of its virtual transport alone); a
# kombu without one of them, or whose stored message has another layout, gets the public path
# instead.
REDIS_INTERNALS = ("_lookup", "_queue_bind", "_q_for_pri", "_get_message_priority", "typeof")


def redis_internals_match(channel: Any, origin: str = "check") -> bool:
    """Whether this kombu's Redis channel stores messages as ``redis_message`` writes them:
    its helpers exist, and its own ``prepare_message`` + ``_inplace_augment_message`` give a
    message with the same keys for a sample run. Checked once per dispatcher."""
    try:
        missing = [name for name in REDIS_INTERNALS if not callable(getattr(channel, name, None))]
        if missing:
            raise AttributeError(f"missing {missing}")
        run = _SAMPLE_RUN
        route = Route("", "celery", None, priority=5, expires=30.0)
        ours = json.loads(redis_message(run, route, origin))
        properties = {
            "correlation_id": run.task_id,
            "reply_to": "",
            "delivery_mode": 2,
            "expiration": "30000",
        }
        theirs = channel.prepare_message(
            message_body(run), 5, "application/json", "utf-8", ours["headers"], properties
        )
        channel._inplace_augment_message(theirs, "", "celery")
        same = set(ours) == set(theirs) and set(ours["properties"]) == set(theirs["properties"])
        same = same and set(ours["properties"]["delivery_info"]) <= set(
            theirs["properties"]["delivery_info"]
        )
        if not same:
            raise ValueError(f"kombu stores {sorted(theirs)} / {sorted(theirs['properties'])}")
    except Exception as exc:
        log.warning(
            "kombu's Redis transport changed (%s): publishing through kombu's public path",
            exc,
            extra={"action": "fast_path_off"},
        )
        return False
    return True


def resolve_route(app: Celery, task: str, queue: str, options: str = "{}") -> Route:
    """Where and how ``apply_async`` would publish ``task``: the task's own options, the
    job's ``queue`` and message ``options`` (JSON) over them, ``task_routes`` and
    ``task_default_*`` (``Router.route`` and ``send_task_message``'s rules). Resolved without
    the message's args: a router function that routes by argument value sees none."""
    exec_options: dict[str, Any] = {}
    task_obj = app.tasks.get(task)
    if task_obj is not None and hasattr(task_obj, "_get_exec_options"):
        # with their None values, as apply_async routes them: a priority None that no route
        # merges away is published as None (no AMQP priority property)
        exec_options = dict(task_obj._get_exec_options())
    message = json.loads(options) if options and options != "{}" else {}
    shadow = _shadow(task_obj, queue, message)
    headers = message.pop("headers", None) or {}
    if queue:
        exec_options["queue"] = queue
    exec_options.update(message)
    time_limit = exec_options.pop("time_limit", None)
    soft_time_limit = exec_options.pop("soft_time_limit", None)
    expires = exec_options.pop("expires", None)
    routed = app.amqp.router.route(exec_options, task, (), {}, task_obj)
    q = routed.get("queue")
    exchange = routed.get("exchange")
    if q is None and exchange is None:  # a route with neither ({"priority": 7}): as
        q = app.amqp.default_queue  # send_task_message, the default queue
    if isinstance(q, str):
        q = app.amqp.queues[q]
    routing_key = routed.get("routing_key")
    exchange_type = getattr(getattr(q, "exchange", None), "type", None) or "direct"
    if exchange_type == "fanout":
        raise ValueError(
            f"it is routed to the broadcast (fanout) exchange {q.exchange.name!r}, which "
            "would run each occurrence on every worker; schedapp runs each occurrence once, "
            "on one worker (route the task to an ordinary queue)"
        )
    if (not exchange or not routing_key) and exchange_type == "direct":
        exchange, routing_key = "", q.name if q is not None else routing_key
    elif exchange is None:
        exchange = q.exchange.name or app.amqp.default_exchange.name
        routing_key = routing_key or q.routing_key or app.conf.task_default_routing_key
    if isinstance(exchange, Exchange):
        exchange = exchange.name
    mode = routed.get("delivery_mode") or getattr(
        getattr(q, "exchange", None), "delivery_mode", None
    )
    mode = mode or app.conf.task_default_delivery_mode
    if isinstance(expires, datetime):
        expires = (expires - app.now()).total_seconds()
    return Route(
        exchange=exchange or "",
        routing_key=routing_key or "",
        queue=q,
        priority=routed.get("priority"),
        expires=max(float(expires), 0.0) if expires is not None else None,
        time_limit=time_limit,
        soft_time_limit=soft_time_limit,
        delivery_mode=2 if mode in (2, "persistent", None) else 1,
        headers=tuple(headers.items()),
        ignore_result=task_obj.ignore_result if task_obj is not None else None,
        compression=routed.get("compression") or app.conf.task_compression,
        repr_levels=app.conf.get("task_repr_maxlevels", 3),
        shadow=shadow,
        properties=tuple((k, v) for k, v in routed.items() if k not in SENDER_OPTIONS),
    )


def _shadow(
    task: Task | None, queue: str, message: dict[str, Any]
) -> Callable[[Any, Any], str | None] | None:
    """The task's ``shadow_name``, given the options Celery's beat would give
    ``apply_async`` for the job (its queue and message options, and the beat's header);
    None for a task whose class does not define one."""
    if task is None or type(task).shadow_name is Task.shadow_name:
        return None
    given = {"queue": queue, **message} if queue else dict(message)
    headers = {**given.pop("headers", {}), **dict(BEAT_HEADERS)}
    shadow_name = task.shadow_name

    def shadow(args: Any, kwargs: Any) -> str | None:
        options = {**given, "headers": dict(headers)} if headers else dict(given)
        return shadow_name(args, kwargs, options)

    return shadow


def _has_receivers() -> bool:
    """Celery sends the publish signals unconditionally; a send without receivers is a no-op,
    so we skip building its arguments (a parsed body per message) when nobody listens."""
    return bool(
        signals.before_task_publish.receivers
        or signals.after_task_publish.receivers
        or getattr(getattr(signals, "task_sent", None), "receivers", None)
    )


def _signal_body(run: ClaimedRun) -> tuple[Any, ...]:
    return (run.args, run.kwargs, json.loads(_EMBED))


def _before_publish(
    run: ClaimedRun,
    route: Route,
    headers: dict[str, Any],
    properties: dict[str, Any],
    retry_policy: dict[str, Any],
) -> None:
    """``before_task_publish`` as Celery sends it; receivers may add to ``headers`` and
    change ``properties``, which are published as they leave them."""
    if not signals.before_task_publish.receivers:
        return
    signals.before_task_publish.send(
        sender=run.task,
        body=_signal_body(run),
        exchange=route.exchange,
        routing_key=route.routing_key,
        declare=[route.queue] if route.queue is not None else [],
        headers=headers,
        properties=properties,
        retry_policy=retry_policy,
    )


def _after_publish(run: ClaimedRun, route: Route, headers: dict[str, Any]) -> None:
    """``after_task_publish``, then the deprecated ``task_sent`` (Celery 5 still sends it, to
    its receivers only, until 6.0), as ``send_task_message`` sends them."""
    if signals.after_task_publish.receivers:
        signals.after_task_publish.send(
            sender=run.task,
            body=_signal_body(run),
            headers=headers,
            exchange=route.exchange,
            routing_key=route.routing_key,
        )
    if getattr(signals, "task_sent", None) is not None and signals.task_sent.receivers:
        signals.task_sent.send(
            sender=run.task,
            task_id=headers["id"],
            task=run.task,
            args=run.args,
            kwargs=run.kwargs,
            eta=headers["eta"],
            taskset=headers["group"],
        )


def task_sent_fields(headers: dict[str, Any], route: Route) -> dict[str, Any]:
    """The fields of the ``task-sent`` event of a message, as Celery builds them with the
    message (``as_task_v2``, then ``send_task_message`` adds where it goes): taken before
    ``before_task_publish`` runs, so a receiver that changes the message's headers (redacts
    ``argsrepr``) leaves the event as Celery's would be."""
    return {
        "uuid": headers["id"],
        "root_id": headers["root_id"],
        "parent_id": headers["parent_id"],
        "name": headers["task"],
        "args": headers["argsrepr"],
        "kwargs": headers["kwargsrepr"],
        "retries": headers["retries"],
        "eta": headers["eta"],
        "expires": headers["expires"],
        "queue": route.queue.name if route.queue is not None else None,
        "exchange": route.exchange,
        "routing_key": route.routing_key,
    }


def _send_task_sent(events: Any, producer: Producer, sent: Sequence[dict[str, Any]]) -> None:
    """A ``task-sent`` event per published message (``task_sent_fields``), after its publish
    signals, as ``send_task_message`` sends it. The messages are on the broker: an event that
    cannot be published is logged, never a failed run."""
    try:
        for fields in sent:
            events.publish("task-sent", fields, producer, retry=False)
    except Exception as exc:
        log.warning(
            "task-sent events not sent: %s",
            exc,
            extra={"action": "sent_event_failed", "count": len(sent)},
        )


def _redis_channel(producer: Producer) -> Any:
    """The producer's kombu Redis channel, or None for any other transport."""
    try:
        from kombu.transport.redis import Channel as RedisChannel
    except ImportError:  # redis-py is not installed
        return None
    channel = producer.channel
    return channel if isinstance(channel, RedisChannel) else None


_SAMPLE_RUN = ClaimedRun(
    run_id=1,
    job_id=1,
    token=1,
    name="sample",
    task="sample",
    args_json="[]",
    kwargs_json="{}",
    queue="",
    scheduled_for=datetime(2001, 1, 1, tzinfo=UTC),
    due_at=datetime(2001, 1, 1, tzinfo=UTC),
    attempt=1,
    lease_seconds=30,
)
