"""The broker's event sites on Trio's MockClock: which event each call records, with the
consumer's protocol and address; topics the patterns leave out record nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio
import trio.testing

from gateway import config
from gateway.archive.read import read_archive
from gateway.archive.writer import Archive
from gateway.broker import Broker, Consumer
from gateway.model import Message
from gateway.stores import MemoryStore


class Sink:
    protocol = "nsq"
    remote = "127.0.0.1:7777"

    def __init__(self) -> None:
        self.got: list[Message] = []

    def deliver(self, message: Message, consumer: Consumer) -> bool:
        self.got.append(message)
        return True


@asynccontextmanager
async def broker(archive: Archive, **kw: Any) -> AsyncIterator[Broker]:
    b = Broker(MemoryStore(), archive=archive, **kw)
    await b.open()
    archive.start()
    async with trio.open_nursery() as nursery:
        await nursery.start(b.run)
        yield b
        nursery.cancel_scope.cancel()
    archive.close()


def rows(root: Path) -> list[tuple[str, int, str, str, str, int]]:
    table = read_archive(root)
    table = table.sort_by([("time_ns", "ascending")])
    return [
        (r["event"], r["id"], r["group"], r["consumer"], r["peer"], r["attempts"])
        for r in table.to_pylist()
    ]


async def test_each_event_site(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    archive = Archive(tmp_path)
    async with broker(archive, max_attempts=2) as b:
        g = b.group("t", "g")
        sink = Sink()
        c = g.attach(sink, 30)
        (m1,), _ = b.publish("t", [b"a"], origin="nats 9.9.9.9:1")
        c.set_ready(1)
        g.finish(c, m1.id)  # delivered, acknowledged
        c.set_ready(0)
        (m2,), _ = b.publish("t", [b"b"], origin="nsq 9.9.9.9:2")
        c.set_ready(1)
        g.requeue(c, m2.id, 0)  # delivered, requeued, delivered again at once
        await trio.sleep(31)  # timed out: attempts 2 = max_attempts, so buried
        g.kick(1)  # kicked (and delivered at once)
        g.bury(c, m2.id)
        assert g.delete(m2.id)  # a buried job deleted
        c.set_ready(0)
        (m3,), _ = b.publish("nobody", [b"c"])
        assert b.topics["nobody"].delete_backlog(m3.id) is not None
    peer = "127.0.0.1:7777"
    assert rows(tmp_path) == [
        ("published", m1.id, "", "", "9.9.9.9:1", 0),
        ("delivered", m1.id, "g", "nsq", peer, 1),
        ("acknowledged", m1.id, "g", "nsq", peer, 1),
        ("published", m2.id, "", "", "9.9.9.9:2", 0),
        ("delivered", m2.id, "g", "nsq", peer, 1),
        ("requeued", m2.id, "g", "nsq", peer, 1),
        ("delivered", m2.id, "g", "nsq", peer, 2),
        ("timed_out", m2.id, "g", "nsq", peer, 2),
        ("buried", m2.id, "g", "", "", 2),
        ("kicked", m2.id, "g", "", "", 2),
        ("delivered", m2.id, "g", "nsq", peer, 3),
        ("buried", m2.id, "g", "nsq", peer, 3),
        ("deleted", m2.id, "g", "", "", 3),
        ("published", m3.id, "", "", "", 0),
        ("deleted", m3.id, "", "", "", 0),
    ]


async def test_topics_left_out_record_nothing(tmp_path: Path) -> None:
    archive = Archive(tmp_path, topics=["keep*"])
    async with broker(archive) as b:
        b.publish("keep.me", [b"a"])
        b.publish("other", [b"b"])
        assert b.topics["other"].archive is None
        assert b.group("other", "g").archive is None
    assert read_archive(tmp_path).column("topic").to_pylist() == ["keep.me"]


async def test_off_by_default_and_no_recorder() -> None:
    b = Broker(MemoryStore())
    b.publish("t", [b"a"])
    assert b.topics["t"].archive is None
    assert config.Settings().archive.enabled is False


def test_environment_settings() -> None:
    s = config.load(
        environ={
            "GATEWAY_ARCHIVE__ENABLED": "true",
            "GATEWAY_ARCHIVE__BODY": "256",
            "GATEWAY_ARCHIVE__TOPICS": "orders*,audit",
            "GATEWAY_ARCHIVE__DIR": "/tmp/a",
        }
    )
    a = s.archive
    assert (a.enabled, a.body, a.topics, a.dir) == (True, 256, ["orders*", "audit"], "/tmp/a")
    assert config.load(environ={"GATEWAY_ARCHIVE__BODY": "none"}).archive.body == "none"
    for bad in ("-1", "some"):
        try:
            config.load(environ={"GATEWAY_ARCHIVE__BODY": bad})
        except config.ValidationError as exc:
            assert config.describe_errors(exc)[0].startswith("archive.body")
        else:
            raise AssertionError(f"body {bad!r} accepted")
