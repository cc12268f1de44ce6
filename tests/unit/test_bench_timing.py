"""The slot timing of ``bench.overhead --timing``: what it reads from the pool processes' marks."""

from pathlib import Path

from bench import timing


def _write(path: Path, marks: list[tuple[str, float]]) -> None:
    path.write_text("".join(f"{name} {t:.9f}\n" for name, t in marks))


def test_cycle_parts_per_process_never_across_processes(tmp_path: Path) -> None:
    # process A: two tasks through the door; in the task 1 ms (door 0.8 ms), 2 ms between
    _write(tmp_path / "101.txt", [
        ("prerun", 0.000), ("door", 0.0001), ("door_end", 0.0009), ("postrun", 0.001),
        ("prerun", 0.003), ("door", 0.0031), ("door_end", 0.0039), ("postrun", 0.004),
    ])
    # process B: one task, then one cut off by the process's end (no postrun): not counted
    _write(tmp_path / "102.txt", [
        ("prerun", 0.0005), ("door", 0.0006), ("door_end", 0.0014), ("postrun", 0.0015),
        ("prerun", 0.0100), ("door", 0.0101),
    ])
    summary = timing.summarise(tmp_path)
    assert summary["tasks_per_process"] == [2, 1]
    assert summary["in_task_ms"] == 1.0
    assert summary["door_ms"] == 0.8
    assert summary["between_tasks_ms"] == 2.0  # A's gap only: B had one whole task
    assert "door 0.800" in timing.line(summary)


def test_a_worker_without_the_door_has_no_door_figure(tmp_path: Path) -> None:
    _write(tmp_path / "7.txt", [("prerun", 1.0), ("postrun", 1.00003), ("prerun", 1.0007),
                                ("postrun", 1.00073)])
    summary = timing.summarise(tmp_path)
    assert summary["door_ms"] is None
    assert summary["in_task_ms"] == 0.03
    assert summary["between_tasks_ms"] == 0.67
    assert "door" not in timing.line(summary)
