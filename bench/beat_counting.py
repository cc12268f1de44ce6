"""``celery`` with a count of the SQL statements its Django connections execute.

``python -m bench.beat_counting -A project beat -S ...`` is ``celery -A project beat -S ...``
plus a Django ``execute_wrapper`` installed on every connection as it is created. The counts
(total; by the statement's first keyword; and ``transactions``: statements run outside
``atomic()`` plus commits of atomic blocks) are written to ``$BENCH_STMT_FILE`` five times a
second and at exit, so the benchmark reads the delta over exactly the burst.
``executemany`` counts one statement per parameter set, as the server sees them.
(pg_stat_statements would count them server-side, but it is not installed here.)
Raw psycopg connections (schedapp's LISTEN connection) are not counted: they only LISTEN.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

_counts: dict[str, int] = {"total": 0}
_lock = threading.Lock()


def _kind(sql: str) -> str:
    word = sql.lstrip().split(None, 1)[0].upper() if sql.strip() else "?"
    return word.strip("(")


def _count(execute: Callable[..., Any], sql: str, params: Any, many: bool,
           context: dict[str, Any]) -> Any:
    n = len(params) if many and params is not None else 1
    kind = _kind(sql)
    autocommit = not context["connection"].in_atomic_block
    with _lock:
        _counts["total"] += n
        _counts[kind] = _counts.get(kind, 0) + n
        if autocommit:  # a statement outside atomic() is a transaction of its own
            _counts["transactions"] = _counts.get("transactions", 0) + n
    return execute(sql, params, many, context)


def _on_connection(sender: Any, connection: Any, **_: Any) -> None:
    if _count in connection.execute_wrappers:
        return
    connection.execute_wrappers.append(_count)
    commit = connection.commit

    def counted_commit() -> None:  # the end of an outermost atomic() block
        with _lock:
            _counts["transactions"] = _counts.get("transactions", 0) + 1
        commit()

    connection.commit = counted_commit


def _dump(path: Path) -> None:
    with _lock:
        data = json.dumps(_counts)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(data)
    tmp.replace(path)


def _writer(path: Path) -> None:
    while True:
        _dump(path)
        threading.Event().wait(0.2)


def main() -> None:
    from django.db.backends.signals import connection_created

    connection_created.connect(_on_connection, weak=False)
    out = os.environ.get("BENCH_STMT_FILE")
    if out:
        path = Path(out)
        threading.Thread(target=_writer, args=(path,), daemon=True).start()
        atexit.register(_dump, path)
    from celery.__main__ import main as celery_main

    sys.argv = ["celery", *sys.argv[1:]]
    celery_main()


if __name__ == "__main__":
    main()
