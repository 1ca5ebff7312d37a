"""Subject taps: wildcards across topics, queue groups one member per message, unsubscribe."""

from __future__ import annotations

from gateway.broker import Broker
from gateway.model import Message
from gateway.stores import MemoryStore


class Recorder:
    def __init__(self) -> None:
        self.got: list[tuple[str, bytes]] = []

    def tap(self, message: Message, publisher: object | None) -> None:
        self.got.append((message.topic, message.body))


async def test_wildcards_match_topics_made_later() -> None:
    broker = Broker(MemoryStore())
    star, tail, exact = Recorder(), Recorder(), Recorder()
    broker.taps.add("orders.*", star)
    broker.taps.add("orders.>", tail)
    broker.taps.add("orders.eu", exact)
    broker.publish("orders.eu", [b"1"], create=False)
    broker.publish("orders.eu.de", [b"2"], create=False)
    broker.publish("orders", [b"3"], create=False)
    broker.publish("other.eu", [b"4"], create=False)
    assert star.got == [("orders.eu", b"1")]
    assert tail.got == [("orders.eu", b"1"), ("orders.eu.de", b"2")]
    assert exact.got == [("orders.eu", b"1")]
    assert broker.topics == {}  # create=False: taps only, nothing stored


async def test_a_queue_gives_each_message_to_one_member() -> None:
    broker = Broker(MemoryStore())
    members = [Recorder() for _ in range(3)]
    plain = Recorder()
    for member in members:
        broker.taps.add("jobs", member, "workers")
    broker.taps.add("jobs", plain)
    for i in range(30):
        broker.publish("jobs", [b"%d" % i], create=False)
    assert sorted(len(m.got) for m in members) == [10, 10, 10]
    assert sorted(b for m in members for _, b in m.got) == sorted(b"%d" % i for i in range(30))
    assert len(plain.got) == 30
    for member in members:
        broker.taps.remove("jobs", member, "workers")
    broker.publish("jobs", [b"x"], create=False)
    assert sum(len(m.got) for m in members) == 30
    assert not broker.taps.interested("other")
    assert broker.taps.interested("jobs")


async def test_taps_see_publishes_from_every_protocol() -> None:
    broker = Broker(MemoryStore())
    await broker.open()
    seen = Recorder()
    broker.taps.add("t", seen)
    group = broker.group("t", "ch")  # an NSQ channel or beanstalkd tube group
    assert group is not None
    broker.publish("t", [b"a", b"b"])
    assert seen.got == [("t", b"a"), ("t", b"b")]
    assert len(group.ready) == 2
