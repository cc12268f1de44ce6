"""The standard Django + Celery layout: settings come from Django's, under CELERY_*.

The benchmarks' worker hooks (defects, ceilings, timing) are installed by ``bench/worker_app.py``,
a Celery app of the bench's own around this one: nothing here imports ``bench/``.
"""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")

app = Celery("project")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

# End-to-end tests configure what a Celery team would, through the environment of the
# processes they start: a beat_schedule (as CELERY_BEAT_SCHEDULE would), an entry added by
# add_periodic_task, and a before_task_publish receiver adding a tracing header.
if os.environ.get("PROJECT_DEFAULT_QUEUE"):  # a queue of the test's own on a shared broker
    app.conf.task_default_queue = os.environ["PROJECT_DEFAULT_QUEUE"]

if os.environ.get("PROJECT_BEAT_SCHEDULE"):
    import json

    app.conf.beat_schedule = json.loads(os.environ["PROJECT_BEAT_SCHEDULE"])

if os.environ.get("PROJECT_PERIODIC_TASK"):

    @app.on_after_configure.connect
    def _add_periodic(sender: Celery, **_: object) -> None:
        name, task, seconds = os.environ["PROJECT_PERIODIC_TASK"].split(",")
        signature = sender.signature(task, kwargs={"label": name})
        sender.add_periodic_task(float(seconds), signature, name=name)


if os.environ.get("PROJECT_TRACE_HEADER"):
    from celery.signals import before_task_publish

    @before_task_publish.connect(weak=False)
    def _trace(headers: dict | None = None, **_: object) -> None:
        if headers is not None:
            headers["trace_id"] = f"{os.environ['PROJECT_TRACE_HEADER']}-{headers.get('id')}"


# Celery's beat signals, as a project receives them: each receiver notes the signal, its
# sender's class and the process it ran in (one JSON line each, in the file named); with
# PROJECT_BEAT_INIT_RAISES set, the beat_init receiver then raises.
if os.environ.get("PROJECT_BEAT_SIGNALS"):
    from celery.signals import beat_embedded_init, beat_init

    def _note_beat_signal(name: str, sender: object) -> None:
        import json

        line = {"signal": name, "sender": type(sender).__name__, "pid": os.getpid()}
        with open(os.environ["PROJECT_BEAT_SIGNALS"], "a") as notes:
            notes.write(json.dumps({**line, "ppid": os.getppid()}) + "\n")

    @beat_init.connect(weak=False)
    def _beat_init(sender: object = None, **_: object) -> None:
        _note_beat_signal("beat_init", sender)
        if os.environ.get("PROJECT_BEAT_INIT_RAISES"):
            raise RuntimeError("the project's beat_init receiver failed")

    @beat_embedded_init.connect(weak=False)
    def _beat_embedded_init(sender: object = None, **_: object) -> None:
        _note_beat_signal("beat_embedded_init", sender)


# A worker that reads the database as it starts (a project warming a cache in worker_init,
# after Celery's Django fixup closed the connections): its main process holds a connection
# when it forks the embedded beat of `worker -B`.
if os.environ.get("PROJECT_DB_AT_WORKER_INIT"):
    from celery.signals import worker_init

    @worker_init.connect(weak=False)
    def _read_the_database(**_: object) -> None:
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM schedapp_job")
