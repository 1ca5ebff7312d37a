"""A real Spark standalone cluster on loopback for the pipeline tests: one master and one
worker, started with `spark-class` from the pyspark package, on ephemeral ports."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyspark

SPARK_HOME = Path(pyspark.__file__).resolve().parent
SPARK_CLASS = SPARK_HOME / "bin" / "spark-class"
START_SECONDS = 90


def _env() -> dict[str, str]:
    return {**os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1"}


def _wait_for(log: Path, pattern: str, proc: subprocess.Popen[bytes]) -> re.Match[str]:
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        if match := re.search(pattern, log.read_text(errors="replace")):
            return match
        assert proc.poll() is None, f"{log.name}: exited {proc.returncode}\n{log.read_text()}"
        time.sleep(0.1)
    raise AssertionError(f"{log.name}: no {pattern!r} in {START_SECONDS}s\n{log.read_text()}")


def _start(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        # its own process group: the worker's executors go with it
        return subprocess.Popen(
            [str(SPARK_CLASS), *argv],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=_env(),
            start_new_session=True,
        )


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
    master = _start(
        ["org.apache.spark.deploy.master.Master",
         "--host", "127.0.0.1", "--port", "0", "--webui-port", "0"],
        root / "master.log",
    )  # fmt: skip
    procs = [master]
    try:
        url = _wait_for(root / "master.log", r"Starting Spark master at (spark://\S+)", master)[1]
        worker = _start(
            ["org.apache.spark.deploy.worker.Worker",
             "--host", "127.0.0.1", "--port", "0", "--webui-port", "0",
             "--cores", str(cores), "--memory", "2g", "--work-dir", str(root / "work"), url],
            root / "worker.log",
        )  # fmt: skip
        procs.append(worker)
        _wait_for(root / "worker.log", r"Successfully registered with master", worker)
        yield url
    finally:
        for proc in reversed(procs):
            _stop(proc)
