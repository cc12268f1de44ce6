"""Real ``celery beat`` and ``celery worker`` processes, as a user runs them: one harness for the
end-to-end tests (tests/fleet.py), the benchmarks (bench/common.py) and the demo command.

Each process runs in a session of its own, so stopping it reaches its pool children and
nothing else; its output goes to a log file that ``wait_for`` reads.
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

import psutil

ROOT = Path(__file__).resolve().parent.parent
CELERY = str(Path(sys.executable).parent / "celery")
SCHEDULER = "schedapp.beat:LeaseScheduler"


def beat_args(schedule_file: Path, scheduler: str = SCHEDULER, loglevel: str = "INFO") -> list[str]:
    """``celery`` arguments of a beat (the ``-s`` file is Celery's own, unused by schedapp's
    scheduler, but each beat needs a private one)."""
    return ["-A", "project", "beat", "-S", scheduler, "-l", loglevel, "-s", str(schedule_file)]


def worker_args(
    name: str,
    *,
    concurrency: int = 2,
    pool: str = "prefork",
    loglevel: str = "INFO",
    heartbeat: int | None = None,
    quiet: bool = True,
    extra: list[str] | None = None,
) -> list[str]:
    """``celery`` arguments of a worker named ``name@<host>``; ``quiet`` leaves gossip and
    mingle out (nothing here needs them, and they slow start-up)."""
    args = ["-A", "project", "worker", "-l", loglevel, "-n", f"{name}@%h"]
    args += ["-P", pool, "-c", str(concurrency)]
    if heartbeat is not None:
        args.append(f"--heartbeat-interval={heartbeat}")
    if quiet:
        args += ["--without-gossip", "--without-mingle"]
    return [*args, *(extra or [])]


class Proc:
    """A subprocess in its own session, its output in ``log_path``."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str],
        log_path: Path,
        *,
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
                cwd=ROOT,
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


def start_beat(
    name: str, env: dict[str, str], logs: Path, scheduler: str = SCHEDULER, **proc: Any
) -> Proc:
    """A real ``celery beat``; its log is ``logs/<name>.log``."""
    argv = [CELERY, *beat_args(logs / f"{name}.schedule", scheduler)]
    return Proc(name, argv, env, logs / f"{name}.log", **proc)


def start_worker(name: str, env: dict[str, str], logs: Path, **options: Any) -> Proc:
    """A real ``celery worker`` named ``name@<host>`` (options: see ``worker_args``)."""
    return Proc(name, [CELERY, *worker_args(name, **options)], env, logs / f"{name}.log")


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
