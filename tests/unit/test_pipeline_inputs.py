"""The pipeline's inputs, checked before Spark starts: times, topic patterns, master URLs,
replay targets, and how replay batches its publishes."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest

from gateway.pipeline.session import (
    PipelineError,
    check_archive,
    check_master,
    glob_regex,
    parse_time,
)
from gateway.pipeline.targets import BATCH_BYTES, BATCH_MESSAGES, Target, batches


def test_times() -> None:
    assert parse_time("2026-11-25", option="--since") == 1795564800 * 10**9
    assert parse_time("2026-11-25T01:00:00Z", option="--since") == (1795564800 + 3600) * 10**9
    assert parse_time("2026-11-25T02:00:00+01:00", option="--since") == (1795564800 + 3600) * 10**9
    assert parse_time("90s", option="--since", now=1000.0) == 910 * 10**9
    assert parse_time("2h", option="--since", now=10_000.0) == (10_000 - 7200) * 10**9
    with pytest.raises(PipelineError, match=r"^--until 'soon': not a time"):
        parse_time("soon", option="--until")


@pytest.mark.parametrize(
    ("pattern", "matches", "misses"),
    [
        ("orders*", ["orders", "orders.eu", "orders-1"], ["order", "xorders"]),
        ("a?c", ["abc", "a.c"], ["ac", "abbc"]),
        ("a.b", ["a.b"], ["axb"]),  # regex characters are literal
        ("x\\Ey*", ["x\\Ey", "x\\Eyz"], ["xy"]),  # a backslash too
        ("é[1]", ["é[1]"], ["é1"]),
    ],
)
def test_topic_patterns_as_regex(pattern: str, matches: list[str], misses: list[str]) -> None:
    regex = glob_regex(pattern)  # no construct Java and Python read differently
    for topic in matches:
        assert re.fullmatch(regex, topic), (pattern, topic, regex)
    for topic in misses:
        assert not re.fullmatch(regex, topic), (pattern, topic, regex)


@pytest.mark.parametrize(
    "url", ["local", "local[2]", "local[*]", "local[4,2]", "yarn", "k8s://https://k:6443"]
)
def test_master_urls_taken(url: str) -> None:
    assert check_master(url) == url


@pytest.mark.parametrize("url", ["", "local[0]", "spark://", "spark://h", "mesos://h:5050", "x"])
def test_master_urls_refused(url: str) -> None:
    with pytest.raises(PipelineError, match="not a Spark master URL"):
        check_master(url)


def test_a_spark_master_must_answer() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        assert check_master(f"spark://127.0.0.1:{port}") == f"spark://127.0.0.1:{port}"
        # the second of two masters answering is enough
        both = f"spark://127.0.0.1:1,127.0.0.1:{port}"
        assert check_master(both) == both
    with pytest.raises(PipelineError, match="cannot reach the Spark master"):
        check_master(f"spark://127.0.0.1:{port}")


def test_archive_directory(tmp_path: Path) -> None:
    with pytest.raises(PipelineError, match="no such directory"):
        check_archive(tmp_path / "missing")
    (tmp_path / "file").write_text("x")
    with pytest.raises(PipelineError, match="not a directory"):
        check_archive(tmp_path / "file")
    folder = tmp_path / "a" / "date=2026-01-01"
    folder.mkdir(parents=True)
    (folder / ".part-1.parquet").write_bytes(b"")  # unfinished: not a segment
    (tmp_path / "a" / "_tmp").mkdir()
    (tmp_path / "a" / "_tmp" / "part-2.parquet").write_bytes(b"")
    with pytest.raises(PipelineError, match="no finished archive segments"):
        check_archive(tmp_path / "a")
    (folder / "part-3.parquet").write_bytes(b"")
    assert check_archive(tmp_path / "a") == tmp_path / "a"


@pytest.mark.parametrize(
    ("url", "target"),
    [
        ("nsq://127.0.0.1:4150/orders", Target("nsq", "127.0.0.1", 4150, "orders")),
        ("nsq://h:1/t#ephemeral", Target("nsq", "h", 1, "t#ephemeral")),
        ("beanstalk://[::1]:11300/jobs", Target("beanstalk", "::1", 11300, "jobs")),
        ("nats://h:4222/orders.eu", Target("nats", "h", 4222, "orders.eu")),
        ("http://h:4151/orders", Target("http", "h", 4151, "orders")),
    ],
)
def test_targets(url: str, target: Target) -> None:
    assert Target.parse(url) == target


@pytest.mark.parametrize(
    ("url", "error"),
    [
        ("kafka://h:9092/t", "the scheme must be one of"),
        ("nsq://h/t", "needs a host and a port"),
        ("nsq://h:99999/t", "needs a host and a port"),
        ("nsq://h:1/bad topic", "not a valid topic name"),
        ("nsq://h:1/a/b", "not a valid topic name"),
        ("beanstalk://h:1/-x", "not a valid tube name"),
        ("nats://h:1/a.>", "not a valid subject name"),
        ("http://h:1/t?x=1", "not a valid topic name"),
    ],
)
def test_bad_targets(url: str, error: str) -> None:
    with pytest.raises(PipelineError, match=re.escape(error)):
        Target.parse(url)


def test_batches_bounded_by_count_and_bytes() -> None:
    small = [b"x"] * (BATCH_MESSAGES * 2 + 1)
    assert [len(b) for b in batches(small)] == [BATCH_MESSAGES, BATCH_MESSAGES, 1]
    big = [b"y" * (BATCH_BYTES // 3)] * 4
    assert [len(b) for b in batches(big)] == [2, 2]
    huge = [b"z" * (BATCH_BYTES + 1)]  # alone in its batch, never split
    assert [len(b) for b in batches(huge)] == [1]
    assert list(batches([])) == []
