"""What every pipeline job shares: its inputs checked before Spark starts (the archive
directory, the master URL, times, topic patterns), the SparkSession with Spark's own logs
in a file, and Spark's errors cut down to one line.

Checking first matters: a missing archive makes Spark raise an AnalysisException with a
Java stack trace, and an unreachable `spark://` master makes the driver retry for minutes.
"""

from __future__ import annotations

import os
import re
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# How long the driver waits for a TCP connection to a spark:// master before giving up.
MASTER_PROBE_SECONDS = 5.0

_MASTER = re.compile(
    r"local(\[(\*|[1-9]\d*)(,[1-9]\d*)?\])?"
    r"|local-cluster\[[1-9]\d*,[1-9]\d*,[1-9]\d*\]"
    r"|spark://[^\s/:,]+:\d{1,5}(,[^\s/:,]+:\d{1,5})*"
    r"|yarn|k8s://\S+"
)
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(s|m|h|d)")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}

LOG4J2 = """\
# Spark's own logging while `gateway pipeline` runs: warnings and errors only, to stderr,
# which the pipeline points at its log file.
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = stderr
appender.stderr.type = Console
appender.stderr.name = stderr
appender.stderr.target = SYSTEM_ERR
appender.stderr.layout.type = PatternLayout
appender.stderr.layout.pattern = %d{yyyy-MM-dd HH:mm:ss} %p %c: %m%n%ex
logger.jetty.name = org.sparkproject.jetty
logger.jetty.level = error
"""


class PipelineError(Exception):
    """A job cannot run or failed: the message is the one line the user sees."""


def check_master(url: str) -> str:
    """`url` if Spark would take it as a master URL; for spark:// also that one of its
    masters accepts a TCP connection."""
    if not _MASTER.fullmatch(url):
        raise PipelineError(
            f"--master {url!r}: not a Spark master URL "
            "(local, local[N], local[*], spark://HOST:PORT, yarn, k8s://...)"
        )
    if url.startswith("spark://"):
        errors = []
        for hostport in url.removeprefix("spark://").split(","):
            host, _, port = hostport.rpartition(":")
            try:
                socket.create_connection((host, int(port)), MASTER_PROBE_SECONDS).close()
                return url
            except OSError as exc:
                errors.append(f"{hostport}: {exc.strerror or exc}")
        raise PipelineError(f"--master {url}: cannot reach the Spark master ({'; '.join(errors)})")
    return url


def check_archive(directory: str | Path) -> Path:
    """The archive directory, if it holds at least one finished segment."""
    root = Path(directory)
    if not root.exists():
        raise PipelineError(f"archive {root}: no such directory")
    if not root.is_dir():
        raise PipelineError(f"archive {root}: not a directory")
    for path in root.rglob("*.parquet"):
        if not any(part.startswith((".", "_")) for part in path.relative_to(root).parts):
            return root
    raise PipelineError(f"archive {root}: no finished archive segments (*.parquet) in it")


def parse_time(text: str, *, option: str, now: float | None = None) -> int:
    """ns since the epoch from an ISO 8601 date or time (UTC unless it says otherwise) or a
    duration back from now (`90s`, `15m`, `2h`, `7d`)."""
    value = text.strip()
    if match := _DURATION.fullmatch(value):
        seconds = float(match[1]) * _UNIT_SECONDS[match[2]]
        base = datetime.now(UTC).timestamp() if now is None else now
        return int((base - seconds) * 1e9)
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise PipelineError(
            f"{option} {text!r}: not a time (2026-11-25, 2026-11-25T08:00:00Z, or 15m, 2h, 7d ago)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1_000_000) * 1000


def glob_regex(pattern: str) -> str:
    """An fnmatch-style topic pattern (`*`, `?`) as an anchored regex for Spark's `rlike`
    (Java's syntax; every other character but letters and digits is backslash-escaped,
    which Java and Python both read as that character)."""
    parts = []
    for c in pattern:
        if c == "*":
            parts.append(".*")
        elif c == "?":
            parts.append(".")
        else:
            parts.append(c if c.isalnum() else "\\" + c)
    return "^" + "".join(parts) + "$"


@contextmanager
def _output_to(log: Path) -> Iterator[None]:
    """fds 1 and 2 point at `log` while the JVM starts, so that it, and the Python workers
    it starts later, write there for good; ours come back afterwards."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for f in (fd, *saved):
            os.close(f)


def start_session(
    app_name: str, master: str | None, log: Path, conf: dict[str, str] | None = None
) -> SparkSession:
    """A SparkSession on `master` (local[*] if None; one spark-submit gave wins), Spark's
    logs at WARN in `log`."""
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise PipelineError(
            "gateway pipeline needs pyspark: pip install 'mq-gateway[pipeline]'"
        ) from None
    log = log.resolve()  # Spark reads it by a file: URI, which a relative path has not
    log.parent.mkdir(parents=True, exist_ok=True)
    log4j = log.with_name(f".{log.name}.log4j2.properties")
    log4j.write_text(LOG4J2)
    # executors run this interpreter, which has pyarrow and the gateway package
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    elif "SPARK_ENV_LOADED" not in os.environ:  # not under spark-submit
        builder = builder.master("local[*]")
    java_options = f"-Dlog4j2.configurationFile={log4j.as_uri()}"
    settings = {
        "spark.driver.extraJavaOptions": java_options,
        "spark.executor.extraJavaOptions": java_options,
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.showConsoleProgress": "false",
        "spark.ui.enabled": "false",
        # percentile_approx is an object aggregate: past this many groups in a task Spark
        # sorts the rows instead of hashing them, much slower (its default is 128, fewer
        # than the report's topics x hours)
        "spark.sql.objectHashAggregate.sortBased.fallbackThreshold": "16384",
        **(conf or {}),
    }
    for key, value in settings.items():
        builder = builder.config(key, value)
    try:
        with _output_to(log):
            spark = builder.getOrCreate()
    except Exception as exc:
        raise PipelineError(
            f"cannot start Spark on {master or 'local[*]'}: {one_line(exc)}"
        ) from exc
    spark.sparkContext.setLogLevel("WARN")
    return spark


def one_line(exc: BaseException) -> str:
    """The first meaningful line of an exception from Spark (a Py4JJavaError's text is the
    whole Java stack trace)."""
    java = getattr(exc, "java_exception", None)
    if java is not None:
        try:
            text = str(java.getMessage() or java.toString())
        except Exception:
            text = str(exc)
    else:
        text = str(exc)
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("at ", "JVM stacktrace", "----")):
            return line[:500]
    return type(exc).__name__
