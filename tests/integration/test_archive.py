"""The archive end to end: an in-process gateway with `[archive] enabled`, NSQ and
beanstalkd traffic through raw sockets, a clean stop, then the Parquet segments read back:
every event, with its columns."""

from __future__ import annotations

from pathlib import Path

import trio
from prometheus_client import generate_latest

from gateway.archive.read import read_archive
from tests.helpers import RawBeanstalk, RawNSQ, be32, parse_message, running_gateway


def local(conn: RawNSQ | RawBeanstalk) -> str:
    host, port = conn.stream.socket.getsockname()[:2]
    return f"{host}:{port}"


async def nsq_pub(conn: RawNSQ, topic: str, body: bytes) -> None:
    await conn.send(f"PUB {topic}\n".encode() + be32(len(body)) + body)
    assert await conn.frame() == (0, b"OK")


async def test_nsq_and_beanstalk_traffic_archived(tmp_path: Path) -> None:
    archive = tmp_path / "archive"
    async with running_gateway(
        beanstalk="127.0.0.1:0", archive__enabled=True, archive__dir=str(archive)
    ) as gw:
        assert gw.archive is not None
        # NSQ: PUB, SUB, deliver + FIN; PUB, deliver + REQ, redeliver + FIN
        pub = await RawNSQ.connect(gw)
        sub = await RawNSQ.connect(gw)
        await nsq_pub(pub, "orders", b"first")
        await sub.send(b"SUB orders ch\n")
        assert await sub.frame() == (0, b"OK")
        await sub.send(b"RDY 1\n")
        ftype, data = await sub.frame()
        _, attempts, first_id, body = parse_message(data)
        assert (ftype, attempts, body) == (2, 1, b"first")
        await sub.send(b"FIN " + first_id + b"\n")
        await nsq_pub(pub, "orders", b"second")
        _, data = await sub.frame()
        second_id = parse_message(data)[2]
        await sub.send(b"REQ " + second_id + b" 0\n")
        _, data = await sub.frame()
        assert parse_message(data)[1:] == (2, second_id, b"second")
        await sub.send(b"FIN " + second_id + b"\n")
        await nsq_pub(sub, "sync", b".")  # the FIN before it is applied

        # beanstalkd: put/reserve/delete, release, bury, kick, delete of a ready job
        bs = await RawBeanstalk.connect(gw)
        assert await bs.call(b"use jobs\r\n") == b"USING jobs\r\n"
        assert await bs.call(b"watch jobs\r\n") == b"WATCHING 2\r\n"
        assert await bs.call(b"ignore default\r\n") == b"WATCHING 1\r\n"
        j1 = int((await bs.call(b"put 10 0 60 2\r\nj1\r\n")).split()[1])
        assert await bs.call(b"reserve\r\n") == f"RESERVED {j1} 2\r\nj1\r\n".encode()
        assert await bs.call(f"delete {j1}\r\n".encode()) == b"DELETED\r\n"
        j2 = int((await bs.call(b"put 20 0 60 2\r\nj2\r\n")).split()[1])
        assert (await bs.call(b"reserve\r\n")).startswith(f"RESERVED {j2} ".encode())
        assert await bs.call(f"release {j2} 21 0\r\n".encode()) == b"RELEASED\r\n"
        assert (await bs.call(b"reserve\r\n")).startswith(f"RESERVED {j2} ".encode())
        assert await bs.call(f"bury {j2} 22\r\n".encode()) == b"BURIED\r\n"
        assert await bs.call(b"kick 1\r\n") == b"KICKED 1\r\n"
        assert (await bs.call(b"reserve\r\n")).startswith(f"RESERVED {j2} ".encode())
        assert await bs.call(f"bury {j2} 22\r\n".encode()) == b"BURIED\r\n"
        assert await bs.call(f"delete {j2}\r\n".encode()) == b"DELETED\r\n"
        j3 = int((await bs.call(b"put 30 0 60 2\r\nj3\r\n")).split()[1])
        assert await bs.call(f"delete {j3}\r\n".encode()) == b"DELETED\r\n"
        nsq_pub_peer, nsq_sub_peer, bs_peer = local(pub), local(sub), local(bs)
        for conn in (pub, sub, bs):
            await conn.aclose()
        archiver = gw.archive
    # the gateway has stopped: the open segment is closed and renamed
    assert list(archive.rglob(".*")) == []
    assert (archiver.dropped, archiver.write_errors, archiver.segments) == (0, 0, 1)

    table = read_archive(archive).sort_by([("time_ns", "ascending")])
    rows = table.to_pylist()
    assert archiver.written == len(rows)
    n1, n2 = int(first_id, 16), int(second_id, 16)
    nsq_sub = ("ch", "nsq", "nsq", nsq_sub_peer)
    bs_sub = ("beanstalk", "beanstalk", "beanstalk", bs_peer)
    bs_admin = ("beanstalk", "beanstalk", "", "")
    expected = [
        # event, id, topic, (group, producer, consumer, peer), attempts, priority, body
        ("published", n1, "orders", ("", "nsq", "", nsq_pub_peer), 0, 1024, b"first"),
        ("delivered", n1, "orders", nsq_sub, 1, 1024, b"first"),
        ("acknowledged", n1, "orders", nsq_sub, 1, 1024, b"first"),
        ("published", n2, "orders", ("", "nsq", "", nsq_pub_peer), 0, 1024, b"second"),
        ("delivered", n2, "orders", nsq_sub, 1, 1024, b"second"),
        ("requeued", n2, "orders", nsq_sub, 1, 1024, b"second"),
        ("delivered", n2, "orders", nsq_sub, 2, 1024, b"second"),
        ("acknowledged", n2, "orders", nsq_sub, 2, 1024, b"second"),
        ("published", n2 + 1, "sync", ("", "nsq", "", nsq_sub_peer), 0, 1024, b"."),
        ("published", j1, "jobs", ("", "beanstalk", "", bs_peer), 0, 10, b"j1"),
        ("delivered", j1, "jobs", bs_sub, 1, 10, b"j1"),
        ("acknowledged", j1, "jobs", bs_sub, 1, 10, b"j1"),
        ("published", j2, "jobs", ("", "beanstalk", "", bs_peer), 0, 20, b"j2"),
        ("delivered", j2, "jobs", bs_sub, 1, 20, b"j2"),
        ("requeued", j2, "jobs", bs_sub, 1, 20, b"j2"),  # before the new priority applies
        ("delivered", j2, "jobs", bs_sub, 2, 21, b"j2"),
        ("buried", j2, "jobs", bs_sub, 2, 22, b"j2"),
        ("kicked", j2, "jobs", bs_admin, 2, 22, b"j2"),
        ("delivered", j2, "jobs", bs_sub, 3, 22, b"j2"),
        ("buried", j2, "jobs", bs_sub, 3, 22, b"j2"),
        ("deleted", j2, "jobs", bs_admin, 3, 22, b"j2"),
        ("published", j3, "jobs", ("", "beanstalk", "", bs_peer), 0, 30, b"j3"),
        ("deleted", j3, "jobs", bs_admin, 0, 30, b"j3"),
    ]
    got = [
        (
            r["event"],
            r["id"],
            r["topic"],
            (r["group"], r["producer"], r["consumer"], r["peer"]),
            r["attempts"],
            r["priority"],
            r["body"],
        )
        for r in rows
    ]
    assert got == expected
    publish_ns = {r["id"]: r["publish_ns"] for r in rows if r["event"] == "published"}
    for r in rows:
        assert r["size"] == len(r["body"])
        assert r["publish_ns"] == publish_ns[r["id"]] <= r["time_ns"]
        assert r["date"] and r["date"] in str(next(archive.glob("date=*")))


async def test_a_segment_cut_short_by_kill_is_ignored(tmp_path: Path) -> None:
    """A leftover temporary segment (what kill -9 leaves) is skipped by the reader; a
    gateway started over it writes its own segment next to it and reads back only that."""
    archive = tmp_path / "archive"
    folder = archive / "date=2026-01-01"
    folder.mkdir(parents=True)
    leftover = folder / ".part-1-000001.parquet.inprogress"
    leftover.write_bytes(b"PAR1" + b"\x00" * 100)  # no footer: unreadable as Parquet
    async with running_gateway(archive__enabled=True, archive__dir=str(archive)) as gw:
        pub = await RawNSQ.connect(gw)
        await nsq_pub(pub, "t", b"kept")
        await pub.aclose()
        assert gw.archive is not None
        assert await trio.to_thread.run_sync(gw.archive.flush)
        scraped = generate_latest(gw.metrics.registry).decode()
        for line in (
            "gateway_archive_events_written_total 1.0",
            "gateway_archive_events_dropped_total 0.0",
            "gateway_archive_segments_written_total 0.0",
            "gateway_archive_buffered_events 0.0",
        ):
            assert line in scraped.splitlines()
    assert leftover.exists()
    table = read_archive(archive)
    assert table.column("event").to_pylist() == ["published"]
    assert table.column("body").to_pylist() == [b"kept"]


async def test_archive_off_has_no_archive(tmp_path: Path) -> None:
    async with running_gateway(data_dir=str(tmp_path)) as gw:
        assert gw.archive is None
        assert gw.broker.archive is None
        pub = await RawNSQ.connect(gw)
        await nsq_pub(pub, "t", b"x")
        assert gw.broker.topics["t"].archive is None
        await pub.aclose()
    assert not (tmp_path / "archive").exists()


async def test_a_rocketmq_dead_letter_is_archived_as_buried_not_as_a_delivery(
    tmp_path: Path,
) -> None:
    """A resend past maxReconsumeTimes goes to %DLQ%<group>, buried there. The archive
    shows its publish and its burial, by nobody: no delivery, which none made (the report
    would count it, and show a rocketmq -> rocketmq flow that never happened)."""
    from gateway.protocols.rocketmq.codes import RequestCode
    from tests.integration.rocketmq_raw import RawRemoting

    archive = tmp_path / "archive"
    async with running_gateway(
        rocketmq="127.0.0.1:0", archive__enabled=True, archive__dir=str(archive)
    ) as gw:
        conn = await RawRemoting.connect(gw)
        header = {"a": "PID_raw", "b": "%RETRY%g", "c": "TBW102", "d": 4, "e": 0, "f": 0}
        header |= {"g": 1700000000000, "h": 0, "i": "", "j": 5, "k": False, "l": 1}
        reply = await conn.call(RequestCode.SEND_MESSAGE_V2, header, b"poison")
        assert reply.code == 0, reply.remark
        await conn.aclose()
    rows = read_archive(archive).sort_by("time_ns").to_pylist()
    dlq = [(r["event"], r["topic"], r["group"], r["consumer"]) for r in rows]
    assert dlq == [("published", "%DLQ%g", "", ""), ("buried", "%DLQ%g", "g", "")], dlq
    assert rows[1]["peer"] == "" and rows[1]["attempts"] == 0
