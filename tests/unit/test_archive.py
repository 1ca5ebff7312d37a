"""The archive writer on its own: buffer and drops, columns, body modes, rotation by size
and by time, date partitions, unfinished segments left out by the reader."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.archive import events
from gateway.archive.read import read_archive
from gateway.archive.writer import SCHEMA, Archive
from gateway.model import Message
from tests.archive_support import earlier_layout_segment

DAY_NS = 86_400 * 1_000_000_000


class Sink:
    protocol = "beanstalk"
    remote = "10.0.0.7:5555"
    __hash__ = None  # type: ignore[assignment]  # a sink need not be hashable


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def message(i: int, body: bytes = b"hello world", topic: str = "orders") -> Message:
    return Message(
        i, topic, body, 1_700_000_000_000_000_000 + i, priority=7, origin="nsq 1.2.3.4:9"
    )


@pytest.fixture
def archive(tmp_path: Path) -> Iterator[Archive]:
    a = Archive(tmp_path / "archive")
    yield a
    a.close()


def finished(root: Path) -> list[Path]:
    return sorted(root.glob("date=*/part-*.parquet"))


def unfinished(root: Path) -> list[Path]:
    return sorted(root.glob("date=*/.part-*.inprogress"))


def test_a_full_buffer_drops_and_counts(tmp_path: Path) -> None:
    a = Archive(tmp_path, buffer=3)
    rec = a.recorder("orders")
    assert rec is not None
    rec.published([message(i) for i in range(1, 6)])  # not started: nothing drains it
    rec.record(events.DELIVERED, message(1), "g", Sink())
    assert (a.buffered, a.dropped) == (3, 3)
    a.start()
    a.close()
    assert a.written == 3
    assert read_archive(tmp_path).column("id").to_pylist() == [1, 2, 3]


def test_every_column(archive: Archive) -> None:
    archive.start()
    rec = archive.recorder("orders")
    assert rec is not None
    msg = message(42)
    before = time.time_ns()
    rec.published([msg])
    msg.attempts = 1
    rec.record(events.DELIVERED, msg, "workers", Sink())
    msg.attempts = 2  # later changes do not reach an event already recorded
    archive.close()
    table = read_archive(archive.directory)
    assert table.schema.names == [*SCHEMA.names, "date"]
    published, delivered = table.to_pylist()
    assert before <= published["time_ns"] <= delivered["time_ns"] <= time.time_ns()
    for row in (published, delivered):
        row.pop("time_ns")
        row.pop("date")
    assert published == {
        "event": "published",
        "id": 42,
        "topic": "orders",
        "group": "",
        "producer": "nsq",
        "consumer": "",
        "peer": "1.2.3.4:9",
        "size": 11,
        "attempts": 0,
        "priority": 7,
        "publish_ns": msg.timestamp,
        "body": b"hello world",
    }
    assert delivered == {
        **published,
        "event": "delivered",
        "group": "workers",
        "consumer": "beanstalk",
        "peer": "10.0.0.7:5555",
        "attempts": 1,
    }
    assert (archive.written, archive.segments, archive.dropped) == (2, 1, 0)


@pytest.mark.parametrize(
    ("mode", "body"), [("full", b"hello world"), ("none", None), (5, b"hello"), (0, b"")]
)
def test_body_modes(tmp_path: Path, mode: str | int, body: bytes | None) -> None:
    a = Archive(tmp_path, body=mode)
    a.start()
    rec = a.recorder("orders")
    assert rec is not None
    rec.published([message(1)])
    a.close()
    row = read_archive(tmp_path).to_pylist()[0]
    assert (row["body"], row["size"]) == (body, 11)


def test_topic_patterns(tmp_path: Path) -> None:
    a = Archive(tmp_path, topics=["orders*", "audit"])
    assert a.recorder("orders.eu") is not None
    assert a.recorder("audit") is not None
    assert a.recorder("audit2") is None
    assert Archive(tmp_path).recorder("anything") is not None


def test_rotation_by_size(tmp_path: Path) -> None:
    a = Archive(tmp_path, segment_bytes=1)  # every write fills a segment
    a.start()
    rec = a.recorder("orders")
    assert rec is not None
    for i in range(1, 4):
        rec.published([message(i)])
        assert a.flush()
        assert a.segments == i
    a.close()
    assert len(finished(tmp_path)) == 3
    assert unfinished(tmp_path) == []
    assert sorted(read_archive(tmp_path).column("id").to_pylist()) == [1, 2, 3]


def test_rotation_by_time(tmp_path: Path) -> None:
    clock = Clock()
    a = Archive(tmp_path, segment_seconds=60, clock=clock)
    a.start()
    rec = a.recorder("orders")
    assert rec is not None
    rec.published([message(1)])
    assert a.flush()
    # written, still open: readers do not see it yet
    assert (a.written, a.segments, len(unfinished(tmp_path))) == (1, 0, 1)
    assert read_archive(tmp_path).num_rows == 0
    clock.now += 59
    assert a.flush()
    assert a.segments == 0
    clock.now += 1
    assert a.flush()
    assert (a.segments, len(finished(tmp_path)), unfinished(tmp_path)) == (1, 1, [])
    rec.published([message(2)])
    a.close()
    assert a.segments == 2
    assert read_archive(tmp_path).column("id").to_pylist() == [1, 2]


def test_a_trickle_of_events_is_readable_within_segment_seconds(tmp_path: Path) -> None:
    """A few events, far fewer than a row group and no flush: `segment_seconds` after the
    first was recorded they are in a closed segment, readable (and safe from kill -9)
    without waiting for a row group to fill or for the gateway to stop."""
    clock = Clock()
    a = Archive(tmp_path, segment_seconds=5, clock=clock)
    a.start()
    try:
        rec = a.recorder("orders")
        assert rec is not None
        rec.published([message(1)])
        rec.published([message(2)])
        deadline = time.monotonic() + 10  # the writer looks every IDLE_WAKE_SECONDS
        while a.taken < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (a.taken, a.buffered) == (2, 2)  # taken into a row group, not written
        clock.now += 5
        while a.segments == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (a.segments, a.buffered) == (1, 0)
        assert read_archive(tmp_path).column("id").to_pylist() == [1, 2]
    finally:
        a.close()


def test_partitions_by_utc_date(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a = Archive(tmp_path)
    rec = a.recorder("orders")
    assert rec is not None
    midnight = 20_000 * DAY_NS  # 2024-10-04T00:00:00Z
    for i, at in enumerate((midnight - 1, midnight, midnight + 5), start=1):
        monkeypatch.setattr("gateway.archive.writer.time.time_ns", lambda at=at: at)
        rec.published([message(i)])
    monkeypatch.undo()
    a.start()
    a.close()
    days = {p.parent.name: p for p in finished(tmp_path)}
    assert sorted(days) == ["date=2024-10-03", "date=2024-10-04"]
    table = read_archive(tmp_path)
    assert sorted(
        zip(table.column("date").to_pylist(), table.column("id").to_pylist(), strict=True)
    ) == [
        ("2024-10-03", 1),
        ("2024-10-04", 2),
        ("2024-10-04", 3),
    ]


def test_reader_skips_unfinished_segments(tmp_path: Path) -> None:
    a = Archive(tmp_path)
    a.start()
    rec = a.recorder("orders")
    assert rec is not None
    rec.published([message(1)])
    a.close()
    # what kill -9 leaves: a segment never closed, cut anywhere (here: no footer at all)
    folder = finished(tmp_path)[0].parent
    (folder / ".part-1-000009.parquet.inprogress").write_bytes(b"PAR1\x00\x01 cut short")
    assert read_archive(tmp_path).column("id").to_pylist() == [1]


def test_reader_on_a_missing_or_empty_dir(tmp_path: Path) -> None:
    assert read_archive(tmp_path / "nothing").num_rows == 0
    assert read_archive(tmp_path).num_rows == 0


def test_row_groups_are_written_as_the_buffer_fills(tmp_path: Path) -> None:
    from gateway.archive.writer import ROW_GROUP_ROWS

    a = Archive(tmp_path)
    a.start()
    rec = a.recorder("orders")
    assert rec is not None
    # bodies of different sizes: a publish cut between row groups keeps each its own
    ids = range(1, ROW_GROUP_ROWS * 2 + 2)
    rec.published([message(i, body=b"b" * (i % 7) + str(i).encode()) for i in ids])
    assert a.flush()
    assert a.written == ROW_GROUP_ROWS * 2 + 1
    a.close()
    import pyarrow.parquet as pq

    table = read_archive(tmp_path)
    assert table.column("id").to_pylist() == list(ids)
    assert table.column("body").to_pylist() == [b"b" * (i % 7) + str(i).encode() for i in ids]
    assert table.column("size").to_pylist() == [i % 7 + len(str(i)) for i in ids]

    meta = pq.ParquetFile(finished(tmp_path)[0]).metadata
    assert [meta.row_group(i).num_rows for i in range(meta.num_row_groups)] == [
        ROW_GROUP_ROWS,
        ROW_GROUP_ROWS,
        1,
    ]


def test_a_failed_write_is_counted_and_the_writer_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = Archive(tmp_path)
    a.start()
    rec = a.recorder("orders")
    assert rec is not None

    def broken(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("gateway.archive.writer.pq.ParquetWriter", broken)
    rec.published([message(1), message(2)])
    assert a.flush()
    assert (a.failed, a.write_errors, a.written) == (2, 1, 0)
    monkeypatch.undo()
    rec.published([message(3)])
    a.close()
    assert read_archive(tmp_path).column("id").to_pylist() == [3]


def test_publishes_of_several_topics_and_publishers_in_one_row_group(tmp_path: Path) -> None:
    """Publishes are buffered one entry per publish (whose messages share a publisher and
    a priority, as Topic.put's do); a row group mixes them with other
    events, in order, each message with its own topic, publisher, attempts and priority."""
    a = Archive(tmp_path)
    orders, audit = a.recorder("orders"), a.recorder("audit")
    assert orders is not None and audit is not None
    m1, m2, m3 = message(1), message(2), message(3, topic="audit")
    m2.origin, m2.priority = "nats 10.0.0.1:4", 3
    orders.published([m1])
    orders.published([m2])  # another publish: its own publisher and priority
    m1.priority = 99  # changed after the publish: the event keeps what it was
    m1.attempts = 1
    orders.record(events.DELIVERED, m1, "g", Sink())
    audit.published(iter([m3]))  # any iterable
    audit.published([])  # nothing: no entry
    assert (a.buffered, a.dropped) == (4, 0)
    a.start()
    a.close()
    rows = read_archive(tmp_path).to_pylist()
    got = [
        (r["event"], r["id"], r["topic"], r["producer"], r["peer"], r["attempts"], r["priority"])
        for r in rows
    ]
    assert got == [
        ("published", 1, "orders", "nsq", "1.2.3.4:9", 0, 7),
        ("published", 2, "orders", "nats", "10.0.0.1:4", 0, 3),
        ("delivered", 1, "orders", "nsq", "10.0.0.7:5555", 1, 99),
        ("published", 3, "audit", "nsq", "1.2.3.4:9", 0, 7),
    ]
    assert [r["group"] for r in rows] == ["", "", "g", ""]
    assert [r["consumer"] for r in rows] == ["", "", "beanstalk", ""]
    assert rows[0]["time_ns"] <= rows[1]["time_ns"] <= rows[2]["time_ns"] <= rows[3]["time_ns"]
    assert a.buffered == 0 and a.written == 4


def test_a_run_of_publishes_keeps_each_message_id_and_publish_facts(tmp_path: Path) -> None:
    """The writer derives a publish's ids from its first id and count, and its publisher,
    priority and publish time from its first message: check them across a run of
    publishes of different sizes, topics and publishers in one row group."""
    a = Archive(tmp_path)
    orders, audit = a.recorder("orders"), a.recorder("audit")
    assert orders is not None and audit is not None
    first = [message(i) for i in (10, 11, 12)]
    for m in first:
        m.timestamp = 5
    second = [message(i, topic="audit") for i in (20, 21)]
    for m in second:
        m.timestamp, m.origin, m.priority = 6, "beanstalk 10.0.0.2:1", 0
    orders.published(first)
    audit.published(second)
    orders.published([message(30, body=b"")])
    a.start()
    a.close()
    got = [
        (r["id"], r["topic"], r["producer"], r["peer"], r["priority"], r["publish_ns"], r["size"])
        for r in read_archive(tmp_path).to_pylist()
    ]
    assert got == [
        (10, "orders", "nsq", "1.2.3.4:9", 7, 5, 11),
        (11, "orders", "nsq", "1.2.3.4:9", 7, 5, 11),
        (12, "orders", "nsq", "1.2.3.4:9", 7, 5, 11),
        (20, "audit", "beanstalk", "10.0.0.2:1", 0, 6, 11),
        (21, "audit", "beanstalk", "10.0.0.2:1", 0, 6, 11),
        (30, "orders", "nsq", "1.2.3.4:9", 7, 1_700_000_000_000_000_030, 0),
    ]


def test_bodies_of_publishes_around_other_events_in_one_table_stay_their_own() -> None:
    """Runs of publishes within one table, around other events, each keep their bodies;
    a publish's bodies are the ones it had when recorded."""
    from gateway.archive.tables import table

    a = Archive("/nonexistent")  # never started: entries are taken from its buffer
    rec = a.recorder("orders")
    assert rec is not None
    rec.published([message(i, body=b"first-%d" % i) for i in range(1, 4)])
    rec.record(events.DELIVERED, message(1, body=b"first-1"), "g", Sink())
    rec.published([message(i, body=b"second-%d" % i) for i in range(4, 6)])
    entries = list(a._buffer)
    got = table(entries, "full")
    expected = [b"first-1", b"first-2", b"first-3", b"first-1", b"second-4", b"second-5"]
    assert got.column("body").to_pylist() == expected
    assert got.column("size").to_pylist() == list(map(len, expected))
    assert table(entries[:1], "full").column("body").to_pylist() == expected[:3]
    assert table(entries, 6).column("body").to_pylist() == [b[:6] for b in expected]


def test_segments_of_the_earlier_layout_read_beside_new_ones(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    earlier_layout_segment(tmp_path, [1, 2])
    a = Archive(tmp_path)
    a.start()
    rec = a.recorder("orders")
    assert rec is not None
    rec.published([message(3), message(4)])
    a.close()
    new = [p for p in finished(tmp_path) if "part-1-" not in p.name]
    assert len(new) == 1
    # the new segment's columns are REQUIRED but the body's
    schema = pq.ParquetFile(new[0]).schema_arrow
    assert [f.name for f in schema if f.nullable] == ["body"]
    table = read_archive(tmp_path)
    assert sorted(table.column("id").to_pylist()) == [1, 2, 3, 4]
    assert table.schema.field("id").nullable
