"""What the gateway announces to its NATS routes: interest as a set, queue weights, and
only local interest (topics with groups, imports, NATS client subscriptions)."""

from __future__ import annotations

from gateway.broker import Broker
from gateway.metrics import Metrics
from gateway.model import Message
from gateway.protocols.nats.cluster import Cluster
from gateway.stores import MemoryStore


class FakeRoute:
    """Records the frames the cluster sends to a route."""

    def __init__(self) -> None:
        self.frames: list[bytes] = []

    def send(self, frame: bytes) -> None:
        self.frames.append(frame)

    def take(self) -> list[bytes]:
        frames, self.frames = self.frames, []
        return frames


class Sub:
    remote = False

    def tap(self, message: Message, publisher: object | None) -> None:
        pass


class RemoteSub(Sub):
    remote = True


def cluster(imports: list[str] | None = None) -> tuple[Broker, Cluster, FakeRoute]:
    broker = Broker(MemoryStore())
    c = Cluster(
        broker,
        Metrics(),
        server_id="NGW",
        server_name="gw",
        name="C",
        urls=[],
        imports=imports or [],
    )
    broker.group("kept", "ch")  # before attach: counted by attach
    c.attach()
    route = FakeRoute()
    c.routes["NSRV"] = route  # type: ignore[assignment]
    return broker, c, route


def test_dump_has_everything_local() -> None:
    broker, c, _ = cluster(imports=["imp.>"])
    broker.taps.add("sub.*", Sub())
    broker.taps.add("q", Sub(), "w")
    broker.taps.add("q", Sub(), "w")
    broker.taps.add("far", RemoteSub())
    assert sorted(c.interest_frames()) == [
        b"RS+ $G imp.>\r\n",
        b"RS+ $G kept\r\n",
        b"RS+ $G q w 2\r\n",
        b"RS+ $G sub.*\r\n",
    ]


def test_plain_interest_is_a_set() -> None:
    broker, _, route = cluster()
    a, b = Sub(), Sub()
    broker.taps.add("s", a)
    broker.taps.add("s", b)
    broker.group("s", "ch")  # a topic with a group on the same subject: still one interest
    assert route.take() == [b"RS+ $G s\r\n"]
    broker.taps.remove("s", a)
    broker.topics["s"].delete_group("ch")
    assert route.take() == []
    broker.taps.remove("s", b)
    assert route.take() == [b"RS- $G s\r\n"]


def test_queue_weight_follows_members() -> None:
    broker, _, route = cluster()
    subs = [Sub(), Sub()]
    for sub in subs:
        broker.taps.add("q", sub, "w")
    broker.taps.remove("q", subs[0], "w")
    broker.taps.remove("q", subs[1], "w")
    assert route.take() == [
        b"RS+ $G q w 1\r\n",
        b"RS+ $G q w 2\r\n",
        b"RS+ $G q w 1\r\n",
        b"RS- $G q w\r\n",
    ]


def test_groups_come_and_go() -> None:
    broker, _, route = cluster()
    broker.group("t", "one")
    broker.group("t", "two")
    broker.topics["t"].delete_group("one")
    assert route.take() == [b"RS+ $G t\r\n"]
    broker.delete_topic("t")
    assert route.take() == [b"RS- $G t\r\n"]
    broker.group("e", "ch#ephemeral", ephemeral=True)
    broker.topics["e"].delete_group("ch#ephemeral")
    assert route.take() == [b"RS+ $G e\r\n", b"RS- $G e\r\n"]


def test_remote_and_unsubjectlike_interest_is_not_announced() -> None:
    broker, _, route = cluster()
    broker.taps.add("far", RemoteSub())
    broker.group("bad..name", "ch")  # a valid NSQ name, not a NATS subject
    broker.group("", "ch")
    assert route.take() == []
