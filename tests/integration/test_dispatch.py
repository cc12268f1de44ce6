"""The Redis fast path stores exactly what kombu would, so stock workers consume it."""

from __future__ import annotations

import base64
import json
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import celery
import pytest
import redis
from celery import Celery
from django.conf import settings
from kombu import Exchange, Producer, Queue

from project.celery import app
from schedapp.dispatch import BEAT_HEADERS, Dispatcher, _redis_channel, resolve_route
from schedapp.lease import ClaimedRun

pytestmark = pytest.mark.usefixtures("broker_url")


def claimed(
    job_id: int = 7,
    token: int = 3,
    queue: str = "",
    task: str = "project.tasks.record",
    message_options: str = "{}",
) -> ClaimedRun:
    return ClaimedRun(
        run_id=11,
        job_id=job_id,
        token=token,
        name="a job",
        task=task,
        args_json='[1, "two"]' if task == "project.tasks.record" else "[]",
        kwargs_json='{"label": "x\\u00e9"}',
        queue=queue,
        scheduled_for=datetime(2030, 1, 1, 12, tzinfo=UTC),
        due_at=datetime(2030, 1, 1, 12, tzinfo=UTC),
        attempt=1,
        lease_seconds=30,
        message_options=message_options,
    )


SEP = "\x06\x16"  # kombu's Redis priority lists: "<queue><sep><step>"


def stored(queue: str = "celery") -> list[dict]:
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    return [json.loads(raw) for raw in client.lrange(queue, 0, -1)]


def test_fast_path_message_matches_kombus_own_publish():
    dispatcher = Dispatcher(app, origin="test")
    run = claimed()
    # Given the same run published by kombu's producer and by the fast path
    with app.producer_or_acquire() as producer:
        assert _redis_channel(producer) is not None
        # the fast path first: it restores the queue binding the flushed test broker lost,
        # which kombu, remembering it declared it, would not (and would drop the message)
        dispatcher._publish_redis(producer, producer.channel, [run])
        dispatcher._publish_one(producer, run)
    slow, fast = stored()  # LPUSH: the newest first
    # Then they are the same message but for kombu's random delivery tag
    for message in (fast, slow):
        message["properties"].pop("delivery_tag")
    assert fast == slow
    body = json.loads(base64.b64decode(fast["body"]))
    assert body[0] == [1, "two"] and body[1] == {"label": "xé"}
    assert fast["headers"]["id"] == "schedapp:7:3"
    assert fast["headers"]["schedapp_token"] == 3


def test_fast_path_message_carries_every_header_celery_sends():
    dispatcher = Dispatcher(app, origin="test")
    result = dispatcher.publish([claimed()])  # declares the queue binding if it is missing
    app.send_task("project.tasks.record", kwargs={"label": "plain"})
    assert result.error is None and len(result.published) == 1
    celerys, ours = stored()
    assert set(celerys["headers"]) <= set(ours["headers"])
    assert set(celerys["properties"]) == set(ours["properties"])
    assert ours["content-type"] == celerys["content-type"] == "application/json"


def test_a_retrys_message_counts_the_occurrences_retries_as_celerys_retry_message_does():
    """``self.request.retries``, which autoretry's ``retry_backoff`` and ``Task.retry``'s
    ``max_retries`` read: 0 for the first attempt, then one more per retry."""
    Dispatcher(app, origin="test").publish([claimed(), replace(claimed(token=4), attempt=3)])
    assert sorted(m["headers"]["retries"] for m in stored()) == [0, 2]


def test_a_job_queue_routes_the_message_to_that_queue():
    Dispatcher(app).publish([claimed(queue="reports")])
    (message,) = stored("reports")
    assert message["properties"]["delivery_info"]["routing_key"] == "reports"
    assert stored("celery") == []


def test_a_flushed_broker_gets_its_queue_binding_back_instead_of_losing_messages():
    dispatcher = Dispatcher(app)
    dispatcher.publish([claimed(1, 1)])
    redis.Redis.from_url(settings.CELERY_BROKER_URL).flushdb()  # bindings gone
    fresh = Dispatcher(app)
    assert fresh.publish([claimed(2, 1)]).error is None
    (message,) = stored()
    assert message["headers"]["id"] == "schedapp:2:1"


def test_publishing_to_an_unreachable_broker_reports_every_run_failed(monkeypatch):
    monkeypatch.delenv("CELERY_BROKER_URL", raising=False)  # Celery prefers it to any config
    broken = app.__class__("broken", broker="redis://127.0.0.1:1/0", set_as_current=False)
    assert broken.conf.broker_url == "redis://127.0.0.1:1/0"
    # No reconnection attempts (kombu's waits between them took 6 s): the report is the test's
    broken.conf.broker_transport_options = {"max_retries": 0}
    result = Dispatcher(broken).publish([claimed(1, 1), claimed(2, 1)])
    assert result.published == []
    assert [r.job_id for r in result.failed] == [1, 2]
    assert result.error is not None


PER_MESSAGE = ("id", "root_id", "origin", "expires")


def test_a_tasks_own_options_are_published_as_apply_async_publishes_them():
    """@shared_task(queue="slowq", priority=7, expires=30, time_limit=60, ...) with a job that
    leaves queue empty: published to "celery" with no priority nor expiry before."""
    Dispatcher(app, origin="test").publish([claimed(task="project.tasks.routed")])
    beats = dict(BEAT_HEADERS)  # as Celery's beat calls apply_async
    app.tasks["project.tasks.routed"].apply_async(kwargs={"label": "x\u00e9"}, headers=beats)
    assert stored("celery") == [] and stored("slowq") == []  # priority 7: its own list
    celerys, ours = stored(f"slowq{SEP}6")
    assert ours["headers"]["timelimit"] == celerys["headers"]["timelimit"] == [60, 50]
    assert ours["headers"]["expires"] and celerys["headers"]["expires"]
    for key in PER_MESSAGE:
        celerys["headers"].pop(key), ours["headers"].pop(key)
    assert {k: v for k, v in ours["headers"].items() if not k.startswith("schedapp")} == (
        celerys["headers"]
    )
    for message in (ours, celerys):
        for key in ("correlation_id", "delivery_tag", "reply_to"):  # reply_to: a caller oid
            message["properties"].pop(key)
    assert ours["properties"] == celerys["properties"]
    assert ours["properties"]["priority"] == 7 and ours["properties"]["expiration"] == "30000"


def test_a_jobs_message_options_override_the_tasks_own():
    options = json.dumps({"queue": "reports", "priority": 3, "headers": {"team": "ops"}})
    Dispatcher(app).publish([claimed(task="project.tasks.routed", message_options=options)])
    (message,) = stored(f"reports{SEP}3")
    assert message["headers"]["team"] == "ops"
    assert message["properties"]["priority"] == 3
    assert message["properties"]["delivery_info"]["routing_key"] == "reports"
    assert message["headers"]["timelimit"] == [60, 50]  # the task's own, not overridden


def test_publish_signals_fire_for_every_dispatch_and_receivers_headers_are_sent():
    from celery.signals import after_task_publish, before_task_publish

    after: list[str] = []

    def add_trace(headers=None, **kwargs):
        headers["trace_id"] = f"t-{headers['id']}"

    def sent(headers=None, **kwargs):
        after.append(headers["id"])

    before_task_publish.connect(add_trace, weak=False)
    after_task_publish.connect(sent, weak=False)
    try:
        Dispatcher(app).publish([claimed(1, 1), claimed(2, 1)])
    finally:
        before_task_publish.disconnect(add_trace)
        after_task_publish.disconnect(sent)
    assert sorted(m["headers"]["trace_id"] for m in stored()) == [
        "t-schedapp:1:1",
        "t-schedapp:2:1",
    ]
    assert sorted(after) == ["schedapp:1:1", "schedapp:2:1"]


def test_a_kombu_whose_redis_internals_changed_gets_the_public_publish_path(monkeypatch):
    from kombu.transport.redis import Channel

    original = Channel.prepare_message

    def changed(self, *args, **kwargs):  # a kombu that stores one more field
        message = original(self, *args, **kwargs)
        message["new-field"] = 1
        return message

    monkeypatch.setattr(Channel, "prepare_message", changed)
    dispatcher = Dispatcher(app)
    calls = []
    monkeypatch.setattr(dispatcher, "_publish_redis", lambda *a: calls.append(a))
    result = dispatcher.publish([claimed(1, 1)])
    assert result.error is None and len(result.published) == 1
    assert calls == [] and dispatcher._fast_ok is False
    (message,) = stored()
    assert message["new-field"] == 1  # kombu itself wrote it


def test_a_kombu_without_a_helper_the_fast_path_uses_gets_the_public_path(monkeypatch):
    from schedapp import dispatch

    # a kombu that renamed one of them (deleting one would break kombu's own path too)
    monkeypatch.setattr(dispatch, "REDIS_INTERNALS", (*dispatch.REDIS_INTERNALS, "_renamed"))
    dispatcher = Dispatcher(app)
    result = dispatcher.publish([claimed(1, 1)])
    assert result.error is None and dispatcher._fast_ok is False
    assert len(stored()) == 1


def test_the_current_kombu_gets_the_fast_path():
    dispatcher = Dispatcher(app)
    assert dispatcher.publish([claimed(1, 1)]).error is None
    assert dispatcher._fast_ok is True


def routed_app(routes: dict) -> Celery:
    """A Celery app of the test's own (its router is cached) with these ``task_routes``."""
    routed = Celery("routed", broker=settings.CELERY_BROKER_URL, set_as_current=False)
    routed.conf.update(task_routes=routes, task_serializer="json")
    return routed


@pytest.mark.parametrize(
    "route",
    [
        {"priority": 7},  # no queue: send_task_message falls back to task_default_queue
        {"routing_key": "rk"},  # the same: '' exchange, the default queue's name as key
        {"exchange": "ex", "routing_key": "rk"},  # as given, no queue
        {"queue": "reports", "priority": 3},
    ],
)
def test_a_task_route_resolves_to_where_send_task_publishes_it(route, monkeypatch):
    routed = routed_app({"project.tasks.record": dict(route)})
    sent: list[dict] = []
    monkeypatch.setattr(Producer, "publish", lambda self, body, **kwargs: sent.append(kwargs))
    routed.send_task("project.tasks.record")
    (celerys,) = sent
    ours = resolve_route(routed, "project.tasks.record", "")
    assert (ours.exchange, ours.routing_key, ours.priority) == (
        celerys["exchange"],
        celerys["routing_key"],
        celerys.get("priority"),
    )
    declared = [q.name for q in celerys["declare"] or ()]
    assert ([ours.queue.name] if ours.queue is not None else []) == declared


def test_a_route_without_a_queue_delivers_to_the_default_queue_as_celery_does():
    """Before, to Redis lists no worker reads: "rk", and "None" (its priority-6 list)."""
    routed = routed_app(
        {"project.tasks.record": {"priority": 7}, "project.tasks.noop": {"routing_key": "rk"}}
    )
    result = Dispatcher(routed).publish([claimed(1, 1), claimed(2, 1, task="project.tasks.noop")])
    assert result.error is None and len(result.published) == 2
    (priority,) = stored(f"celery{SEP}6")
    assert priority["headers"]["id"] == "schedapp:1:1"
    assert priority["properties"]["priority"] == 7
    (keyed,) = stored("celery")
    assert keyed["headers"]["id"] == "schedapp:2:1"
    assert keyed["properties"]["delivery_info"]["routing_key"] == "celery"


def app_routing_to_a_topic_exchange(name: str) -> tuple[Celery, Exchange]:
    """``project.tasks.record`` to the topic exchange ``name`` with key "<name>.daily"; its
    queue ``name`` binds "<name>.#". A name of each test's own: kombu's producer pool, global
    per broker URL, keeps the exchanges and bindings its connection declared across tests."""
    exchange = Exchange(name, type="topic")
    own = routed_app({"project.tasks.record": {"queue": name, "routing_key": f"{name}.daily"}})
    own.conf.task_queues = [Queue(name, exchange, routing_key=f"{name}.#")]
    return own, exchange


def ids(queue: str) -> list[str]:
    return [message["headers"]["id"] for message in stored(queue)]


def test_a_queue_bound_after_a_dispatch_receives_the_next_as_kombus_publish_delivers_it():
    """A new worker's queue bound to the route's exchange: kombu's publish reads the bindings
    at every publish. Before, the fast path kept the queues it had found at its first
    publish on the route until the beat restarted: the new queue got nothing."""
    own, exchange = app_routing_to_a_topic_exchange("late")
    dispatcher = Dispatcher(own)
    assert dispatcher.publish([claimed(1, 1)]).error is None
    assert dispatcher._fast_ok is True
    eu = Queue("late-eu", exchange, routing_key="late.#")
    with own.connection_for_write() as conn:
        eu.bind(conn.default_channel).declare()  # as the worker consuming it declares it
    assert dispatcher.publish([claimed(2, 1), claimed(3, 1)]).error is None
    celerys = own.send_task("project.tasks.record").id
    assert ids("late") == [celerys, "schedapp:3:1", "schedapp:2:1", "schedapp:1:1"]
    assert ids("late-eu") == [celerys, "schedapp:3:1", "schedapp:2:1"]


def test_a_queue_deleted_after_a_dispatch_receives_no_more_as_with_kombus_publish():
    """Deleting a queue removes its binding: kombu's publish no longer delivers to it.
    Before, the fast path went on pushing into the deleted queue's list."""
    own, exchange = app_routing_to_a_topic_exchange("gone")
    dispatcher = Dispatcher(own)
    with own.connection_for_write() as conn:
        eu = Queue("gone-eu", exchange, routing_key="gone.#").bind(conn.default_channel)
        eu.declare()
        assert dispatcher.publish([claimed(1, 1)]).error is None
        assert ids("gone-eu") == ["schedapp:1:1"]
        eu.delete()  # its binding and its list (the connection that declared it knows both)
    assert dispatcher.publish([claimed(2, 1)]).error is None
    celerys = own.send_task("project.tasks.record").id
    assert ids("gone") == [celerys, "schedapp:2:1", "schedapp:1:1"]
    assert ids("gone-eu") == []


def test_a_lost_binding_comes_back_with_its_topic_pattern_not_one_matching_every_key():
    """Bindings lost (a flushed or restarted Redis): the fast path binds the route's queue
    again as kombu's ``queue_bind`` stores a binding, with the topic exchange's pattern.
    Before, it stored an empty pattern, which kombu's topic lookup matches to every key: the
    other tasks' messages to that exchange, kombu's and the fast path's, went into it too."""
    own, exchange = app_routing_to_a_topic_exchange("lost")
    dispatcher = Dispatcher(own)
    assert dispatcher.publish([claimed(1, 1)]).error is None
    redis.Redis.from_url(settings.CELERY_BROKER_URL).flushdb()  # bindings gone
    assert dispatcher.publish([claimed(2, 1)]).error is None  # binds the queue again
    other = Queue("lost-other", exchange, routing_key="lost-other.#")
    with own.connection_for_write() as conn:
        other.bind(conn.default_channel).declare()  # as the worker consuming it declares it
    celerys = own.send_task("project.tasks.record", routing_key="lost-other.x").id
    options = '{"routing_key": "lost-other.x"}'
    assert dispatcher.publish([claimed(3, 1, message_options=options)]).error is None
    assert ids("lost") == ["schedapp:2:1"]
    assert ids("lost-other") == ["schedapp:3:1", celerys]


def test_a_fresh_connection_matches_a_topic_exchange_as_topic_as_kombus_publish_does():
    """A connection that has not declared the route's exchange: kombu's publish declares the
    queue (and so its exchange, its type) before its lookup. Before, the fast path's lookup
    took the exchange for a direct one there: an exact binding matched, so a pattern's
    queue got nothing."""
    exchange = Exchange("fresh", type="topic")
    own = routed_app({"project.tasks.record": {"queue": "fresh", "routing_key": "fresh.daily"}})
    own.conf.task_queues = [
        Queue("fresh", exchange, routing_key="fresh.daily"),
        Queue("fresh-all", exchange, routing_key="fresh.#"),
    ]
    with own.connection_for_write() as conn:  # as the workers consuming them declare them
        for queue in own.conf.task_queues:
            queue.bind(conn.default_channel).declare()
    assert Dispatcher(own).publish([claimed(1, 1)]).error is None
    celerys = own.send_task("project.tasks.record").id
    assert ids("fresh") == [celerys, "schedapp:1:1"]
    assert ids("fresh-all") == [celerys, "schedapp:1:1"]


def test_an_exchange_named_by_a_route_alone_is_matched_as_kombus_publish_matches_it():
    """``task_routes`` naming an exchange and no queue: kombu's publish declares nothing, so
    its lookup takes the exchange for what the connection declared, else direct; the fast
    path invents no type either."""
    own = routed_app({"project.tasks.record": {"exchange": "named", "routing_key": "named.daily"}})
    exchange = Exchange("named", type="topic")
    with own.connection_for_write() as conn:  # as the workers consuming them declare them
        for queue in (
            Queue("named", exchange, routing_key="named.daily"),
            Queue("named-all", exchange, routing_key="named.#"),
        ):
            queue.bind(conn.default_channel).declare()
    assert Dispatcher(own).publish([claimed(1, 1)]).error is None
    celerys = own.send_task("project.tasks.record").id
    assert ids("named") == [celerys, "schedapp:1:1"]
    assert ids("named-all") == []


def app_with_tasks() -> Celery:
    """An app of the test's own with a task that ignores its result and one that does not."""
    own = Celery("own", broker=settings.CELERY_BROKER_URL, set_as_current=False)
    own.conf.task_serializer = "json"

    @own.task(name="project.tasks.quiet", ignore_result=True, shared=False)
    def quiet(label: str = "") -> None: ...

    @own.task(name="project.tasks.loud", shared=False)
    def loud(label: str = "") -> None: ...

    return own


def beat_and_dispatch(own: Celery, task: str) -> tuple[dict, dict]:
    """The message Celery's own beat sends for an entry of ``task`` (Scheduler.apply_async),
    and a dispatch's, as Redis stores them."""
    from celery.beat import ScheduleEntry, Scheduler

    Dispatcher(own, origin="test").publish([claimed(task=task)])
    entry = ScheduleEntry(name="a job", task=task, kwargs={"label": "x\u00e9"}, app=own)
    Scheduler(own, lazy=True).apply_async(entry, advance=False)
    celerys, ours = stored()
    return celerys, ours


@pytest.mark.parametrize(
    ("task", "ignore_result"),
    [
        ("project.tasks.quiet", True),  # @task(ignore_result=True): apply_async's default
        ("project.tasks.loud", False),  # from task_ignore_result, False by default
        ("project.tasks.elsewhere", None),  # not registered here: beat's send_task sends None
    ],
)
def test_a_dispatch_sends_ignore_result_as_celerys_beat_does_for_the_task(task, ignore_result):
    """A False header overrides the task's own ignore_result on the worker: results stored."""
    celerys, ours = beat_and_dispatch(app_with_tasks(), task)
    assert ours["headers"]["ignore_result"] is celerys["headers"]["ignore_result"]
    assert ours["headers"]["ignore_result"] is ignore_result


def test_a_dispatch_carries_every_header_celerys_own_beat_sends():
    """Celery 5.7's beat marks its messages (celery_beat_task); earlier beats do not."""
    celerys, ours = beat_and_dispatch(app_with_tasks(), "project.tasks.quiet")
    assert ("celery_beat_task" in ours["headers"]) is (celery.VERSION >= (5, 7))
    for key in PER_MESSAGE:
        celerys["headers"].pop(key), ours["headers"].pop(key)
    assert {k: v for k, v in ours["headers"].items() if not k.startswith("schedapp")} == (
        celerys["headers"]
    )


def test_a_jobs_own_celery_beat_task_header_does_not_hide_that_beat_sent_it():
    """Celery's beat sets the header over an entry's own headers; so does a dispatch."""
    options = json.dumps({"headers": {"celery_beat_task": False, "team": "ops"}})
    Dispatcher(app).publish([claimed(message_options=options)])
    (message,) = stored()
    assert message["headers"]["team"] == "ops"
    assert message["headers"].get("celery_beat_task") is (celery.VERSION >= (5, 7))


def test_a_task_routed_to_a_broadcast_queue_is_refused_with_the_reason():
    """Before, on Redis, it was pushed into the fanout queue's list, which workers never read
    (they take fanout messages by pub/sub): every dispatch silently lost."""
    from kombu.common import Broadcast

    routed = routed_app({"project.tasks.record": {"queue": "everyone"}})
    routed.conf.task_queues = [Broadcast("everyone"), routed.amqp.Queues({}).new_missing("celery")]
    with pytest.raises(ValueError, match="broadcast"):
        resolve_route(routed, "project.tasks.record", "")
    result = Dispatcher(routed).publish([claimed(1, 1)])
    assert result.published == []
    ((run, reason),) = result.refused
    assert run.job_id == 1 and "broadcast (fanout) exchange" in reason
    assert "once, on one worker" in reason


def app_compressing(setting: str | None) -> Celery:
    """``app_with_tasks`` with ``task_compression`` set, and a task with its own."""
    own = app_with_tasks()
    own.conf.task_compression = setting

    @own.task(name="project.tasks.packed", compression="bzip2", shared=False)
    def packed(label: str = "") -> None: ...

    return own


def unpacked(message: dict) -> tuple[Any, ...]:
    from kombu.compression import decompress

    body = base64.b64decode(message["body"])
    if "compression" in message["headers"]:
        body = decompress(body, message["headers"]["compression"])
    return json.loads(body)


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize(
    ("setting", "task", "compression"),
    [
        ("gzip", "project.tasks.loud", "application/x-gzip"),  # task_compression
        (None, "project.tasks.packed", "application/x-bz2"),  # @task(compression=...)
        ("gzip", "project.tasks.packed", "application/x-bz2"),  # the task's own first
        (None, "project.tasks.loud", None),
    ],
)
def test_a_dispatch_is_compressed_as_apply_async_compresses_it(setting, task, compression, fast):
    """Before, sent uncompressed whatever task_compression and the task said."""
    own = app_compressing(setting)
    dispatcher = Dispatcher(own, origin="test")
    dispatcher._fast_ok = fast  # False: kombu's public publish, as on RabbitMQ
    dispatcher.publish([claimed(task=task)])
    own.tasks[task].apply_async(kwargs={"label": "x\u00e9"}, headers=dict(BEAT_HEADERS))
    celerys, ours = stored()
    assert ours["headers"].get("compression") == celerys["headers"].get("compression")
    assert ours["headers"].get("compression") == compression
    assert unpacked(ours) == unpacked(celerys)
    assert unpacked(ours)[1] == {"label": "xé"}
    for message in (ours, celerys):
        for key in PER_MESSAGE:
            message["headers"].pop(key)
        for key in ("correlation_id", "delivery_tag", "reply_to"):
            message["properties"].pop(key)
        message.pop("body")
    ours["headers"] = {k: v for k, v in ours["headers"].items() if not k.startswith("schedapp")}
    assert ours == celerys


def sent_events(publish: Any) -> list[dict]:
    """The ``task-sent`` events ``publish()`` puts on the broker, as an event monitor (Flower)
    receives them: Celery's event exchange is Redis pub/sub, on channels of every database."""
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    db = client.connection_pool.connection_kwargs.get("db", 0)
    end = f"/{db}.celeryev/task.end-of-test"
    with client.pubsub() as pubsub:
        pubsub.psubscribe(f"/{db}.celeryev/task.*")  # kombu's keyprefix_fanout
        pubsub.get_message(timeout=1)  # the subscription's confirmation
        publish()
        # Published after publish() returned, so delivered after every event it sent.
        client.publish(end, "")
        events = []
        while (message := pubsub.get_message(timeout=5)) is not None:
            if message["channel"].decode() == end:
                return events
            payload = json.loads(message["data"])
            events.append(json.loads(base64.b64decode(payload["body"])))
    raise AssertionError("the end-of-test marker never arrived")


@pytest.mark.parametrize("fast", [True, False])
def test_a_dispatch_sends_the_task_sent_event_apply_async_sends(fast):
    """With task_send_sent_event; before, none: Flower never saw a dispatch sent."""
    own = app_with_tasks()
    own.conf.task_send_sent_event = True
    dispatcher = Dispatcher(own, origin="test")
    dispatcher._fast_ok = fast  # False: kombu's public publish, as on RabbitMQ
    dispatcher.publish([claimed(1, 1, task="project.tasks.loud")])  # bindings declared

    def both() -> None:
        dispatcher.publish([claimed(task="project.tasks.loud")])
        own.tasks["project.tasks.loud"].apply_async(
            kwargs={"label": "x\u00e9"}, headers=dict(BEAT_HEADERS)
        )

    ours, celerys = sent_events(both)
    assert celerys["type"] == "task-sent"
    assert ours["uuid"] == "schedapp:7:3"
    for event in (ours, celerys):
        for key in ("uuid", "root_id", "timestamp", "clock"):
            event.pop(key)
    assert ours == celerys


@pytest.mark.parametrize("fast", [True, False])
def test_the_task_sent_event_keeps_what_apply_async_built_whatever_receivers_change(fast):
    """Celery builds the event's fields with the message (``as_task_v2``), before
    ``before_task_publish``, and sends it after ``after_task_publish`` and ``task_sent``: a
    receiver that redacts ``argsrepr`` from the message (a scrubber of personal data) leaves
    the event as it was built. Before, a dispatch read the event's fields from the headers
    after the receivers ran, so its event showed the redacted text where Celery's showed the
    arguments (Flower's "args" column)."""
    from celery.signals import after_task_publish, before_task_publish, task_sent

    own = app_with_tasks()
    own.conf.task_send_sent_event = True
    dispatcher = Dispatcher(own, origin="test")
    dispatcher._fast_ok = fast  # False: kombu's public publish, as on RabbitMQ
    dispatcher.publish([claimed(1, 1, task="project.tasks.loud")])  # bindings declared
    seen: list[tuple[str, str]] = []  # (what, task id), in the order it happened

    def redact(headers: dict[str, Any], **kwargs: Any) -> None:
        seen.append(("before_task_publish", headers["id"]))
        headers.update(argsrepr="<redacted>", kwargsrepr="<redacted>", retries=9)

    def after(headers: dict[str, Any], **kwargs: Any) -> None:
        seen.append(("after_task_publish", headers["id"]))

    def deprecated(task_id: str, **kwargs: Any) -> None:
        seen.append(("task_sent", task_id))

    def watch(evd: Any) -> None:
        publish = evd.publish  # the dispatcher's own, which this only watches

        def watched(type: str, fields: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
            seen.append((f"event {type}", fields["uuid"]))
            return publish(type, fields, *args, **kwargs)

        evd.publish = watched

    watch(own.amqp._event_dispatcher)  # what send_task_message publishes events with
    watch(dispatcher._events())

    def both() -> None:
        dispatcher.publish([claimed(task="project.tasks.loud")])
        own.tasks["project.tasks.loud"].apply_async(
            kwargs={"label": "x\u00e9"}, headers=dict(BEAT_HEADERS)
        )

    receivers = [
        (before_task_publish, redact),
        (after_task_publish, after),
        (task_sent, deprecated),
    ]
    for signal, receiver in receivers:
        signal.connect(receiver, weak=False)
    try:
        ours, celerys = sent_events(both)
    finally:
        for signal, receiver in receivers:
            signal.disconnect(receiver)
    celerys_id = celerys["uuid"]
    steps = ["before_task_publish", "after_task_publish", "task_sent", "event task-sent"]
    assert seen == [(step, "schedapp:7:3") for step in steps] + [
        (step, celerys_id) for step in steps
    ]
    assert celerys["args"] == "()" and celerys["kwargs"] == "{'label': 'xé'}"
    for event in (ours, celerys):
        for key in ("uuid", "root_id", "timestamp", "clock"):
            event.pop(key)
    assert ours == celerys
    celery_message, our_message, _ = stored()
    assert our_message["headers"]["argsrepr"] == celery_message["headers"]["argsrepr"]
    assert our_message["headers"]["argsrepr"] == "<redacted>"


def test_task_sent_events_alone_do_not_send_the_publish_signals(monkeypatch):
    """Without receivers the publish signals are skipped (each parses its message's body):
    turning on task-sent events must not bring them back."""
    from schedapp import dispatch

    signalled: list[str] = []
    monkeypatch.setattr(dispatch, "_after_publish", lambda run, *_: signalled.append(run.task_id))
    own = app_with_tasks()
    own.conf.task_send_sent_event = True
    dispatcher = Dispatcher(own, origin="test")
    dispatcher.publish([claimed(1, 1, task="project.tasks.loud")])
    assert signalled == []


def test_no_task_sent_event_without_task_send_sent_event():
    own = app_with_tasks()
    dispatcher = Dispatcher(own, origin="test")
    dispatcher.publish([claimed(1, 1, task="project.tasks.loud")])
    assert sent_events(lambda: dispatcher.publish([claimed(task="project.tasks.loud")])) == []


def test_a_task_sent_event_that_cannot_be_sent_does_not_fail_the_published_runs(monkeypatch):
    from schedapp import dispatch

    warned: list[str] = []
    monkeypatch.setattr(dispatch.log, "warning", lambda msg, *a, **k: warned.append(msg % a))
    own = app_with_tasks()
    own.conf.task_send_sent_event = True
    dispatcher = Dispatcher(own, origin="test")

    def refused(*args: Any, **kwargs: Any) -> None:
        raise ConnectionError("celeryev refused")

    dispatcher._events().publish = refused
    result = dispatcher.publish([claimed(task="project.tasks.loud")])
    assert result.error is None and len(result.published) == 1
    assert len(stored()) == 1
    assert warned == ["task-sent events not sent: celeryev refused"]


@pytest.mark.parametrize(
    ("args_json", "args"),
    [('[1, "two", true, null, {"k": [1.5]}]', [1, "two", True, None, {"k": [1.5]}]), ("[]", [])],
)
def test_argsrepr_and_kwargsrepr_are_the_python_reprs_apply_async_sends(args_json, args):
    """Before, the JSON text (``[1, "two", true, null]``), where Flower and ``celery
    inspect`` show Celery's ``saferepr`` (``[1, 'two', True, None]``; ``()`` for no args)."""
    own = app_with_tasks()
    own.conf.task_send_sent_event = True

    @own.task(name="project.tasks.anything", shared=False)
    def anything(*args: Any, **kwargs: Any) -> None: ...

    run = replace(claimed(task="project.tasks.anything"), args_json=args_json)
    dispatcher = Dispatcher(own, origin="test")
    dispatcher.publish([claimed(1, 1, task="project.tasks.anything")])  # bindings declared

    def both() -> None:
        dispatcher.publish([run])
        anything.apply_async(args, {"label": "x\u00e9"})

    ours_event, celerys_event = sent_events(both)
    celerys, ours, _ = stored()
    for key in ("argsrepr", "kwargsrepr"):
        assert ours["headers"][key] == celerys["headers"][key]
    assert ours["headers"]["kwargsrepr"] == "{'label': 'xé'}"
    assert (ours_event["args"], ours_event["kwargs"]) == (
        celerys_event["args"],
        celerys_event["kwargs"],
    )


def app_with_shadows() -> Celery:
    """``app_with_tasks`` with a task naming itself by its arguments and options, through
    ``@task(shadow_name=...)``, and one through a Task class of its own."""
    from celery import Task

    own = app_with_tasks()

    def by_label(task: Any, args: Any, kwargs: Any, options: Any) -> str:
        return f"report:{kwargs['label']}:{list(args)}:{options}"

    @own.task(name="project.tasks.shadowed", shadow_name=by_label, shared=False)
    def shadowed(*args: Any, **kwargs: Any) -> None: ...

    class Named(Task):
        def shadow_name(self, args: Any, kwargs: Any, options: Any) -> str:
            if kwargs.get("label") == "boom":
                raise KeyError("no name for boom")
            return f"named:{kwargs['label']}"

    @own.task(name="project.tasks.named", base=Named, shared=False)
    def named(*args: Any, **kwargs: Any) -> None: ...

    return own


@pytest.mark.parametrize("task", ["project.tasks.shadowed", "project.tasks.named"])
def test_the_shadow_header_is_the_tasks_shadow_name_as_celerys_beat_sends_it(task):
    """Before, None: workers' logs and monitors showed the task's name, not its shadow."""
    celerys, ours = beat_and_dispatch(app_with_shadows(), task)
    assert ours["headers"]["shadow"] == celerys["headers"]["shadow"]
    assert ours["headers"]["shadow"].startswith(("report:xé:[]:", "named:xé"))


def test_a_run_whose_shadow_name_raises_is_refused_with_the_reason():
    """apply_async would raise: the job is quarantined, and the rest of the batch sent."""
    fine = claimed(1, 1, task="project.tasks.named")
    boom = replace(claimed(2, 1, task="project.tasks.named"), kwargs_json='{"label": "boom"}')
    result = Dispatcher(app_with_shadows()).publish([fine, boom])
    assert result.error is None and result.published == [fine]
    ((run, reason),) = result.refused
    assert run == boom and "shadow_name" in reason and "no name for boom" in reason
    (message,) = stored()
    assert message["headers"]["shadow"] == "named:xé"


@pytest.mark.parametrize("fast", [True, False])
def test_a_tasks_shadow_name_is_asked_once_per_message_as_apply_async_asks_it(fast):
    """It was asked twice (once to refuse a run whose shadow_name raises, once for the
    header): a shadow_name that counts, logs or costs did so twice per dispatch."""
    own = app_with_tasks()
    asked: list[Any] = []

    def counted(task: Any, args: Any, kwargs: Any, options: Any) -> str:
        asked.append(kwargs["label"])
        return f"counted:{kwargs['label']}"

    @own.task(name="project.tasks.counted", shadow_name=counted, shared=False)
    def counted_task(*args: Any, **kwargs: Any) -> None: ...

    dispatcher = Dispatcher(own)
    dispatcher._fast_ok = fast  # False: kombu's public publish, as on RabbitMQ
    runs = [
        claimed(1, 1, task="project.tasks.counted"),
        claimed(2, 1, task="project.tasks.counted"),
    ]
    assert dispatcher.publish(runs).published == runs
    assert asked == ["x\u00e9", "x\u00e9"]
    assert [m["headers"]["shadow"] for m in stored()] == ["counted:x\u00e9"] * 2


@pytest.mark.parametrize("fast", [True, False])
def test_properties_a_before_task_publish_receiver_sets_are_published_as_celerys(fast):
    """Celery publishes the properties its receivers were given as they leave them (on Redis,
    a priority set there picks the priority list). Before, they were dropped."""
    from celery.beat import ScheduleEntry, Scheduler
    from celery.signals import before_task_publish

    def reprioritise(properties: dict[str, Any], **kwargs: Any) -> None:
        properties["priority"] = 3
        properties["expiration"] = 20

    own = app_with_tasks()
    dispatcher = Dispatcher(own, origin="test")
    dispatcher._fast_ok = fast  # False: kombu's public publish, as on RabbitMQ
    entry = ScheduleEntry(name="a job", task="project.tasks.loud", kwargs={"label": "x"}, app=own)
    before_task_publish.connect(reprioritise, weak=False)
    try:
        dispatcher.publish([claimed(task="project.tasks.loud")])
        Scheduler(own, lazy=True).apply_async(entry, advance=False)
    finally:
        before_task_publish.disconnect(reprioritise)
    assert stored() == []
    celerys, ours = stored(f"celery{SEP}3")
    for message in (ours, celerys):
        for key in ("correlation_id", "delivery_tag", "reply_to"):  # reply_to: a caller oid
            message["properties"].pop(key)
    assert ours["properties"] == celerys["properties"]
    assert ours["properties"]["priority"] == 3 and ours["properties"]["expiration"] == "20000"


@pytest.mark.parametrize("fast", [True, False])
def test_the_deprecated_task_sent_signal_is_sent_as_apply_async_sends_it(fast):
    """Celery 5 sends it to its receivers until 6.0 (older monitoring code listens to it);
    before, a dispatch never sent it."""
    from celery.signals import task_sent

    received: list[dict] = []

    def listen(sender=None, **kwargs):
        received.append({"sender": sender, **kwargs})

    own = app_with_tasks()
    dispatcher = Dispatcher(own)
    dispatcher._fast_ok = fast  # False: kombu's public publish, as on RabbitMQ
    task_sent.connect(listen, weak=False)
    try:
        dispatcher.publish([claimed(task="project.tasks.loud")])
        own.tasks["project.tasks.loud"].apply_async(kwargs={"label": "x\u00e9"})
    finally:
        task_sent.disconnect(listen)
    ours, celerys = received
    assert ours.pop("task_id") == "schedapp:7:3"
    celerys.pop("task_id")
    ours.pop("signal"), celerys.pop("signal")
    celerys["args"] = list(celerys["args"])  # JSON has no tuples (docs/semantics.md)
    assert (
        ours
        == celerys
        == {
            "sender": "project.tasks.loud",
            "task": "project.tasks.loud",
            "args": [],
            "kwargs": {"label": "x\u00e9"},
            "eta": None,
            "taskset": None,
        }
    )
