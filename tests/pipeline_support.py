"""A real Spark standalone cluster on loopback for the pipeline tests: one master and one
worker, started with `spark-class` from the pyspark package, on ephemeral ports."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import pyspark

SPARK_HOME = Path(pyspark.__file__).resolve().parent
SPARK_CLASS = SPARK_HOME / "bin" / "spark-class"
START_SECONDS = 90


def _env() -> dict[str, str]:
    return {**os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1"}


class Output:
    """A child's output, read line by line by a thread (a full pipe would stall the child),
    kept, and waited on: `wait_for` returns as soon as a line matches."""

    def __init__(self, proc: subprocess.Popen[bytes], name: str) -> None:
        assert proc.stdout is not None
        self.proc, self.name = proc, name
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._closed = False
        threading.Thread(target=self._read, args=(proc.stdout,), daemon=True).start()

    def _read(self, stream: IO[bytes]) -> None:
        for raw in stream:
            with self._changed:
                self.lines.append(raw.decode(errors="replace"))
                self._changed.notify_all()
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def wait_for(self, pattern: str, timeout: float = START_SECONDS) -> re.Match[str]:
        found: list[re.Match[str]] = []

        def match() -> bool:
            found.extend(m for line in self.lines if (m := re.search(pattern, line)))
            return bool(found) or self._closed

        with self._changed:
            self._changed.wait_for(match, timeout)
        if found:
            return found[0]
        state = "exited" if self._closed else f"no {pattern!r} in {timeout:.0f}s"
        raise AssertionError(f"{self.name}: {state}\n{''.join(self.lines)}")


def _start(argv: list[str], name: str) -> tuple[subprocess.Popen[bytes], Output]:
    # its own process group: the worker's executors go with it
    proc = subprocess.Popen(
        [str(SPARK_CLASS), *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=_env(),
        start_new_session=True,
    )
    return proc, Output(proc, name)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


@contextmanager
def spark_cluster(root: Path, cores: int = 2) -> Iterator[str]:
    """A master and one worker with `cores` cores; yields the master's spark:// URL once
    the worker has registered."""
    root.mkdir(parents=True, exist_ok=True)
    master, master_out = _start(
        ["org.apache.spark.deploy.master.Master",
         "--host", "127.0.0.1", "--port", "0", "--webui-port", "0"],
        "spark master",
    )  # fmt: skip
    procs = [master]
    try:
        url = master_out.wait_for(r"Starting Spark master at (spark://\S+)")[1]
        worker, worker_out = _start(
            ["org.apache.spark.deploy.worker.Worker",
             "--host", "127.0.0.1", "--port", "0", "--webui-port", "0",
             "--cores", str(cores), "--memory", "2g", "--work-dir", str(root / "work"), url],
            "spark worker",
        )  # fmt: skip
        procs.append(worker)
        worker_out.wait_for(r"Successfully registered with master")
        yield url
    finally:
        for proc in reversed(procs):
            _stop(proc)
