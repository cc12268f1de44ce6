"""Parts of the worker protocol taken out, to show what each costs next to plain Celery
(``bench.overhead --ceilings``; ``BENCH_CEILING=<name>`` in the worker's environment,
installed by ``bench/worker_app.py``).

* ``no-door``: the door admits without asking the database. The bench marks the staged
  runs ``running`` beforehand, so the completion is the real one: what is left is the cost
  of schedapp's messages, hooks and completion write.
* ``round-trip``: the door makes one round trip to PostgreSQL that reads and writes nothing
  (``SELECT 1`` on the pool process's connection) and admits; the runs are marked
  ``running`` beforehand as for ``no-door``. It shows what the mere wait for the database,
  once per execution before the body, costs: the floor of any door that asks the database.
* ``no-writes``: the door as in ``no-door``, and no completion is written: schedapp's messages and
  hooks with no database work at all.

Each is a ceiling, not a mode: without the door a run whose lease was lost would execute
again, and without the completion nothing is recorded. Bench code only: nothing in
``schedapp`` knows about it.
"""

from __future__ import annotations

from bench.defects import at_worker_start

CEILINGS = ("no-door", "round-trip", "no-writes")


def install(name: str) -> None:
    """Replace the worker's door (and for ``no-writes`` its completions) once it starts."""
    if name not in CEILINGS:
        raise ValueError(f"unknown ceiling {name!r}; known: {', '.join(CEILINGS)}")
    at_worker_start(lambda: _take_out(name), "bench.ceiling")


def _take_out(name: str) -> None:
    """Swap the objects on ``schedapp.worker.hooks`` (its documented seam), before the
    worker's own ``worker_init`` gives them the door board."""
    from schedapp.store.base import DoorVerdict
    from schedapp.worker import Completions, Door, Outcome, hooks

    class AdmitAll(Door):
        """The door admits without asking the database; a pool process's successes, with
        no door to carry them, are written by its linger thread."""

        def check(self, *args: object, **kwargs: object) -> DoorVerdict:
            return DoorVerdict.ADMITTED

    class RoundTrip(Door):
        """The door's own path to the database, with no work, and admits."""

        def check(self, *args: object, **kwargs: object) -> DoorVerdict:
            from schedapp.store.postgresql import call_function

            call_function("SELECT 1", [])
            return DoorVerdict.ADMITTED

    class NoWrites(Completions):
        """No outcome is written."""

        def record_many(self, outcomes: list[Outcome]) -> None:
            pass

        def record(self, outcome: Outcome) -> None:
            pass

    if name == "no-writes":
        hooks.completions = NoWrites()  # first: the door is built with it
    hooks.door = (RoundTrip if name == "round-trip" else AdmitAll)(hooks.completions)
