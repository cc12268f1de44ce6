"""Real ``celery beat`` and ``celery worker`` processes, as a user runs them: one harness for the
end-to-end tests (tests/conftest.py's fleets), the benchmarks (bench/common.py, bench/chaos.py)
and the demo command (project/management/commands/demo.py).

The Celery app (``-A``) and the directory the processes run in are the caller's: the kit knows
no project. Each process runs in a session of its own, so stopping it reaches its pool children
and nothing else; its output goes to a log file that ``wait_for`` reads.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

CELERY = str(Path(sys.executable).parent / "celery")
SCHEDULER = "schedapp.beat:LeaseScheduler"


def beat_args(
    schedule_file: Path, *, app: str, scheduler: str = SCHEDULER, loglevel: str = "INFO"
) -> list[str]:
    """``celery`` arguments of a beat of Celery app ``app`` (the ``-s`` file is Celery's own,
    unused by schedapp's scheduler, but each beat needs a private one)."""
    return ["-A", app, "beat", "-S", scheduler, "-l", loglevel, "-s", str(schedule_file)]


def worker_args(
    name: str,
    *,
    app: str,
    concurrency: int = 2,
    pool: str = "prefork",
    loglevel: str = "INFO",
    heartbeat: int | None = None,
    quiet: bool = True,
    extra: list[str] | None = None,
) -> list[str]:
    """``celery`` arguments of a worker of Celery app ``app`` named ``name@<host>``; ``quiet``
    leaves gossip and mingle out (nothing here needs them, and they slow start-up)."""
    args = ["-A", app, "worker", "-l", loglevel, "-n", f"{name}@%h"]
    args += ["-P", pool, "-c", str(concurrency)]
    if heartbeat is not None:
        args.append(f"--heartbeat-interval={heartbeat}")
    if quiet:
        args += ["--without-gossip", "--without-mingle"]
    return [*args, *(extra or [])]


class Proc:
    """A subprocess in its own session, run in ``cwd``, its output in ``log_path``."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str],
        log_path: Path,
        *,
        cwd: Path,
        append: bool = True,
        stmt_path: Path | None = None,
    ) -> None:
        self.name = name
        self.argv = argv
        self.env = env
        self.log_path = log_path
        self.stmt_path = stmt_path  # bench.beat_counting writes its statement counts there
        self.cpu_mark = 0.0
        with open(log_path, "ab" if append else "wb") as log:  # the child keeps its own fd
            self.popen = subprocess.Popen(
                argv,
                cwd=cwd,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: signals reach pool children
            )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def alive(self) -> bool:
        return self.popen.poll() is None

    def wait_for(self, text: str, timeout: float = 30.0) -> None:
        """Until ``text`` appears in the log; RuntimeError if the process exits first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.log():
                return
            if not self.alive():
                raise RuntimeError(f"{self.name} exited early:\n{self.log()[-4000:]}")
            time.sleep(0.1)
        raise TimeoutError(f"{self.name}: {text!r} not seen in {timeout}s:\n{self.log()[-4000:]}")

    def signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.popen.pid, sig)
        except ProcessLookupError:
            pass

    def signal_main(self, sig: int) -> None:
        """Signal the main process only (e.g. SIGSTOP: pool children keep running)."""
        self.popen.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL the whole process group: main process and pool children, no cleanup."""
        self.signal_group(signal.SIGKILL)
        self.popen.wait(timeout=10)

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM the group (a warm shutdown), SIGKILL it if it has not exited in time."""
        if self.alive():
            self.signal_group(signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()

    # --- what the benchmarks read --------------------------------------------------------

    def cpu_seconds(self) -> float:
        """User + system CPU of the process and its children (a worker's pool)."""
        psutil = _psutil()
        try:
            proc = psutil.Process(self.pid)
            total = sum(proc.cpu_times()[:2])
            for child in proc.children(recursive=True):
                try:
                    total += sum(child.cpu_times()[:2])
                except psutil.NoSuchProcess:
                    pass
            return total
        except psutil.NoSuchProcess:
            return 0.0

    def mark_cpu(self) -> None:
        self.cpu_mark = self.cpu_seconds()

    def memory(self) -> dict[str, float]:
        """Resident set now and its peak since the process started (``VmHWM``), in MB."""
        out = {"rss_mb": 0.0, "peak_rss_mb": 0.0}
        try:
            text = Path(f"/proc/{self.pid}/status").read_text()
        except OSError:
            return out
        for line in text.splitlines():
            if line.startswith("VmRSS:"):
                out["rss_mb"] = int(line.split()[1]) / 1024
            elif line.startswith("VmHWM:"):
                out["peak_rss_mb"] = int(line.split()[1]) / 1024
        return out

    def statements(self) -> dict[str, int]:
        """Statements the process has executed so far, by kind (see ``bench.beat_counting``)."""
        if self.stmt_path is None or not self.stmt_path.exists():
            return {}
        try:
            return json.loads(self.stmt_path.read_text())
        except ValueError:  # caught mid-write: the next read is whole
            time.sleep(0.05)
            return json.loads(self.stmt_path.read_text())


def _psutil() -> Any:
    """psutil, which only the CPU figures need (it is in schedapp's ``test`` and ``bench``
    extras, not in its dependencies)."""
    try:
        import psutil
    except ImportError as exc:
        raise ImportError(
            "schedapp.testing's CPU figures need psutil: pip install 'schedapp[test]'"
        ) from exc
    return psutil


def start_beat(
    name: str,
    env: dict[str, str],
    logs: Path,
    *,
    app: str,
    cwd: Path,
    scheduler: str = SCHEDULER,
    **proc: Any,
) -> Proc:
    """A real ``celery -A <app> beat`` run in ``cwd``; its log is ``logs/<name>.log``."""
    argv = [CELERY, *beat_args(logs / f"{name}.schedule", app=app, scheduler=scheduler)]
    return Proc(name, argv, env, logs / f"{name}.log", cwd=cwd, **proc)


def start_worker(
    name: str, env: dict[str, str], logs: Path, *, app: str, cwd: Path, **options: Any
) -> Proc:
    """A real ``celery -A <app> worker`` named ``name@<host>``, run in ``cwd`` (options: see
    ``worker_args``)."""
    argv = [CELERY, *worker_args(name, app=app, **options)]
    return Proc(name, argv, env, logs / f"{name}.log", cwd=cwd)


def wait_until(
    predicate: Callable[[], Any],
    timeout: float,
    interval: float = 0.2,
    message: str = "condition",
    *,
    raise_on_timeout: bool = True,
) -> Any:
    """Poll ``predicate`` until it returns something true, and return that. At the timeout:
    TimeoutError, or (``raise_on_timeout=False``) its last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            if not raise_on_timeout:
                return value
            raise TimeoutError(f"{message} not reached within {timeout}s (last: {value!r})")
        time.sleep(interval)
