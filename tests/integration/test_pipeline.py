"""The data pipeline end to end: a `gateway serve` process with the archive on, real
traffic through pynsq, greenstalk and nats-py, a SIGTERM, then the report on real Spark
(in this process: one SparkSession for the module, a JVM start is expensive), its page in
Chromium, and the same report by `gateway pipeline report` on a real standalone cluster."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import greenstalk
import nats
import pyarrow.parquet as pq
import pytest

from gateway.archive.events import EVENTS
from gateway.pipeline import report
from gateway.pipeline.session import start_session
from tests.pipeline_support import spark_cluster

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


def _ready_line(log: Path, proc: subprocess.Popen[bytes]) -> str:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        for line in log.read_text().splitlines():
            if "ready:" in line:
                return line
        assert proc.poll() is None, log.read_text()
        time.sleep(0.05)
    raise AssertionError(f"gateway not ready: {log.read_text()}")


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
    log = root / "gateway.log"
    env = {
        **os.environ,
        "GATEWAY_ARCHIVE__ENABLED": "true",
        "GATEWAY_ARCHIVE__DIR": str(archive),
    }
    argv = [sys.executable, "-m", "gateway", "serve", "--data-dir", str(root / "data")]
    for name in ("nsq", "beanstalk", "nats"):
        argv += [f"--{name}", "127.0.0.1:0"]
    argv += ["--http", "off", "--nats-route", "off", "--rocketmq", "off"]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stderr=out, cwd=REPO, env=env)
    try:
        line = _ready_line(log, proc)
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
        assert proc.wait(30) == 0, log.read_text()
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
    the pyspark package: the same numbers as on local Spark."""
    with spark_cluster(tmp_path / "cluster") as master:
        result = subprocess.run(
            [sys.executable, "-m", "gateway", "pipeline", "report", "--master", master,
             "--archive", str(traffic.archive), "--out", str(tmp_path / "out")],
            capture_output=True, text=True, timeout=300, cwd=REPO, check=False,
            env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"},
        )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    assert lines[0].startswith("spark application app-"), lines  # a cluster's, not local-
    assert lines[-1] == f"report: {tmp_path / 'out' / 'report.html'}"
    check_report(tmp_path / "out", traffic)
