"""schedapp's test kit: what the test suite and the benchmarks both need to run schedapp for
real, as ``django.test`` and ``celery.contrib.testing`` are Django's and Celery's.

* ``processes``: real ``celery beat`` and ``celery worker`` subprocesses (``Proc``,
  ``start_beat``, ``start_worker``, ``wait_until``), for any Celery app (``app="project"`` is
  ``-A project``);
* ``fleet``: a set of those processes on one database and broker, stopped together;
* ``servers``: private PostgreSQL, Redis and PgBouncer servers a test may kill and restart;
* ``pgproxy``: a fault-injecting proxy for PostgreSQL's wire protocol (lost COMMIT replies,
  stalls, cuts), in a thread or in a process of its own (``python -m schedapp.testing.pgproxy``).

It imports schedapp's public modules and nothing of a project: the Celery app to run, the
directory to run it in and the settings module are parameters. Nothing else in schedapp imports
it (``tests/unit/test_layers.py``). ``psutil`` (CPU and memory figures) is imported only when
those are asked for.
"""
