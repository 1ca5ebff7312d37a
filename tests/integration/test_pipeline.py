"""The data pipeline end to end: a `gateway serve` process with the archive on, real
traffic through pynsq, greenstalk and nats-py, a SIGTERM, then the report on real Spark
(in this process: one SparkSession for the module, a JVM start is expensive), its page in
Chromium, and the same report by `gateway pipeline report` on a real standalone cluster."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import greenstalk
import nats
import pyarrow.parquet as pq
import pytest
import trio

from gateway.archive.events import EVENTS
from gateway.pipeline import replay, report
from gateway.pipeline.session import one_line, start_session
from gateway.pipeline.targets import Target
from tests.archive_support import earlier_layout_segment
from tests.helpers import running_gateway
from tests.pipeline_support import Output, spark_cluster

REPO = Path(__file__).resolve().parents[2]
CLIENTS = REPO / "tests" / "clients"
ORDERS = ["fin-0", "fin-1", "fin-2", "req-0", "req-1", "timeout-0"]
NATS_BODY = "fin-from-nats"
DEAD = [b"dead \x00\xff one", b"dead two\r\n"]


@dataclass
class Traffic:
    """What the test did, and the archive it left."""

    archive: Path
    counts: dict[str, dict[str, int]]
    flow: dict[tuple[str, str], int]
    acknowledged: dict[str, int]
    dead: list[bytes] = field(default_factory=list)


def _port(line: str, name: str) -> int:
    return int(line.split(f"{name}=127.0.0.1:")[1].split(",")[0])


def _client(*args: str) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, str(CLIENTS / "pynsq_lifecycle.py"), *args],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr.decode()
    return json.loads(result.stdout)


async def _nats_publish(port: int, subject: str, body: bytes) -> None:
    nc = await nats.connect(f"nats://127.0.0.1:{port}")
    await nc.publish(subject, body)
    await nc.flush()  # PING/PONG: the gateway has taken the PUB
    await nc.close()


def _beanstalk_traffic(port: int) -> None:
    with greenstalk.Client(("127.0.0.1", port), encoding=None, use="jobs", watch="jobs") as bs:
        bs.put(b"job-ack")
        job = bs.reserve(timeout=5)
        bs.delete(job)
        bs.put(b"job-release")
        job = bs.reserve(timeout=5)
        bs.release(job)
        job = bs.reserve(timeout=5)
        assert job.body == b"job-release"
        bs.delete(job)
        for body in DEAD:
            bs.put(body)
            job = bs.reserve(timeout=5)
            assert job.body == body
            bs.bury(job)


@pytest.fixture(scope="module")
def traffic(tmp_path_factory: pytest.TempPathFactory) -> Traffic:
    root = tmp_path_factory.mktemp("pipeline")
    archive = root / "archive"
    env = {
        **os.environ,
        "GATEWAY_ARCHIVE__ENABLED": "true",
        "GATEWAY_ARCHIVE__DIR": str(archive),
    }
    argv = [sys.executable, "-m", "gateway", "serve", "--data-dir", str(root / "data")]
    for name in ("nsq", "beanstalk", "nats"):
        argv += [f"--{name}", "127.0.0.1:0"]
    argv += ["--http", "off", "--nats-route", "off", "--rocketmq", "off"]
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=REPO, env=env
    )
    output = Output(proc, "gateway")
    try:
        line = output.wait_for(r"ready: .*")[0]
        nsq, bs, nats_port = (_port(line, n) for n in ("nsq", "beanstalk", "nats"))
        bodies = [a for b in ORDERS for a in ("--body", b)]
        pub = _client("pub", "--port", str(nsq), "--topic", "orders", *bodies)
        assert pub["replies"] == ["OK"] * len(ORDERS)
        # into the NSQ topic (kept: it has a backlog), consumed below by pynsq
        asyncio.run(_nats_publish(nats_port, "orders", NATS_BODY.encode()))
        sub = _client(
            "sub", "--port", str(nsq), "--topic", "orders", "--channel", "ch",
            "--msg-timeout", "1000", "--count", str(len(ORDERS) + 1),
        )  # fmt: skip
        assert (sub["fin"], sub["req"], sub["ignored"]) == (7, 2, 1)
        _beanstalk_traffic(bs)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, "".join(output.lines)
    zero = dict.fromkeys(EVENTS, 0)
    orders_bytes = sum(len(b) for b in ORDERS) + len(NATS_BODY)
    jobs_bytes = len(b"job-ack") + len(b"job-release") + sum(len(b) for b in DEAD)
    counts = {
        "orders": {
            **zero, "published": 7, "delivered": 10, "acknowledged": 7, "requeued": 2,
            "timed_out": 1, "bytes": orders_bytes, "redelivered": 3, "dead_letters": 0,
        },
        "jobs": {
            **zero, "published": 4, "delivered": 5, "acknowledged": 2, "requeued": 1,
            "buried": 2, "bytes": jobs_bytes, "redelivered": 1, "dead_letters": 2,
        },
    }  # fmt: skip
    flow = {("nsq", "nsq"): 6, ("nats", "nsq"): 1, ("beanstalk", "beanstalk"): 4}
    return Traffic(archive, counts, flow, {"orders": 7, "jobs": 2}, DEAD)


@pytest.fixture(scope="module")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    session = start_session(
        "gateway tests", "local[2]", tmp_path_factory.mktemp("spark") / "spark.log"
    )
    yield session
    session.stop()


@pytest.fixture(scope="module")
def report_out(spark: Any, traffic: Traffic, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("report")
    report.run(spark, report.Options(traffic.archive, out))
    return out


def check_report(out: Path, traffic: Traffic) -> None:
    counts = {row.pop("topic"): row for row in json.loads((out / "counts.json").read_text())}
    assert set(counts) == set(traffic.counts)
    for topic, expected in traffic.counts.items():
        got = counts[topic]
        assert {k: got[k] for k in expected} == expected, topic
        assert got["redelivery_rate"] == pytest.approx(
            expected["redelivered"] / expected["delivered"]
        )
    latency = {row["topic"]: row for row in json.loads((out / "latency.json").read_text())}
    for topic, acknowledged in traffic.acknowledged.items():
        row = latency[topic]
        assert row["acknowledged"] == acknowledged
        assert 0 < row["p50"] <= row["p95"] <= row["p99"], row
    flow = pq.read_table(out / "tables" / "flow.parquet").to_pylist()
    assert {(r["producer"], r["consumer"]): r["messages"] for r in flow} == traffic.flow
    dead = pq.read_table(out / "tables" / "dead_letters.parquet").to_pylist()
    assert [(r["topic"], r["group"]) for r in dead] == [("jobs", "beanstalk")] * len(traffic.dead)
    for name in ("by_topic", "by_group", "by_hour", "by_pair", "throughput"):
        assert pq.read_table(out / "tables" / f"{name}.parquet").num_rows > 0, name
    hours = pq.read_table(out / "tables" / "by_hour.parquet").to_pylist()
    assert sum(r["published"] for r in hours) == 11


def test_report_counts_equal_the_traffic(report_out: Path, traffic: Traffic) -> None:
    check_report(report_out, traffic)
    groups = pq.read_table(report_out / "tables" / "by_group.parquet").to_pylist()
    by_group = {(r["topic"], r["group"]): r for r in groups}
    assert set(by_group) == {("orders", "ch"), ("jobs", "beanstalk")}
    assert by_group["orders", "ch"]["timed_out"] == 1
    pairs = pq.read_table(report_out / "tables" / "by_pair.parquet").to_pylist()
    acked = {(r["producer"], r["consumer"]): r["acknowledged"] for r in pairs}
    assert acked == {("nsq", "nsq"): 6, ("nats", "nsq"): 1, ("beanstalk", "beanstalk"): 2}


def test_spark_reads_segments_of_the_earlier_layout_beside_new_ones(
    spark: Any, traffic: Traffic, tmp_path: Path
) -> None:
    """An archive written partly before the columns became REQUIRED (and the pages v2):
    Spark reads both kinds of segment with the one schema."""
    import shutil

    from gateway.pipeline.events import load_events

    shutil.copytree(traffic.archive, tmp_path, dirs_exist_ok=True)
    earlier_layout_segment(tmp_path, [10**9, 10**9 + 1])
    published = load_events(spark, tmp_path).filter("event = 'published'")
    assert published.count() == 11 + 2
    assert published.filter("id >= 1000000000").count() == 2


def test_report_topic_filter(spark: Any, traffic: Traffic, tmp_path: Path) -> None:
    result, _ = report.run(spark, report.Options(traffic.archive, tmp_path, topic="ord*"))
    assert [r["topic"] for r in result.rows("by_topic")] == ["orders"]
    future = time.time_ns() + 3600 * 10**9
    result, _ = report.run(spark, report.Options(traffic.archive, tmp_path, since_ns=future))
    assert result.rows("by_topic") == [] and result.events == 0
    page = (tmp_path / "report.html").read_text()
    assert page.count('<figure data-chart="') == 4


def test_report_page_in_chromium(report_out: Path, tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(CLIENTS / "browser" / "report_page.py"),
         "--file", str(report_out / "report.html"), "--screenshot", str(tmp_path / "r.png")],
        capture_output=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr.decode()
    page = json.loads(result.stdout)
    assert page["console_errors"] == [] and page["page_errors"] == []
    charts = {c["chart"]: c for c in page["charts"]}
    assert set(charts) == {"throughput", "latency", "flow", "dead-letters"}
    for chart in charts.values():
        assert chart["complete"] and chart["width"] > 0 and chart["height"] > 0, chart
    assert page["tables"] == ["counts", "latency", "groups", "pairs"]
    assert (tmp_path / "r.png").stat().st_size > 0


def test_report_on_a_standalone_cluster(traffic: Traffic, tmp_path: Path) -> None:
    """`gateway pipeline report --master spark://...` on a master and a worker started from
    the pyspark package: the same numbers as on local Spark. `--out` is relative, as in
    the README's example (Spark's log goes there, read by a file: URI)."""
    with spark_cluster(tmp_path / "cluster") as master:
        result = subprocess.run(
            [sys.executable, "-m", "gateway", "pipeline", "report", "--master", master,
             "--archive", str(traffic.archive), "--out", "out"],
            capture_output=True, text=True, timeout=300, cwd=tmp_path, check=False,
            env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"},
        )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    assert lines[0].startswith("spark application app-"), lines  # a cluster's, not local-
    assert lines[-1] == f"report: {(tmp_path / 'out' / 'report.html').resolve()}"
    check_report(tmp_path / "out", traffic)


# -- replay -------------------------------------------------------------------------------


def _worker(port: int, tube: str) -> greenstalk.Client:
    return greenstalk.Client(("127.0.0.1", port), encoding=None, use=tube, watch=tube)


def _drain(client: greenstalk.Client, expected: int) -> list[bytes]:
    """`expected` jobs reserved and deleted, then proof that nothing else is ready."""
    bodies = []
    for _ in range(expected):
        job = client.reserve(timeout=10)
        bodies.append(job.body)
        client.delete(job)
    with pytest.raises(greenstalk.TimedOutError):
        client.reserve(timeout=0)
    return bodies


async def _replay(spark: Any, traffic: Traffic, url: str, event: str = "buried") -> replay.Result:
    options = replay.Options(traffic.archive, "jobs", event, Target.parse(url))
    return await trio.to_thread.run_sync(replay.run, spark, options)


@pytest.mark.parametrize(
    ("scheme", "listener"),
    [("nsq", "nsq"), ("beanstalk", "beanstalk"), ("nats", "nats"), ("http", "http")],
)
async def test_replay_buried_messages_reach_a_beanstalk_worker(
    spark: Any, traffic: Traffic, scheme: str, listener: str
) -> None:
    """The dead letters of tube `jobs`, replayed into a running gateway by each kind of
    URL, are exactly what a beanstalkd worker of the target's tube reserves: byte-exact,
    each once, nothing else."""
    tube = f"replayed-{scheme}"
    async with running_gateway(
        beanstalk="127.0.0.1:0", nats="127.0.0.1:0", http="127.0.0.1:0"
    ) as gw:
        # the worker first: a NATS publish is kept only for a topic that exists
        worker = await trio.to_thread.run_sync(_worker, gw.addresses["beanstalk"][1], tube)
        try:
            host, port = gw.addresses[listener]
            result = await _replay(spark, traffic, f"{scheme}://{host}:{port}/{tube}")
            assert (result.read, result.published, result.failed, result.error) == (2, 2, 0, "")
            bodies = await trio.to_thread.run_sync(_drain, worker, 2)
        finally:
            worker.close()
    assert sorted(bodies) == sorted(traffic.dead)


async def test_replay_of_another_last_event(spark: Any, traffic: Traffic) -> None:
    async with running_gateway(beanstalk="127.0.0.1:0") as gw:
        worker = await trio.to_thread.run_sync(_worker, gw.addresses["beanstalk"][1], "acked")
        try:
            host, port = gw.addresses["nsq"]
            result = await _replay(spark, traffic, f"nsq://{host}:{port}/acked", "acknowledged")
            assert (result.read, result.published, result.failed) == (2, 2, 0)
            bodies = await trio.to_thread.run_sync(_drain, worker, 2)
        finally:
            worker.close()
    assert sorted(bodies) == [b"job-ack", b"job-release"]
    # no message of `jobs` is only published: every one reached a worker
    result = await _replay(spark, traffic, f"nsq://{host}:{port}/x", "published")
    assert (result.read, result.published, result.failed) == (0, 0, 0)


class ClosingListener:
    """A TCP listener that accepts and closes at once: a target that takes no publish."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.close()

    def close(self) -> None:
        self.sock.close()


def test_cli_replay_to_a_target_that_takes_nothing(traffic: Traffic, tmp_path: Path) -> None:
    """`gateway pipeline replay` through its own JVM: every failed publish is counted, the
    exit status is 1, and the user sees one error line, no Java."""
    listener = ClosingListener()
    try:
        result = gateway_pipeline(
            "replay", "--archive", str(traffic.archive), "--topic", "jobs",
            "--to", f"nsq://127.0.0.1:{listener.port}/jobs",
            "--spark-log", str(tmp_path / "spark.log"),
        )  # fmt: skip
    finally:
        listener.close()
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert lines[0].startswith("spark application local-"), lines
    assert lines[1:] == ["read 2, published 0, failed 2"]
    [error] = result.stderr.splitlines()
    assert error.startswith(f"error: 2 publishes to nsq://127.0.0.1:{listener.port}/jobs failed: ")
    assert (tmp_path / "spark.log").exists()


# -- bad input: one line, exit 1, before Spark starts ---------------------------------------


def gateway_pipeline(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", "pipeline", *args],
        capture_output=True, text=True, timeout=300, cwd=REPO, check=False,
        env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"},
    )  # fmt: skip


def _refused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again: nothing listens there


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--archive", "{missing}"], "error: archive {missing}: no such directory"),
        (["--archive", "{empty}"], "error: archive {empty}: no finished archive segments"),
        (["--master", "spark:/x"], "error: --master 'spark:/x': not a Spark master URL"),
        (["--master", "spark://127.0.0.1:{refused}"],
         "error: --master spark://127.0.0.1:{refused}: cannot reach the Spark master"),
        (["--since", "yesterday"], "error: --since 'yesterday': not a time"),
        (["--since", "1h", "--until", "2h"], "error: --since 1h is not before --until 2h"),
    ],
)  # fmt: skip
def test_report_bad_input(traffic: Traffic, tmp_path: Path, args: list[str], error: str) -> None:
    (tmp_path / "empty" / "date=2026-01-01").mkdir(parents=True)
    (tmp_path / "empty" / "date=2026-01-01" / ".part-1.parquet.inprogress").write_bytes(b"PAR1")
    names = {"missing": tmp_path / "nope", "empty": tmp_path / "empty", "refused": _refused_port()}
    argv = ["--archive", str(traffic.archive), "--out", str(tmp_path / "out")]
    argv += [a.format(**names) for a in args]
    result = gateway_pipeline("report", *argv)
    assert result.returncode == 1
    [line] = result.stderr.splitlines()
    assert line.startswith(error.format(**names)), line
    assert result.stdout == ""


@pytest.mark.parametrize(
    ("to", "error"),
    [
        ("ftp://127.0.0.1:1/t", "error: --to 'ftp://127.0.0.1:1/t': the scheme must be one of"),
        ("nsq://127.0.0.1/t", "error: --to 'nsq://127.0.0.1/t': needs a host and a port"),
        ("nsq://127.0.0.1:4150/", "error: --to 'nsq://127.0.0.1:4150/': '' is not a valid topic"),
        ("nats://127.0.0.1:1/a.*", "error: --to 'nats://127.0.0.1:1/a.*': 'a.*' is not a valid"),
        ("beanstalk://127.0.0.1:{refused}/t",
         "error: --to beanstalk://127.0.0.1:{refused}/t: cannot connect: Connection refused"),
    ],
)  # fmt: skip
def test_replay_bad_input(traffic: Traffic, to: str, error: str) -> None:
    refused = _refused_port()
    result = gateway_pipeline(
        "replay", "--archive", str(traffic.archive), "--topic", "jobs",
        "--to", to.format(refused=refused),
    )  # fmt: skip
    assert result.returncode == 1
    [line] = result.stderr.splitlines()
    assert line.startswith(error.format(refused=refused)), line


def test_a_job_failing_inside_spark_is_one_line(spark: Any, tmp_path: Path) -> None:
    """A segment that is not Parquet fails the job in Spark's executors; what the command
    prints of it is one line naming the file, not the Java stack trace."""
    folder = tmp_path / "archive" / "date=2026-01-01"
    folder.mkdir(parents=True)
    (folder / "part-1-000001.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(Exception) as failure:
        report.run(spark, report.Options(tmp_path / "archive", tmp_path / "out"))
    line = one_line(failure.value)
    assert "\n" not in line and "part-1-000001.parquet" in line, line
    assert "at org.apache" not in line
