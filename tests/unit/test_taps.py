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


# -- remote interest (a NATS cluster route's) ---------------------------------------------


class Remote:
    """Stands for a route: remote, weighted, and told once per message after every tap."""

    remote = True

    def __init__(self, weight: int = 1) -> None:
        self.weight = weight
        self.noted: list[bytes] = []
        self.sent: list[bytes] = []

    def tap(self, message: Message, publisher: object | None) -> Remote | None:
        # the first match of a message answers with itself: told once all taps saw it
        first = not self.noted or self.noted[-1] is not message.body
        self.noted.append(message.body)
        return self if first else None

    def tapped(self, message: Message) -> None:
        self.sent.append(message.body)


async def test_queue_members_across_the_route_by_weight() -> None:
    broker = Broker(MemoryStore())
    local = Recorder()
    far = Remote(weight=3)
    idle = Remote(weight=0)
    broker.taps.add("jobs", local, "w")
    broker.taps.add("jobs", far, "w")
    broker.taps.add("jobs", idle, "w")
    for i in range(400):
        broker.publish("jobs", [b"%d" % i], create=False)
    assert len(local.got) == 100
    assert len(far.sent) == 300
    assert idle.sent == []  # weight 0 is announced but never chosen
    assert sorted([b for _, b in local.got] + far.sent) == sorted(b"%d" % i for i in range(400))


async def test_routed_messages_stay_local() -> None:
    """From a route: plain local taps get it, remote taps never do, and a local queue member
    only when the route named its queue."""
    broker = Broker(MemoryStore())
    plain, member = Recorder(), Recorder()
    far_plain, far_member = Remote(), Remote()
    broker.taps.add("s.*", plain)
    broker.taps.add("s.a", member, "w")
    broker.taps.add("s.>", far_plain)
    broker.taps.add("s.a", far_member, "w")
    broker.publish("s.a", [b"named"], create=False, routed=("w",))
    broker.publish("s.a", [b"unnamed"], create=False, routed=())
    broker.publish("s.a", [b"other"], create=False, routed=("x",))
    assert plain.got == [("s.a", b"named"), ("s.a", b"unnamed"), ("s.a", b"other")]
    assert member.got == [("s.a", b"named")]
    assert far_plain.sent == far_member.sent == []


async def test_a_remote_tap_sends_once_per_message() -> None:
    """A route with plain interest under two matching patterns and a queue member: one
    `tapped` per message, after it saw every match."""
    broker = Broker(MemoryStore())
    route = Remote()
    broker.taps.add("a.*", route)
    broker.taps.add("a.>", route)
    broker.publish("a.b", [b"1", b"2"], create=False)
    assert route.sent == [b"1", b"2"]
    assert route.noted == [b"1", b"1", b"2", b"2"]


async def test_watch_hears_local_interest_only() -> None:
    broker = Broker(MemoryStore())
    heard: list[tuple[str, str | None, int]] = []
    broker.watch_interest(lambda p, q, d: heard.append((p, q, d)), lambda t, g: None)
    a, b = Recorder(), Recorder()
    broker.taps.add("x", a)
    broker.taps.add("x", b, "q")
    broker.taps.add("x", Remote())
    broker.taps.remove("x", a)
    broker.taps.remove("x", a)  # not there: nothing to hear
    broker.taps.remove("x", b, "q")
    assert heard == [("x", None, 1), ("x", "q", 1), ("x", None, -1), ("x", "q", -1)]


class Declining(Recorder):
    def tap(self, message: Message, publisher: object | None) -> bool:
        return False  # a subscriber whose own publisher's echo is off


async def test_publish_returns_the_deliveries_taken() -> None:
    """What a NATS request's no-responders check reads: deliveries taken, declines not."""
    broker = Broker(MemoryStore())
    assert broker.publish("s", [b"nobody"], create=False)[1] == 0
    broker.subscribe("s", Declining())
    assert broker.publish("s", [b"declined"], create=False)[1] == 0
    broker.subscribe("s", Recorder())
    broker.subscribe("s", Recorder(), "q")
    broker.subscribe("s", Declining(), "q")
    assert broker.publish("s", [b"a", b"b"], create=False)[1] == 4
