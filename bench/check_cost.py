"""What the job table's CHECK constraints cost the door and the success.

    .venv/bin/python -m bench.check_cost --n 4000 --pairs 2
    .venv/bin/python -m bench.check_cost --overhead --n 3000 --rounds 2 --ceilings --timing

PostgreSQL parses every CHECK constraint of a table again (``stringToNode`` of its stored
expression, then ``ExecPrepareExpr``) each time a statement that writes the table starts
(``ExecRelCheck`` builds them per result relation, per execution), cached plan or not. The
success rewrites its job row in a statement of its own (``schedapp_succeed_run_v5``), so each
execution pays for all of the job table's constraints: 51 of them, about 45 KB of stored
node trees in the form Django writes them (range checks on every integer, timestamp and
interval field, the choices, the schedule's shape), 27 KB since migration 0049 holds 31 of
them in a shorter form of the same rules (``schedapp/sql/checks.sql``). A claim pays once
per batch.

Without ``--overhead``: ``bench.door_cost``'s ``hooks`` and ``sql`` paths on a fresh database,
in turn with the job table's CHECK constraints as migrated (``compact``), with those 31 put
back in Django's form as before 0049 (``django``), and with every one of them dropped
(``none``; bench only: nothing in schedapp drops them), ``--pairs`` times. With
``--overhead``: ``bench.overhead`` (its arguments after ``--overhead``) with them dropped, to
read beside a run of ``bench.overhead`` as it is.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Any

from bench import common, door_cost, overhead

CHECKS = "SELECT conname FROM pg_constraint WHERE contype = 'c' AND conrelid = %s::regclass"


def drop_checks(db: str, table: str = "schedapp_job") -> int:
    """Drop every CHECK constraint of ``table`` in the bench database ``db``; how many."""
    with common.connect(db) as conn:
        names = [row[0] for row in conn.execute(CHECKS, [table]).fetchall()]
        for name in names:
            conn.execute(f'ALTER TABLE {table} DROP CONSTRAINT "{name}"')
    return len(names)


def django_forms(db: str, table: str = "schedapp_job") -> int:
    """Put the constraints migration 0049 shortened back in Django's form, as before it."""
    forms = importlib.import_module("schedapp.migrations.0049_compact_job_checks").DJANGO
    with common.connect(db) as conn:
        for name, condition in forms.items():
            conn.execute(
                f"ALTER TABLE {table} DROP CONSTRAINT {name}, "
                f"ADD CONSTRAINT {name} CHECK ({condition})"
            )
    return len(forms)


ARMS = ("compact", "django", "none")


def _door_and_success(n: int, arm: str) -> dict[str, Any]:
    from django.db import connection

    overhead.setup()
    if arm == "none":
        changed = drop_checks(overhead.DB)
    else:
        changed = django_forms(overhead.DB) if arm == "django" else 0
    with common.connect(overhead.DB) as conn:
        (size,) = conn.execute(
            "SELECT coalesce(sum(length(conbin::text)), 0) FROM pg_constraint "
            "WHERE contype = 'c' AND conrelid = 'schedapp_job'::regclass"
        ).fetchone()
    connection.close()
    results: dict[str, Any] = {"arm": arm, "changed": changed, "check_trees_bytes": size}
    results.update(door_cost.through_hooks(n))
    results.update(door_cost.as_raw_sql(n))
    return results


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if "--overhead" in argv:
        rest = [a for a in argv if a != "--overhead"]
        recreate = common.recreate_db

        def recreate_without_checks(name: str, settings: str = common.BASELINE_SETTINGS) -> None:
            recreate(name, settings)
            print(f"dropped {drop_checks(name)} CHECK constraints of schedapp_job in {name}")

        common.recreate_db = recreate_without_checks  # type: ignore[assignment]
        overhead.main(rest)
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=4000)
    parser.add_argument("--pairs", type=int, default=2, help="rounds of the three arms")
    args = parser.parse_args(argv)
    rounds = []
    for _ in range(args.pairs):
        for arm in ARMS:
            r = _door_and_success(args.n, arm)
            rounds.append(r)
            side = f"{arm} ({r['check_trees_bytes'] / 1000:.1f} KB)"
            print(
                f"{side:18s} "
                + " | ".join(
                    f"{k}: wall {r[k]['wall_ms']:.3f} ms, client CPU {r[k]['client_ms']:.3f} ms, "
                    f"PostgreSQL CPU {r[k]['backend_ms']:.3f} ms"
                    for k in ("hooks", "sql")
                ),
                flush=True,
            )
    common.save("check-cost", {"n": args.n, "machine": common.machine(), "rounds": rounds})


if __name__ == "__main__":
    main()
