"""Each pool slot's cycle, timed (``bench.overhead --timing``; ``BENCH_TIMING=<dir>`` in the
worker's environment, installed by ``bench/worker_app.py``).

CPU per execution says what each side spends, not what a pool slot waits for, and py-spy's
samples do not tell waiting from working inside a call. With ``-c 2`` and prefetch 1 the
rate is two slots over the length of one slot's cycle, so this times the cycle's parts.
Each pool process notes (``time.perf_counter``) when Celery's tracer starts a task
(``task_prerun``), when schedapp's door starts and returns, and when the tracer is done
(``task_postrun``), and writes them to ``<dir>/<pid>.txt`` as it exits. From those:

* **in the task**: prerun to postrun (the door, the body, the success handed on);
* **door**: the door's call alone (its round trip and commit, the successes it carries);
* **between tasks**: postrun to the same process's next prerun: the result's way back to the
  worker's main process, the acknowledgement, the next message from Redis and its way to
  this process. It is the main process's serial loop as a slot sees it.

A mark costs a list append; nothing is written until the process exits.
"""

from __future__ import annotations

import itertools
import os
import statistics
import time
from pathlib import Path
from typing import Any

from bench.defects import at_worker_start

_marks: list[tuple[str, float]] = []


def install(directory: str) -> None:
    """Note the marks in every pool process; the door's from when the worker starts."""
    from celery import signals

    def mark(name: str) -> Any:
        def receiver(**_: Any) -> None:
            _marks.append((name, time.perf_counter()))

        return receiver

    signals.task_prerun.connect(mark("prerun"), weak=False, dispatch_uid="bench.timing.pre")
    signals.task_postrun.connect(mark("postrun"), weak=False, dispatch_uid="bench.timing.post")

    def dump(**_: Any) -> None:
        with open(Path(directory) / f"{os.getpid()}.txt", "w") as f:
            f.writelines(f"{name} {t:.9f}\n" for name, t in _marks)

    signals.worker_process_shutdown.connect(dump, weak=False, dispatch_uid="bench.timing.dump")
    at_worker_start(_time_the_door, "bench.timing.door")


def _time_the_door() -> None:
    """Replace the worker's door with one that notes when it starts and returns: a subclass
    of the door in place (a ceiling's, when one is installed too), built as it was."""
    from schedapp.worker import hooks

    class TimedDoor(type(hooks.door)):  # type: ignore[misc]
        def admit(self, task: Any, task_id: str) -> None:
            _marks.append(("door", time.perf_counter()))
            try:
                super().admit(task, task_id)
            finally:
                _marks.append(("door_end", time.perf_counter()))

    hooks.door = TimedDoor(hooks.completions)


def summarise(directory: Path) -> dict[str, Any]:
    """Medians (ms) over every task of every pool process, and each process's share."""
    in_task: list[float] = []
    door: list[float] = []
    between: list[float] = []
    tasks: list[int] = []
    for path in sorted(directory.glob("*.txt")):
        runs = _tasks(path)
        tasks.append(len(runs))
        in_task += [r["postrun"] - r["prerun"] for r in runs]
        door += [r["door_end"] - r["door"] for r in runs if "door_end" in r]
        between += [b["prerun"] - a["postrun"] for a, b in itertools.pairwise(runs)]

    def ms(values: list[float]) -> float | None:
        return round(1000 * statistics.median(values), 3) if values else None

    return {"tasks_per_process": sorted(tasks, reverse=True), "in_task_ms": ms(in_task),
            "door_ms": ms(door), "between_tasks_ms": ms(between)}


def _tasks(path: Path) -> list[dict[str, float]]:
    runs: list[dict[str, float]] = []
    for line in path.read_text().splitlines():
        name, t = line.split()
        if name == "prerun":
            runs.append({})
        if runs:
            runs[-1][name] = float(t)
    return [r for r in runs if "prerun" in r and "postrun" in r]


def line(summary: dict[str, Any]) -> str:
    door = summary["door_ms"]
    return (f"slot cycle: in the task {summary['in_task_ms']:.3f} ms"
            + (f" (door {door:.3f})" if door is not None else "")
            + f", between tasks {summary['between_tasks_ms']:.3f} ms, tasks per process "
            + "/".join(str(n) for n in summary["tasks_per_process"]))
