"""On RabbitMQ a dispatch is the message Celery's own beat publishes for the same entry.

Each case publishes, over the machine's RabbitMQ, the message ``celery.beat.Scheduler``
sends for an entry (``apply_async``) and schedapp's dispatch of the same task and options
(kombu's public path), into queues of the test's own, then reads both raw off the broker and
compares everything a worker or monitor can see: body, content type and encoding, every
AMQP property, the headers and where the broker delivered it (exchange, routing key).
Only the differences docs/semantics.md documents are normalised away, each named below.
"""

from __future__ import annotations

import json
import uuid
import zlib
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import kombu
import pytest
from celery import Celery
from kombu import Exchange, Queue

from schedapp.dispatch import Dispatcher
from schedapp.testing.fleet import RABBITMQ
from tests.integration.test_dispatch import claimed

KWARGS = {"label": "x\u00e9"}  # claimed()'s kwargs; its args are [] but for tasks.record


class Rabbit:
    """Names of this test's own on the shared RabbitMQ; what it declared is deleted after."""

    def __init__(self) -> None:
        self.suffix = uuid.uuid4().hex[:10]
        self.queues: list[str] = []
        self.exchanges: list[str] = []

    def name(self, prefix: str, exchange: bool = False) -> str:
        name = f"schedapp-{prefix}-{self.suffix}"
        (self.exchanges if exchange else self.queues).append(name)
        return name

    def app(self) -> Celery:
        """An app of the test's own on RabbitMQ: its default queue, and the cases' tasks."""
        own = Celery("amqp", broker=RABBITMQ, set_as_current=False)
        own.conf.task_serializer = "json"
        own.conf.task_default_queue = self.name("default")
        own.conf.broker_pool_limit = None  # no pooled connection outlives the test
        assert own.conf.broker_url == RABBITMQ
        optioned = self.name("optioned")

        @own.task(name="project.tasks.loud", shared=False)
        def loud(label: str = "") -> None: ...

        @own.task(name="project.tasks.quiet", ignore_result=True, shared=False)
        def quiet(label: str = "") -> None: ...

        @own.task(
            name="project.tasks.optioned",
            queue=optioned,
            priority=7,
            expires=30,
            time_limit=60,
            soft_time_limit=50,
            shared=False,
        )
        def optioned_task(label: str = "") -> None: ...

        @own.task(name="project.tasks.packed", compression="bzip2", shared=False)
        def packed(label: str = "") -> None: ...

        return own

    def delete(self) -> None:
        with kombu.Connection(RABBITMQ) as conn:
            channel = conn.default_channel
            for name in self.queues:
                channel.queue_delete(name)
            for name in self.exchanges:
                channel.exchange_delete(name)


@pytest.fixture
def rabbit(monkeypatch: pytest.MonkeyPatch) -> Iterator[Rabbit]:
    monkeypatch.delenv("CELERY_BROKER_URL", raising=False)  # Celery prefers it to any config
    own = Rabbit()
    try:
        yield own
    finally:
        own.delete()


def raw(queue: str) -> list[Any]:
    """Every message in ``queue``, as py-amqp reads it off the broker (no kombu decoding)."""
    messages = []
    with kombu.Connection(RABBITMQ) as conn:
        while (message := conn.default_channel.basic_get(queue, no_ack=True)) is not None:
            messages.append(message)
    return messages


def seen(message: Any) -> dict[str, Any]:
    """What a consumer sees of a message: its properties (headers included), its body
    decompressed and parsed, and where the broker delivered it."""
    properties = dict(message.properties)
    headers = dict(properties.pop("application_headers", None) or {})
    body = message.body
    if headers.get("compression") == "application/x-gzip":
        body = zlib.decompress(body)
    elif headers.get("compression") == "application/x-bz2":
        import bz2

        body = bz2.decompress(body)
    return {
        "properties": properties,
        "headers": headers,
        "body": json.loads(body),
        "exchange": message.delivery_info["exchange"],
        "routing_key": message.delivery_info["routing_key"],
    }


def normalised(message: dict[str, Any]) -> dict[str, Any]:
    """The message without what differs between any two sends of one entry, or by design."""
    headers, properties = message["headers"], message["properties"]
    # A task id per message (schedapp's names the claim, "schedapp:<job>:<token>": docs/
    # index.md); the message's correlation_id and root_id are that id, as Celery sends them.
    assert properties.pop("correlation_id") == headers["id"] == headers.pop("root_id")
    headers.pop("id")
    # The sending process's name (Celery's "gen<pid>@<host>", the beat's node name here).
    headers.pop("origin")
    # Difference 6: reply_to is empty (nobody waits for a dispatch's result), where
    # apply_async puts the caller's oid.
    properties.pop("reply_to", None)
    # schedapp's own headers: what the worker fences the run with (docs/index.md, publish).
    for key in [k for k in headers if k.startswith("schedapp_")]:
        headers.pop(key)
    # ``expires`` is dated at each send: compared to the second by the caller, not here.
    if headers.get("expires") is not None:
        headers["expires"] = datetime.fromisoformat(headers["expires"])
    return message


def beat_and_dispatch(
    own: Celery, task: str, queue: str = "", options: dict[str, Any] | None = None
) -> None:
    """Celery's beat sends its entry for ``task`` (Scheduler.apply_async), then schedapp
    dispatches the job it becomes (its ``queue``, ``options`` as message options)."""
    from celery.beat import ScheduleEntry, Scheduler

    options = dict(options or {})
    entry = ScheduleEntry(
        name="a job",
        task=task,
        kwargs=dict(KWARGS),
        options={**options, "queue": queue} if queue else options,
        app=own,
    )
    Scheduler(own, lazy=True).apply_async(entry, advance=False)
    run = claimed(task=task, queue=queue, message_options=json.dumps(options))
    result = Dispatcher(own, origin="test").publish([run])
    assert result.error is None and result.published == [run], result.refused


def assert_same(queue: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Celery's message and schedapp's, in that order, in ``queue``: equal once normalised."""
    celerys, ours = (normalised(seen(m)) for m in raw(queue))
    assert ours["headers"]["task"] == celerys["headers"]["task"]
    expires = celerys["headers"].pop("expires"), ours["headers"].pop("expires")
    assert (expires[0] is None) is (expires[1] is None)
    if expires[0] is not None:
        assert abs((expires[1] - expires[0]).total_seconds()) < 5
    assert ours == celerys
    return celerys, ours


def send_and_compare(
    own: Celery, task: str, expect: str, queue: str = "", options: dict | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    beat_and_dispatch(own, task, queue, options)
    return assert_same(expect)


def test_the_default_queue(rabbit: Rabbit) -> None:
    own = rabbit.app()
    celerys, _ = send_and_compare(own, "project.tasks.loud", own.conf.task_default_queue)
    assert celerys["exchange"] == "" and celerys["routing_key"] == own.conf.task_default_queue
    assert celerys["body"] == [
        [],
        KWARGS,
        dict.fromkeys(["callbacks", "errbacks", "chain", "chord"]),
    ]


@pytest.mark.parametrize("task", ["project.tasks.quiet", "project.tasks.elsewhere"])
def test_a_task_that_ignores_its_result_and_one_this_app_does_not_know(
    rabbit: Rabbit, task: str
) -> None:
    own = rabbit.app()
    send_and_compare(own, task, own.conf.task_default_queue)


def test_a_tasks_own_queue_priority_expires_and_time_limits(rabbit: Rabbit) -> None:
    own = rabbit.app()
    celerys, _ = send_and_compare(own, "project.tasks.optioned", rabbit.queues[1])
    assert celerys["properties"]["priority"] == 7
    assert celerys["properties"]["expiration"] == "30000"
    assert celerys["headers"]["timelimit"] == [60, 50]


def test_a_jobs_queue_and_message_options_over_the_tasks_own(rabbit: Rabbit) -> None:
    own = rabbit.app()
    queue = rabbit.name("job")
    options = {"priority": 3, "expires": 10, "headers": {"team": "ops"}}
    celerys, _ = send_and_compare(own, "project.tasks.optioned", queue, queue, options)
    assert celerys["properties"]["priority"] == 3
    assert celerys["properties"]["expiration"] == "10000"
    assert celerys["headers"]["team"] == "ops"


def test_a_jobs_queue_for_a_task_without_a_priority(rabbit: Rabbit) -> None:
    """apply_async publishes the task's priority None (no route merged it away): the message
    has no priority property. Before, a dispatch sent priority 0."""
    own = rabbit.app()
    queue = rabbit.name("job")
    celerys, _ = send_and_compare(own, "project.tasks.loud", queue, queue)
    assert "priority" not in celerys["properties"]


def topic(rabbit: Rabbit, own: Celery) -> tuple[str, str]:
    """A topic exchange of the test's own with a queue bound to "<exchange>.#"."""
    exchange = rabbit.name("topic", exchange=True)
    queue = rabbit.name("topic")
    own.conf.task_queues = [
        Queue(own.conf.task_default_queue),
        Queue(queue, Exchange(exchange, type="topic"), routing_key=f"{exchange}.#"),
    ]
    return exchange, queue


def test_a_task_route_to_a_topic_exchange_with_a_routing_key(rabbit: Rabbit) -> None:
    own = rabbit.app()
    exchange, queue = topic(rabbit, own)
    own.conf.task_routes = {
        "project.tasks.loud": {"queue": queue, "routing_key": f"{exchange}.daily"}
    }
    celerys, _ = send_and_compare(own, "project.tasks.loud", queue)
    assert (celerys["exchange"], celerys["routing_key"]) == (exchange, f"{exchange}.daily")


def test_a_jobs_exchange_and_routing_key(rabbit: Rabbit) -> None:
    own = rabbit.app()
    exchange, queue = topic(rabbit, own)
    with own.connection_for_write() as conn:  # as the worker consuming it declares it
        own.amqp.queues[queue].bind(conn.default_channel).declare()
    options = {"exchange": exchange, "routing_key": f"{exchange}.weekly"}
    celerys, _ = send_and_compare(own, "project.tasks.loud", queue, options=options)
    assert (celerys["exchange"], celerys["routing_key"]) == (exchange, f"{exchange}.weekly")


def test_task_default_delivery_mode_transient(rabbit: Rabbit) -> None:
    own = rabbit.app()
    own.conf.task_default_delivery_mode = "transient"
    celerys, _ = send_and_compare(own, "project.tasks.loud", own.conf.task_default_queue)
    assert celerys["properties"]["delivery_mode"] == 1


def test_a_queue_whose_exchange_is_transient(rabbit: Rabbit) -> None:
    own = rabbit.app()
    queue = rabbit.name("transient")
    exchange = Exchange(rabbit.name("transient", exchange=True), delivery_mode="transient")
    own.conf.task_queues = [Queue(own.conf.task_default_queue), Queue(queue, exchange)]
    celerys, _ = send_and_compare(own, "project.tasks.loud", queue, queue)
    assert celerys["properties"]["delivery_mode"] == 1


def test_a_default_topic_exchange_and_routing_key(rabbit: Rabbit) -> None:
    own = rabbit.app()
    own.conf.task_default_exchange = rabbit.name("tasks", exchange=True)
    own.conf.task_default_exchange_type = "topic"
    own.conf.task_default_routing_key = "task.default"
    celerys, _ = send_and_compare(own, "project.tasks.loud", own.conf.task_default_queue)
    assert celerys["exchange"] == own.conf.task_default_exchange
    assert celerys["routing_key"] == "task.default"


@pytest.mark.parametrize(
    ("setting", "task", "compression"),
    [
        ("gzip", "project.tasks.loud", "application/x-gzip"),  # task_compression
        (None, "project.tasks.packed", "application/x-bz2"),  # @task(compression=...)
        ("gzip", "project.tasks.packed", "application/x-bz2"),  # the task's own first
    ],
)
def test_compression(rabbit: Rabbit, setting: str | None, task: str, compression: str) -> None:
    own = rabbit.app()
    own.conf.task_compression = setting
    celerys, _ = send_and_compare(own, task, own.conf.task_default_queue)
    assert celerys["headers"]["compression"] == compression


def test_a_before_task_publish_receiver_adding_a_header(rabbit: Rabbit) -> None:
    from celery.signals import before_task_publish

    def add_trace(headers: dict[str, Any] | None = None, **kwargs: Any) -> None:
        headers["trace"] = "t-1"  # type: ignore[index]

    own = rabbit.app()
    before_task_publish.connect(add_trace, weak=False)
    try:
        celerys, _ = send_and_compare(own, "project.tasks.loud", own.conf.task_default_queue)
    finally:
        before_task_publish.disconnect(add_trace)
    assert celerys["headers"]["trace"] == "t-1"


@pytest.mark.parametrize("queue", ["", "job"])
def test_a_before_task_publish_receiver_sees_and_sets_the_properties_apply_async_publishes(
    rabbit: Rabbit, queue: str
) -> None:
    """Celery publishes the properties its receivers were given, as they left them. Before,
    a receiver saw neither the expiration nor the task publish retry policy, and what it set
    was not sent."""
    from celery.signals import before_task_publish

    given: list[tuple[dict[str, Any], dict[str, Any]]] = []

    def reprioritise(properties: dict[str, Any], retry_policy: dict[str, Any], **_: Any) -> None:
        seen = {k: v for k, v in properties.items() if k not in ("correlation_id", "reply_to")}
        given.append((seen, retry_policy))
        properties["priority"] = 5
        properties["expiration"] = 20

    own = rabbit.app()
    queue = rabbit.name(queue) if queue else rabbit.queues[1]
    before_task_publish.connect(reprioritise, weak=False)
    try:
        celerys, _ = send_and_compare(own, "project.tasks.optioned", queue, queue)
    finally:
        before_task_publish.disconnect(reprioritise)
    celery_given, ours_given = given
    assert ours_given == celery_given
    assert celerys["properties"]["priority"] == 5
    assert celerys["properties"]["expiration"] == "20000"
